"""Ops in doubt: a call whose outcome nobody can tell, and calls found unfinished
after a crash.

An op is in doubt when its response was lost (or the worker crashed while it was in
flight), its tool cannot reconcile (or reconcile cannot tell) and sending it again is
not safe (not idempotent). Then a human decides, never a guess: `<op>.in_doubt`, one
request per attempt (approve: send again with the same key; approve --done: it did take
effect; reject: record it as failed).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from tether import events as ev
from tether.models.base import ToolCall
from tether.runtime.ops import results as R
from tether.runtime.ops.human.exhausted import Asks
from tether.runtime.ops.human.requests import DONE_OPTIONS, done_by_hand
from tether.runtime.ops.journal import args_text
from tether.runtime.run.outcome import Outcome
from tether.store.base import OpRecord
from tether.tools.registry import Tool

if TYPE_CHECKING:
    pass


class Doubt(Asks):
    """Ops in doubt, and the recovery of ops found unfinished."""

    async def ask(self, tool: Tool, record: OpRecord, detail: str) -> R.Wait | None:
        """An op whose outcome nobody can tell: `Wait` for a human (asked once: a resume
        while the request is pending only waits again); None once a human decided."""
        request_id, appr = await self.requests.in_doubt(record)
        if appr is not None and appr.status != "pending":
            return None
        first = appr is None
        extra: list[ev.Event] = []
        if appr is None:
            ask = self.requests.ask(
                request_id,
                record,
                kind="op_in_doubt",
                what=f"did {tool.name}({args_text(record, 200)}) take effect? (outcome "
                f"unknown after {detail})",
                impact="approve to send it again with the same idempotency key, "
                "approve --done if it did take effect, reject to record it as failed",
                options=DONE_OPTIONS,
            )
            appr = ask.record
            extra = [
                ev.AuditWarning(
                    code="op_in_doubt",
                    message=f"the outcome of {record.op_id} ({tool.name}) is unknown and the tool "
                    "can neither be reconciled nor safely retried; a human must decide",
                    details={"op_id": record.op_id, "detail": detail},
                ),
                ask.event,
            ]
        tid = self.run.journal.task_id
        waiting = {
            "kind": "human",
            "request_id": request_id,
            "ops": [record.op_id],
            "reason": f"{appr.request['what']}; check it, then: tether approve {tid} "
            f"{request_id} (send again), tether approve {tid} {request_id} --done (it "
            f"happened) or tether reject {tid} {request_id} (record as failed)",
        }
        return R.Wait(
            Outcome(
                "waiting",
                reason="op outcome unknown",
                waiting=waiting,
                events=tuple(extra),
                ops=(replace(record, status="unknown"),) if first else (),
                approvals=(appr,) if first else (),
            )
        )

    async def recover(
        self, tool: Tool, call: ToolCall, record: OpRecord, status: str
    ) -> R.OpOutcome | R.Wait | None:
        """An op found unfinished after a crash (`status`: its state, as recovery sees
        it): settled here (an outcome), `Wait` for a human, or None to send it (again)
        with its original op id."""
        if status in ("retry_wait", "awaiting_approval"):
            return None  # resume the stored schedule / send the approved call
        _, human = await self.requests.in_doubt(record)
        if human is not None and human.status == "approved":
            # A human checked the outside world: it did happen. Backfill, never resend.
            done, result = done_by_hand(human)
            return self.attempts.success(call, tool, record, result, 0.0) if done else None
        if human is not None and human.status == "rejected":
            who = human.decided_by or "a human"
            msg = f"{who} recorded this call as failed"
            reason = (human.decision or {}).get("reason")
            if reason:
                msg += f" ({reason})"
            return R.failure(call, tool, record, "deterministic", msg, 0.0)
        effectful = tool.effect != "read"
        if status == "intended" and effectful and not tool.idempotent and tool.reconcile is None:
            # No `dispatched` mark was written: the crash came before sending.
            return None
        if tool.reconcile is not None and effectful:
            rec = await self.attempts.reconcile(tool, record)
            if rec.outcome == "done":
                return self.attempts.success(call, tool, record, rec.result, 0.0)
            if rec.outcome == "not_done":
                return None
        if tool.idempotent or not effectful:
            return None  # the same idempotency key makes a second send harmless
        detail = "a lost response" if status == "unknown" else "a crash while it was in flight"
        return await self.ask(tool, record, detail)
