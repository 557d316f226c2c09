"""The run's journal (`ports.Journal`): every durable write of a run, under its fencing
token, with the blobs staged for it and the outside world's secrets masked.

- `RunJournal.write(Commit)`: events and projections in one transaction (the run's
  usage always goes along; a staged decision goes first).
- `BlobStage`: blobs that go into the store with the next commit (the one whose events
  reference them), the tool schemas and the epoch document staged once each.
- Redaction: events that carry text from the outside world, and op results, are
  masked (`tether.redact`) before they are stored.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tether import events as ev
from tether import ledger as L
from tether import lifecycle
from tether.models.base import ModelRequest
from tether.redact import Redactor
from tether.runtime.round import history
from tether.runtime.run.ports import Commit
from tether.runtime.run.state import RunView
from tether.store._rules import replaced
from tether.store.base import (
    UNSET,
    CommitResult,
    LedgerWrite,
    OpRecord,
    Store,
    TaskPatch,
    TaskRecord,
    blob_hash,
)

#: Events that carry text from the outside world (errors, results, model names).
REDACTED_EVENTS = frozenset(
    {
        "model.called",
        "model.failed",
        "op.result",
        "op.retry_scheduled",
        "round.committed",
        "audit.warning",
        "approval.requested",
        "probe.answered",
        "task.status",
    }
)
#: A commit of nothing (what `set_status` adds by default).
_NOTHING = Commit()


def redacted(event: ev.Event, redactor: Redactor) -> ev.Event:
    """The event with secret values and URL userinfo masked (see `tether.redact`). Its
    JSON text (pydantic's, fast) is scanned first: most events hold nothing to mask."""
    if event.TYPE not in REDACTED_EVENTS or redactor.clean(event.json_text()):
        return event
    data = event.data()
    masked = redactor.data(data)
    return event if masked == data else type(event).model_validate(masked)


def redacted_op(op: OpRecord, redactor: Redactor) -> OpRecord:
    """The op record with secrets masked in its error and result."""
    if op.error is None and op.result is None:
        return op
    # Looked at before a masked copy is built: most results hold nothing to mask.
    if redactor.clean_data([op.error, op.result]):
        return op
    error, result = redactor.data(op.error), redactor.data(op.result)
    if (error, result) == (op.error, op.result):
        return op
    return replace(op, error=error, result=result)


#: The patch of no change, which `task_patch` copies with the commit's fields.
_NO_PATCH = TaskPatch()


def task_patch(**given: Any) -> TaskPatch:
    """`TaskPatch(**given)`, made by `store._rules.replaced`: its fields put in its
    `__dict__` at once. Its `__init__` sets each of its ten fields through
    `object.__setattr__` (it is frozen), and every commit makes one: two a round."""
    return replaced(_NO_PATCH, **given)


@dataclass(frozen=True)
class Snapshot:
    """What a progress display shows after each step."""

    task_id: str
    status: str
    round: int
    focus: str | None
    progress: L.Progress
    tokens: int
    #: Cached and total input tokens of the actor's calls (the cache hit rate).
    cached_tokens: int
    input_tokens: int
    cost_usd: float
    message: str

    @property
    def cache_hit_rate(self) -> float:
        """Cached share of input tokens so far."""
        return self.cached_tokens / self.input_tokens if self.input_tokens else 0.0


class BlobStage:
    """Blobs that go into the store with the next commit: one transaction instead of
    one per blob. The request's tool schemas and the epoch document are staged once
    each (their refs are kept in the run state)."""

    def __init__(self, view: RunView) -> None:
        self.view = view
        self.pending: dict[str, bytes] = {}
        # (id of the tool schema tuple, its blob): the schemas change only per turn.
        self._tools: tuple[int, str] | None = None
        # (the epoch's parts, its blob): most rounds of a turn share one epoch.
        self._epoch: tuple[tuple[Any, ...], str] | None = None

    def blob(self, data: bytes) -> str:
        """Stage `data`; returns its ref."""
        ref = blob_hash(data)
        self.pending[ref] = data
        return ref

    def packed(self, obj: Any) -> str:
        """Stage a JSON document, compressed when large (see `history.pack`)."""
        return self.blob(history.pack(obj))

    def tools(self, request: ModelRequest) -> str:
        """The blob of the request's tool schemas, staged once per set of schemas."""
        key = id(request.tools)
        if self._tools is None or self._tools[0] != key:
            data = history.dumps([t.to_dict() for t in request.tools]).encode("utf-8")
            ref = blob_hash(data)
            if self.view.state.tools_blob != ref:
                self.blob(data)
                self.view.state.tools_blob = ref
            self._tools = (key, ref)
        return self._tools[1]

    def epoch(self, obj: Mapping[str, Any]) -> str:
        """Stage the epoch document unless it is the one staged last (the same epoch is
        recognised without serializing it again)."""
        key = tuple(sorted(obj.items()))
        if self._epoch is not None and self._epoch[0] == key:
            return self._epoch[1]
        data = history.dumps(obj).encode("utf-8")
        ref = blob_hash(data)
        if self.view.state.epoch_blob != ref:
            self.blob(data)
            self.view.state.epoch_blob = ref
        self._epoch = (key, ref)
        return ref

    def ready(self) -> list[bytes]:
        """The staged blobs, for a commit (`clear` once it is stored)."""
        return list(self.pending.values())

    def clear(self) -> None:
        """The staged blobs are stored."""
        self.pending.clear()


#: Told of a commit the store accepted: its result, the events and ops as written.
Written = Callable[[CommitResult, Sequence[ev.Event], Sequence[OpRecord]], None]


class RunJournal:
    """The run's commit port (`ports.Journal`)."""

    def __init__(
        self,
        store: Store,
        task_id: str,
        token: int,
        view: RunView,
        *,
        on_commit: Callable[[CommitResult], None],
        on_progress: Callable[[Snapshot], None] | None = None,
        on_written: Written | None = None,
    ) -> None:
        self._store = store
        #: Told of every commit as written (the judge's indexes: `judge.rules.own`).
        self._on_written = on_written
        self.task_id = task_id
        self.token = token
        self.view = view
        self.status = "queued"
        self.blobs = BlobStage(view)
        # The environment's secrets, read once per run rather than once per document.
        self.redactor = Redactor()
        # The round's decision, staged until the round's first commit (`phases.decide`).
        self.staged_events: list[ev.Event] = []
        self.staged_ledger: L.Ledger | None = None
        self._on_commit = on_commit
        self._on_progress = on_progress
        self._wall_mark = time.monotonic()

    def _tick_wall(self, milestone: str | None) -> None:
        now = time.monotonic()
        spent = now - self._wall_mark
        self.view.state.wall_seconds += spent
        self.view.state.count_for_milestone(milestone, wall_seconds=spent)
        self._wall_mark = now

    def commit(self, events: Sequence[ev.Event], **fields: Any) -> Coroutine[Any, Any, int]:
        """`write(Commit(events, **fields))`: that write's own coroutine, awaited by the
        caller (no second coroutine around it, two a round)."""
        return self.write(Commit(events, **fields))

    async def write(self, commit: Commit) -> int:
        """Commit events and projections (usage always) under our fencing token; a
        staged decision goes first, in the same transaction. Returns the last seq."""
        events, ledger = commit.events, commit.ledger
        if self.staged_events:
            events = [*self.staged_events, *events]
            self.staged_events = []
        if self.staged_ledger is not None:
            if ledger is None:
                ledger = self.staged_ledger
            self.staged_ledger = None
        view = self.view
        milestone = view.ledger.current_milestone()
        self._tick_wall(milestone)
        write = None
        if ledger is not None and ledger.version != view.ledger.version:
            write = LedgerWrite.of(ledger, view.ledger.version, since=view.ledger)
        waiting = commit.waiting
        patch = task_patch(
            status=commit.status,
            stop_reason=commit.stop_reason,
            usage=view.state.to_dict(),
            marks=view.state.marks_write(),
            waiting=self.redactor.data(waiting) if isinstance(waiting, dict) else waiting,
            wake_at=commit.wake_at,
            current_milestone=(
                ledger.current_milestone()
                if ledger is not None and ledger is not view.ledger
                else milestone
            ),
        )
        redactor = self.redactor
        try:
            # Most events carry nothing from outside: not even looked at.
            written = [
                e if e.TYPE not in REDACTED_EVENTS else redacted(e, redactor) for e in events
            ]
            ops = [redacted_op(o, redactor) for o in commit.ops]
            # `_write` inline (a coroutine less per commit, two a round).
            res = await self._store.commit(
                self.task_id,
                self.token,
                written,
                task=patch,
                ledger=write,
                ops=ops,
                artifacts=commit.artifacts,
                approvals=commit.approvals,
                blobs=self.blobs.ready(),
            )
            if self._on_written is not None:
                self._on_written(res, written, ops or ())
        except BaseException:
            view.state.marks_unsure()  # its marks may not be stored: the next sends all
            raise
        self.blobs.clear()
        self._on_commit(res)
        if ledger is not None:
            view.ledger = ledger
        if commit.status is not None:
            self.status = commit.status
        view.state.last_seq = res.last_seq
        return res.last_seq

    async def _write(self, events: list[ev.Event], **parts: Any) -> CommitResult:
        """`Store.commit` as the run's owner, told to `on_written`."""
        res = await self._store.commit(self.task_id, self.token, events, **parts)
        if self._on_written is not None:
            self._on_written(res, events, parts.get("ops") or ())
        return res

    async def commit_aside(self, events: Sequence[ev.Event], blobs: Sequence[bytes]) -> None:
        """Commit events (redacted) and the run's usage next to the round in flight,
        leaving its staged decision and blobs for its own commit (the status probe).
        The usage may then count a staged call of the round: over, never under."""
        state = self.view.state
        try:
            await self._write(
                [redacted(e, self.redactor) for e in events],
                task=TaskPatch(usage=state.to_dict(), marks=state.marks_write()),
                blobs=blobs,
            )
        except BaseException:
            state.marks_unsure()
            raise

    async def set_status(
        self, dst: str, stop_reason: str | None = None, reason: str = "", *, also: Commit = _NOTHING
    ) -> None:
        """Move the task (with its event, after `also`'s events) in one commit
        (`lifecycle.transition`); a move to anything but `waiting` clears the wait unless
        `also` says otherwise."""
        waiting, wake_at = also.waiting, also.wake_at
        if waiting is UNSET:
            waiting = lifecycle.KEEP if dst == "waiting" else None
        change, patch = lifecycle.transition(
            self,
            dst,
            reason,
            stop_reason=stop_reason,
            waiting=waiting,
            wake_at=lifecycle.KEEP if wake_at is UNSET else wake_at,
        )
        await self.write(replace(also, events=[*also.events, change], **patch))

    async def ask_human(
        self, warning: ev.Event, waiting: Mapping[str, Any], reason: str
    ) -> TaskRecord:
        """Commit, next to the round in flight (which was cancelled), that the task waits
        for a person (a failed status probe's `AskHuman`); returns the task row after.
        Raises what the store raises (the task was cancelled or taken over meanwhile,
        the store is away)."""
        task = await self._store.get_task(self.task_id)
        change, patch = lifecycle.transition(
            task, "waiting", reason, waiting=self.redactor.data(dict(waiting))
        )
        await self._write([warning, change], task=TaskPatch(**patch))
        task = await self._store.get_task(self.task_id)
        self.status = task.status
        return task

    def stage_blob(self, data: bytes) -> str:
        """A blob that goes into the store with the next commit; returns its ref."""
        return self.blobs.blob(data)

    async def get_json(self, ref: str) -> Any:
        """Read a JSON blob (plain or packed)."""
        return history.unpack(await self._store.get_blob(ref))

    def snapshot(self, message: str) -> None:
        """Tell the progress display."""
        if self._on_progress is None:
            return
        view, st = self.view, self.view.state
        act = st.by_purpose.get("act")
        self._on_progress(
            Snapshot(
                task_id=self.task_id,
                status=self.status,
                round=st.rounds,
                focus=view.ledger.next_item(),
                progress=view.ledger.progress(),
                tokens=st.tokens,
                # The cache hit rate that matters is the actor's: judge and compaction
                # calls have prompts of their own and are not meant to share a prefix.
                cached_tokens=act.cached if act else 0,
                input_tokens=act.input if act else 0,
                cost_usd=st.cost_usd,
                message=message,
            )
        )


__all__ = [
    "BlobStage",
    "RunJournal",
    "Snapshot",
    "redacted",
    "redacted_op",
    "task_patch",
]
