"""How a round ends when the task does not simply go on, and the one place that turns
that into a status change.

The parts of a round never move the task's status themselves: they say what happened
as an `Outcome` — interrupted, cancelled, waiting (for a human, a decision, an
approval, a retry time, a service, more budget), suspended, finished — carried up by a
`Stop`, and the engine hands it to `apply`, which checks the transition against the
state machine and commits it with its event (and whatever the outcome brings along:
the approval request it waits for, the op in doubt, threshold events) in one write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tether import events as ev
from tether import lifecycle
from tether.runtime.run.ports import Commit
from tether.store.base import ApprovalRecord, OpRecord

if TYPE_CHECKING:
    from tether.runtime.run.ports import Journal


@dataclass(frozen=True)
class Outcome:
    """Where the task goes when the round stops, and why."""

    status: str
    stop_reason: str | None = None
    reason: str = ""
    waiting: Mapping[str, Any] | None = None
    wake_at: float | None = None
    events: tuple[ev.Event, ...] = ()
    ops: tuple[OpRecord, ...] = ()
    approvals: tuple[ApprovalRecord, ...] = ()
    #: Committed as they are; the status is already what it should be.
    committed: bool = field(default=False, compare=False)
    #: The run goes on in a fresh turn (its goal changed: an edit it applied).
    again: bool = field(default=False, compare=False)


class Stop(Exception):
    """Carries an `Outcome` up to the engine (the round cannot go on)."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.reason or outcome.status)
        self.outcome = outcome


# --- the outcomes ---------------------------------------------------------------------


def interrupted(reason: str) -> Outcome:
    """Back to the queue: a stop request, a goal change, this run's round limit."""
    return Outcome("queued", reason=reason)


def cancelled() -> Outcome:
    """A cancel request was seen."""
    return Outcome("cancelled", "cancelled_by_user", "cancel requested")


def waiting(
    kind: str,
    reason: str,
    *,
    why: str,
    until: float | None = None,
    events: Sequence[ev.Event] = (),
    ops: Sequence[OpRecord] = (),
    approvals: Sequence[ApprovalRecord] = (),
    **details: Any,
) -> Outcome:
    """The task waits: for a `human`, a `decision`, an `approval`, a `retry` time, an
    `external` system. `why` is the status event's short reason; `reason` what the
    person reading `status` is told."""
    doc: dict[str, Any] = {"kind": kind, "reason": reason, **details}
    if until is not None:
        doc["until"] = until
    return Outcome(
        "waiting",
        reason=why,
        waiting=doc,
        wake_at=until,
        events=tuple(events),
        ops=tuple(ops),
        approvals=tuple(approvals),
    )


def suspended(reason: str, *, why: str, events: Sequence[ev.Event] = (), **details: Any) -> Outcome:
    """Parked until a human raises a limit (a budget)."""
    return Outcome(
        "suspended", reason=why, waiting={"reason": reason, **details}, events=tuple(events)
    )


def finished(
    status: str, stop_reason: str, reason: str, *, events: Sequence[ev.Event] = ()
) -> Outcome:
    """A terminal state with its stop reason."""
    return Outcome(status, stop_reason, reason, events=tuple(events))


# --- the one place a round's end becomes a status change -----------------------------


async def apply(journal: Journal, outcome: Outcome) -> None:
    """Commit the outcome: its status (checked against the state machine), its event,
    and what it brings along, in one write."""
    if outcome.committed:
        return
    lifecycle.check_transition(
        journal.status, outcome.status, outcome.stop_reason, task_id=journal.task_id
    )
    await journal.set_status(
        outcome.status,
        outcome.stop_reason,
        outcome.reason,
        also=Commit(
            outcome.events,
            ops=outcome.ops,
            approvals=outcome.approvals,
            waiting=dict(outcome.waiting) if outcome.waiting is not None else None,
            wake_at=outcome.wake_at,
        ),
    )
    journal.snapshot(outcome.reason or outcome.status)
