"""Changing a task that already runs: its goal or constraints (a new version), and
telling it something.

`edit_task` applies a partial contract to the stored one — raise a budget or a limit,
reword the objective, add or drop items — validates the result like a new spec, raises
the task's version and commits the new contract with the ledger carried over: items
that did not change keep their state and evidence, changed items (another title or
`done_when`) start again, new items are pending, dropped items leave. A task that was
waiting or suspended (for a limit, a budget, a human) is queued again; a finished one is
re-opened by the goal change. A dropped item's requests about calls never sent close
with it (`approval.closed`): those calls are not sent later. A worker notices a new
version between rounds and starts a fresh turn whose system prompt carries the new
contract.

An edit of a task a live worker runs is journaled (`task.edit_requested`) and applied
by that worker at its next round boundary, with the same new version; a task whose
owner is gone (its process died on this machine, or its lease expired) is taken over
and edited at once.

`tell` adds a message from a person; a running task's model reads it in its next round
(the worker looks for new messages between rounds), and a task that waits for a human
is queued again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from tether import approvals, errors, failpoints, lifecycle
from tether import events as ev
from tether import ledger as L
from tether._validation import free_text
from tether.artifacts import invalidate_for_edit
from tether.decisions import changeable, store_time
from tether.runtime import hints
from tether.runtime.takeover import take_from_gone
from tether.runtime.tasks import ledger_from_spec
from tether.spec import TaskSpec, parse_spec
from tether.store.base import LedgerWrite, Store, StoredEvent, TaskPatch, TaskRecord


def _merge(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """`changes` over `base`: mappings merge key by key, anything else (lists included:
    `items`, `tools`, `acceptance`) is replaced whole."""
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def carry_over(old: L.Ledger, old_spec: TaskSpec, new_spec: TaskSpec) -> tuple[L.Ledger, list[str]]:
    """The ledger of the new contract: each unchanged item keeps its state; changed ones
    (title or `done_when`) are pending again. Returns it with the ids that started over."""
    before = {i.id: i for i in old_spec.items}
    fresh = ledger_from_spec(new_spec)
    states = []
    restarted = []
    for item in new_spec.items:
        prior = before.get(item.id)
        if prior is not None and old.has_item(item.id):
            if (prior.title, prior.done_when) == (item.title, item.done_when):
                states.append(old.item(item.id))
                continue
            restarted.append(item.id)
        states.append(L.ItemState())
    return L.Ledger(fresh.skeleton, tuple(states), old.version + 1), restarted


def item_changes(
    items: Sequence[Mapping[str, Any]],
    *,
    add: Sequence[Mapping[str, Any]] = (),
    remove: Sequence[str] = (),
    update: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """A contract's `items` with some dropped, some changed field by field (`title`,
    `done_when`, ...) and new ones appended; `UserError` for an id it does not have."""
    known = [str(i.get("id")) for i in items]
    update = dict(update or {})
    for item_id in [*remove, *update]:
        if item_id not in known:
            raise errors.UserError(
                f"the task has no item {item_id!r} (its items: {', '.join(known)})"
            )
    out = [
        {**dict(i), **dict(update.get(str(i.get("id")), {}))}
        for i in items
        if str(i.get("id")) not in set(remove)
    ]
    return out + [dict(i) for i in add]


async def edit_task(
    store: Store,
    task_id: str,
    changes: Mapping[str, Any] | None = None,
    *,
    add_items: Sequence[Mapping[str, Any]] = (),
    remove_items: Sequence[str] = (),
    update_items: Mapping[str, Mapping[str, Any]] | None = None,
    by: str = "user",
    reason: str = "",
) -> TaskRecord:
    """Change a task's contract (a partial spec merged over the stored one, and items
    added, removed or changed by id); returns the task at its new version. Raises
    `SpecError` (nothing written) if the result is not a valid contract.

    A task a live worker runs is not changed under it: the edit is checked, then
    journaled (`task.edit_requested`) and the worker applies it at its next round
    boundary (`apply_requested`); the task returned is then still `running` at its old
    version. A task whose owner is gone (its process died, its lease expired) is taken
    from it first (see `takeover.take_from_gone`) and edited at once."""
    reason = free_text(reason, "the reason", limit=MAX_MESSAGE_CHARS)
    changes = dict(changes or {}) if isinstance(changes, Mapping | None) else changes
    if not isinstance(changes, dict):
        raise errors.UserError("an edit's changes must be a mapping of spec fields")
    if not (changes or add_items or remove_items or update_items):
        raise errors.UserError("an edit needs at least one field of the spec to change")
    request = ev.EditRequested(
        changes=changes,
        add_items=[dict(i) for i in add_items],
        remove_items=list(remove_items),
        update_items={k: dict(v) for k, v in (update_items or {}).items()},
        by=by,
        reason=reason,
    )
    task = await changeable(store, task_id, "edit", reopen=True, running=True)
    if task.status == "running":
        _new_spec(task, request)  # a bad edit is refused now, not by the worker later
        await store.commit(task_id, None, [request])
        return await store.get_task(task_id)
    await _apply_pending(store, task_id)
    await _apply(store, await store.get_task(task_id), request, token=None, request_seq=None)
    return await store.get_task(task_id)


async def apply_requested(
    store: Store, task_id: str, token: int | None, request: ev.EditRequested, seq: int
) -> TaskRecord:
    """Apply an edit requested while the task ran (`task.edit_requested` at `seq`), as
    its owner (the fencing `token`) at a round boundary: the same new version as an edit
    of a stopped task, the task queued again for the owner's next turn. An edit that no
    longer makes a valid contract is refused with an `audit.warning`
    (`edit_refused`, naming the request) and the task goes on. Returns the task after."""
    task = await store.get_task(task_id)
    try:
        if task.status == "cancelled":
            raise errors.AlreadySettled(f"task {task_id} was cancelled first")
        await _apply(store, task, request, token=token, request_seq=seq)
    except errors.UserError as exc:
        warning = ev.AuditWarning(
            code="edit_refused",
            message=f"the edit requested at seq {seq} by {request.by} was not applied: {exc}",
            details={"request": seq},
        )
        await store.commit(task_id, token, [warning])
    return await store.get_task(task_id)


def _new_spec(
    task: TaskRecord, request: ev.EditRequested
) -> tuple[TaskSpec, TaskSpec, dict[str, Any]]:
    """The stored contract, the edited one and the changes as applied (`SpecError` or
    `UserError` when the edit does not make a valid contract)."""
    task_id = task.task_id
    changes = dict(request.changes)
    old_spec = parse_spec(task.spec, source=f"task {task_id}", stored=True)
    if request.add_items or request.remove_items or request.update_items:
        base = changes.get("items") or [i.model_dump(mode="json") for i in old_spec.items]
        if not isinstance(base, list) or not all(isinstance(i, Mapping) for i in base):
            raise errors.UserError("items must be a list of items (mappings with an id)")
        changes["items"] = item_changes(
            base,
            add=request.add_items,
            remove=request.remove_items,
            update=request.update_items,
        )
    merged = _merge(old_spec.model_dump(mode="json", exclude_unset=True), changes)
    new_spec = parse_spec(merged, source=f"edit of task {task_id}")
    if new_spec.workspace != old_spec.workspace:
        # The task's folder is fixed when it is created (its files, the marker workers
        # place it by, the paths its journal names): a changed spec field would be
        # stored and silently not used.
        raise errors.UserError(
            f"workspace: a task's workspace is fixed when the task is created "
            f"(task {task_id} works in {task.workspace or old_spec.workspace!r}); "
            "to work in another folder, start a new task there"
        )
    return old_spec, new_spec, changes


async def _apply(
    store: Store,
    task: TaskRecord,
    request: ev.EditRequested,
    *,
    token: int | None,
    request_seq: int | None,
) -> None:
    """Commit the edit: the new contract and version, the ledger carried over, what the
    old source versions held invalidated, the task queued (`token`: as its owner)."""
    task_id, by = task.task_id, request.by
    old_spec, new_spec, changes = _new_spec(task, request)
    old_ledger = (await store.get_ledger(task_id)).to_ledger()
    ledger, restarted = carry_over(old_ledger, old_spec, new_spec)
    version = task.version + 1
    # A changed source version invalidates exactly what depended on the old one.
    stale = await invalidate_for_edit(store, task_id, old_spec, new_spec, ledger, version=version)
    ledger = stale.ledger
    events: list[ev.Event] = [
        ev.TaskEdited(
            old_version=task.version,
            new_version=version,
            changes=dict(changes),
            invalidated=restarted,
            by=by,
            request=request_seq,
        ),
        *stale.events,
        ev.LedgerUpdated(version=ledger.version, diff=[], cause="edit"),
    ]
    # Calls made for a dropped item and never sent are not sent now: their requests close.
    removed = {i.id for i in old_spec.items} - {i.id for i in new_spec.items}
    closed_events, closed = await approvals.close_for_items(
        store,
        task_id,
        removed,
        f"item removed by edit v{version} ({by})",
        by=by,
        now=store_time(store),
    )
    events += closed_events
    patch = TaskPatch(
        version=version, spec=new_spec.model_dump(mode="json"), waiting=None, wake_at=None
    )
    if task.status not in ("queued", "paused"):  # a paused task stays paused
        change, moved = lifecycle.transition(
            task, "queued", request.reason or f"edited by {by} (v{version})"
        )
        events.append(change)
        patch = replace(patch, **moved)
    failpoints.hit("before_edit_apply")
    await store.commit(
        task_id,
        token,
        events,
        task=patch,
        ledger=LedgerWrite.of(ledger, old_ledger.version, skeleton=True),
        artifacts=stale.records,
        ops=stale.ops,
        approvals=closed,
    )
    failpoints.hit("after_edit_apply")


#: The events `pending_requests` reads: what a person asks of a running task, and what
#: settles it.
REQUEST_TYPES = frozenset(
    {
        "user.message",
        "task.pause_requested",
        "task.edit_requested",
        "task.edited",
        "task.status",
        "audit.warning",
    }
)


def pending_requests(
    found: Sequence[StoredEvent],
) -> tuple[StoredEvent | None, list[StoredEvent]]:
    """Of a task's events (`REQUEST_TYPES`, oldest first): the pause request not yet
    honoured (none after the last move to `paused` or to a terminal state), and the edit
    requests not yet applied or refused, oldest first."""
    pause: StoredEvent | None = None
    edits: dict[int, StoredEvent] = {}
    for e in found:
        if e.type == "task.pause_requested":
            pause = e
        elif e.type == "task.status" and (
            e.data.get("dst") == "paused" or e.data.get("stop_reason") is not None
        ):
            pause = None
        elif e.type == "task.edit_requested":
            edits[e.seq] = e
        elif e.type == "task.edited" and e.data.get("request") is not None:
            edits.pop(int(e.data["request"]), None)
        elif e.type == "audit.warning" and e.data.get("code") == "edit_refused":
            edits.pop(int((e.data.get("details") or {}).get("request", -1)), None)
    return pause, list(edits.values())


async def _apply_pending(store: Store, task_id: str) -> None:
    """Apply the edits requested while the task ran and not applied (its worker died
    first), oldest first: a later edit goes over them, not under."""
    found = await store.read_events(
        task_id, types={"task.edit_requested", "task.edited", "audit.warning"}
    )
    for e in pending_requests(found)[1]:
        await apply_requested(store, task_id, None, ev.EditRequested.model_validate(e.data), e.seq)


#: The longest message `tell` takes.
MAX_MESSAGE_CHARS = 8000


async def tell(store: Store, task_id: str, text: str, *, by: str = "user") -> TaskRecord:
    """A message from a person to the agent (an answer to its NEED_HELP, a correction);
    a task that waits for a human is queued again. A worker running the task hands it
    to the model at its next round boundary (not only at its next turn); a task whose
    owner is gone is taken from it first (`takeover.take_from_gone`)."""
    body = free_text(text, "the message", limit=MAX_MESSAGE_CHARS, required=True)
    task = await take_from_gone(store, task_id, by=by)
    if task.status == "cancelled":  # never reopened, not even by an edit
        raise errors.AlreadySettled(
            f"task {task_id} is cancelled, and a cancelled task is never reopened; to go on "
            "with its goal, start a new task from its spec: tether run SPEC"
        )
    if lifecycle.is_terminal(task.status):
        raise errors.AlreadySettled(
            f"task {task_id} is {task.status}; give it a new goal instead: "
            f"{hints.new_goal(task_id)}"
        )
    events: list[ev.Event] = [ev.UserMessage(text=body, by=by)]
    patch = None
    kind = (task.waiting or {}).get("kind")
    if task.status == "waiting" and kind in ("human", "decision"):
        change, moved = lifecycle.transition(task, "queued", f"{by} answered")
        events.append(change)
        patch = TaskPatch(**moved)
    await store.commit(task_id, None, events, task=patch)
    return await store.get_task(task_id)
