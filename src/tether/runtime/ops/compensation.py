"""Compensation, a saga's rollback: `on_exhausted: compensate`.

When a call's retries run out under this policy the item cannot finish, so the ops it
applied are undone and it is blocked. The ops compensated are the focus item's
succeeded ops, of tools that declare `compensate`, from the rounds of its current
stretch of work (back to the last round whose focus was another item; with no items,
the failed call's round only) and not compensated before: newest first (round, then
call, descending). The plan is journaled with the failed call (`op.exhausted`), before
any compensation runs; each compensation is an op of its own, `<op>.compensate`, run
like any other (intent committed first, reconciled after a crash, in doubt → a human),
and committed together with the mark on the op it undid (`op.compensated`), so a
restart resumes the plan without repeating a finished step. A compensation that fails
after its retries asks a human (`<op>.compensate.failed`: try again, done by hand, or
leave it) and never loops. The calls of the round after the failed one are not sent.

This module plans and judges; it never runs an op itself. `Compensation.step` says
what one target needs — already undone (its state), a `Run` of its compensation op
(the runner executes it like any call, then hands the outcome to `ran`), or a `Wait`
for a person.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from tether import events as ev
from tether import failpoints
from tether.models.base import ToolCall
from tether.runtime.ops import results as R
from tether.runtime.ops.attempt import policy
from tether.runtime.ops.human.exhausted import wait_for_person
from tether.runtime.ops.human.requests import DONE_OPTIONS, Requests
from tether.runtime.ops.journal import (
    args_text,
    compensation_id,
    compensation_of,
    hash_args,
    history_only,
)
from tether.runtime.ops.ports import RoundOps
from tether.runtime.run import outcome as out
from tether.store.base import ArtifactRecord, OpRecord
from tether.tools.registry import Reconciliation, Tool, ToolContext

if TYPE_CHECKING:
    from tether.runtime.run.ports import OpsHost


@dataclass(frozen=True)
class Run:
    """The compensation op of one target, to run now."""

    tool: Tool
    call: ToolCall
    record: OpRecord
    fresh: bool


def stretch_start(focus_log: Any, round_no: int) -> int:
    """The first round of the focus item's current stretch of work: back to the last
    round whose focus was another item (the round itself when there is no item)."""
    first = round_no
    for start, item in focus_log:
        if int(start) > round_no:
            break
        first = int(start) if item is not None else round_no
    return first


def compensation_tool(tool: Tool, target: OpRecord, retry: Any) -> Tool:
    """The compensation of one applied op as a tool the op machinery runs: the
    original's service, timeout and schedule (`retry`), never asking a human
    mid-schedule."""
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
        retry=replace(retry, on_exhausted="fail_item"),
        reconcile=reconcile,
        classify=tool.classify,
    )


class Compensation:
    """Plans the compensation of an item's applied ops and judges each step."""

    def __init__(self, run: OpsHost, book: RoundOps, requests: Requests) -> None:
        self.run = run
        self.book = book
        self.requests = requests

    async def begin(self, failed: R.OpOutcome, round_no: int) -> tuple[R.OpOutcome, dict[str, Any]]:
        """Journal the plan with the failed call (the round's finished calls are saved
        first, by the runner: they may be among the ops to undo)."""
        assert failed.record is not None
        record = failed.record
        focus = self.run.view.state.focus_of(round_no)
        targets = await self._targets(round_no)
        plan: dict[str, Any] = {
            "item": focus,
            "ops": [t.op_id for t in targets],
            "after": f"{failed.tool} failed: {failed.error or failed.summary}"[:300],
        }
        record = replace(record, error={**(record.error or {}), "compensation": plan})
        failed = replace(failed, record=record)
        await self.run.journal.commit(
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
                *self.book.events,
            ],
            ops=[record],
            artifacts=[failed.artifact] if failed.artifact is not None else [],
        )
        self.book.events.clear()
        failed.replayed = True
        return failed, plan

    async def targets_of(self, plan: Mapping[str, Any]) -> list[tuple[OpRecord, Tool | None]]:
        """The plan's ops still stored, each with its tool (None: its tool is gone from
        the registry or declares no compensation, so there is nothing to run)."""
        ids = [str(i) for i in plan.get("ops") or ()]
        stored = {
            o.op_id: o
            for o in await self.run.store.get_ops(self.run.journal.task_id, op_ids=set(ids))
        }
        found: list[tuple[OpRecord, Tool | None]] = []
        for op_id in ids:
            target = stored.get(op_id)
            if target is None:
                continue
            tool = self.run.known_tools.get(target.tool)
            found.append(
                (target, tool if tool is not None and tool.compensate is not None else None)
            )
        return found

    async def step(
        self, tool: Tool, target: OpRecord, round_no: int, after: str
    ) -> str | Run | R.Wait:
        """What undoing one applied op needs now: its final state if it is done
        (`compensated`, `done_by_hand` or `left`), a `Run` of its compensation op, or
        `Wait` while a person decides."""
        done = compensation_of(target)
        if done is not None:
            return done
        comp_id = compensation_id(target.op_id)
        ctool = compensation_tool(tool, target, policy(self.run, tool))
        found = await self.run.store.get_ops(self.run.journal.task_id, op_ids={comp_id})
        prior = found[0] if found else None
        args = {"compensates": target.op_id, "tool": target.tool, "args": target.args}
        call = ToolCall(comp_id, ctool.name, args)
        if prior is not None and prior.status == "succeeded":
            return await self._mark(target, comp_id, "compensated", after)
        if prior is None:
            record = OpRecord(
                op_id=comp_id,
                task_id=self.run.journal.task_id,
                round=round_no,
                call_index=target.call_index,
                tool=ctool.name,
                args=args,
                args_hash=hash_args(args),
                effect=ctool.effect,
                status="intended",
                task_version=self.run.view.task.version,
            )
            return Run(ctool, call, record, fresh=True)
        if prior.status != "failed":
            return Run(ctool, call, prior, fresh=False)
        asked = await self.requests.latest(comp_id, "compensation_failed")
        if asked is None or (
            asked.status == "approved" and int(asked.request.get("attempts") or 0) < prior.attempts
        ):
            # Failed, and no one was asked yet about this failure.
            return await self._ask(ctool, prior, target)
        if asked.status == "pending":
            return wait_for_person(self.run.journal.task_id, "compensation failed", asked)
        if asked.status in ("rejected", "closed"):
            return await self._mark(target, comp_id, "left", after)
        if (asked.decision or {}).get("decision") == "done":
            return await self._mark(target, comp_id, "done_by_hand", after)
        # "Try again": the same op, a fresh schedule (see `Requests.attempt_base`).
        record = replace(prior, status="intended", error=None, next_attempt_at=None)
        return Run(ctool, call, record, fresh=True)

    async def ran(
        self, target: OpRecord, step: Run, outcome: R.OpOutcome, after: str
    ) -> str | R.Wait:
        """The compensation op ran to `outcome`: the target is marked `compensated`, or
        the task waits (for the service, or for a person)."""
        if outcome.retry_at is not None:
            # The service is down (an open breaker): wait for it, then go on.
            return R.Wait(
                out.waiting(
                    "external",
                    f"{step.tool.name}: the service is unavailable until "
                    f"{outcome.retry_at:.0f} ({outcome.error}); the compensation continues then",
                    why="service unavailable",
                    until=outcome.retry_at,
                )
            )
        assert outcome.record is not None
        if outcome.status == "succeeded":
            comp_id = compensation_id(target.op_id)
            return await self._mark(target, comp_id, "compensated", after, outcome)
        await self.run.journal.commit(outcome.result_events(), ops=[outcome.record])
        return await self._ask(step.tool, outcome.record, target)

    @staticmethod
    def blocked(
        failed: R.OpOutcome, plan: Mapping[str, Any], undone: list[str], left: list[str]
    ) -> R.OpOutcome:
        """The failed call's outcome once the plan ran: the item is blocked."""
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
        return replace(failed, content="\n".join(parts), blocks=reason[:300], compensate=False)

    async def _targets(self, round_no: int) -> list[OpRecord]:
        """The ops to compensate: the focus item's applied ops of its current stretch
        (see `stretch_start`), of tools that declare `compensate`, not compensated
        before, newest first."""
        run = self.run
        tools = {n for n, t in run.known_tools.items() if t.compensate is not None}
        if not tools:
            return []
        first = stretch_start(run.view.state.focus_log, round_no)
        ops = [
            o
            for o in await run.store.get_ops(
                run.journal.task_id, statuses={"succeeded"}, tools=tools
            )
            if first <= o.round <= round_no and not history_only(o)
        ]
        return sorted(ops, key=lambda o: (o.round, o.call_index), reverse=True)

    async def _mark(
        self,
        target: OpRecord,
        comp_id: str,
        state: str,
        after: str,
        outcome: R.OpOutcome | None = None,
    ) -> str:
        """Journal how an applied op was undone, with the compensation's result, in one
        commit: a restart never runs a finished compensation again. Returns `state`."""
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
        await self.run.journal.commit(events, ops=ops, artifacts=arts)
        failpoints.hit("after_compensation")
        return state

    async def _ask(self, ctool: Tool, record: OpRecord, target: OpRecord) -> R.Wait:
        """A compensation failed after its retries: a person decides; it is never tried
        again on its own."""
        request_id = await self.requests.numbered(record.op_id, "compensation_failed", "failed")
        error = str((record.error or {}).get("message") or "failed")
        ask = self.requests.ask(
            request_id,
            record,
            kind="compensation_failed",
            what=f"the compensation of {target.tool}({args_text(target, 200)}) "
            f"[{target.op_id}] failed: {error[:300]}",
            impact="approve to try the compensation again, approve --done if it was undone "
            "by hand, reject to leave the op as it is",
            options=DONE_OPTIONS,
            attempts=record.attempts,
            reject="leave the op as it is",
        )
        return wait_for_person(
            self.run.journal.task_id,
            "compensation failed",
            ask.record,
            ev.AuditWarning(
                code="compensation_failed",
                message=f"the compensation {record.op_id} of {target.op_id} failed "
                f"after its retries ({error[:200]}); a human must decide",
                details={"op_id": target.op_id, "compensation": record.op_id},
            ),
            ask.event,
            approvals=(ask.record,),
        )
