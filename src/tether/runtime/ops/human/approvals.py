"""Approvals: whether a call waits for a human before it is sent, and the answer.

A call needs approval when its effect (the tool's, refined per call by `effect_of`) is
risky, unless the contract's permission for the tool says otherwise; a tool may also
ask itself (`ApprovalRequired`). Either way one request, `<op>.approval`, is asked
(`Approvals._ask`) and its decision stands: approved (maybe with modified arguments),
rejected, or closed with its task.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tether import events as ev
from tether.models.base import ToolCall
from tether.runtime import hints, launch
from tether.runtime.ops import results as R
from tether.runtime.ops.attempt import Attempts
from tether.runtime.ops.human.exhausted import Asks
from tether.runtime.ops.human.requests import Requests
from tether.runtime.ops.journal import approval_id, args_text, closed_msg, intent
from tether.runtime.ops.ports import RoundOps
from tether.runtime.run import outcome as out
from tether.store.base import ApprovalRecord, OpRecord
from tether.tools.builtin.files import as_sent
from tether.tools.registry import RISKY, Tool

if TYPE_CHECKING:
    from tether.runtime.run.ports import OpsHost

#: What a call's own `ApprovalRequired` may be answered.
_TOOL_ASKS = ("approve", "reject")


class Approvals(Asks):
    """The approval policy applied to the calls of one round."""

    def __init__(
        self, run: OpsHost, book: RoundOps, requests: Requests, attempts: Attempts
    ) -> None:
        super().__init__(run, requests, attempts)
        self.book = book

    async def approval(
        self, tool: Tool, call: ToolCall, record: OpRecord
    ) -> Mapping[str, Any] | R.OpOutcome | R.Wait | None:
        """Approved args (maybe modified), a refusal outcome, `Wait` while a decision is
        pending, or None when no approval is needed."""
        if record.op_id in self.book.journaled:
            return None  # `plan` found it needs no approval, before it was journaled
        request_id = approval_id(record.op_id)
        if record.status == "awaiting_approval":
            # Asked before (for its effect, or by the tool itself): the decision stands.
            asked = await self.requests.get(request_id)
            if asked is not None:
                return await self._approved(tool, call, record, asked)
        effect = await self.call_effect(tool, record)
        if not self._needed(tool, effect):
            return None
        appr = await self.requests.get(request_id)
        if appr is None:
            appr = await self._ask(
                tool, record, impact=_impact(tool, effect, record.args), effect=effect
            )
        return await self._approved(tool, call, record, appr)

    async def asked(
        self, tool: Tool, call: ToolCall, record: OpRecord, why: str
    ) -> R.OpOutcome | R.Wait | None:
        """The tool raised `ApprovalRequired`: `Wait` for a human, then None to run it
        again approved, or the refusal's outcome."""
        appr = await self.requests.get(approval_id(record.op_id))
        if appr is None:
            appr = await self._ask(
                tool,
                record,
                impact=f"the tool asks: {why[:500]}",
                effect=tool.effect,
                options=_TOOL_ASKS,
                journal_intent=False,
            )
        decided = await self._decided(tool, call, record, appr)
        if decided is None:
            self.book.approved.add(record.op_id)
        return decided if isinstance(decided, R.OpOutcome | R.Wait) else None

    async def needs_approval(self, tool: Tool, record: OpRecord) -> bool:
        """Whether this call waits for a human before it is sent."""
        return self._needed(tool, await self.call_effect(tool, record))

    async def call_effect(self, tool: Tool, record: OpRecord) -> str:
        """The effect of this call: the one already journaled for it when it was asked
        about (a decision made once stays made), else the tool's, refined per call."""
        if tool.effect_of is None:
            return tool.effect
        if record.status == "awaiting_approval" or record.effect != tool.effect:
            return record.effect
        store, task_id = self.run.store, self.run.journal.task_id

        async def journal(
            tools: Collection[str], statuses: Collection[str] | None = None
        ) -> list[OpRecord]:
            # With the arguments actually sent (a human's `modify`), not as asked.
            ops = await store.get_ops(task_id, statuses, tools=tools)
            return as_sent(ops, await store.get_approvals(task_id, statuses={"approved"}))

        async def earlier(
            tools: Collection[str], statuses: Collection[str] | None = None
        ) -> list[OpRecord]:
            # Read only when a hook asks (a file there before this task started): the
            # earlier occurrences of its schedule, which share its workspace.
            if statuses is not None and "succeeded" not in statuses:
                return []
            found: list[OpRecord] = []
            for other in launch.earlier_occurrences(await launch.read(store, task_id)):
                ops = await store.get_ops(other, ("succeeded",), tools=tools)
                if ops:
                    approved = await store.get_approvals(other, statuses={"approved"})
                    found += as_sent(ops, approved)
            return found

        ctx = replace(
            self.attempts.context(tool, record, record.attempts), journal=journal, earlier=earlier
        )
        return await tool.call_effect(record.args, ctx)

    # ------------------------------------------------------------------ the request

    async def _ask(
        self,
        tool: Tool,
        record: OpRecord,
        *,
        impact: str,
        effect: str,
        options: tuple[str, ...] = ("approve", "reject", "modify"),
        journal_intent: bool = True,
    ) -> ApprovalRecord:
        """Ask `<op>.approval`, committed with the op as `awaiting_approval`. Asked for
        its effect (`journal_intent`), the call was not journaled yet: its intent goes
        in with the request, with the effect the decision is about."""
        ask = self.requests.ask(
            approval_id(record.op_id),
            record,
            kind="op",
            what=f"{tool.name}({args_text(record, 300)})",
            impact=impact,
            options=options,
            effect=effect,
        )
        waiting = replace(record, status="awaiting_approval")
        events: list[ev.Event] = [ask.event]
        if journal_intent:
            events.insert(0, intent(tool, record).model_copy(update={"effect": effect}))
            waiting = replace(waiting, effect=effect)
        await self.run.journal.commit(events, ops=[waiting], approvals=[ask.record])
        return ask.record

    async def _approved(
        self, tool: Tool, call: ToolCall, record: OpRecord, appr: ApprovalRecord
    ) -> Mapping[str, Any] | R.OpOutcome | R.Wait:
        """The approved arguments (the call runs with `ctx.approved`), or a refusal."""
        decided = await self._decided(tool, call, record, appr)
        if isinstance(decided, R.OpOutcome | R.Wait):
            return decided
        self.book.approved.add(record.op_id)
        return decided if decided is not None else dict(record.args)

    async def _decided(
        self, tool: Tool, call: ToolCall, record: OpRecord, appr: ApprovalRecord
    ) -> Mapping[str, Any] | R.OpOutcome | R.Wait | None:
        """`Wait` while a request is pending; a rejection's outcome; else the approved
        (maybe modified) arguments, or None."""
        run = self.run
        if appr.status == "pending":
            return R.Wait(
                out.waiting(
                    "approval",
                    f"approve or reject {appr.request['what']}: "
                    f"{hints.approve(run.journal.task_id, appr.request_id)} or "
                    f"{hints.reject(run.journal.task_id, appr.request_id)}",
                    why="approval required",
                    request_id=appr.request_id,
                )
            )
        if appr.status == "closed":
            return R.failure(call, tool, record, "not_sent", closed_msg(appr), 0.0)
        if appr.status == "rejected":
            who = appr.decided_by or "a human"
            msg = f"not permitted: {who} rejected {tool.name} for this call"
            reason = (appr.decision or {}).get("reason")
            if reason:
                msg += f" ({reason})"
            op = (record.op_id, run.journal.task_id, record.round, record.call_index)
            return R.refused(call, op, tool.name, msg, "rejected", run.view.task.version)
        modified = (appr.decision or {}).get("modified_args")
        return dict(modified) if isinstance(modified, Mapping) else None

    def _needed(self, tool: Tool, effect: str) -> bool:
        perm = self.run.view.spec.permission(tool.name)
        if perm is not None and perm.approval is not None:
            return perm.approval
        return effect in RISKY


def _impact(tool: Tool, effect: str, args: Mapping[str, Any]) -> str:
    """What an approval request says the call would do."""
    path = args.get("path")
    if effect == "overwrite" and tool.effect_of is not None and isinstance(path, str):
        # Only a per-call refinement knows the thing was there before the task.
        return f"overwrites {path}, which existed before the task started"
    article = "an" if effect[:1] in "aeiou" else "a"
    return f"{article} {effect} action on {tool.service or 'an external system'}"
