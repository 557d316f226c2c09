"""Pure readers and builders of op records: ids, marks a record carries, its intent.

Nothing here reads the store or the run: judges, recovery and the other parts of `ops`
use these to tell what a journaled op means now.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tether import events as ev
from tether.store._rules import replaced
from tether.store.base import ApprovalRecord, OpRecord, blob_hash
from tether.tools.registry import Tool

#: Op states in which a call of an older task version is known not to be in flight: it
#: is not sent any more (the model decides again under the new contract).
NOT_IN_FLIGHT = frozenset({"awaiting_approval", "retry_wait"})
#: Contract fields whose edit raises the version without changing the goal: results of
#: the version before stay current.
NOT_THE_GOAL = frozenset({"limits", "budget", "notify", "services", "context", "models"})


def op_id_for(task_id: str, round_no: int, call_index: int) -> str:
    """Deterministic op id: the idempotency key of one tool call."""
    return f"{task_id}.r{round_no}.c{call_index}"


def compensation_id(op_id: str) -> str:
    """The op id (and idempotency key) of the compensation of an op."""
    return f"{op_id}.compensate"


def approval_id(op_id: str) -> str:
    """The request a human answers before an op is sent (for its effect, or because
    the tool asked)."""
    return f"{op_id}.approval"


def doubt_id(record: OpRecord) -> str:
    """The request a human answers about an op in doubt, one per attempt: approving a
    resend permits that one send; if its outcome is lost too, a human is asked again."""
    base = f"{record.op_id}.in_doubt"
    return base if record.attempts <= 1 else f"{base}.{record.attempts}"


def evolve(record: OpRecord, **changes: Any) -> OpRecord:
    """`dataclasses.replace(record, **changes)` without a pass through `__init__` (the
    store's `replaced`): a call replaces its record several times on the way (attempt,
    dispatch, result)."""
    return replaced(record, **changes)


#: `json.dumps(args, sort_keys=True, default=str)` made once: `dumps` with any keyword
#: builds an encoder per call (the same text either way).
_ARGS_ENCODER = json.JSONEncoder(sort_keys=True, default=str)


def hash_args(args: Mapping[str, Any]) -> str:
    """The hash of a call's arguments (its record's `args_hash`)."""
    return blob_hash(_ARGS_ENCODER.encode(args).encode())


def intent(tool: Tool, record: OpRecord) -> ev.OpIntended:
    """The journal entry written (and committed) before an op is sent."""
    return ev.OpIntended(
        op_id=record.op_id,
        tool=tool.name,
        args=record.args,
        round=record.round,
        call_index=record.call_index,
        effect=tool.effect,
    )


def compensation_of(record: OpRecord) -> str | None:
    """How an applied op was undone, if it was: `compensated` (by its compensation op),
    `done_by_hand` or `left` (a human's decision). Such an op is history only: it proves
    nothing for an item."""
    mark = (record.result or {}).get("compensation")
    return str(mark) if mark else None


def superseded_by(record: OpRecord) -> int | None:
    """The task version under which a late result of this op arrived, if it did: the
    op was decided under an older version, so its result is history only and proves
    nothing for the current contract (judges skip it)."""
    late = (record.result or {}).get("superseded_by")
    return int(late) if isinstance(late, int) else None


def history_only(record: OpRecord) -> bool:
    """True when an op's result proves nothing now: superseded by a newer goal, or
    compensated."""
    return superseded_by(record) is not None or compensation_of(record) is not None


def plan_of(record: OpRecord) -> dict[str, Any] | None:
    """The compensation plan journaled with a failed call, if it has one."""
    plan = (record.error or {}).get("compensation")
    return dict(plan) if isinstance(plan, Mapping) else None


def closed_msg(appr: ApprovalRecord) -> str:
    """What the model is told of a call whose request was closed before a decision."""
    reason = (appr.decision or {}).get("reason") or "closed"
    return f"not sent: its approval request {appr.request_id} was closed ({reason})"


def args_text(record: OpRecord, limit: int) -> str:
    """A call's arguments as a request shows them."""
    return json.dumps(record.args, ensure_ascii=False)[:limit]
