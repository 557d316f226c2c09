"""What a tool call comes to: its final `OpOutcome`, and the values the parts of `ops`
return to the runner instead of calling one another.

An attempt ends as one of `Settled` (the call's outcome), `Retry` (a transient failure,
the next attempt stored), `InDoubt` (nobody can tell whether it took effect),
`Exhausted` (its retries ran out and its policy asks a human or compensates) or
`AsksApproval` (the tool itself wants a human's approval); anything that must pause
the round returns `Wait`. The runner dispatches on these (`runner.OpRunner`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tether import artifacts as A
from tether import events as ev
from tether.models.base import ToolCall, direct_init
from tether.runtime.ops.journal import evolve, hash_args
from tether.runtime.run.outcome import Outcome
from tether.store.base import ArtifactRecord, OpRecord
from tether.tools import failures
from tether.tools.registry import Tool


@dataclass
class OpOutcome:
    """One tool call's final outcome in a round."""

    call: ToolCall
    op_id: str
    tool: str
    effect: str
    status: str  # succeeded | failed
    content: str
    summary: str
    error: str | None = None
    error_class: str | None = None
    artifact: ArtifactRecord | None = None
    record: OpRecord | None = None
    duration_ms: float = 0.0
    args_hash: str = ""
    replayed: bool = False
    #: Set when an open breaker held the call back: the service's next chance.
    retry_at: float | None = None
    #: Its retries ran out and its policy says `compensate` (see `compensation`).
    compensate: bool = False
    #: Set once the item's applied ops were compensated: why the item is blocked.
    blocks: str | None = None
    #: Asking again is waiting (`waits`): a success of a read whose answer can change by
    #: itself (`Tool.volatile`), or its "not now" (`errors.RetryLater`) once its retries
    #: ran out.
    volatile: bool = False
    #: A read of a tool whose answers can change by themselves (`shifts`), whatever
    #: this call's outcome: once the item's own work started (a job, a build), the same
    #: failure of it again ("job 7 not ready") is waiting on that work, as a workspace
    #: read's is (`progress.moves`, `phases.track_failures`).
    shifting: bool = False

    def result_events(self) -> list[ev.Event]:
        """The journal entries of this outcome: its result, and its artifact if any."""
        out: list[ev.Event] = [
            ev.OpResult(
                op_id=self.op_id,
                tool=self.tool,
                status=self.status,
                summary=self.summary[:120],
                artifact_id=self.artifact.artifact_id if self.artifact else None,
                error_class=self.error_class,
                error=self.error,
                attempt=max(1, self.record.attempts) if self.record is not None else 1,
                duration_ms=self.duration_ms,
            )
        ]
        if self.artifact is not None:
            out.append(A.stored_event(self.artifact, source=self.op_id))
        return out


# --- what a part of ops returns to the runner ---------------------------------------------


@dataclass(frozen=True)
class Wait:
    """The round must pause with this outcome (the runner raises `Pause`)."""

    outcome: Outcome


@direct_init
@dataclass(frozen=True)
class Settled:
    """The call ended: succeeded or failed, its outcome final for the round."""

    outcome: OpOutcome


@dataclass(frozen=True)
class Retry:
    """A transient failure: the next attempt is stored in `record` (`retry_wait`)."""

    record: OpRecord


@dataclass(frozen=True)
class InDoubt:
    """A lost response that reconcile could not settle, of a tool that cannot be sent
    again safely: a human decides (unless one already did, then it is retried)."""

    record: OpRecord
    failure: failures.Classified
    ms: float


@dataclass(frozen=True)
class Exhausted:
    """The call's retries ran out and its policy says what next: `ask_human` or
    `compensate`. `outcome` is the call's failure; `record` the op as it was sent."""

    outcome: OpOutcome
    record: OpRecord
    policy: Literal["ask_human", "compensate"]


@dataclass(frozen=True)
class AsksApproval:
    """The tool raised `ApprovalRequired` (not an attempt): a human decides."""

    record: OpRecord
    why: str


Step = Settled | Retry | InDoubt | Exhausted | AsksApproval | Wait


# --- outcomes built from records ------------------------------------------------------------

#: The key of an op's `error` saying its tool answered "not now" (`errors.RetryLater`)
#: until its retries ran out: kept with the op, so a replay judges it the same.
_LATER = "later"


def said_later(record: OpRecord) -> OpRecord:
    """`record` (a failure) marked as the tool's "not now" (see `waits`)."""
    return evolve(record, error={**(record.error or {}), _LATER: True})


def is_later(record: OpRecord | None) -> bool:
    """Whether `record` failed with its tool's or service's "not now" (`said_later`)."""
    return record is not None and bool((record.error or {}).get(_LATER))


def waits(tool: Tool | None, record: OpRecord) -> bool:
    """Whether asking `tool` again after this op is waiting (`OpOutcome.volatile`): its
    read succeeded and its answer can change by itself, or it said "not now"
    (`said_later`: a volatile tool's failure that outlasted its retries, or any tool's
    `RetryLater`, or a service's refusal with `Retry-After`)."""
    if tool is None:
        return False
    if is_later(record):
        return True
    return bool(tool.volatile) and record.status == "succeeded"


def shifts(tool: Tool | None) -> bool:
    """Whether `tool` is a read whose answers can change by themselves
    (`OpOutcome.shifting`)."""
    return tool is not None and bool(tool.volatile) and tool.effect == "read"


def replay(call: ToolCall, prior: OpRecord) -> OpOutcome:
    """An op that finished before a crash: never sent again, its result reused."""
    res = prior.result or {}
    err = prior.error or {}
    return OpOutcome(
        call,
        prior.op_id,
        prior.tool,
        prior.effect,
        prior.status,
        str(
            res.get("content")
            or (f"ERROR ({err.get('class')}): {err.get('message')}" if err else "")
        ),
        str(res.get("summary") or err.get("message") or ""),
        err.get("message"),
        err.get("class"),
        record=prior,
        args_hash=prior.args_hash,
        replayed=True,
    )


def refused(
    call: ToolCall,
    op: tuple[str, str, int, int],
    tool: str,
    msg: str,
    cls: str,
    task_version: int,
) -> OpOutcome:
    """A call that never ran (not permitted, malformed, bad arguments, rejected);
    `op` is its (op id, task id, round, call index)."""
    op_id, task_id, round_no, idx = op
    args = dict(call.arguments or {"_raw": call.raw_arguments[:2000]})
    rec = OpRecord(
        op_id=op_id,
        task_id=task_id,
        round=round_no,
        call_index=idx,
        tool=tool,
        args=args,
        args_hash=hash_args(args),
        effect="read",
        status="failed",
        error={"class": cls, "message": msg},
        task_version=task_version,
    )
    return OpOutcome(
        call,
        op_id,
        tool,
        "read",
        "failed",
        f"ERROR: {msg}",
        msg[:200],
        msg,
        cls,
        record=rec,
        args_hash=rec.args_hash,
    )


def failure(
    call: ToolCall, tool: Tool, record: OpRecord, cls: str, msg: str, ms: float
) -> OpOutcome:
    """A call that ran (or tried to) and failed."""
    rec = evolve(
        record, status="failed", error={"class": cls, "message": msg}, next_attempt_at=None
    )
    return OpOutcome(
        call,
        record.op_id,
        tool.name,
        tool.effect,
        "failed",
        f"ERROR ({cls}): {msg}",
        msg[:200],
        msg,
        cls,
        record=rec,
        duration_ms=ms,
        args_hash=record.args_hash,
        shifting=shifts(tool),
    )
