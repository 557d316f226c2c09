"""The requests for a human decision about ops: finding them, and building one.

Every request `ops` asks (an op's approval, an op in doubt, exhausted retries, a failed
compensation) is built by `Requests.ask`: the pending record and its
`approval.requested` event, from one description.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tether import events as ev
from tether.runtime.ops.journal import doubt_id
from tether.store.base import ApprovalRecord, OpRecord

if TYPE_CHECKING:
    from tether.clock import Clock
    from tether.runtime.run.ports import OpsHost

#: What a person may answer to a request that also accepts "it was done".
DONE_OPTIONS = ("approve", "done", "reject")


def done_by_hand(appr: ApprovalRecord) -> tuple[bool, Any]:
    """`(True, result)` when a person answered that the call did happen (`approve
    --done`, with the result they recorded, or a line saying who recorded it): the op is
    backfilled as a success and never sent again. `(False, None)` otherwise."""
    decision = appr.decision or {}
    if decision.get("decision") != "done":
        return False, None
    result = decision.get("result")
    if result is None:
        result = f"{appr.decided_by or 'a human'} recorded this call as done"
    return True, result


@dataclass(frozen=True)
class Ask:
    """A request for a human decision about one op, as built by `Requests.ask`."""

    record: ApprovalRecord
    event: ev.ApprovalRequested

    @property
    def request_id(self) -> str:
        """The request's id."""
        return self.record.request_id

    @property
    def what(self) -> str:
        """What the request asks."""
        return str(self.record.request["what"])


class Requests:
    """The approval requests of one task's ops."""

    def __init__(self, run: OpsHost) -> None:
        self.run = run

    @property
    def clock(self) -> Clock:
        """The run's clock (asked for when a request is made: most rounds make none,
        and the run's `tool_env` is built at each access)."""
        return self.run.tool_env.clock

    async def get(self, request_id: str) -> ApprovalRecord | None:
        """The approval request with this id, if the task has one."""
        for appr in await self.run.store.get_approvals(self.run.journal.task_id):
            if appr.request_id == request_id:
                return appr
        return None

    async def of_kind(self, op_id: str, kind: str) -> list[ApprovalRecord]:
        """The requests of this kind about this op, oldest first."""
        return [
            a
            for a in await self.run.store.get_approvals(self.run.journal.task_id)
            if a.op_id == op_id and a.request.get("kind") == kind
        ]

    async def latest(self, op_id: str, kind: str) -> ApprovalRecord | None:
        """The newest request of this kind about this op."""
        asked = await self.of_kind(op_id, kind)
        return max(asked, key=lambda a: (a.created_at, a.request_id), default=None)

    async def numbered(self, op_id: str, kind: str, stem: str) -> str:
        """A new request id `<op_id>.<stem>`, numbered from the second one of its kind."""
        n = len(await self.of_kind(op_id, kind)) + 1
        return f"{op_id}.{stem}" + (f".{n}" if n > 1 else "")

    async def in_doubt(self, record: OpRecord) -> tuple[str, ApprovalRecord | None]:
        """The id of the request about this op in doubt, and the request if asked: a
        request closed with its task (which an edit re-opened since) is asked again
        under a new id, never taken as an answer."""
        base = rid = doubt_id(record)
        n = 1
        while True:
            appr = await self.get(rid)
            if appr is None or appr.status != "closed":
                return rid, appr
            n += 1
            rid = f"{base}.reopened{n}"

    async def attempt_base(self, record: OpRecord) -> int:
        """The attempts an op had made when a human last said "try again" after its
        retries were exhausted (or its compensation failed): its schedule counts from
        there."""
        if record.attempts <= 1:
            return 0
        base = 0
        approved = await self.run.store.get_approvals(
            self.run.journal.task_id, statuses={"approved"}
        )
        for a in approved:
            if a.op_id != record.op_id:
                continue
            if a.request.get("kind") not in ("op_exhausted", "compensation_failed"):
                continue
            if (a.decision or {}).get("decision") == "done":
                continue
            base = max(base, int(a.request.get("attempts") or 0))
        return base

    def ask(
        self,
        request_id: str,
        record: OpRecord,
        *,
        kind: str,
        what: str,
        impact: str,
        options: tuple[str, ...] = ("approve", "reject", "modify"),
        **extra: Any,
    ) -> Ask:
        """A pending request for a human decision about one op, with its event."""
        event = ev.ApprovalRequested(
            request_id=request_id,
            what=what,
            impact=impact,
            op_id=record.op_id,
            options=list(options),
        )
        appr = ApprovalRecord(
            request_id=request_id,
            task_id=self.run.journal.task_id,
            op_id=record.op_id,
            status="pending",
            request={
                "kind": kind,
                "tool": record.tool,
                "args": record.args,
                "what": what,
                "impact": impact,
                "options": list(options),
                **extra,
            },
            created_at=self.clock.now(),
        )
        return Ask(appr, event)
