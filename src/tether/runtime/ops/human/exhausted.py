"""Exhausted retries under `on_exhausted: ask_human`: a person decides.

The request `<op>.exhausted` (numbered from the second) offers: try again (a new
schedule, the same op and key), done another way (recorded as a success), or fail the
call (the model is told). The call waits as `awaiting_approval` until then.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tether import events as ev
from tether.models.base import ToolCall
from tether.runtime.ops import results as R
from tether.runtime.ops.attempt import Attempts
from tether.runtime.ops.human.requests import DONE_OPTIONS, Requests, done_by_hand
from tether.runtime.ops.journal import args_text, closed_msg
from tether.runtime.run.outcome import Outcome
from tether.store.base import ApprovalRecord, OpRecord
from tether.tools.registry import Tool

if TYPE_CHECKING:
    from tether.runtime.run.ports import OpsHost


def human_wait(task_id: str, appr: ApprovalRecord) -> dict[str, Any]:
    """What the task waits for while a person decides about an op's exhausted retries
    (or its failed compensation)."""
    rid = appr.request_id
    return {
        "kind": "human",
        "request_id": rid,
        "ops": [appr.op_id],
        "reason": f"{appr.request['what']}; decide: tether approve {task_id} {rid} (try "
        f"again), tether approve {task_id} {rid} --done (it was done another way) or "
        f"tether reject {task_id} {rid} ({appr.request.get('reject', 'fail the call')})",
    }


def wait_for_person(
    task_id: str, reason: str, appr: ApprovalRecord, *events: ev.Event, **more: Any
) -> R.Wait:
    """The round waits while a person decides about an op (`appr`: the request; see
    `human_wait`), with `events` and what `more` carries (the request's record, the op)."""
    return R.Wait(
        Outcome("waiting", reason=reason, waiting=human_wait(task_id, appr), events=events, **more)
    )


class Asks:
    """A part of ops that asks a person about an op (its approval, an op in doubt,
    exhausted retries): it reads the run, asks through `requests`, and sends the op
    again through `attempts` when the person says so."""

    def __init__(self, run: OpsHost, requests: Requests, attempts: Attempts) -> None:
        self.run = run
        self.requests = requests
        self.attempts = attempts


class Exhaustion(Asks):
    """Asks a person about a call whose retries ran out, and reads the answer."""

    async def ask(self, tool: Tool, record: OpRecord, error: str) -> R.Wait:
        """`on_exhausted: ask_human`: the call waits for a person."""
        request_id = await self.requests.numbered(record.op_id, "op_exhausted", "exhausted")
        ask = self.requests.ask(
            request_id,
            record,
            kind="op_exhausted",
            what=f"{tool.name}({args_text(record, 200)}) failed after its retries: {error[:300]}",
            impact="approve to try it again (a new round of attempts, the same idempotency "
            "key), approve --done if it was done another way, reject to fail the call (the "
            "model is told)",
            options=DONE_OPTIONS,
            attempts=record.attempts,
        )
        return wait_for_person(
            self.run.journal.task_id,
            "retries exhausted",
            ask.record,
            ev.OpExhausted(
                op_id=record.op_id,
                tool=tool.name,
                attempts=record.attempts,
                policy="ask_human",
                error=error[:300],
                item=self.run.view.state.focus_of(record.round),
            ),
            ask.event,
            ops=(
                replace(
                    record,
                    status="awaiting_approval",
                    next_attempt_at=None,
                    error={"class": "transient", "message": error},
                ),
            ),
            approvals=(ask.record,),
        )

    async def answer(
        self, tool: Tool, call: ToolCall, record: OpRecord, appr: ApprovalRecord
    ) -> R.OpOutcome | R.Wait | None:
        """A person's answer about a call whose retries ran out: still waiting (`Wait`),
        done another way (a success), failed (the model is told), or None: try again."""
        if appr.status == "pending":
            return wait_for_person(self.run.journal.task_id, "retries exhausted", appr)
        decision = appr.decision or {}
        who = appr.decided_by or "a human"
        if appr.status == "closed":
            return R.failure(call, tool, record, "not_sent", closed_msg(appr), 0.0)
        if appr.status == "rejected":
            msg = f"{who} decided not to try {tool.name} again after its retries ran out"
            if decision.get("reason"):
                msg += f" ({decision['reason']})"
            last = (record.error or {}).get("message")
            if last:
                msg += f"; last error: {str(last)[:200]}"
            return R.failure(call, tool, record, "transient", msg, 0.0)
        done, result = done_by_hand(appr)
        return self.attempts.success(call, tool, record, result, 0.0) if done else None
