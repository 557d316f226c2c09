"""An in-memory ticket tracker whose `create_ticket` tool retries and can be undone
(`compensate`), counting every call: the compensation tests of the integration and
adversarial tiers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import tether

#: Two attempts, no delay: a transient failure runs out at once.
FAST = tether.RetryPolicy(max_attempts=2, base_delay=0.0)


@dataclass
class Tickets:
    """A ticket service in memory: which calls were made, in order."""

    created: dict[str, str] = field(default_factory=dict)
    sends: list[str] = field(default_factory=list)
    cancels: list[str] = field(default_factory=list)
    #: Titles whose creation fails transiently, and for how many more sends.
    failing: dict[str, int] = field(default_factory=dict)
    #: Ops whose cancellation fails transiently, for how many more sends.
    cancel_failing: dict[str, int] = field(default_factory=dict)
    #: Ops whose cancellation takes effect but loses its answer, for how many more sends.
    cancel_lost: dict[str, int] = field(default_factory=dict)

    def tools(self, policy: tether.RetryPolicy = FAST) -> tether.Tool:
        def cancel_ticket(op: tether.OpRecord, ctx: tether.ToolContext) -> dict[str, Any]:
            self.cancels.append(op.op_id)
            left = self.cancel_failing.get(op.op_id, 0)
            if left:
                self.cancel_failing[op.op_id] = left - 1
                raise tether.RetryLater("the tracker is busy")
            assert ctx.op_id == f"{op.op_id}.compensate"
            assert op.result is not None and "T-" in str(op.result.get("content"))
            self.created.pop(op.op_id)
            lost = self.cancel_lost.get(op.op_id, 0)
            if lost:
                self.cancel_lost[op.op_id] = lost - 1
                raise tether.OutcomeUnknown("the connection dropped after the cancel")
            return {"cancelled": op.op_id}

        @tether.tool(effect="write", service="tickets", retry=policy, compensate=cancel_ticket)
        def create_ticket(title: str, ctx: tether.ToolContext) -> dict[str, Any]:
            """File a ticket."""
            self.sends.append(ctx.op_id)
            left = self.failing.get(title, 0)
            if left:
                self.failing[title] = left - 1
                raise tether.RetryLater("the tracker is busy", delay=0)
            ticket = f"T-{len(self.created) + 1}"
            self.created[ctx.op_id] = title
            return {"id": ticket, "title": title}

        return create_ticket
