"""Deterministic replay: run a task's rounds again from what was recorded, with no side
effects, and check that the runtime decides what it decided then.

The replay drives the public `Engine` against a fresh in-memory store seeded with the
task's contract, workspace path and first event. Its models answer each call with the
response recorded for that call (the `model.called` events and their blobs, in order; a
recorded `model.failed` is raised again), and every tool is a stand-in that returns the
journaled result of the op it is called with (the op ids are the idempotency keys, so a
call the recording does not have is a divergence, never a real call). The clock shows
the recorded time of each model call. Then the replayed event log is compared with the
recorded one, event by event, on what the runtime decided: ledger diffs, verdicts, op
ids, arguments and outcomes, round boundaries, status changes, approvals and decisions
asked for. Timings, lease bookkeeping and model-call summaries are not compared.

What replay cannot check (`LIMITS`): the contents of workspace files are not recorded,
so the replay works in a throwaway copy of today's workspace without the files the
task's writes created (the built-in file writers write there again); a tool's
`effect_of` answer is taken from the recording; human actions (approvals, retries,
waivers, messages, cancels, abandons) are taken again through the functions the CLI
calls, where the replayed task stopped for them (one that came in while a round ran,
or a goal edit, ends the replay there; only the edited contract is stored, so rounds
before an edit that decide otherwise under it are refused, not called a divergence); a
tasks with MCP servers are refused (their tools come from live servers).

The recording is followed run by run (`_steps`): every claim of the task — `tether
run`, each `tether resume` (even one that found the same wait and went back to it, or
a forced one), a worker's — is one run of the engine again, told by its fencing token,
with the out-of-band commits between them taken again in order: a human's, a forced
takeover's note, the watchdog's suspension of an unanswered wait or its stall mark. A
run whose worker died in a model call, or while a tool call was out, is killed again
there.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tether import errors, lifecycle
from tether.models.base import ModelRequest, ModelResponse
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.round import history
from tether.runtime.tasks import ledger_from_spec
from tether.spec import parse_spec
from tether.store.base import OpRecord, Store, StoredEvent, TaskPatch, TaskRecord
from tether.store.memory import MemoryStore
from tether.tools import files
from tether.tools.builtin.files import as_sent, default_registry
from tether.tools.registry import (
    Compensation,
    Reconciliation,
    Tool,
    ToolContext,
    ToolRegistry,
)

#: What replay cannot check (printed with every result).
LIMITS: tuple[str, ...] = (
    "workspace file contents are not recorded: the replay works in a scratch copy of today's "
    "workspace without the files the task created (a file the task changed that existed "
    "before, or one changed since, is read as it is now)",
    "a tool's effect (effect_of) is taken from the recording, not decided again",
    "human actions (approvals, decisions, messages, cancels) are taken again through the "
    "same functions at the point they were recorded, not at their recorded moment within a "
    "running round; a goal edit is not: the replay stops before it",
    "only the latest contract is stored: rounds before a goal edit are run under the edited "
    "one (where they decide otherwise, the replay is refused)",
    "a run that died is killed again at the model or tool call it died in, not at its "
    "moment within that call",
)
#: Events that say nothing the runtime decided (bookkeeping of leases and processes).
_SKIPPED = frozenset({"lease.claimed", "lease.released", "lease.renewed", "lease.taken_over"})
_ADMITTED = frozenset({"too_many_calls", "call_ids_replaced"})  # see `_probed`
#: What a sweeper (`runtime.notices`, `runtime.watch`) writes beside a run: a notice sent
#: to a person is no decision of the run and no action of a person's.
_SENT = frozenset({"notice.sent"})
#: Fields that differ between two runs of the same decisions.
_VOLATILE = frozenset(
    {"duration_ms", "latency_ms", "expires_at", "worker_id", "at", "token", "summary_at"}
)
#: How the op runner ends the message of a call whose retries ran out.
_GAVE_UP = re.compile(r" \(gave up after \d+ attempts\)$")
#: How `decisions.abandon_task` words its status change: who abandoned it, and why.
_ABANDONED = re.compile(r"abandoned by (.+?): (.*)", re.S)
#: The built-in tools that write workspace files (replayed into the scratch copy).
WRITERS = frozenset({"write_file", "append_file"})
#: Of a model call only which call it was is compared (its answer is the recorded one).
_CALL_FIELDS = ("call_id", "purpose", "round")


@dataclass(frozen=True)
class Divergence:
    """The first place where the replay decided something else than the recording."""

    seq: int | None
    round: int | None
    what: str
    recorded: Any
    replayed: Any

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "seq": self.seq,
            "round": self.round,
            "what": self.what,
            "recorded": self.recorded,
            "replayed": self.replayed,
        }


@dataclass(frozen=True)
class ReplayResult:
    """How a replay went: the rounds and events that matched, or the first divergence."""

    task_id: str
    until: int
    rounds: int
    events: int
    divergence: Divergence | None
    stopped_at: str | None = None
    limits: tuple[str, ...] = LIMITS

    @property
    def ok(self) -> bool:
        """True when every compared decision matched."""
        return self.divergence is None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "task_id": self.task_id,
            "ok": self.ok,
            "until": self.until,
            "rounds_matched": self.rounds,
            "events_compared": self.events,
            "divergence": self.divergence.to_dict() if self.divergence else None,
            "stopped_at": self.stopped_at,
            "limits": list(self.limits),
        }


@dataclass
class _Recording:
    """The recorded task: its events up to the replay's end and its op journal."""

    task: TaskRecord
    events: list[StoredEvent]
    ops: dict[str, OpRecord]
    source: Store
    #: Recorded attempts per op id (from `op.result` and `op.retry_scheduled`).
    attempts: dict[str, list[Mapping[str, Any]]] = field(default_factory=dict)
    #: Recorded reconcile outcomes per op id, in order (`op.reconciled`).
    reconciled: dict[str, list[str]] = field(default_factory=dict)
    #: What each op's approval request said (its tool asked, or its effect did).
    asked: dict[str, str] = field(default_factory=dict)
    #: Each op's arguments as sent (after a human's `modify`), by op id.
    sent: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The replay's copy of the workspace (see `_scratch`).
    scratch: Path | None = None
    #: The model answers' cursor, which also knows a run to kill where it died.
    cursor: _Cursor | None = None

    def round_at(self, seq: int | None) -> int | None:
        """The round in progress at recorded event `seq`."""
        current = None
        for e in self.events:
            if seq is not None and e.seq > seq:
                break
            if e.type == "round.started":
                current = e.data.get("round")
        return current


class _Cursor:
    """The recorded model answers in order, shared by the replaying models."""

    def __init__(self, rec: _Recording, until: int, stop: asyncio.Event) -> None:
        self.rec = rec
        self.answers = [
            e for e in rec.events if e.type in ("model.called", "model.failed") and not _probed(e)
        ]
        self.until = until
        self.stop = stop
        self.next = 0
        self.mismatch: Divergence | None = None
        self.clock: _ReplayClock | None = None
        #: The run being driven, when the recorded one died waiting for this call (see
        #: `_crashed`): past its answers it is cancelled, as its process was killed.
        self.crash: asyncio.Task[Any] | None = None

    async def answer(self, request: ModelRequest) -> ModelResponse:
        if self.next >= len(self.answers) or self.answers[self.next].seq > self.until:
            if self.crash is not None:
                self.crash.cancel()
                await asyncio.Event().wait()
            if self.until >= self.rec.task.last_seq and self.mismatch is None:
                # Asked past the end of the whole recording (not of a stretch or of
                # `--until`): the runtime wanted a call the recorded run never made.
                self.mismatch = Divergence(
                    None,
                    None,
                    "the runtime asked the model once more than recorded",
                    "no further model call",
                    f"a {request.purpose} call",
                )
            # The end of the replay: the engine's stop cancels this call (interrupted).
            self.stop.set()
            await asyncio.Event().wait()
        event = self.answers[self.next]
        self.next += 1
        if self.clock is not None:
            self.clock.at = max(self.clock.at, event.at)
        if event.data.get("purpose") != request.purpose:
            self.mismatch = self.mismatch or Divergence(
                event.seq,
                self.rec.round_at(event.seq),
                "the runtime asked for a model call of another purpose",
                event.data.get("purpose"),
                request.purpose,
            )
            self.stop.set()
            await asyncio.Event().wait()
        if event.type == "model.failed":
            raise errors.ModelError(
                str(event.data.get("error", "")),
                transient=bool(event.data.get("transient")),
                attempts=int(event.data.get("attempts", 1)),
            )
        return ModelResponse.from_dict(await history.call_response(self.rec.source, event.data))


class _ReplayModel:
    """A model that answers with the recorded responses (see `_Cursor`)."""

    def __init__(self, cursor: _Cursor, name: str) -> None:
        self.cursor = cursor
        self.name = name

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """The recorded answer to this call."""
        return await self.cursor.answer(request)


class _ReplayClock:
    """The recorded time: moves to each recorded model call's time, and when slept on."""

    def __init__(self, start: float) -> None:
        self.at = start

    def now(self) -> float:
        """The replayed time."""
        return self.at

    async def sleep(self, seconds: float) -> None:
        """Advance instead of waiting."""
        self.at += max(0.0, seconds)
        await asyncio.sleep(0)


class _RecordedFailure(errors.RetryLater):
    """A recorded failed attempt, raised again with its recorded class and, for one that
    was retried, the recorded wait before the next attempt (as the service's asked-for
    delay, which the op runner honours as it is): the backoff's jitter, or a tool's own
    `RetryLater` delay, is not drawn again, so the worker waits, or parks the task until
    a stored time, where it did."""

    def __init__(self, message: str, cls: str, delay: float | None) -> None:
        # A negative delay is no hint (`retry.retry_delay`): the policy's backoff decides.
        super().__init__(message, delay=-1.0 if delay is None else delay)
        self.cls = cls


async def _die_if_it_did(rec: _Recording, tries: Sequence[Mapping[str, Any]], attempt: int) -> None:
    """In a run that is killed where the recorded one died (see `_crashed`): when this
    attempt's recorded outcome came only after that run, the run died while the call
    was out; it is cancelled here too."""
    cursor = rec.cursor
    if cursor is None or cursor.crash is None:
        return
    recorded = tries[min(attempt, len(tries)) - 1] if tries else None
    if recorded is None or int(recorded.get("_seq", 0)) > cursor.until:
        cursor.crash.cancel()
        await asyncio.Event().wait()


def _stand_in(tool: Tool, rec: _Recording, effects: Mapping[str, str]) -> Tool:
    """The tool with its declaration kept and its effects replaced by the recording.

    The built-in file writers also write, into the replay's scratch copy of the
    workspace (see `_scratch`), so the file rules of later rounds see their files."""

    async def fn(args: Mapping[str, Any], ctx: ToolContext) -> Any:
        asked = rec.asked.get(ctx.op_id)
        if asked is not None and not ctx.approved:
            # The recorded call waited for a human's approval here.
            raise errors.ApprovalRequired(asked.removeprefix("the tool asks: "))
        tries = rec.attempts.get(ctx.op_id, [])
        await _die_if_it_did(rec, tries, ctx.attempt)
        op = rec.ops.get(ctx.op_id)
        if op is None or not tries:
            raise errors.ReplayMismatch(f"op {ctx.op_id} ({tool.name}) was never recorded")
        attempt = tries[min(ctx.attempt, len(tries)) - 1]
        if attempt.get("status") == "succeeded":
            if tool.name in WRITERS and rec.scratch is not None:
                await tool.fn(args, replace(ctx, workspace=rec.scratch))
            res = op.result or {}
            if res.get("artifact_id"):
                # The model read a preview: the stand-in gives the whole output again.
                art = await rec.source.get_artifact(str(res["artifact_id"]))
                return (await rec.source.get_blob(art.blob_hash)).decode("utf-8")
            return res.get("content", "")
        delay = attempt.get("delay")
        raise _RecordedFailure(
            # The replayed schedule says "gave up after N attempts" again itself.
            _GAVE_UP.sub("", str(attempt.get("error") or "recorded failure")),
            str(attempt.get("error_class") or "deterministic"),
            float(delay) if isinstance(delay, int | float) else None,
        )

    def effect_of(args: Mapping[str, Any], ctx: ToolContext) -> Any:
        return effects.get(ctx.op_id, tool.effect)

    async def reconcile(op: Any, ctx: ToolContext) -> Reconciliation:
        recorded = rec.ops.get(ctx.op_id)
        done = recorded is not None and recorded.status == "succeeded"
        outcomes = rec.reconciled.get(ctx.op_id)
        if outcomes:  # what the outside world answered then, in order
            outcome = outcomes.pop(0)
            if outcome != "done":
                return Reconciliation("not_done" if outcome == "not_done" else "unknown")
        elif not done:
            return Reconciliation("unknown")
        return Reconciliation("done", (recorded.result or {}).get("content") if recorded else None)

    def classify(exc: BaseException) -> Any:
        return exc.cls if isinstance(exc, _RecordedFailure) else None

    undo = None
    if tool.compensate is not None:
        # A compensation is an op of its own (`ctx.op_id` is `<op>.compensate`): it gets
        # its recorded result too, never the real undo.
        async def compensate(op: Any, ctx: ToolContext) -> Any:
            return await fn({}, ctx)

        declared = tool.compensate
        undo = Compensation(
            compensate,
            reconcile if declared.reconcile is not None else None,
            declared.idempotent,
            declared.timeout,
        )
    return replace(
        tool,
        fn=fn,
        effect_of=effect_of,
        reconcile=reconcile if tool.reconcile is not None else None,
        classify=classify,
        validate=None,
        compensate=undo,
    )


def _comparable(e: StoredEvent) -> dict[str, Any]:
    """What of an event the comparison looks at."""
    if e.type == "model.called":
        return {"type": e.type, **{k: e.data.get(k) for k in _CALL_FIELDS}}
    data = {k: v for k, v in e.data.items() if k not in _VOLATILE}
    if e.type == "round.committed":  # where its response is stored is no decision
        data["messages"] = history.round_refs(data.get("messages"))
    if e.type == "turn.started":
        # The system prompt names the workspace, which is the replay's scratch copy.
        data = {k: v for k, v in data.items() if k not in ("system_blob", "system_chars")}
    if e.type == "op.result":
        # The message of a failure is the recorded one; its class is what matters.
        data.pop("error", None)
    if e.type == "op.retry_scheduled":
        # The backoff is jittered (random by design): when is not compared, that is.
        data = {k: v for k, v in data.items() if k not in ("delay", "next_attempt_at")}
    if e.type == "decision.requested":  # a sign-off's report: its cost is not decided
        data["report"] = {k: v for k, v in data.get("report", {}).items() if k != "cost"}
    if e.type == "op.reconciled":
        # The world's answer is the recorded result (only a cut text of it journaled).
        data.pop("detail", None)
    return {"type": e.type, **data}


def _probed(e: StoredEvent) -> bool:
    """Not decided: a status probe's event (replays do not probe), or an edit of a model's
    answer before it was journaled (`admit_calls`: the replay is fed it as journaled)."""
    if e.type in ("model.called", "model.failed"):
        return e.data.get("purpose") == "probe"
    return e.type == "probe.answered" or e.data.get("code") in _ADMITTED


def _decisions(events: Sequence[StoredEvent]) -> list[StoredEvent]:
    """The events that record decisions (not lease bookkeeping, not `_probed`)."""
    return [e for e in events if e.type not in _SKIPPED | _SENT and not _probed(e)]


def compare(
    rec: _Recording, recorded: Sequence[StoredEvent], replayed: Sequence[StoredEvent]
) -> tuple[Divergence | None, int]:
    """The first divergence between two event logs and how many events matched."""
    a, b = _decisions(recorded), _decisions(replayed)
    for n, (x, y) in enumerate(zip(a, b, strict=False)):
        cx, cy = _comparable(x), _comparable(y)
        if cx != cy:
            what = (
                f"the runtime wrote {y.type} where the recording has {x.type}"
                if x.type != y.type
                else f"{x.type} differs"
            )
            return Divergence(x.seq, rec.round_at(x.seq), what, cx, cy), n
    if len(a) > len(b):
        x = a[len(b)]
        return (
            Divergence(
                x.seq,
                rec.round_at(x.seq),
                f"the replay ended before recorded event {x.seq} ({x.type})",
                _comparable(x),
                None,
            ),
            len(b),
        )
    if len(b) > len(a):
        y = b[len(a)]
        return (
            Divergence(
                None,
                rec.round_at(a[-1].seq if a else None),
                f"the replay went on with {y.type} after the recording ended",
                None,
                _comparable(y),
            ),
            len(a),
        )
    return None, len(a)


async def _load(source: Store, task_id: str, until: int | None) -> _Recording:
    task = await source.get_task(task_id)
    if task.last_seq < 1:
        raise errors.UserError(f"task {task_id} has no events to replay")
    if until is not None and not 1 <= until <= task.last_seq:
        raise errors.UserError(
            f"--until {until} is out of range: task {task_id} has events 1 to {task.last_seq}"
        )
    if task.spec.get("mcp_servers"):
        raise errors.UserError(
            f"task {task_id} uses MCP servers; replay cannot stand in for their tools yet"
        )
    events = await source.read_events(task_id, limit=until)
    ops = {o.op_id: o for o in await source.get_ops(task_id)}
    rec = _Recording(task, events, ops, source)
    approved = await source.get_approvals(task_id, statuses={"approved"})
    rec.sent = {o.op_id: o.args for o in as_sent(list(ops.values()), approved)}
    in_doubt: set[str] = set()
    for e in events:
        if e.type == "approval.requested" and e.data.get("op_id"):
            rec.asked[str(e.data["op_id"])] = str(e.data.get("impact") or "")
        if e.type == "op.reconciled":
            rec.reconciled.setdefault(str(e.data["op_id"]), []).append(str(e.data["outcome"]))
            in_doubt.add(str(e.data["op_id"]))
        if e.type == "op.result" or e.type == "op.retry_scheduled":
            op_id = str(e.data["op_id"])
            attempt = {**e.data, "status": e.data.get("status", "failed"), "_seq": e.seq}
            if op_id in in_doubt:
                # Settled by a reconcile: the attempt itself ended in doubt (a lost
                # answer), whatever the retry or the backfilled result says.
                in_doubt.discard(op_id)
                attempt.update(status="failed", error_class="unknown")
            rec.attempts.setdefault(op_id, []).append(attempt)
    return rec


def _scratch(rec: _Recording) -> Path | None:
    """A throwaway copy of the workspace as it was before the task, as far as the
    recording can tell: today's files without those the task's file writes created."""
    if not rec.task.workspace or not Path(rec.task.workspace).is_dir():
        return None
    root = Path(tempfile.mkdtemp(prefix="tether-replay-")) / "workspace"
    shutil.copytree(rec.task.workspace, root, symlinks=True)
    for op in rec.ops.values():
        summary = str((op.result or {}).get("summary", ""))
        path = rec.sent.get(op.op_id, op.args).get("path")  # where it wrote, not was asked
        if op.tool in WRITERS and files.says_created(summary) and isinstance(path, str):
            target = (root / path).resolve()
            if target.is_relative_to(root.resolve()) and target.is_file():
                target.unlink()
    return root


def _actor(event: StoredEvent) -> str:
    """Who wrote an out-of-band event, for `stopped_at`: the watchdog suspending a wait
    nobody answered (`runtime.watch`), or a person."""
    why = str(event.data.get("reason", "")) if event.data.get("dst") == "suspended" else ""
    if event.type == "task.status" and why.startswith("no answer"):
        return "the watchdog's suspension of an unanswered wait, which"
    if _swept(event):
        return "the watchdog's stall mark of a run the replay did not see die, which"
    return "a human action"


@dataclass(frozen=True)
class _Step:
    """One stretch of the recording: a run of an engine (`run`: the events it wrote
    under one lease's fencing token; `more`: the rest of one after an out-of-band
    commit), or a commit made beside the runs (`out`: a human's decision, a message, an
    edit, a cancel request, a forced takeover's note, a watchdog's mark or suspension)."""

    kind: str
    events: list[StoredEvent]


def _swept(e: StoredEvent) -> bool:
    """A watchdog's stall mark (`runtime.watch`): written under a sweep's own lease,
    yet no run of an engine."""
    return e.type == "task.status" and e.data.get("dst") == "stalled"


def _steps(events: Sequence[StoredEvent]) -> list[_Step]:
    """The recording after its first event as the runs and the out-of-band commits, in
    order. Every claim of the task (`tether run`, each `tether resume`, forced or not,
    a worker's) is a run of its own, even one that only went back to the wait it found:
    a run is told by its fencing token, never by the human actions around it."""
    steps: list[_Step] = []
    token: int | None = None
    for n, e in enumerate(events):
        if n == 0 or e.type in _SENT:
            continue
        last = steps[-1] if steps else None
        if e.fencing_token is None or _swept(e):
            if last is not None and last.kind == "out" and last.events[-1].seq == e.seq - 1:
                last.events.append(e)
            else:
                steps.append(_Step("out", [e]))
        elif e.fencing_token == token and last is not None and last.kind != "out":
            last.events.append(e)
        elif e.fencing_token == token:
            # The run that was under way when an out-of-band commit came in goes on:
            # no new claim (`more` is driven by nobody).
            steps.append(_Step("more", [e]))
        else:
            # A new claim. (The same token again after an out-of-band commit is the
            # run that was under way when it came in, not a new one.)
            token = e.fencing_token
            steps.append(_Step("run", [e]))
    return steps


async def _apply_human(store: Store, rec: _Recording, group: Sequence[StoredEvent]) -> bool:
    """Take a recorded human action again on the replay's store, through the function
    the CLI and the dashboard call; False for one replay cannot take (an edit)."""
    from tether import approvals, decisions, edits, signoff
    from tether.runtime import tasks

    tid, first = rec.task.task_id, group[0]
    d, by = first.data, str(first.data.get("by", "user"))
    if first.type == "item.waived":
        await decisions.waive_item(store, tid, str(d["item"]), reason=str(d["reason"]), by=by)
    elif first.type == "item.retried":
        await decisions.retry_item(store, tid, str(d["item"]), hint=d.get("hint"), by=by)
    elif first.type == "approval.decided":
        recorded = {a.request_id: a for a in await rec.source.get_approvals(tid)}
        decision = (recorded[d["request_id"]].decision or {}) if d["request_id"] in recorded else {}
        await approvals.decide(
            store,
            tid,
            str(d["request_id"]),
            "approve" if d["decision"] == "modify" else d["decision"],
            by=by,
            modified_args=d.get("modified_args"),
            reason=str(decision.get("reason") or ""),
            result=decision.get("result"),
        )
    elif first.type == "signoff.decided":
        await signoff.take_again(store, tid, d, by=by)
    elif first.type == "user.message":
        await edits.tell(store, tid, str(d["text"]), by=by)
    elif first.type == "task.cancel_requested" or d.get("stop_reason") == "cancelled_by_user":
        await tasks.cancel(store, tid, by=by)
    elif first.type == "task.status" and d.get("dst") == "abandoned":
        # The event says who and why in one reason ("abandoned by ana: why").
        said = _ABANDONED.fullmatch(str(d.get("reason", "")))
        who, why = said.groups() if said else (by, str(d.get("reason", "")))
        await decisions.abandon_task(store, tid, reason=why, by=who)
    else:
        return await _apply_watch(store, tid, group)
    return True


async def _apply_watch(store: Store, task_id: str, group: Sequence[StoredEvent]) -> bool:
    """Write again what a watchdog or a forced takeover wrote beside the runs: the note
    of a takeover (`runtime.takeover`), the suspension of a wait nobody answered, a stall
    mark (`runtime.watch`); each only where the replayed task stands where the recorded
    one stood. False for anything else."""
    first = group[0]
    d = first.data
    if len(group) == 1 and first.type == "audit.warning" and d.get("code") == "lease_taken_over":
        await store.commit(task_id, None, [first.typed()])
        return True
    if not (len(group) == 1 and first.type == "task.status"):
        return False
    task = await store.get_task(task_id)
    if task.status != d.get("src") or task.lease_owner is not None:
        return False
    reason = str(d.get("reason", ""))
    keep = lifecycle.KEEP
    if d.get("dst") == "suspended" and reason.startswith("no answer"):
        waiting = {**(task.waiting or {}), "escalated_at": first.at}
        _, patch = lifecycle.transition(task, "suspended", reason, waiting=waiting)
    elif _swept(first):
        _, patch = lifecycle.transition(task, "stalled", reason, waiting=keep, wake_at=keep)
    else:
        return False
    # The recorded event as it is; the row changes as the watchdog's did.
    await store.commit(task_id, None, [first.typed()], task=TaskPatch(**patch))
    return True


def _models(rec: _Recording, cursor: _Cursor) -> ModelSet:
    names: dict[str, str] = {}
    for e in cursor.answers:
        names.setdefault(str(e.data.get("purpose")), str(e.data.get("model", "replay")))
    act = _ReplayModel(cursor, names.get("act", "replay"))

    def model(purpose: str) -> _ReplayModel:
        return _ReplayModel(cursor, names.get(purpose, act.name))

    # Whether the run had an LLM judge or a reviewer is not stored (a caller may pass
    # fewer models than the contract names): the recorded calls say it.
    judge = model("judge") if "judge" in names else None
    review = model("review") if "review" in names else None
    return ModelSet(actor=act, judge=judge, compact=model("compact"), review=review)


def _registry(rec: _Recording, declared: ToolRegistry) -> ToolRegistry:
    effects = {
        str(e.data["op_id"]): str(e.data.get("effect", "read"))
        for e in rec.events
        if e.type == "op.intended"
    }
    out = ToolRegistry()
    for name in declared.names():
        tool = declared.get(name)
        if tool is not None:
            out.add(_stand_in(tool, rec, effects))
    return out


async def replay_task(
    source: Store,
    task_id: str,
    *,
    until: int | None = None,
    registry: ToolRegistry | None = None,
) -> ReplayResult:
    """Replay `task_id` from `source` (up to event `until`, default all) and compare.

    `registry` declares the tools the task used (default: the built-in ones); only their
    declarations are used. Nothing is written to `source`, and no tool runs.
    `UserError` for a task or `until` that cannot be replayed."""
    rec = await _load(source, task_id, until)
    clock = _ReplayClock(rec.events[0].at)
    store = MemoryStore(clock=clock)
    cursor = _Cursor(rec, rec.events[-1].seq, asyncio.Event())
    cursor.clock = clock
    rec.cursor = cursor
    declared = registry or default_registry(lambda: store)
    rec.scratch = _scratch(rec)
    try:
        result = await _run(rec, store, clock, cursor, declared)
    finally:
        if rec.scratch is not None:
            shutil.rmtree(rec.scratch.parent, ignore_errors=True)
    await _check_contract(source, task_id, result)
    return result


async def _check_contract(source: Store, task_id: str, result: ReplayResult) -> None:
    """`UserError` for a divergence the replay's contract may have caused: the task only
    holds its latest contract, so the rounds before a goal edit ran under one replay
    does not have. A divergence there says nothing about the runtime."""
    d = result.divergence
    edited = await source.read_events(task_id, types={"task.edited"})
    if d is None or not edited or (d.seq is not None and d.seq > edited[0].seq):
        return
    first = edited[0]
    raise errors.UserError(
        f"task {task_id} cannot be replayed before its goal edit at event {first.seq} "
        f"(version {first.data.get('old_version')} to {first.data.get('new_version')}): "
        "only the edited contract is stored, and under it the earlier rounds decide "
        f"otherwise ({d.what}); the edit itself is not replayed"
    )


def _crashed(events: Sequence[StoredEvent], run: _Step, steps: Sequence[_Step]) -> bool:
    """Did the recorded run die (its worker killed while it ran): it left the task
    `running`, and the recording goes on after it?"""
    if run is steps[-1]:
        return False  # still running now, or cut by `--until`: nothing died
    token = run.events[0].fencing_token
    if any(s.kind == "more" and s.events[0].fencing_token == token for s in steps):
        return False  # it went on after a human came in while it ran
    status = None
    for e in events:
        if e.seq > run.events[-1].seq:
            break
        if e.type == "task.status":
            status = e.data.get("dst")
    return status == "running"


async def _drive(
    engine: Engine,
    store: Store,
    rec: _Recording,
    clock: _ReplayClock,
    run: _Step,
    cursor: _Cursor,
    crashed: bool,
) -> None:
    """Run the task once for one recorded run (a claim of it), at the recorded time of
    that claim; from the worker it was taken over from, when the recording names one.
    A run that `crashed` is killed where the recorded one died: at the model call
    after its last recorded answer (nothing of that round was committed)."""
    clock.at = max(clock.at, run.events[0].at)
    started = next((e for e in run.events if e.type == "recovery.started"), None)
    owner = started.data.get("previous_owner") if started is not None else None
    if owner:
        # The recorded run took a lease over (`resume --force`, a worker after a stall):
        # the replay's task is held by that owner first, so the takeover is the same.
        task = await store.get_task(rec.task.task_id)
        if task.lease_owner is None:
            await store.claim(str(owner), 60.0, task_id=rec.task.task_id, force=True)
    driver = asyncio.create_task(engine.run(rec.task.task_id, force=True))
    cursor.crash = driver if crashed else None
    try:
        await driver
    except asyncio.CancelledError:
        me = asyncio.current_task()
        if not crashed or (me is not None and me.cancelling()):
            raise  # the replay itself was cancelled, not the run it kills
    finally:
        cursor.crash = None


async def _run(
    rec: _Recording,
    store: MemoryStore,
    clock: _ReplayClock,
    cursor: _Cursor,
    declared: ToolRegistry,
) -> ReplayResult:
    task_id, stop = rec.task.task_id, cursor.stop
    await store.create_task(
        task_id=task_id,
        name=rec.task.name,
        spec=rec.task.spec,
        ledger=ledger_from_spec(parse_spec(rec.task.spec, source=f"task {task_id}", stored=True)),
        workspace=str(rec.scratch) if rec.scratch is not None else rec.task.workspace,
        events=[rec.events[0].typed()],
    )
    engine = Engine(
        store,
        _models(rec, cursor),
        registry=_registry(rec, declared),
        clock=clock,
        worker_id="replay",
        stop=stop,
        status_probe=False,
    )
    recorded, human = rec.events, None
    steps = _steps(rec.events)
    for n, step in enumerate(steps):
        if step.kind == "more":
            continue  # the run it belongs to was driven through already
        if step.kind == "run":
            # The model answers up to the next out-of-band commit: asked for more (the
            # recorded run met it while a round ran), the replay stops.
            later = next((s for s in steps[n + 1 :] if s.kind == "out"), None)
            cursor.until = later.events[0].seq - 1 if later else rec.events[-1].seq
            crashed = _crashed(rec.events, step, steps)
            if crashed:
                cursor.until = step.events[-1].seq
            await _drive(engine, store, rec, clock, step, cursor, crashed)
            if stop.is_set():
                if later is not None:
                    # The moment it came in, within a round, cannot be reproduced.
                    human = later.events[0]
                    recorded = [e for e in rec.events if e.seq < human.seq]
                break
            continue
        group = step.events
        clock.at = max(clock.at, group[0].at)
        try:
            applied = await _apply_human(store, rec, group)
        except errors.UserError:
            applied = False  # the replayed task is not where the human found it
        if not applied:
            human, recorded = group[0], [e for e in rec.events if e.seq < group[0].seq]
            break
    return _result(rec, cursor, recorded, await store.read_events(task_id), human)


def _result(
    rec: _Recording,
    cursor: _Cursor,
    recorded_events: list[StoredEvent],
    replayed_events: list[StoredEvent],
    human: StoredEvent | None,
) -> ReplayResult:
    """Compare the two logs and sum up."""
    replayed, recorded = _decisions(replayed_events), _decisions(recorded_events)
    if cursor.stop.is_set():
        # The replay's own stop (at `--until` or an action it cannot take) ended the
        # last run: what it wrote after the recorded span is not a decision to compare.
        replayed = replayed[: len(recorded)]
    divergence, matched = compare(rec, recorded, replayed)
    m = cursor.mismatch
    if m is not None and (divergence is None or (m.seq or 1 << 62) < (divergence.seq or 1 << 62)):
        # The model call asked out of turn came first.
        divergence = m
    # A round matched when every event of it did: the diverging round does not count.
    bad = divergence.round if divergence is not None else None
    rounds = sum(
        1 for e in recorded[:matched] if e.type == "round.committed" and e.data.get("round") != bad
    )
    stopped = (
        f"event {human.seq}: {human.type} ({_actor(human)} replay cannot take)" if human else None
    )
    end = recorded_events[-1].seq if recorded_events else 0
    return ReplayResult(rec.task.task_id, end, rounds, matched, divergence, stopped)
