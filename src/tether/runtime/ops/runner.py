"""Acting: every tool call of a round, through permissions, the op journal and retries.

Each call passes the allowlist and its argument schema, then the approval policy (risky
effects wait for a human unless the contract relaxes it), then the service's shared
breaker and concurrency limit. A call with effects is journaled as an op intent (its
`op_id` is the idempotency key) and committed before dispatch. Failures are handled by
class: transient ones are retried on a stored schedule, unknown outcomes are reconciled
(or retried with the same key when the tool is idempotent, or left to a human), and
deterministic and validation failures go back to the model.

Op states: `intended → dispatched → succeeded | failed | unknown`, plus `retry_wait`
(a transient failure with its next attempt time) and `awaiting_approval`. The round's
write-back commits the final state together with `op.committed`.

When a call's retries are exhausted its policy's `on_exhausted` decides: `fail_item`
(the failure goes back to the model), `ask_human` (a request `<op>.exhausted`: try
again with a new schedule, record it done, or fail it) or `compensate`, a saga's
rollback: the item cannot finish, so the ops it applied are undone and it is blocked.
The ops compensated are the focus item's succeeded ops, of tools that declare
`compensate`, from the rounds of its current stretch of work (back to the last round
whose focus was another item; with no items, the failed call's round only) and not
compensated before: newest first (round, then call, descending). The plan is journaled
with the failed call (`op.exhausted`), before any compensation runs; each compensation
is an op of its own, `<op>.compensate`, run like any other (intent committed first,
reconciled after a crash, in doubt → a human), and committed together with the mark on
the op it undid (`op.compensated`), so a restart resumes the plan without repeating a
finished step. A compensation that fails after its retries asks a human
(`<op>.compensate.failed`: try again, done by hand, or leave it) and never loops. The
calls of the round after the failed one are not sent.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from tether import errors, failpoints, telemetry
from tether import events as ev
from tether.models.base import ModelResponse, ToolCall
from tether.runtime import hints
from tether.runtime.run import outcome as out
from tether.runtime.run.outcome import Outcome, Stop
from tether.store.base import ApprovalRecord, ArtifactRecord, OpRecord, blob_hash
from tether.tools import failures, files
from tether.tools.builtin.files import READ_ARTIFACT, as_sent
from tether.tools.registry import (
    RISKY,
    Reconciliation,
    Tool,
    ToolContext,
    ensure_lease,
    render_result,
)
from tether.tools.retry import RetryPolicy, decide

if TYPE_CHECKING:
    from tether.runtime.run.ports import OpsHost

#: Backoffs up to this long are waited out in the worker; longer ones park the task as
#: `waiting` until the stored time, releasing the lease.
INLINE_WAIT_MAX = 30.0


class Pause(Stop):
    """The round cannot go on now (approval, long backoff, op in doubt): its finished
    calls are saved before the outcome is applied."""


class Admission(Protocol):
    """What a service guard answers."""

    @property
    def allowed(self) -> bool:
        """May the call go now?"""
        ...

    @property
    def retry_at(self) -> float | None:
        """When to try again, if refused."""
        ...

    @property
    def reason(self) -> str:
        """Why."""
        ...


class Guard(Protocol):
    """Shared breakers and concurrency limits (see `tether.tools.breaker`)."""

    async def admit(self, service: str, holder: str) -> Admission:
        """May a call to `service` go now?"""
        ...

    async def release(self, service: str, holder: str) -> None:
        """Give the concurrency slot back."""
        ...

    async def record(self, service: str, ok: bool, holder: str) -> list[Any]:
        """Count an outcome; returns breaker transitions."""
        ...


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
    #: Its retries ran out and its policy says `compensate` (see `OpRunner.compensate`).
    compensate: bool = False
    #: Set once the item's applied ops were compensated: why the item is blocked.
    blocks: str | None = None

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
            out.append(
                ev.ArtifactStored(
                    artifact_id=self.artifact.artifact_id,
                    kind=self.artifact.kind,
                    name=self.artifact.name,
                    blob=self.artifact.blob_hash,
                    size=self.artifact.size,
                    source=self.op_id,
                )
            )
        return out


def _intent(tool: Tool, record: OpRecord) -> ev.OpIntended:
    """The journal entry written (and committed) before an op is sent."""
    return ev.OpIntended(
        op_id=record.op_id,
        tool=tool.name,
        args=record.args,
        round=record.round,
        call_index=record.call_index,
        effect=tool.effect,
    )


def doubt_id(record: OpRecord) -> str:
    """The request a human answers about an op in doubt, one per attempt: approving a
    resend permits that one send; if its outcome is lost too, a human is asked again."""
    base = f"{record.op_id}.in_doubt"
    return base if record.attempts <= 1 else f"{base}.{record.attempts}"


def _closed_msg(appr: ApprovalRecord) -> str:
    """What the model is told of a call whose request was closed before a decision."""
    reason = (appr.decision or {}).get("reason") or "closed"
    return f"not sent: its approval request {appr.request_id} was closed ({reason})"


def compensation_of(record: OpRecord) -> str | None:
    """How an applied op was undone, if it was: `compensated` (by its compensation op),
    `done_by_hand` or `left` (a human's decision). Such an op is history only: it proves
    nothing for an item."""
    mark = (record.result or {}).get("compensation")
    return str(mark) if mark else None


def history_only(record: OpRecord) -> bool:
    """True when an op's result proves nothing now: superseded by a newer goal, or
    compensated."""
    return superseded_by(record) is not None or compensation_of(record) is not None


def compensation_id(op_id: str) -> str:
    """The op id (and idempotency key) of the compensation of an op."""
    return f"{op_id}.compensate"


def _plan(record: OpRecord) -> dict[str, Any] | None:
    """The compensation plan journaled with a failed call, if it has one."""
    plan = (record.error or {}).get("compensation")
    return dict(plan) if isinstance(plan, Mapping) else None


def superseded_by(record: OpRecord) -> int | None:
    """The task version under which a late result of this op arrived, if it did: the
    op was decided under an older version, so its result is history only and proves
    nothing for the current contract (judges skip it)."""
    late = (record.result or {}).get("superseded_by")
    return int(late) if isinstance(late, int) else None


#: Op states in which a call of an older task version is known not to be in flight: it
#: is not sent any more (the model decides again under the new contract).
_NOT_IN_FLIGHT = frozenset({"awaiting_approval", "retry_wait"})
#: Contract fields whose edit raises the version without changing the goal: results of
#: the version before stay current.
_NOT_THE_GOAL = frozenset({"limits", "budget", "notify", "services", "context", "models"})


def op_id_for(task_id: str, round_no: int, call_index: int) -> str:
    """Deterministic op id: the idempotency key of one tool call."""
    return f"{task_id}.r{round_no}.c{call_index}"


def _hash_args(args: Mapping[str, Any]) -> str:
    return blob_hash(json.dumps(args, sort_keys=True, default=str).encode())


@dataclass(frozen=True)
class _Asks:
    """A tool's `ApprovalRequired`: why it wants a human's approval."""

    why: str


class OpRunner:
    """Runs the tool calls of one round for a `OpsHost`."""

    def __init__(self, run: OpsHost) -> None:
        self.run = run
        self.store = run.store
        self.clock = run.clock
        self.rng = random.Random()
        self.pending_events: list[ev.Event] = []
        #: Op ids whose intent was committed with the round's decision (see `plan`).
        self.journaled: set[str] = set()
        #: Op ids a human approved (the tool sees `ctx.approved`).
        self.approved: set[str] = set()
        #: Ops decided under a version below this one are of an older goal (see `act`).
        self.goal_version = 0
        #: Set once a call of the round was compensated: the rest are not sent.
        self.halted: str | None = None

    # ------------------------------------------------------------------ entry

    async def plan(self, round_no: int, response: ModelResponse) -> list[tuple[Tool, OpRecord]]:
        """The op intents of the round: every call with effects that passes the allowlist
        and its argument schema and needs no approval. They are committed together with
        the model's decision, before anything is sent, so a round with effects costs one
        commit up front. (A call that needs a human's approval is journaled with its
        request, when the round reaches it.)"""
        run = self.run
        allowed = {t.name: t for t in run.tools}
        intents: list[tuple[Tool, OpRecord]] = []
        for idx, call in enumerate(response.tool_calls):
            tool = allowed.get(call.name)
            if tool is None or tool.effect == "read" or call.arguments is None or call.error:
                continue
            try:
                args = tool.check_args(call.arguments)
            except errors.ToolFailed:
                continue
            record = self.intended(tool, round_no, idx, args)
            if await self.needs_approval(tool, record):
                continue
            intents.append((tool, record))
        self.journaled = {r.op_id for _, r in intents}
        return intents

    def intended(self, tool: Tool, round_no: int, idx: int, args: Mapping[str, Any]) -> OpRecord:
        """A new op record for one call, before anything is sent."""
        run = self.run
        return OpRecord(
            op_id=op_id_for(run.task_id, round_no, idx),
            task_id=run.task_id,
            round=round_no,
            call_index=idx,
            tool=tool.name,
            args=dict(args),
            args_hash=_hash_args(args),
            effect=tool.effect,
            status="intended",
            task_version=run.task.version,
        )

    @staticmethod
    def intent_events(intents: list[tuple[Tool, OpRecord]]) -> list[ev.Event]:
        """The journal entries of planned intents."""
        return [_intent(tool, record) for tool, record in intents]

    async def act(
        self, round_no: int, response: ModelResponse, *, resumed: bool = True
    ) -> list[OpOutcome]:
        """Phases 4 and 5 for every tool call of the round (`resumed`: the round was
        interrupted before, so some of its ops may already be journaled)."""
        run = self.run
        outcomes: list[OpOutcome] = []
        allowed = {t.name: t for t in run.tools}
        existing = (
            {o.op_id: o for o in await self.store.get_ops(run.task_id, round=round_no)}
            if resumed
            else {}
        )
        if any(o.task_version < run.task.version for o in existing.values()):
            self.goal_version = await self._goal_version()
        for idx, call in enumerate(response.tool_calls):
            op_id = op_id_for(run.task_id, round_no, idx)
            prior = existing.get(op_id)
            if prior is not None and prior.status in ("succeeded", "failed"):
                done = self.replay(call, prior)
                if _plan(prior) is not None:
                    # A compensation a crash or a human's decision interrupted: resume it.
                    done = await self._compensating(done, outcomes, round_no)
                outcomes.append(done)
                continue
            if self.halted is not None:
                msg = f"not sent: {self.halted}"
                outcomes.append(
                    self.refused(call, op_id, round_no, idx, call.name, msg, "not_sent")
                )
                continue
            tool = allowed.get(call.name)
            if tool is None:
                known = call.name in run.known_tools
                msg = (
                    f"not permitted: the tool {call.name!r} is not allowed for this task"
                    if known
                    else f"not permitted: there is no tool named {call.name!r}"
                )
                msg += f"; allowed tools: {', '.join(sorted(allowed))}"
                outcomes.append(
                    self.refused(call, op_id, round_no, idx, call.name, msg, "not_permitted")
                )
                continue
            if call.arguments is None or call.error:
                msg = f"malformed call to {call.name}: {call.error or 'arguments missing'}"
                run.state.malformed_calls += 1
                outcomes.append(
                    self.refused(call, op_id, round_no, idx, tool.name, msg, "malformed")
                )
                continue
            try:
                args = tool.check_args(call.arguments)
            except errors.ToolFailed as exc:
                run.state.malformed_calls += 1
                outcomes.append(
                    self.refused(call, op_id, round_no, idx, tool.name, str(exc), "deterministic")
                )
                continue
            record = prior or self.intended(tool, round_no, idx, args)
            if prior is not None and self._unsent_and_stale(tool, prior):
                outcomes.append(await self.supersede(call, tool, prior))
                continue
            approved = await self.approval(tool, call, record)
            if isinstance(approved, OpOutcome):
                outcomes.append(approved)
                continue
            if approved is not None and approved != record.args:
                try:
                    args = tool.check_args(approved)
                except errors.ToolFailed as exc:
                    outcomes.append(
                        self.refused(
                            call, op_id, round_no, idx, tool.name, str(exc), "deterministic"
                        )
                    )
                    continue
                record = replace(record, args=args, args_hash=_hash_args(args))
            await self._leave_approval(prior, record)
            try:
                done = await self.execute(tool, call, record, fresh=prior is None)
            except Pause:
                await self.save_finished(outcomes)
                raise
            if done.compensate:
                done = await self._compensating(done, outcomes, round_no)
            outcomes.append(done)
        return outcomes

    async def _compensating(
        self, failed: OpOutcome, outcomes: list[OpOutcome], round_no: int
    ) -> OpOutcome:
        """`compensate`, with the round's finished calls saved before a pause."""
        try:
            return await self.compensate(failed, outcomes, round_no)
        except Pause:
            await self.save_finished(outcomes)
            raise

    async def _leave_approval(self, prior: OpRecord | None, record: OpRecord) -> None:
        """An approved call is about to be sent: store it as `intended`, so that a crash
        after the send is recovered like any call in flight (reconciled, or sent again
        under its key), not sent blind as a call that never left."""
        if (
            prior is not None
            and prior.status == "awaiting_approval"
            and record.op_id in self.approved
        ):
            await self.run.commit([], ops=[replace(record, status="intended")])

    async def save_finished(self, outcomes: list[OpOutcome]) -> None:
        """Before pausing a round, make its finished calls durable so that resuming
        replays them instead of sending them again."""
        new = [o for o in outcomes if not o.replayed and o.record is not None]
        if not new:
            return
        events: list[ev.Event] = []
        for o in new:
            events.extend(o.result_events())
            o.replayed = True
        await self.run.commit(
            events + self.pending_events,
            ops=[o.record for o in new if o.record is not None],
            artifacts=[o.artifact for o in new if o.artifact is not None],
        )
        self.pending_events = []

    async def _goal_version(self) -> int:
        """The version made by the latest edit that changed the goal (the objective,
        items, constraints, tools...: not only limits or budgets)."""
        edits = await self.store.read_events(self.run.task_id, types={"task.edited"})
        changed = [
            int(e.data.get("new_version", 0))
            for e in edits
            if set(e.data.get("changes") or {}) - _NOT_THE_GOAL
        ]
        return max(changed, default=0)

    def _unsent_and_stale(self, tool: Tool, record: OpRecord) -> bool:
        """A call decided for an older goal that was never sent (waiting for an
        approval or a retry time, or intended with no `dispatched` mark)."""
        if record.task_version >= self.goal_version:
            return False
        if record.status in _NOT_IN_FLIGHT:
            return True
        marks_dispatch = tool.effect != "read" and not tool.idempotent and tool.reconcile is None
        return record.status == "intended" and marks_dispatch

    async def supersede(self, call: ToolCall, tool: Tool, record: OpRecord) -> OpOutcome:
        """Drop a call the contract changed under: it is not sent, its pending approval
        request is closed, and the model is told to decide again."""
        version = self.run.task.version
        msg = (
            f"not sent: the task's goal changed (version {version}) after this call was "
            f"decided under version {record.task_version}; decide again under the new "
            "contract"
        )
        asked = [
            a
            for a in await self.store.get_approvals(self.run.task_id, statuses={"pending"})
            if a.op_id == record.op_id
        ]
        for appr in asked:
            closed = replace(
                appr,
                status="rejected",
                decision={"decision": "superseded", "reason": msg},
                decided_by="tether",
                decided_at=self.clock.now(),
            )
            await self.run.commit(
                [
                    ev.ApprovalDecided(
                        request_id=appr.request_id, decision="superseded", by="tether"
                    )
                ],
                approvals=[closed],
            )
        return self.failure(call, tool, record, "superseded", msg, 0.0)

    def _late(self, record: OpRecord, result: dict[str, Any]) -> dict[str, Any]:
        """A result that arrives for an op decided for an older goal is marked so."""
        if record.task_version < self.goal_version:
            return {**result, "superseded_by": self.run.task.version}
        return result

    # ------------------------------------------------------------------ outcomes

    def replay(self, call: ToolCall, prior: OpRecord) -> OpOutcome:
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
        self, call: ToolCall, op_id: str, round_no: int, idx: int, tool: str, msg: str, cls: str
    ) -> OpOutcome:
        """A call that never ran (not permitted, malformed, bad arguments, rejected)."""
        args = dict(call.arguments or {"_raw": call.raw_arguments[:2000]})
        rec = OpRecord(
            op_id=op_id,
            task_id=self.run.task_id,
            round=round_no,
            call_index=idx,
            tool=tool,
            args=args,
            args_hash=_hash_args(args),
            effect="read",
            status="failed",
            error={"class": cls, "message": msg},
            task_version=self.run.task.version,
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
        self, call: ToolCall, tool: Tool, record: OpRecord, cls: str, msg: str, ms: float
    ) -> OpOutcome:
        """A call that ran (or tried to) and failed."""
        rec = replace(
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
        )

    async def success(
        self, call: ToolCall, tool: Tool, record: OpRecord, raw: Any, ms: float
    ) -> OpOutcome:
        """A call that succeeded; a large output becomes an artifact with a preview."""
        run = self.run
        text = render_result(raw)
        limit = run.spec.context.preview_chars
        artifact = None
        content = text
        # read_artifact returns a slice the model asked for; previewing it again would
        # send the model round in circles.
        if len(text) > limit and tool.name != READ_ARTIFACT:
            ref = self.run.stage_blob(text.encode("utf-8"))
            artifact = ArtifactRecord(
                artifact_id=f"{record.op_id}.out",
                task_id=run.task_id,
                kind="tool_output",
                name=f"{tool.name} output",
                blob_hash=ref,
                size=len(text),
                source=record.op_id,
                task_version=run.task.version,
                deps=(f"op:{record.op_id}",),
            )
            content = (
                f"{text[:limit]}\n[... {len(text) - limit} more characters. The full output is "
                f"artifact {artifact.artifact_id}; call read_artifact(artifact_id="
                f'"{artifact.artifact_id}", offset={limit}) to read on.]'
            )
        result = {
            "summary": text[:200],
            "content": content,
            "artifact_id": artifact.artifact_id if artifact else None,
        }
        rec = replace(
            record,
            status="succeeded",
            result=self._late(record, result),
            error=None,
            next_attempt_at=None,
        )
        return OpOutcome(
            call,
            record.op_id,
            tool.name,
            tool.effect,
            "succeeded",
            content,
            text[:200],
            artifact=artifact,
            record=rec,
            duration_ms=ms,
            args_hash=record.args_hash,
        )

    # ------------------------------------------------------------------ approvals

    async def approval(
        self, tool: Tool, call: ToolCall, record: OpRecord
    ) -> Mapping[str, Any] | OpOutcome | None:
        """Approved args (maybe modified), a refusal outcome, or None when no approval
        is needed. Raises `Pause` while a decision is pending."""
        run = self.run
        if record.op_id in self.journaled:
            return None  # `plan` found it needs no approval, before it was journaled
        request_id = f"{record.op_id}.approval"
        if record.status == "awaiting_approval":
            # Asked before (for its effect, or by the tool itself): the decision stands.
            asked = await self.request(request_id)
            if asked is not None:
                return await self._approved(tool, call, record, asked)
        effect = await self._call_effect(tool, record)
        if not self._approval_needed(tool, effect):
            return None
        appr = await self.request(request_id)
        if appr is None:
            appr = self.new_request(
                request_id,
                record,
                kind="op",
                what=f"{tool.name}({json.dumps(record.args, ensure_ascii=False)[:300]})",
                impact=self._impact(tool, effect, record.args),
                options=["approve", "reject", "modify"],
                effect=effect,
            )
            await run.commit(
                [
                    _intent(tool, record).model_copy(update={"effect": effect}),
                    ev.ApprovalRequested(
                        request_id=request_id,
                        what=appr.request["what"],
                        impact=appr.request["impact"],
                        op_id=record.op_id,
                    ),
                ],
                ops=[replace(record, status="awaiting_approval", effect=effect)],
                approvals=[appr],
            )
        return await self._approved(tool, call, record, appr)

    async def _approved(
        self, tool: Tool, call: ToolCall, record: OpRecord, appr: ApprovalRecord
    ) -> Mapping[str, Any] | OpOutcome:
        """The approved arguments (the call runs with `ctx.approved`), or a refusal."""
        decided = await self._decided(tool, call, record, appr)
        if isinstance(decided, OpOutcome):
            return decided
        self.approved.add(record.op_id)
        return decided if decided is not None else dict(record.args)

    async def asked_approval(
        self, tool: Tool, call: ToolCall, record: OpRecord, why: str
    ) -> OpOutcome | None:
        """The tool raised `ApprovalRequired`: wait for a human (`Pause`), then None to
        run it again approved, or the refusal's outcome."""
        run = self.run
        request_id = f"{record.op_id}.approval"
        appr = await self.request(request_id)
        if appr is None:
            appr = self.new_request(
                request_id,
                record,
                kind="op",
                what=f"{tool.name}({json.dumps(record.args, ensure_ascii=False)[:300]})",
                impact=f"the tool asks: {why[:500]}",
                options=["approve", "reject"],
                effect=tool.effect,
            )
            await run.commit(
                [
                    ev.ApprovalRequested(
                        request_id=request_id,
                        what=appr.request["what"],
                        impact=appr.request["impact"],
                        op_id=record.op_id,
                        options=["approve", "reject"],
                    )
                ],
                ops=[replace(record, status="awaiting_approval")],
                approvals=[appr],
            )
        outcome = await self._decided(tool, call, record, appr)
        if outcome is None:
            self.approved.add(record.op_id)
        return outcome if isinstance(outcome, OpOutcome) else None

    async def _decided(
        self, tool: Tool, call: ToolCall, record: OpRecord, appr: ApprovalRecord
    ) -> Mapping[str, Any] | OpOutcome | None:
        """Wait while a request is pending (`Pause`); a rejection's outcome; else the
        approved (maybe modified) arguments, or None."""
        run = self.run
        if appr.status == "pending":
            raise Pause(
                out.waiting(
                    "approval",
                    f"approve or reject {appr.request['what']}: "
                    f"{hints.approve(run.task_id, appr.request_id)} or "
                    f"{hints.reject(run.task_id, appr.request_id)}",
                    why="approval required",
                    request_id=appr.request_id,
                )
            )
        if appr.status == "closed":
            return self.failure(call, tool, record, "not_sent", _closed_msg(appr), 0.0)
        if appr.status == "rejected":
            who = appr.decided_by or "a human"
            msg = f"not permitted: {who} rejected {tool.name} for this call"
            reason = (appr.decision or {}).get("reason")
            if reason:
                msg += f" ({reason})"
            return self.refused(
                call, record.op_id, record.round, record.call_index, tool.name, msg, "rejected"
            )
        modified = (appr.decision or {}).get("modified_args")
        return dict(modified) if isinstance(modified, Mapping) else None

    def _approval_needed(self, tool: Tool, effect: str) -> bool:
        perm = self.run.spec.permission(tool.name)
        if perm is not None and perm.approval is not None:
            return perm.approval
        return effect in RISKY

    async def needs_approval(self, tool: Tool, record: OpRecord) -> bool:
        """Whether this call waits for a human before it is sent."""
        return self._approval_needed(tool, await self._call_effect(tool, record))

    async def _call_effect(self, tool: Tool, record: OpRecord) -> str:
        """The effect of this call: the one already journaled for it when it was asked
        about (a decision made once stays made), else the tool's, refined per call."""
        if tool.effect_of is None:
            return tool.effect
        if record.status == "awaiting_approval" or record.effect != tool.effect:
            return record.effect
        store, task_id = self.store, self.run.task_id

        async def journal(
            tools: Collection[str], statuses: Collection[str] | None = None
        ) -> list[OpRecord]:
            # With the arguments actually sent (a human's `modify`), not as asked.
            ops = await store.get_ops(task_id, statuses, tools=tools)
            return as_sent(ops, await store.get_approvals(task_id, statuses={"approved"}))

        ctx = replace(self.context(tool, record, record.attempts), journal=journal)
        return await tool.call_effect(record.args, ctx)

    @staticmethod
    def _impact(tool: Tool, effect: str, args: Mapping[str, Any]) -> str:
        """What an approval request says the call would do."""
        path = args.get("path")
        if effect == "overwrite" and tool.effect_of is not None and isinstance(path, str):
            # Only a per-call refinement knows the thing was there before the task.
            return f"overwrites {path}, which existed before the task started"
        article = "an" if effect[:1] in "aeiou" else "a"
        return f"{article} {effect} action on {tool.service or 'an external system'}"

    async def request(self, request_id: str) -> ApprovalRecord | None:
        """The approval request with this id, if the task has one."""
        for appr in await self.store.get_approvals(self.run.task_id):
            if appr.request_id == request_id:
                return appr
        return None

    def new_request(
        self,
        request_id: str,
        record: OpRecord,
        *,
        kind: str,
        what: str,
        impact: str,
        options: list[str],
        **extra: Any,
    ) -> ApprovalRecord:
        """A pending request for a human decision about one op."""
        return ApprovalRecord(
            request_id=request_id,
            task_id=self.run.task_id,
            op_id=record.op_id,
            status="pending",
            request={
                "kind": kind,
                "tool": record.tool,
                "args": record.args,
                "what": what,
                "impact": impact,
                "options": options,
                **extra,
            },
            created_at=self.clock.now(),
        )

    async def _doubt_request(self, record: OpRecord) -> tuple[str, ApprovalRecord | None]:
        """The id of the request about this op in doubt, and the request if asked: a
        request closed with its task (which an edit re-opened since) is asked again
        under a new id, never taken as an answer."""
        base = rid = doubt_id(record)
        n = 1
        while True:
            appr = await self.request(rid)
            if appr is None or appr.status != "closed":
                return rid, appr
            n += 1
            rid = f"{base}.reopened{n}"

    async def in_doubt(self, tool: Tool, record: OpRecord, detail: str) -> None:
        """An op whose outcome nobody can tell: wait for a human, never guess."""
        run = self.run
        request_id, appr = await self._doubt_request(record)
        if appr is not None and appr.status != "pending":
            return
        first = appr is None
        if appr is None:
            args = json.dumps(record.args, ensure_ascii=False)[:200]
            appr = self.new_request(
                request_id,
                record,
                kind="op_in_doubt",
                what=f"did {tool.name}({args}) take effect? (outcome unknown after {detail})",
                impact="approve to send it again with the same idempotency key, "
                "approve --done if it did take effect, reject to record it as failed",
                options=["approve", "done", "reject"],
            )
        tid = run.task_id
        waiting = {
            "kind": "human",
            "request_id": request_id,
            "ops": [record.op_id],
            "reason": f"{appr.request['what']}; check it, then: tether approve {tid} "
            f"{request_id} (send again), tether approve {tid} {request_id} --done (it "
            f"happened) or tether reject {tid} {request_id} (record as failed)",
        }
        # Ask once: a resume while the request is pending only waits again.
        extra: list[ev.Event] = []
        if first:
            extra = [
                ev.AuditWarning(
                    code="op_in_doubt",
                    message=f"the outcome of {record.op_id} ({tool.name}) is unknown and the tool "
                    "can neither be reconciled nor safely retried; a human must decide",
                    details={"op_id": record.op_id, "detail": detail},
                ),
                ev.ApprovalRequested(
                    request_id=request_id,
                    what=appr.request["what"],
                    impact=appr.request["impact"],
                    op_id=record.op_id,
                    options=["approve", "done", "reject"],
                ),
            ]
        raise Pause(
            Outcome(
                "waiting",
                reason="op outcome unknown",
                waiting=waiting,
                events=tuple(extra),
                ops=(replace(record, status="unknown"),) if first else (),
                approvals=(appr,) if first else (),
            )
        )

    # ------------------------------------------------------------------ execution

    def context(self, tool: Tool, record: OpRecord, attempt: int) -> ToolContext:
        """The context a tool function receives."""
        import logging

        run = self.run
        # A compensation (`<tool>.compensate`) has the secrets its tool was granted.
        perm = run.spec.permission(tool.name.removesuffix(".compensate"))
        return ToolContext(
            op_id=record.op_id,
            task_id=run.task_id,
            task_version=run.task.version,
            fencing_token=run.token,
            workspace=run.workspace,
            logger=logging.getLogger(f"tether.tool.{tool.name}"),
            services=run.services,
            attempt=attempt,
            approved=record.op_id in self.approved,
            owner_check=functools.partial(ensure_lease, self.store, run.task_id, run.token),
            secret_names=frozenset(perm.secrets if perm is not None else ()),
            round=record.round,
            call_index=record.call_index,
            # A SQLite store kept inside the workspace: no file tool may reach it.
            private_files=files.database_files(getattr(self.store, "path", None)),
        )

    def policy(self, tool: Tool) -> RetryPolicy:
        """The tool's retry policy, with the contract's overrides (attempts, what to do
        once they are exhausted)."""
        perm = self.run.spec.permission(tool.name)
        policy = tool.retry
        if perm is not None and perm.max_attempts is not None:
            policy = replace(policy, max_attempts=perm.max_attempts)
        if perm is not None and perm.on_exhausted is not None:
            policy = replace(policy, on_exhausted=perm.on_exhausted)
        return policy

    async def reconcile(self, tool: Tool, record: OpRecord) -> Reconciliation:
        """Ask the outside world whether an op happened (journaled)."""
        if tool.reconcile is None:
            return Reconciliation("unknown")
        policy = self.policy(tool)
        attempt = 0
        while True:
            attempt += 1
            try:
                rec = await asyncio.wait_for(
                    tool.reconcile(record, self.context(tool, record, record.attempts)),
                    tool.timeout,
                )
                break
            except Exception as exc:  # a failing reconcile tells us nothing (yet)
                rec = Reconciliation("unknown", f"reconcile failed: {type(exc).__name__}: {exc}")
                cls = self._classify(tool, exc).cls
                # A passing fault of the service (a 503, a timeout) is asked again on the
                # tool's schedule before a human has to decide.
                step = decide(
                    policy, attempt, "transient" if cls == "unknown" else cls, rng=self.rng
                )
                if not step.retry or step.delay > self.run.inline_wait_max:
                    break
                await self.clock.sleep(step.delay)
        await self.run.commit(
            [ev.OpReconciled(op_id=record.op_id, outcome=rec.outcome, detail=str(rec.result)[:200])]
        )
        return rec

    async def execute(
        self, tool: Tool, call: ToolCall, record: OpRecord, *, fresh: bool
    ) -> OpOutcome:
        """Run one call to its end: success, failure, or a `Pause`.

        Each attempt: wait for a stored retry time, pass the service guard, send (with the
        `dispatched` mark when the tool needs it), then settle the outcome by class — a
        transient failure stores the next attempt's time and goes round again."""
        run = self.run
        effectful = tool.effect != "read"
        t0 = time.perf_counter()
        if not fresh:
            outcome = await self.recover(tool, call, record)
            if outcome is not None:
                return outcome
        elif effectful and record.op_id not in self.journaled:
            await run.commit([_intent(tool, record)], ops=[record])
            failpoints.hit("after_op_intent")
        while True:
            if record.status == "retry_wait" and record.next_attempt_at is not None:
                await self.wait_until(record, record.next_attempt_at)
            held = await self._admit(tool, call, record)
            if held is not None:
                return held
            record = replace(record, attempts=record.attempts + 1)
            raw, cls_msg, ms = await self._send(tool, record)
            if isinstance(raw, _Asks):
                refused = await self.asked_approval(tool, call, record, raw.why)
                if refused is not None:
                    return refused
                record = replace(record, attempts=record.attempts - 1)  # not an attempt
                continue
            if cls_msg is None:
                problem = self.validate(tool, raw)
                if problem is not None:
                    self.count_validation()
                    return self.failure(call, tool, record, "validation", problem, ms)
                return await self.success(call, tool, record, raw, ms)
            settled = await self._settle(tool, call, record, cls_msg, ms, t0)
            if isinstance(settled, OpOutcome):
                return settled
            record = settled

    def _holder(self, record: OpRecord, attempt: int) -> str:
        """Who holds a concurrency slot: one attempt of this op."""
        return f"{self.run.task_id}:{record.op_id}:{attempt}"

    def _breaker_events(self, transitions: Any) -> None:
        for t in transitions:
            self.pending_events.append(
                ev.BreakerChanged(service=t.service, src=t.src, dst=t.dst, reason=t.reason)
            )

    async def _admit(self, tool: Tool, call: ToolCall, record: OpRecord) -> OpOutcome | None:
        """The service guard's answer: None to go, or the outcome of a call held back."""
        guard: Guard | None = self.run.guard
        if guard is None or not tool.service:
            return None
        adm = await guard.admit(tool.service, self._holder(record, record.attempts + 1))
        self._breaker_events(getattr(adm, "transitions", ()))
        if adm.allowed:
            return None
        when = f" until {adm.retry_at:.0f}" if adm.retry_at else ""
        msg = f"service {tool.service} is unavailable{when}: {adm.reason}; work on something else"
        out = self.failure(call, tool, record, "transient", msg, 0.0)
        # Held back by the service's breaker (before any attempt, or after this call's
        # own failures opened it): the service is down, not the item's work; the round
        # waits for the breaker's next chance and costs the item nothing.
        out.retry_at = adm.retry_at
        return out

    async def _send(
        self, tool: Tool, record: OpRecord
    ) -> tuple[Any, failures.Classified | None, float]:
        """One attempt: (result, failure class or None, milliseconds). The guard's slot
        is given back and the outcome counted for the service's breaker."""
        run = self.run
        effectful = tool.effect != "read"
        # Only a non-idempotent tool that cannot reconcile needs the extra `dispatched`
        # mark: for the others a crash before or after sending is handled the same way.
        if effectful and not tool.idempotent and tool.reconcile is None:
            record = replace(record, status="dispatched")
            await run.commit(
                [ev.OpDispatched(op_id=record.op_id, attempt=record.attempts)], ops=[record]
            )
        guard: Guard | None = run.guard if tool.service else None
        holder = self._holder(record, record.attempts)
        t1 = time.perf_counter()
        raw: Any = None
        cls_msg: failures.Classified | None = None
        attrs = telemetry.tool_call_attributes(tool.name, record.op_id, run.task_id, record.round)
        try:
            with telemetry.span(f"execute_tool {tool.name}", attrs):
                raw = await asyncio.wait_for(
                    tool.fn(record.args, self.context(tool, record, record.attempts)),
                    tool.timeout,
                )
        except asyncio.CancelledError:
            if guard is not None and tool.service:
                # Give the slot back now; a leaked one would hold the limit for its ttl.
                await asyncio.shield(guard.release(tool.service, holder))
            raise
        except errors.ApprovalRequired as exc:
            if record.op_id in self.approved:
                # Asking twice for one call would loop: once approved, it is a failure.
                cls_msg = failures.Classified(
                    "deterministic", f"the tool asked for approval again: {exc}", None
                )
            else:
                raw = _Asks(str(exc) or "the tool asks for a human's approval")
        except errors.StaleLease:
            raise  # `ctx.ensure_owner()`: the task is another worker's now
        except Exception as exc:  # classified here; a tool's bug is the tool's failure
            cls_msg = self._classify(tool, exc)
        failpoints.hit("after_op_dispatch")
        ms = (time.perf_counter() - t1) * 1000
        if guard is not None and tool.service:
            # The service answered unless the failure is on the way to or from it.
            ok = cls_msg is None or cls_msg.cls in ("deterministic", "validation")
            finish = getattr(guard, "finish", None)
            if self._verdict_waits(tool, cls_msg):
                # A lost response the tool can reconcile: the breaker's verdict waits
                # for the reconcile (`_settle`), which may prove the call done.
                await guard.release(tool.service, holder)
                transitions: list[Any] = []
            elif finish is not None:
                transitions = await finish(tool.service, ok, holder)
            else:
                await guard.release(tool.service, holder)
                transitions = await guard.record(tool.service, ok, holder)
            self._breaker_events(transitions)
        return raw, cls_msg, ms

    def _verdict_waits(self, tool: Tool, cls_msg: failures.Classified | None) -> bool:
        """Whether a call's outcome is counted for its service's breaker only after a
        reconcile: a lost response that reconcile proves done is a success, not one of
        the failures that open the breaker for every task on the database."""
        return (
            self.run.guard is not None
            and bool(tool.service)
            and tool.reconcile is not None
            and cls_msg is not None
            and cls_msg.cls == "unknown"
        )

    async def _count(self, tool: Tool, record: OpRecord, *, ok: bool) -> None:
        """Give the service's breaker the verdict of a reconciled call."""
        guard: Guard | None = self.run.guard
        if guard is None or not tool.service:
            return
        holder = self._holder(record, record.attempts)
        self._breaker_events(await guard.record(tool.service, ok, holder))

    @staticmethod
    def _classify(tool: Tool, exc: Exception) -> failures.Classified:
        cls_msg = failures.classify(exc, has_effect=tool.effect != "read")
        if tool.classify is not None:
            override = tool.classify(exc)
            if override is not None:
                cls_msg = failures.Classified(override, cls_msg.message, cls_msg.delay)
        return cls_msg

    async def _settle(
        self,
        tool: Tool,
        call: ToolCall,
        record: OpRecord,
        cls_msg: failures.Classified,
        ms: float,
        t0: float,
    ) -> OpOutcome | OpRecord:
        """A failed attempt: its outcome, or the record with the next attempt stored."""
        cls, msg = cls_msg.cls, cls_msg.message
        if cls == "unknown":
            rec = await self.reconcile(tool, record)
            if self._verdict_waits(tool, cls_msg):
                await self._count(tool, record, ok=rec.outcome == "done")
            if rec.outcome == "done":
                return await self.success(call, tool, record, rec.result, ms)
            if rec.outcome == "unknown" and not tool.idempotent:
                await self.in_doubt(tool, record, msg)
            # not done, or idempotent: sending again with the same key is safe.
            cls = "transient"
        if cls in ("deterministic", "validation"):
            if cls == "validation":
                self.count_validation()
            return self.failure(call, tool, record, cls, msg, (time.perf_counter() - t0) * 1000)
        policy = self.policy(tool)
        # After a human's "try again" the schedule starts afresh (same op, same key).
        attempt = record.attempts - await self._attempt_base(record)
        decision = decide(policy, attempt, "transient", hint=cls_msg.delay, rng=self.rng)
        if not decision.retry:
            out = self.failure(call, tool, record, "transient", f"{msg} ({decision.reason})", ms)
            if cls_msg.down:
                # The service is down, not the item's work: held back like a call an open
                # breaker stopped, at no cost to the item; the task waits for the service.
                out.retry_at = self.clock.now() + max(1.0, policy.max_delay)
            elif policy.on_exhausted == "ask_human":
                await self.ask_exhausted(tool, record, out.error or msg)
            elif policy.on_exhausted == "compensate":
                out.compensate = True
            return out
        next_at = self.clock.now() + decision.delay
        record = replace(
            record,
            status="retry_wait",
            next_attempt_at=next_at,
            error={"class": "transient", "message": msg},
        )
        await self.run.commit(
            [
                ev.OpRetryScheduled(
                    op_id=record.op_id,
                    attempt=record.attempts,
                    next_attempt_at=next_at,
                    delay=decision.delay,
                    error_class="transient",
                    error=msg[:300],
                )
            ],
            ops=[record],
        )
        return record

    async def wait_until(self, record: OpRecord, at: float) -> None:
        """Wait for a stored retry time: in the worker if short, else park the task."""
        run = self.run
        delay = at - self.clock.now()
        if delay <= 0:
            return
        if delay <= run.inline_wait_max:
            await self.clock.sleep(delay)
            return
        raise Pause(
            out.waiting(
                "retry",
                f"{record.tool} failed transiently; attempt {record.attempts + 1} "
                f"is scheduled for {at:.0f}",
                why="retry scheduled",
                until=at,
            )
        )

    async def recover(self, tool: Tool, call: ToolCall, record: OpRecord) -> OpOutcome | None:
        """An op found unfinished after a crash: settle it here (an outcome), or return
        None to send it (again) with its original op id."""
        status = record.status
        if status == "awaiting_approval":
            asked = await self._latest(record.op_id, "op_exhausted")
            if asked is not None:
                settled = await self._after_exhausted(tool, call, record, asked)
                if settled is not None:
                    return settled
                # "Try again": a call about to be sent, reconciled first if it may have
                # been sent before a crash.
                status = "intended"
        if status in ("retry_wait", "awaiting_approval"):
            return None  # resume the stored schedule / send the approved call
        _, human = await self._doubt_request(record)
        if human is not None and human.status == "approved":
            decision = human.decision or {}
            if decision.get("decision") == "done":
                # A human checked the outside world: it did happen. Backfill, never resend.
                result = decision.get("result")
                if result is None:
                    result = f"{human.decided_by or 'a human'} recorded this call as done"
                return await self.success(call, tool, record, result, 0.0)
            return None
        if human is not None and human.status == "rejected":
            who = human.decided_by or "a human"
            msg = f"{who} recorded this call as failed"
            reason = (human.decision or {}).get("reason")
            if reason:
                msg += f" ({reason})"
            return self.failure(call, tool, record, "deterministic", msg, 0.0)
        effectful = tool.effect != "read"
        if status == "intended" and effectful and not tool.idempotent and tool.reconcile is None:
            # No `dispatched` mark was written: the crash came before sending.
            return None
        if tool.reconcile is not None and effectful:
            rec = await self.reconcile(tool, record)
            if rec.outcome == "done":
                return await self.success(call, tool, record, rec.result, 0.0)
            if rec.outcome == "not_done":
                return None
        if tool.idempotent or not effectful:
            return None  # the same idempotency key makes a second send harmless
        detail = "a lost response" if status == "unknown" else "a crash while it was in flight"
        await self.in_doubt(tool, record, detail)
        return None

    # ------------------------------------------------------------------ exhausted retries

    async def _latest(self, op_id: str, kind: str) -> ApprovalRecord | None:
        """The newest request of this kind about this op."""
        asked = [
            a
            for a in await self.store.get_approvals(self.run.task_id)
            if a.op_id == op_id and a.request.get("kind") == kind
        ]
        return max(asked, key=lambda a: (a.created_at, a.request_id), default=None)

    async def _attempt_base(self, record: OpRecord) -> int:
        """The attempts an op had made when a human last said "try again" after its
        retries were exhausted: its schedule counts from there."""
        if record.attempts <= 1:
            return 0
        base = 0
        for a in await self.store.get_approvals(self.run.task_id, statuses={"approved"}):
            if a.op_id != record.op_id:
                continue
            if a.request.get("kind") not in ("op_exhausted", "compensation_failed"):
                continue
            if (a.decision or {}).get("decision") == "done":
                continue
            base = max(base, int(a.request.get("attempts") or 0))
        return base

    def _exhausted_wait(self, appr: ApprovalRecord) -> dict[str, Any]:
        tid, rid = self.run.task_id, appr.request_id
        return {
            "kind": "human",
            "request_id": rid,
            "ops": [appr.op_id],
            "reason": f"{appr.request['what']}; decide: tether approve {tid} {rid} (try "
            f"again), tether approve {tid} {rid} --done (it was done another way) or "
            f"tether reject {tid} {rid} ({appr.request.get('reject', 'fail the call')})",
        }

    async def ask_exhausted(self, tool: Tool, record: OpRecord, error: str) -> None:
        """`on_exhausted: ask_human`: the call waits for a person (`Pause`)."""
        earlier = [
            a
            for a in await self.store.get_approvals(self.run.task_id)
            if a.op_id == record.op_id and a.request.get("kind") == "op_exhausted"
        ]
        n = len(earlier) + 1
        request_id = f"{record.op_id}.exhausted" + (f".{n}" if n > 1 else "")
        args = json.dumps(record.args, ensure_ascii=False)[:200]
        appr = self.new_request(
            request_id,
            record,
            kind="op_exhausted",
            what=f"{tool.name}({args}) failed after its retries: {error[:300]}",
            impact="approve to try it again (a new round of attempts, the same idempotency "
            "key), approve --done if it was done another way, reject to fail the call (the "
            "model is told)",
            options=["approve", "done", "reject"],
            attempts=record.attempts,
        )
        raise Pause(
            Outcome(
                "waiting",
                reason="retries exhausted",
                waiting=self._exhausted_wait(appr),
                events=(
                    ev.OpExhausted(
                        op_id=record.op_id,
                        tool=tool.name,
                        attempts=record.attempts,
                        policy="ask_human",
                        error=error[:300],
                        item=self._focus(record.round),
                    ),
                    ev.ApprovalRequested(
                        request_id=request_id,
                        what=appr.request["what"],
                        impact=appr.request["impact"],
                        op_id=record.op_id,
                        options=["approve", "done", "reject"],
                    ),
                ),
                ops=(
                    replace(
                        record,
                        status="awaiting_approval",
                        next_attempt_at=None,
                        error={"class": "transient", "message": error},
                    ),
                ),
                approvals=(appr,),
            )
        )

    async def _after_exhausted(
        self, tool: Tool, call: ToolCall, record: OpRecord, appr: ApprovalRecord
    ) -> OpOutcome | None:
        """A person's answer about a call whose retries ran out: still waiting (`Pause`),
        done another way (a success), failed (the model is told), or None: try again."""
        if appr.status == "pending":
            raise Pause(
                Outcome("waiting", reason="retries exhausted", waiting=self._exhausted_wait(appr))
            )
        decision = appr.decision or {}
        who = appr.decided_by or "a human"
        if appr.status == "closed":
            return self.failure(call, tool, record, "not_sent", _closed_msg(appr), 0.0)
        if appr.status == "rejected":
            msg = f"{who} decided not to try {tool.name} again after its retries ran out"
            if decision.get("reason"):
                msg += f" ({decision['reason']})"
            last = (record.error or {}).get("message")
            if last:
                msg += f"; last error: {str(last)[:200]}"
            return self.failure(call, tool, record, "transient", msg, 0.0)
        if decision.get("decision") == "done":
            result = decision.get("result")
            if result is None:
                result = f"{who} recorded this call as done"
            return await self.success(call, tool, record, result, 0.0)
        return None

    def _focus(self, round_no: int) -> str | None:
        """The focus item of a round, from the run's focus log."""
        found: str | None = None
        for start, item in self.run.state.focus_log:
            if int(start) > round_no:
                break
            found = item
        return found

    def _stretch(self, round_no: int) -> int:
        """The first round of the focus item's current stretch of work: back to the last
        round whose focus was another item (the round itself when there is no item)."""
        first = round_no
        for start, item in self.run.state.focus_log:
            if int(start) > round_no:
                break
            first = int(start) if item is not None else round_no
        return first

    # ------------------------------------------------------------------ compensation

    async def compensate(
        self, failed: OpOutcome, outcomes: list[OpOutcome], round_no: int
    ) -> OpOutcome:
        """`on_exhausted: compensate`: undo the item's applied ops, newest first, and
        block the item (see the module's docstring for which ops). The plan is
        journaled with the failed call before anything runs; a resumed round (a crash,
        a human's decision) calls this again and only the remaining steps run."""
        run = self.run
        assert failed.record is not None
        record = failed.record
        plan = _plan(record)
        if plan is None:
            # The batch's finished calls first: they may be among the ops to undo.
            await self.save_finished(outcomes)
            focus = self._focus(round_no)
            targets = await self._targets(round_no)
            plan = {
                "item": focus,
                "ops": [t.op_id for t in targets],
                "after": f"{failed.tool} failed: {failed.error or failed.summary}"[:300],
            }
            record = replace(record, error={**(record.error or {}), "compensation": plan})
            failed = replace(failed, record=record)
            await run.commit(
                [
                    *failed.result_events(),
                    ev.OpExhausted(
                        op_id=record.op_id,
                        tool=failed.tool,
                        attempts=record.attempts,
                        policy="compensate",
                        error=(failed.error or "")[:300],
                        item=focus,
                        compensate=plan["ops"],
                    ),
                    *self.pending_events,
                ],
                ops=[record],
                artifacts=[failed.artifact] if failed.artifact is not None else [],
            )
            self.pending_events = []
            failed.replayed = True
        ids = [str(i) for i in plan.get("ops") or ()]
        stored = {o.op_id: o for o in await self.store.get_ops(run.task_id, op_ids=set(ids))}
        undone: list[str] = []
        left: list[str] = []
        for op_id in ids:
            target = stored.get(op_id)
            if target is None:
                continue
            tool = run.known_tools.get(target.tool)
            if tool is None or tool.compensate is None:
                left.append(op_id)  # its tool is gone from the registry: nothing to run
                continue
            state = await self._compensate_one(tool, target, round_no, str(plan.get("after")))
            (undone if state != "left" else left).append(op_id)
        after = str(plan.get("after") or failed.tool)
        reason = f"compensated after {after}"
        parts = [f"ERROR ({failed.error_class or 'transient'}): {failed.error or ''}"]
        parts.append(
            "The item cannot finish: "
            + (
                f"its applied ops were compensated, newest first: {', '.join(undone)}"
                if undone
                else "it had no applied ops to compensate"
            )
            + (f"; left as they are by a human: {', '.join(left)}" if left else "")
            + ". The item is blocked; do not redo it, work on something else."
        )
        self.halted = f"the item was compensated after {failed.tool} failed"
        return replace(failed, content="\n".join(parts), blocks=reason[:300], compensate=False)

    async def _targets(self, round_no: int) -> list[OpRecord]:
        """The ops to compensate: the focus item's applied ops of its current stretch
        (see `_stretch`), of tools that declare `compensate`, not compensated before,
        newest first."""
        run = self.run
        tools = {n for n, t in run.known_tools.items() if t.compensate is not None}
        if not tools:
            return []
        first = self._stretch(round_no)
        ops = [
            o
            for o in await self.store.get_ops(run.task_id, statuses={"succeeded"}, tools=tools)
            if first <= o.round <= round_no and not history_only(o)
        ]
        return sorted(ops, key=lambda o: (o.round, o.call_index), reverse=True)

    def _compensation_tool(self, tool: Tool, target: OpRecord) -> Tool:
        """The compensation of one applied op as a tool the op machinery runs: the
        original's service, timeout and schedule, never asking a human mid-schedule."""
        comp = tool.compensate
        assert comp is not None

        async def run(args: Mapping[str, Any], ctx: ToolContext) -> Any:
            return await comp.run(target, ctx)

        reconcile = None
        if comp.reconcile is not None:
            check = comp.reconcile

            async def reconcile(op: Any, ctx: ToolContext) -> Reconciliation:
                return await check(target, ctx)

        return Tool(
            name=f"{tool.name}.compensate",
            description=f"undo an applied {tool.name} op",
            parameters={"type": "object", "properties": {}},
            fn=run,
            effect=tool.effect,
            idempotent=comp.idempotent,
            service=tool.service,
            timeout=comp.timeout or tool.timeout,
            retry=replace(self.policy(tool), on_exhausted="fail_item"),
            reconcile=reconcile,
            classify=tool.classify,
        )

    async def _compensate_one(self, tool: Tool, target: OpRecord, round_no: int, after: str) -> str:
        """Undo one applied op, exactly once: `compensated`, `done_by_hand` or `left`
        (a human's decision). Raises `Pause` while a human must decide."""
        run = self.run
        done = compensation_of(target)
        if done is not None:
            return done
        comp_id = compensation_id(target.op_id)
        ctool = self._compensation_tool(tool, target)
        found = await self.store.get_ops(run.task_id, op_ids={comp_id})
        prior = found[0] if found else None
        args = {"compensates": target.op_id, "tool": target.tool, "args": target.args}
        call = ToolCall(comp_id, ctool.name, args)
        if prior is not None and prior.status == "succeeded":
            await self._mark(target, comp_id, "compensated", after)
            return "compensated"
        fresh = prior is None
        record = prior or OpRecord(
            op_id=comp_id,
            task_id=run.task_id,
            round=round_no,
            call_index=target.call_index,
            tool=ctool.name,
            args=args,
            args_hash=_hash_args(args),
            effect=ctool.effect,
            status="intended",
            task_version=run.task.version,
        )
        if prior is not None and prior.status == "failed":
            asked = await self._latest(comp_id, "compensation_failed")
            if asked is None or (
                asked.status == "approved"
                and int(asked.request.get("attempts") or 0) < prior.attempts
            ):
                # Failed, and no one was asked yet about this failure.
                await self._ask_compensation(ctool, prior, target)
            assert asked is not None
            if asked.status == "pending":
                raise Pause(
                    Outcome(
                        "waiting",
                        reason="compensation failed",
                        waiting=self._exhausted_wait(asked),
                    )
                )
            decision = (asked.decision or {}).get("decision")
            if asked.status in ("rejected", "closed"):
                await self._mark(target, comp_id, "left", after)
                return "left"
            if decision == "done":
                await self._mark(target, comp_id, "done_by_hand", after)
                return "done_by_hand"
            # "Try again": the same op, a fresh schedule (see `_attempt_base`).
            record = replace(prior, status="intended", error=None, next_attempt_at=None)
            fresh = True
        outcome = await self.execute(ctool, call, record, fresh=fresh)
        if outcome.retry_at is not None:
            # The service is down (an open breaker): wait for it, then go on.
            raise Pause(
                out.waiting(
                    "external",
                    f"{ctool.name}: the service is unavailable until {outcome.retry_at:.0f} "
                    f"({outcome.error}); the compensation continues then",
                    why="service unavailable",
                    until=outcome.retry_at,
                )
            )
        assert outcome.record is not None
        if outcome.status == "succeeded":
            await self._mark(target, comp_id, "compensated", after, outcome)
            return "compensated"
        await run.commit(outcome.result_events(), ops=[outcome.record])
        await self._ask_compensation(ctool, outcome.record, target)
        raise AssertionError("unreachable")  # `_ask_compensation` pauses

    async def _mark(
        self,
        target: OpRecord,
        comp_id: str,
        state: str,
        after: str,
        outcome: OpOutcome | None = None,
    ) -> None:
        """Journal how an applied op was undone, with the compensation's result, in one
        commit: a restart never runs a finished compensation again."""
        marked = replace(
            target,
            result={**(target.result or {}), "compensation": state, "compensated_by": comp_id},
        )
        events: list[ev.Event] = []
        ops = [marked]
        arts: list[ArtifactRecord] = []
        if outcome is not None and outcome.record is not None:
            events.extend(outcome.result_events())
            ops.insert(0, outcome.record)
            if outcome.artifact is not None:
                arts.append(outcome.artifact)
        events.append(
            ev.OpCompensated(op_id=target.op_id, by=comp_id, outcome=state, after=after[:200])
        )
        await self.run.commit(events, ops=ops, artifacts=arts)
        failpoints.hit("after_compensation")

    async def _ask_compensation(self, ctool: Tool, record: OpRecord, target: OpRecord) -> None:
        """A compensation failed after its retries: a person decides (`Pause`); it is
        never tried again on its own."""
        earlier = [
            a
            for a in await self.store.get_approvals(self.run.task_id)
            if a.op_id == record.op_id and a.request.get("kind") == "compensation_failed"
        ]
        n = len(earlier) + 1
        request_id = f"{record.op_id}.failed" + (f".{n}" if n > 1 else "")
        error = str((record.error or {}).get("message") or "failed")
        args = json.dumps(target.args, ensure_ascii=False)[:200]
        appr = self.new_request(
            request_id,
            record,
            kind="compensation_failed",
            what=f"the compensation of {target.tool}({args}) [{target.op_id}] failed: "
            f"{error[:300]}",
            impact="approve to try the compensation again, approve --done if it was undone "
            "by hand, reject to leave the op as it is",
            options=["approve", "done", "reject"],
            attempts=record.attempts,
            reject="leave the op as it is",
        )
        raise Pause(
            Outcome(
                "waiting",
                reason="compensation failed",
                waiting=self._exhausted_wait(appr),
                events=(
                    ev.AuditWarning(
                        code="compensation_failed",
                        message=f"the compensation {record.op_id} of {target.op_id} failed "
                        f"after its retries ({error[:200]}); a human must decide",
                        details={"op_id": target.op_id, "compensation": record.op_id},
                    ),
                    ev.ApprovalRequested(
                        request_id=request_id,
                        what=appr.request["what"],
                        impact=appr.request["impact"],
                        op_id=record.op_id,
                        options=["approve", "done", "reject"],
                    ),
                ),
                approvals=(appr,),
            )
        )

    def validate(self, tool: Tool, raw: Any) -> str | None:
        """Run the tool's post-condition; a message when it is broken."""
        if tool.validate is None:
            return None
        try:
            verdict = tool.validate(raw)
        except errors.ValidationFailed as exc:
            return str(exc) or "the result failed validation"
        except Exception as exc:
            return f"validator raised {type(exc).__name__}: {exc}"
        if verdict is None or verdict is True:
            return None
        if verdict is False:
            return "the result failed validation"
        return str(verdict)

    def count_validation(self) -> None:
        """Validation failures are counted (they go back to the model, limited)."""
        self.run.state.validation_failures += 1
