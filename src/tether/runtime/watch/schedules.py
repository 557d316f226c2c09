"""Recurring tasks in the store: a schedule submitted, its due occurrences started as
tasks, listed and cancelled.

A schedule lives in the store's shared documents (`schedule:<id>`, with an index under
`schedules`), so every worker on the database sees it; any worker may start its due
occurrences. The index also holds each schedule's state and next time as a hint, so a
worker's poll reads the index and only the documents that are due, not every schedule
(thousands of schedules polled by every worker each second would be thousands of reads).
The hint is written after the document it mirrors and only from what was read back from
it, and a schedule's next time only moves forward: a hint may lag (the document is then
read, found not due, and the hint repaired), never run ahead of the document, so no
occurrence is missed because of it.

Occurrence `n` of schedule `s…` is the task `s…-n`: the id is fixed by the schedule, so
two workers that start the same occurrence at once, or one that crashed between starting
it and recording so, make one task, never two — the second creation finds it there. The
schedule's document then moves past it (never backwards).

Each occurrence is a task of its own (its own ledger, budget and log, in the schedule's
workspace), queued for the workers like `tether submit`'s; its `TaskCreated` event names the
schedule and the occurrence (`launch.schedule`).
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether import errors
from tether import schedule as S
from tether.lifecycle import TERMINAL
from tether.runtime import launch
from tether.store.base import Store

log = logging.getLogger("tether.schedules")

INDEX = "schedules"
#: How many of its latest occurrences a schedule's document remembers.
RECENT = launch.LOOKBACK


def key(schedule_id: str) -> str:
    """The shared document of one schedule."""
    return f"schedule:{schedule_id}"


def new_schedule_id() -> str:
    """A short, sortable, unique schedule id (`s…`, as task ids are `t…`)."""
    return f"s{int(time.time()):x}{secrets.token_hex(3)}"


@dataclass(frozen=True)
class ScheduleView:
    """A schedule as `tether schedule list` shows it."""

    schedule_id: str
    name: str
    rule: str
    state: str
    next_n: int
    next_at: float | None
    started: int
    skipped: int
    last_task: str | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dict(self.__dict__)


def _view(doc: dict[str, Any]) -> ScheduleView:
    rule = S.Schedule.model_validate(doc["schedule"])
    return ScheduleView(
        schedule_id=doc["id"],
        name=doc["name"],
        rule=rule.describe(),
        state=doc["state"],
        next_n=doc["next_n"],
        next_at=doc["next_at"] if doc["state"] == "active" else None,
        started=doc["started"],
        skipped=doc["skipped"],
        last_task=doc["recent"][-1]["task_id"] if doc["recent"] else None,
    )


async def create_schedule(
    store: Store,
    spec: Any,
    *,
    launch: dict[str, Any] | None = None,
    workspace: str | Path | None = None,
    schedule_id: str | None = None,
) -> ScheduleView:
    """Store `spec` (a `TaskSpec` with a `schedule`) as a schedule; workers start its
    occurrences. `workspace` (else the contract's): the folder every occurrence works
    in; a file an earlier occurrence left does not count as a later one's work (file
    rules want it fresh, see `runtime.tasks`)."""
    rule: S.Schedule | None = spec.schedule
    if rule is None:
        raise errors.UserError("this contract has no `schedule`")
    sid = schedule_id or new_schedule_id()
    ws = workspace if workspace is not None else spec.workspace

    def put(doc: dict[str, Any] | None, now: float) -> tuple[dict[str, Any], dict[str, Any]]:
        if doc is not None:
            raise errors.UserError(f"schedule {sid} exists already")
        first = S.first_at(rule, now)
        new = {
            "id": sid,
            "name": spec.name,
            "spec": spec.model_dump(mode="json"),
            "schedule": rule.model_dump(mode="json"),
            "launch": dict(launch or {}),
            "workspace": str(ws) if ws is not None else None,
            "state": "ended" if S.ended(rule, 1, first) else "active",
            "created_at": now,
            "next_n": 1,
            "next_at": first,
            "started": 0,
            "skipped": 0,
            "recent": [],
        }
        return new, new

    doc = await store.update_shared(key(sid), put)

    def index(ids: dict[str, Any] | None, now: float) -> tuple[dict[str, Any], None]:
        ids = dict(ids or {})
        ids[sid] = {"name": spec.name, "at": now, **_hint(doc)}
        return ids, None

    await store.update_shared(INDEX, index)
    return _view(doc)


def _hint(doc: dict[str, Any]) -> dict[str, Any]:
    """What the index keeps of a schedule's document for the poll: its state and next time."""
    return {"state": doc["state"], "next_at": doc["next_at"]}


def _may_be_due(entry: Any, now: float) -> bool:
    """Whether the index entry leaves the schedule possibly due (an entry from before the
    hints, with none, always does: its document is read)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("next_at"), int | float):
        return True
    return bool(entry.get("state") == "active" and entry["next_at"] <= now)


async def _rehint(store: Store, sid: str, doc: dict[str, Any] | None) -> None:
    """Write the index's hint for `sid` from its document as just read back (a schedule
    whose document is gone keeps its entry: `list_schedules` skips it)."""
    if doc is None:
        return
    hint = _hint(doc)

    def put(ids: dict[str, Any] | None, now: float) -> tuple[dict[str, Any] | None, None]:
        entry = (ids or {}).get(sid)
        if ids is None or not isinstance(entry, dict) or {**entry, **hint} == entry:
            return ids, None  # no index, no entry, or nothing to change: no write
        return {**ids, sid: {**entry, **hint}}, None

    await store.update_shared(INDEX, put)


async def list_schedules(store: Store) -> list[ScheduleView]:
    """Every schedule on the database, newest first."""
    ids = await store.get_shared(INDEX) or {}
    views = []
    for sid in sorted(ids, key=lambda s: ids[s].get("at", 0), reverse=True):
        doc = await store.get_shared(key(sid))
        if doc is not None:
            views.append(_view(doc))
    return views


async def get_schedule(store: Store, schedule_id: str) -> ScheduleView:
    """One schedule; `UserError` (exit 2) if there is none by that id."""
    doc = await store.get_shared(key(schedule_id))
    if doc is None:
        raise errors.UserError(f"no schedule {schedule_id!r}: `tether schedule list` shows them")
    return _view(doc)


async def cancel_schedule(store: Store, schedule_id: str) -> ScheduleView:
    """Start no more occurrences (the ones already started go on)."""
    await get_schedule(store, schedule_id)

    def stop(doc: dict[str, Any] | None, now: float) -> tuple[dict[str, Any] | None, Any]:
        if doc is not None and doc["state"] == "active":
            doc = {**doc, "state": "cancelled", "cancelled_at": now}
        return doc, doc

    doc = await store.update_shared(key(schedule_id), stop)
    await _rehint(store, schedule_id, doc)
    return _view(doc)


@dataclass(frozen=True)
class Occurrence:
    """One due occurrence: start it (`start`), or count it skipped (`why`)."""

    schedule_id: str
    n: int
    at: float
    why: str | None = None

    @property
    def task_id(self) -> str:
        """The occurrence's task: fixed by the schedule, so it is made at most once."""
        return launch.occurrence_id(self.schedule_id, self.n)


async def _previous_running(store: Store, doc: dict[str, Any]) -> bool:
    if not doc["recent"]:
        return False
    try:
        task = await store.get_task(doc["recent"][-1]["task_id"])
    except errors.TaskNotFound:
        return False
    return task.status not in TERMINAL


def _plan(doc: dict[str, Any], now: float, previous_running: bool) -> list[Occurrence]:
    """The due occurrences of one schedule at `now`, each to start or to skip."""
    rule = S.Schedule.model_validate(doc["schedule"])
    found = list(S.due(rule, doc["next_n"], doc["next_at"], now))
    if not found:
        return []
    sid = doc["id"]
    plan = [Occurrence(sid, n, at, "missed") for n, at in found[:-1]]
    n, at = found[-1]
    why = None
    if rule.missed == "skip" and now - at > rule.grace:
        why = "missed"
    elif previous_running and rule.overlap == "skip":
        why = "overlap"
    plan.append(Occurrence(sid, n, at, why))
    return plan


async def _start(store: Store, doc: dict[str, Any], occ: Occurrence) -> str:
    """Create the occurrence's task (once: its id is fixed); its id."""
    from tether.runtime.tasks import create_task
    from tether.spec import TaskSpec

    tid = occ.task_id
    with_schedule = TaskSpec.model_validate(doc["spec"])
    spec = with_schedule.model_copy(update={"schedule": None, "name": f"{doc['name']} #{occ.n}"})
    launch = {
        **doc["launch"],
        "schedule": {"id": doc["id"], "occurrence": occ.n, "at": occ.at},
    }
    ws = Path(doc["workspace"]) if doc["workspace"] else None
    try:
        await store.get_task(tid)
        return tid  # made before (by a peer, or before a crash)
    except errors.TaskNotFound:
        pass
    try:
        await create_task(store, spec, task_id=tid, workspace=ws, launch=launch)
    except errors.TetherError:
        try:
            await store.get_task(tid)  # a peer made it at the same moment
        except errors.TaskNotFound:
            raise
    return tid


def _advance(plan: list[Occurrence], started: str | None) -> Any:
    last = plan[-1]

    def move(
        doc: dict[str, Any] | None, now: float
    ) -> tuple[dict[str, Any] | None, tuple[bool, dict[str, Any] | None]]:
        if doc is None or doc["next_n"] > last.n:
            return doc, (False, doc)  # gone, or a peer moved it further already
        rule = S.Schedule.model_validate(doc["schedule"])
        skipped = sum(1 for o in plan if o.why is not None and o.n >= doc["next_n"])
        recent = list(doc["recent"])
        if started is not None:
            recent = [*recent, {"n": last.n, "at": last.at, "task_id": started}][-RECENT:]
        n, at = last.n + 1, S.following(rule, last.at)
        state = doc["state"]
        if state == "active" and S.ended(rule, n, at):
            state = "ended"
        new = {
            **doc,
            "next_n": n,
            "next_at": at,
            "state": state,
            "started": doc["started"] + (1 if started is not None else 0),
            "skipped": doc["skipped"] + skipped,
            "recent": recent,
        }
        return new, (True, new)

    return move


async def start_due(store: Store) -> list[str]:
    """Start every schedule's due occurrences (skipping what its policies say); the ids
    of the tasks started. Safe to call from many workers at once."""
    ids = await store.get_shared(INDEX) or {}
    started: list[str] = []
    for sid in sorted(ids):
        if not _may_be_due(ids[sid], store.clock.now()):
            continue  # the hint never runs ahead of the document: not due yet
        doc = await store.get_shared(key(sid))
        now = store.clock.now()
        if doc is None or doc["state"] != "active" or doc["next_at"] > now:
            await _rehint(store, sid, doc)  # a hint that lagged (or predates hints)
            continue
        plan = _plan(doc, now, await _previous_running(store, doc))
        if not plan:
            await _rehint(store, sid, doc)
            continue
        tid = await _start(store, doc, plan[-1]) if plan[-1].why is None else None
        moved, latest = await store.update_shared(key(sid), _advance(plan, tid))
        await _rehint(store, sid, latest)
        if moved and tid is not None:
            log.info("schedule %s: started occurrence %d as task %s", sid, plan[-1].n, tid)
            started.append(tid)
        for occ in plan:
            if occ.why is not None:
                log.info("schedule %s: occurrence %d skipped (%s)", sid, occ.n, occ.why)
    return started


__all__ = [
    "Occurrence",
    "ScheduleView",
    "cancel_schedule",
    "create_schedule",
    "get_schedule",
    "list_schedules",
    "start_due",
]
