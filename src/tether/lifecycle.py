"""The task state machine: every state, every allowed transition, in one place.

Non-terminal states: `queued` (ready for a worker), `running` (a worker holds the
lease), `waiting` (for a human, an external system, a retry time or more budget),
`suspended` (parked by a budget cap or an admin), `stalled` (the watchdog found a
stale heartbeat). Terminal states carry a `stop_reason`: `satisfied`, `abandoned`,
`cancelled`, `failed`.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

from tether import errors

Status = Literal[
    "queued",
    "running",
    "waiting",
    "suspended",
    "stalled",
    "satisfied",
    "abandoned",
    "cancelled",
    "failed",
]
StopReason = Literal[
    "delivered",
    "delivered_with_waivers",
    "abandoned_by_user",
    "budget_exhausted",
    "environment_unrecoverable",
    "needs_user_input",
    "non_convergent",
    "cancelled_by_user",
    "max_rounds",
    "internal_error",
]

STATUSES: Final[tuple[str, ...]] = get_args(Status)
STOP_REASONS: Final[tuple[str, ...]] = get_args(StopReason)
TERMINAL: Final[frozenset[str]] = frozenset({"satisfied", "abandoned", "cancelled", "failed"})
ACTIVE: Final[frozenset[str]] = frozenset(STATUSES) - TERMINAL

#: Every allowed transition. A terminal task may only be re-opened (back to `queued`)
#: by a goal change, which raises its version; a cancelled task stays cancelled.
TRANSITIONS: Final[dict[str, frozenset[str]]] = {
    "queued": frozenset({"running", "suspended", "cancelled", "abandoned", "failed"}),
    "running": frozenset(
        {
            "queued",
            "waiting",
            "suspended",
            "stalled",
            "satisfied",
            "abandoned",
            "cancelled",
            "failed",
        }
    ),
    "waiting": frozenset({"queued", "running", "suspended", "cancelled", "abandoned", "failed"}),
    "suspended": frozenset({"queued", "running", "cancelled", "abandoned", "failed"}),
    "stalled": frozenset({"queued", "running", "suspended", "cancelled", "abandoned", "failed"}),
    "satisfied": frozenset({"queued"}),
    "abandoned": frozenset({"queued"}),
    "failed": frozenset({"queued"}),
    "cancelled": frozenset(),
}

#: Which stop reasons each terminal state accepts.
TERMINAL_REASONS: Final[dict[str, frozenset[str]]] = {
    "satisfied": frozenset({"delivered", "delivered_with_waivers"}),
    "abandoned": frozenset(
        {
            "abandoned_by_user",
            "budget_exhausted",
            "environment_unrecoverable",
            "needs_user_input",
            "non_convergent",
            "max_rounds",
        }
    ),
    "cancelled": frozenset({"cancelled_by_user"}),
    "failed": frozenset({"environment_unrecoverable", "internal_error", "budget_exhausted"}),
}


def is_terminal(status: str) -> bool:
    """True for `satisfied`, `abandoned`, `cancelled` and `failed`."""
    return status in TERMINAL


def check_transition(
    src: str, dst: str, stop_reason: str | None = None, *, task_id: str | None = None
) -> None:
    """Raise `IllegalTransition` unless `src -> dst` (with `stop_reason`) is allowed.

    Staying in the same non-terminal state is allowed (a heartbeat or a projection
    update that does not move the task).
    """
    if src not in TRANSITIONS:
        raise errors.IllegalTransition(task_id, src, dst, "unknown source state")
    if dst not in TRANSITIONS:
        raise errors.IllegalTransition(task_id, src, dst, "unknown target state")
    if src == dst and src not in TERMINAL:
        if stop_reason is not None:
            raise errors.IllegalTransition(task_id, src, dst, "only terminal states stop")
        return
    if dst not in TRANSITIONS[src]:
        raise errors.IllegalTransition(task_id, src, dst)
    if dst in TERMINAL:
        if stop_reason is None:
            raise errors.IllegalTransition(
                task_id, src, dst, "a terminal state needs a stop_reason"
            )
        if stop_reason not in TERMINAL_REASONS[dst]:
            raise errors.IllegalTransition(
                task_id, src, dst, f"stop_reason {stop_reason!r} does not fit {dst!r}"
            )
    elif stop_reason is not None:
        raise errors.IllegalTransition(task_id, src, dst, "only terminal states stop")
