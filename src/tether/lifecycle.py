"""The task state machine: every state, every allowed transition, in one place.

Non-terminal states: `queued` (ready for a worker), `running` (a worker holds the
lease), `waiting` (for a human, an external system, a retry time or more budget),
`suspended` (parked by a budget cap or an admin), `stalled` (the watchdog found a
stale heartbeat), `paused` (a person paused it: `tether pause`; only `resume` moves it
on, no worker takes it by itself). Terminal states carry a `stop_reason`: `satisfied`, `abandoned`,
`cancelled`, `failed`.

`transition` is the one builder of a status change: the journaled event and the fields
of the task row that go with it, checked against `TRANSITIONS`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, Required, TypedDict, get_args

from tether import errors

if TYPE_CHECKING:  # the event models load where a change is built, not to read a status
    from tether import events as ev

Status = Literal[
    "queued",
    "running",
    "waiting",
    "suspended",
    "stalled",
    "paused",
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
]

STATUSES: Final[tuple[str, ...]] = get_args(Status)
STOP_REASONS: Final[tuple[str, ...]] = get_args(StopReason)
TERMINAL: Final[frozenset[str]] = frozenset({"satisfied", "abandoned", "cancelled", "failed"})
ACTIVE: Final[frozenset[str]] = frozenset(STATUSES) - TERMINAL

#: Every allowed transition. A terminal task may only be re-opened (back to `queued`)
#: by a goal change, which raises its version, or by `tether verify` finding what it
#: rests on broken; a cancelled task stays cancelled.
TRANSITIONS: Final[dict[str, frozenset[str]]] = {
    "queued": frozenset({"running", "suspended", "paused", "cancelled", "abandoned", "failed"}),
    # The worker holding the lease may end a round in any other state.
    "running": frozenset(STATUSES) - {"running"},
    "waiting": frozenset(
        {"queued", "running", "suspended", "paused", "cancelled", "abandoned", "failed"}
    ),
    "suspended": frozenset({"queued", "running", "paused", "cancelled", "abandoned", "failed"}),
    "stalled": frozenset(
        {"queued", "running", "suspended", "paused", "cancelled", "abandoned", "failed"}
    ),
    "paused": frozenset({"queued", "running", "cancelled", "abandoned", "failed"}),
    # A delivered task whose pinned source drifted (`tether verify`) waits for a person.
    "satisfied": frozenset({"queued", "waiting"}),
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
    # The contract's `on_budget_exhausted` / `on_unanswered: fail` (`spec_policies`).
    "failed": frozenset(
        {"environment_unrecoverable", "budget_exhausted", "needs_user_input", "max_rounds"}
    ),
}
#: The stop reasons `tether abandon --code` may give (the default: `abandoned_by_user`).
ABANDON_CODES: Final[tuple[str, ...]] = tuple(
    r for r in STOP_REASONS if r in TERMINAL_REASONS["abandoned"]
)


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


# --- the one builder of a status change ------------------------------------------------

#: The longest wait's own words (`TaskStatusChanged.told`) a status change keeps.
MAX_TOLD_CHARS = 1000


class Keep(enum.Enum):
    """Leave a field of the task row as it is (see `transition`)."""

    KEEP = "keep"


#: Leave the field as it is.
KEEP: Final = Keep.KEEP


class Moving(Protocol):
    """What `transition` reads of a task: a stored task row, or a run of one."""

    @property
    def task_id(self) -> str:
        """The task's id."""
        ...

    @property
    def status(self) -> str:
        """Its status now (the change's source)."""
        ...


class StatusPatch(TypedDict, total=False):
    """The fields of the task row a status change sets, named as `TaskPatch` names them
    (`TaskPatch(**patch, ...)`); a field absent is left as it is."""

    status: Required[str]
    stop_reason: Required[str | None]
    waiting: dict[str, Any] | None
    wake_at: float | None


def transition(
    task: Moving,
    to: str,
    why: str = "",
    *,
    stop_reason: str | None = None,
    waiting: Mapping[str, Any] | Keep | None = None,
    wake_at: float | Keep | None = None,
) -> tuple[ev.TaskStatusChanged, StatusPatch]:
    """The status change of `task` to `to` (`why`: the event's reason): its journaled
    event and the task-row fields to commit with it, in one write.

    Raises `IllegalTransition` unless `TRANSITIONS` allows it (with `stop_reason`, which
    a terminal state needs). The wait ends with the state it belongs to: `waiting` (the
    wait's document) and `wake_at` are cleared unless given, or kept as they are with
    `KEEP`. Moving to `waiting` with a document that has a `reason` journals those words
    as the event's `told` (what a notice of the wait quotes, even sent later).
    """
    from tether import events as ev

    check_transition(task.status, to, stop_reason, task_id=task.task_id)
    told = ""
    if to == "waiting" and isinstance(waiting, Mapping) and waiting.get("reason"):
        told = str(waiting["reason"])[:MAX_TOLD_CHARS]
    event = ev.TaskStatusChanged(
        src=task.status, dst=to, stop_reason=stop_reason, reason=why, told=told
    )
    patch: StatusPatch = {"status": to, "stop_reason": stop_reason}
    if not isinstance(waiting, Keep):
        patch["waiting"] = dict(waiting) if waiting is not None else None
    if not isinstance(wake_at, Keep):
        patch["wake_at"] = wake_at
    return event, patch
