"""Acting: every tool call of a round, through permissions, the op journal and retries.

Each call passes the allowlist and its argument schema, then the approval policy (risky
effects wait for a human unless the contract relaxes it: `approvals`), then the
service's shared breaker and concurrency limit (`attempt`). A call with effects is
journaled as an op intent (its `op_id` is the idempotency key) and committed before
dispatch. Failures are handled by class: transient ones are retried on a stored
schedule, unknown outcomes are reconciled (or retried with the same key when the tool
is idempotent, or left to a human: `doubt`), and deterministic and validation failures
go back to the model. Retries that run out follow the policy's `on_exhausted`:
`fail_item` (the failure goes back to the model), `ask_human` (`exhausted`) or
`compensate` (`compensation`).

Op states: `intended → dispatched → succeeded | failed | unknown`, plus `retry_wait`
(a transient failure with its next attempt time) and `awaiting_approval`. The round's
write-back commits the final state together with `op.committed`.

The parts return values (`results`): an attempt says what happened (`Settled`,
`Retry`, `InDoubt`, `Exhausted`, `AsksApproval`), and anything that must pause the
round is a `Wait`. `OpRunner` alone dispatches on them: it asks the next part, and it
alone raises `Pause`. No part calls back into another above it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from tether import errors, failpoints
from tether import events as ev
from tether.models.base import ModelResponse, ToolCall
from tether.runtime.ops import results as R
from tether.runtime.ops.attempt import Attempts
from tether.runtime.ops.compensation import Compensation, Run
from tether.runtime.ops.human.approvals import Approvals
from tether.runtime.ops.human.doubt import Doubt
from tether.runtime.ops.human.exhausted import Exhaustion
from tether.runtime.ops.human.requests import Requests
from tether.runtime.ops.journal import (
    NOT_IN_FLIGHT,
    NOT_THE_GOAL,
    compensation_id,
    compensation_of,
    doubt_id,
    hash_args,
    history_only,
    intent,
    op_id_for,
    plan_of,
    superseded_by,
)
from tether.runtime.ops.ports import INLINE_WAIT_MAX as INLINE_WAIT_MAX  # kept here too
from tether.runtime.ops.ports import RoundOps
from tether.runtime.ops.results import OpOutcome
from tether.runtime.run.outcome import Stop
from tether.store.base import OpRecord
from tether.tools.breaker import Admission, Guard
from tether.tools.registry import Tool

if TYPE_CHECKING:
    from tether.runtime.run.ports import OpsHost

T = TypeVar("T")


class Pause(Stop):
    """The round cannot go on now (approval, long backoff, op in doubt): its finished
    calls are saved before the outcome is applied."""


def _go(step: T | R.Wait) -> T:
    """A part's answer, or `Pause` when it says the round must wait."""
    if isinstance(step, R.Wait):
        raise Pause(step.outcome)
    return step


class OpRunner:
    """Runs the tool calls of one round for an `OpsHost`."""

    def __init__(self, run: OpsHost) -> None:
        self.run = run
        self.book = RoundOps()
        self.requests = Requests(run)
        self.attempts = Attempts(run, self.book, self.requests)
        self.approvals = Approvals(run, self.book, self.requests, self.attempts)
        #: Set once a call of the round was compensated: the rest are not sent.
        self.halted: str | None = None
        #: The round's op intents by call index, as `plan` made them (arguments
        #: checked): the call's run starts from it instead of checking them again.
        self._planned: dict[int, OpRecord] = {}
        self._allowed: dict[str, Tool] | None = None

    def allowed(self) -> dict[str, Tool]:
        """The task's allowed tools by name (the run's list does not change within a
        round)."""
        found = self._allowed
        if found is None:
            found = self._allowed = {t.name: t for t in self.run.tools}
        return found

    # The parts few rounds need are made on first use.

    @functools.cached_property
    def doubt(self) -> Doubt:
        """Asks about ops in doubt and recovers unfinished ones."""
        return Doubt(self.run, self.requests, self.attempts)

    @functools.cached_property
    def exhaustion(self) -> Exhaustion:
        """Asks about calls whose retries ran out."""
        return Exhaustion(self.run, self.requests, self.attempts)

    @functools.cached_property
    def compensation(self) -> Compensation:
        """Undoes an item's applied ops."""
        return Compensation(self.run, self.book, self.requests)

    @property
    def pending_events(self) -> list[ev.Event]:
        """Events for the round's write-back (breaker transitions)."""
        return self.book.events

    # ------------------------------------------------------------------ entry

    async def plan(self, round_no: int, response: ModelResponse) -> list[tuple[Tool, OpRecord]]:
        """The op intents of the round: every call with effects that passes the allowlist
        and its argument schema and needs no approval. They are committed together with
        the model's decision, before anything is sent, so a round with effects costs one
        commit up front. (A call that needs a human's approval is journaled with its
        request, when the round reaches it.)"""
        allowed = self.allowed()
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
            if await self.approvals.needs_approval(tool, record):
                continue
            intents.append((tool, record))
            self._planned[idx] = record
        self.book.journaled = {r.op_id for _, r in intents}
        return intents

    def intended(self, tool: Tool, round_no: int, idx: int, args: Mapping[str, Any]) -> OpRecord:
        """A new op record for one call, before anything is sent."""
        run = self.run
        return OpRecord(
            op_id=op_id_for(run.journal.task_id, round_no, idx),
            task_id=run.journal.task_id,
            round=round_no,
            call_index=idx,
            tool=tool.name,
            args=dict(args),
            args_hash=hash_args(args),
            effect=tool.effect,
            status="intended",
            task_version=run.view.task.version,
        )

    @staticmethod
    def intent_events(intents: list[tuple[Tool, OpRecord]]) -> list[ev.Event]:
        """The journal entries of planned intents."""
        return [intent(tool, record) for tool, record in intents]

    async def act(
        self, round_no: int, response: ModelResponse, *, resumed: bool = True
    ) -> list[OpOutcome]:
        """Phases 4 and 5 for every tool call of the round (`resumed`: the round was
        interrupted before, so some of its ops may already be journaled)."""
        run = self.run
        outcomes: list[OpOutcome] = []
        existing = (
            {o.op_id: o for o in await run.store.get_ops(run.journal.task_id, round=round_no)}
            if resumed
            else {}
        )
        if any(o.task_version < run.view.task.version for o in existing.values()):
            self.book.goal_version = await self._goal_version()
        for idx, call in enumerate(response.tool_calls):
            prior = existing.get(op_id_for(run.journal.task_id, round_no, idx))
            if prior is not None and prior.status in ("succeeded", "failed"):
                done = R.replay(call, prior)
                known = self.allowed().get(prior.tool)
                done.volatile = R.waits(known, prior)
                done.shifting = R.shifts(known)
                if plan_of(prior) is not None:
                    # A compensation a crash or a human's decision interrupted: resume it.
                    done = await self._compensating(done, outcomes, round_no)
                outcomes.append(done)
                continue
            done = await self._call(call, round_no, idx, prior, outcomes)
            if done.compensate:
                done = await self._compensating(done, outcomes, round_no)
            outcomes.append(done)
        return outcomes

    async def _call(
        self,
        call: ToolCall,
        round_no: int,
        idx: int,
        prior: OpRecord | None,
        outcomes: list[OpOutcome],
    ) -> OpOutcome:
        """One call not finished before: refused, superseded, or run."""
        run = self.run
        op = (op_id_for(run.journal.task_id, round_no, idx), run.journal.task_id, round_no, idx)
        version = run.view.task.version
        if self.halted is not None:
            return R.refused(call, op, call.name, f"not sent: {self.halted}", "not_sent", version)
        allowed = self.allowed()
        tool = allowed.get(call.name)
        if tool is None:
            known = call.name in run.known_tools
            msg = (
                f"not permitted: the tool {call.name!r} is not allowed for this task"
                if known
                else f"not permitted: there is no tool named {call.name!r}"
            )
            msg += f"; allowed tools: {', '.join(sorted(allowed))}"
            return R.refused(call, op, call.name, msg, "not_permitted", version)
        if call.arguments is None or call.error:
            msg = f"malformed call to {call.name}: {call.error or 'arguments missing'}"
            run.view.state.malformed_calls += 1
            return R.refused(call, op, tool.name, msg, "malformed", version)
        planned = self._planned.get(idx) if prior is None else None
        if planned is not None and planned.tool == tool.name and planned.task_version == version:
            # Checked and made by `plan` from this very call.
            record = planned
        else:
            try:
                args = tool.check_args(call.arguments)
            except errors.ToolFailed as exc:
                run.view.state.malformed_calls += 1
                return R.refused(call, op, tool.name, str(exc), "deterministic", version)
            record = prior or self.intended(tool, round_no, idx, args)
        if prior is not None and self._unsent_and_stale(tool, prior):
            return await self.supersede(call, tool, prior)
        approved = _go(await self.approvals.approval(tool, call, record))
        if isinstance(approved, OpOutcome):
            return approved
        if approved is not None and approved != record.args:
            try:
                args = tool.check_args(approved)
            except errors.ToolFailed as exc:
                return R.refused(call, op, tool.name, str(exc), "deterministic", version)
            record = replace(record, args=args, args_hash=hash_args(args))
        if prior is not None:  # a fresh call never waited for an approval
            await self._leave_approval(prior, record)
        try:
            return await self.execute(tool, call, record, fresh=prior is None)
        except Pause:
            await self.save_finished(outcomes)
            raise

    # ------------------------------------------------------------------ one call

    async def execute(
        self, tool: Tool, call: ToolCall, record: OpRecord, *, fresh: bool
    ) -> OpOutcome:
        """Run one call to its end: success, failure, or a `Pause`. Each attempt's value
        says what comes next (see the module's docstring)."""
        t0 = time.perf_counter()
        if not fresh:
            self.book.recovered.add(record.op_id)
            recovered = await self._recover(tool, call, record)
            if recovered is not None:
                return recovered
        elif tool.effect != "read" and record.op_id not in self.book.journaled:
            await self.run.journal.commit([intent(tool, record)], ops=[record])
            failpoints.hit("after_op_intent")
        while True:
            step = await self.attempts.once(tool, call, record, t0)
            if isinstance(step, R.Wait):
                raise Pause(step.outcome)
            if isinstance(step, R.AsksApproval):
                refused = _go(await self.approvals.asked(tool, call, step.record, step.why))
                if refused is not None:
                    return refused
                record = replace(step.record, attempts=step.record.attempts - 1)  # not one
                continue
            if isinstance(step, R.InDoubt):
                # Asked, and decided already: sending again with the same key is allowed.
                _go(await self.doubt.ask(tool, step.record, step.failure.message))
                step = await self.attempts.schedule(tool, call, step.record, step.failure, step.ms)
            if isinstance(step, R.Retry):
                record = step.record
                continue
            if isinstance(step, R.Exhausted):
                if step.policy == "ask_human":
                    error = step.outcome.error or ""
                    raise Pause((await self.exhaustion.ask(tool, step.record, error)).outcome)
                step.outcome.compensate = True
                return step.outcome
            return step.outcome

    async def _recover(self, tool: Tool, call: ToolCall, record: OpRecord) -> OpOutcome | None:
        """An op found unfinished after a crash: settle it here (an outcome), or return
        None to send it (again) with its original op id."""
        status = record.status
        if status == "awaiting_approval":
            asked = await self.requests.latest(record.op_id, "op_exhausted")
            if asked is not None:
                settled = _go(await self.exhaustion.answer(tool, call, record, asked))
                if settled is not None:
                    return settled
                # "Try again": a call about to be sent, reconciled first if it may have
                # been sent before a crash.
                status = "intended"
        return _go(await self.doubt.recover(tool, call, record, status))

    # ------------------------------------------------------------------ compensation

    async def _compensating(
        self, failed: OpOutcome, outcomes: list[OpOutcome], round_no: int
    ) -> OpOutcome:
        """`compensate`, with the round's finished calls saved before a pause."""
        try:
            return await self.compensate(failed, outcomes, round_no)
        except Pause:
            await self.save_finished(outcomes)
            raise

    async def compensate(
        self, failed: OpOutcome, outcomes: list[OpOutcome], round_no: int
    ) -> OpOutcome:
        """`on_exhausted: compensate`: undo the item's applied ops, newest first, and
        block the item (see `compensation`). A resumed round (a crash, a human's
        decision) calls this again and only the remaining steps run."""
        assert failed.record is not None
        plan = plan_of(failed.record)
        if plan is None:
            # The batch's finished calls first: they may be among the ops to undo.
            await self.save_finished(outcomes)
            failed, plan = await self.compensation.begin(failed, round_no)
        after = str(plan.get("after"))
        undone: list[str] = []
        left: list[str] = []
        for target, tool in await self.compensation.targets_of(plan):
            state = "left"  # its tool is gone from the registry: nothing to run
            if tool is not None:
                step = await self.compensation.step(tool, target, round_no, after)
                if isinstance(step, R.Wait):
                    raise Pause(step.outcome)
                if isinstance(step, Run):
                    done = await self.execute(step.tool, step.call, step.record, fresh=step.fresh)
                    state = _go(await self.compensation.ran(target, step, done, after))
                else:
                    state = step
            (undone if state != "left" else left).append(target.op_id)
        self.halted = f"the item was compensated after {failed.tool} failed"
        return self.compensation.blocked(failed, plan, undone, left)

    # ------------------------------------------------------------------ the journal

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
        await self.run.journal.commit(
            events + self.book.events,
            ops=[o.record for o in new if o.record is not None],
            artifacts=[o.artifact for o in new if o.artifact is not None],
        )
        self.book.events.clear()

    async def _leave_approval(self, prior: OpRecord | None, record: OpRecord) -> None:
        """An approved call is about to be sent: store it as `intended`, so that a crash
        after the send is recovered like any call in flight (reconciled, or sent again
        under its key), not sent blind as a call that never left."""
        if (
            prior is not None
            and prior.status == "awaiting_approval"
            and record.op_id in self.book.approved
        ):
            await self.run.journal.commit([], ops=[replace(record, status="intended")])

    async def _goal_version(self) -> int:
        """The version made by the latest edit that changed the goal (the objective,
        items, constraints, tools...: not only limits or budgets)."""
        edits = await self.run.store.read_events(self.run.journal.task_id, types={"task.edited"})
        changed = [
            int(e.data.get("new_version", 0))
            for e in edits
            if set(e.data.get("changes") or {}) - NOT_THE_GOAL
        ]
        return max(changed, default=0)

    def _unsent_and_stale(self, tool: Tool, record: OpRecord) -> bool:
        """A call decided for an older goal that was never sent (waiting for an
        approval or a retry time, or intended with no `dispatched` mark)."""
        if record.task_version >= self.book.goal_version:
            return False
        if record.status in NOT_IN_FLIGHT:
            return True
        marks_dispatch = tool.effect != "read" and not tool.idempotent and tool.reconcile is None
        return record.status == "intended" and marks_dispatch

    async def supersede(self, call: ToolCall, tool: Tool, record: OpRecord) -> OpOutcome:
        """Drop a call the contract changed under: it is not sent, its pending approval
        request is closed, and the model is told to decide again."""
        run = self.run
        msg = (
            f"not sent: the task's goal changed (version {run.view.task.version}) after this "
            f"call was decided under version {record.task_version}; decide again under the "
            "new contract"
        )
        pending = await run.store.get_approvals(run.journal.task_id, statuses={"pending"})
        for appr in (a for a in pending if a.op_id == record.op_id):
            closed = replace(
                appr,
                status="rejected",
                decision={"decision": "superseded", "reason": msg},
                decided_by="tether",
                decided_at=self.attempts.env.clock.now(),
            )
            await run.journal.commit(
                [
                    ev.ApprovalDecided(
                        request_id=appr.request_id, decision="superseded", by="tether"
                    )
                ],
                approvals=[closed],
            )
        return R.failure(call, tool, record, "superseded", msg, 0.0)


__all__ = [
    "INLINE_WAIT_MAX",
    "Admission",
    "Guard",
    "OpOutcome",
    "OpRunner",
    "Pause",
    "compensation_id",
    "compensation_of",
    "doubt_id",
    "history_only",
    "op_id_for",
    "superseded_by",
]
