"""Time travel: the ledger and the task as they were at any event of the log.

The ledger's state is folded from the `ledger.updated` events: each carries the full
before/after of every field it changed (`tether.ledger.apply` writes it so), so setting
each field to its `after` value, in order, gives back the very state the runtime stored
with that event. A goal change (`task.edited`) restarts the items it lists as
invalidated. The items are the task's current contract's; an item a later edit dropped
still shows while events name it.

The task's state (status, stop reason, version, what it waited for, what it had spent)
is folded from the lifecycle and model-call events the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from tether import errors
from tether import ledger as L
from tether.runtime.tasks import item_rows
from tether.store.base import Store, StoredEvent

#: Fields of an item's state a ledger diff may set (see `tether.ledger.apply`).
_ITEM_FIELDS = ("status", "evidence", "attempts", "breaker", "note")
#: What a task waits for, by the event that asked (see `tether.runtime.run.outcome`).
_WAIT_KIND = {"approval.requested": "approval", "decision.requested": "decision"}


@dataclass
class LedgerFold:
    """The ledger's item states while the event log is read in order."""

    skeleton: L.Skeleton
    states: dict[str, dict[str, Any]] = field(default_factory=dict)
    version: int = 0

    @classmethod
    def start(cls, skeleton: Mapping[str, Any]) -> LedgerFold:
        """Every item pending, version 0 (the ledger a task is created with)."""
        sk = L.Skeleton.from_dict(skeleton)
        return cls(sk, {d.id: L.ItemState().to_dict() for d in sk.items})

    def apply(self, event: StoredEvent) -> bool:
        """Fold one event in; True when it changed the ledger."""
        if event.type == "ledger.updated":
            for change in event.data.get("diff", []):
                item = str(change.get("item"))
                fname = change.get("field")
                if fname not in _ITEM_FIELDS:
                    continue
                state = self.states.setdefault(item, L.ItemState().to_dict())
                state[fname] = change.get("after")
            self.version = int(event.data.get("version", self.version))
            return True
        if event.type == "task.edited":
            for item in event.data.get("invalidated", []):
                self.states[str(item)] = L.ItemState().to_dict()
            return True
        return False

    def ledger(self) -> L.Ledger:
        """The folded state as a domain ledger (items of the contract first)."""
        known = {d.id for d in self.skeleton.items}
        dropped = tuple(
            L.ItemDef(item_id, "(dropped by a later edit)")
            for item_id in self.states
            if item_id not in known
        )
        sk = L.Skeleton(
            objective=self.skeleton.objective,
            items=self.skeleton.items + dropped,
            acceptance=self.skeleton.acceptance,
            milestones=self.skeleton.milestones,
        )
        return L.Ledger.from_parts(sk.to_dict(), self.states, self.version)


@dataclass
class TaskFold:
    """The task's lifecycle and spending while the event log is read in order."""

    status: str = "queued"
    stop_reason: str | None = None
    version: int = 1
    waiting: dict[str, Any] | None = None
    rounds: int = 0
    model_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0
    first_at: float | None = None
    last_at: float | None = None
    #: Why the task last asked for someone, until its status says it waits.
    _asked: dict[str, Any] | None = None

    def apply(self, event: StoredEvent) -> None:
        """Fold one event in."""
        self.first_at = event.at if self.first_at is None else self.first_at
        self.last_at = event.at
        self.version = max(self.version, event.task_version)
        d = event.data
        if event.type == "task.status":
            self.status = str(d.get("dst"))
            self.stop_reason = d.get("stop_reason")
            if self.status == "waiting":
                self.waiting = {"reason": d.get("reason", ""), **(self._asked or {})}
            else:
                self.waiting = None
            self._asked = None
        elif event.type in _WAIT_KIND:
            self._asked = {"kind": _WAIT_KIND[event.type]}
            if event.type == "decision.requested":
                self._asked["partial"] = d.get("partial", {})
            else:
                self._asked["request_id"] = d.get("request_id")
        elif event.type == "round.committed":
            self.rounds += 1
        elif event.type == "model.called":
            self.model_calls += 1
            self.input_tokens += int(d.get("input_tokens", 0))
            self.output_tokens += int(d.get("output_tokens", 0))
            self.cached_tokens += int(d.get("cached_tokens", 0))
            self.cost_usd += float(d.get("cost_usd", 0.0))
        elif event.type == "task.edited":
            self.version = int(d.get("new_version", self.version))

    def used(self) -> dict[str, Any]:
        """What the task had spent, in the shape of `status --json`'s `budget.used`
        (wall time here is the time between the first and the last event)."""
        span = (self.last_at or 0.0) - (self.first_at or 0.0)
        return {
            "tokens": self.input_tokens + self.output_tokens,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            "money_usd": round(self.cost_usd, 6),
            "wall_seconds": round(span, 3),
            "rounds": self.rounds,
            "model_calls": self.model_calls,
        }


def replay(
    skeleton: Mapping[str, Any], events: Iterable[StoredEvent]
) -> Iterator[tuple[StoredEvent, LedgerFold, TaskFold]]:
    """Each event with the ledger and task states just after it (the same two objects,
    updated in place: copy what you keep)."""
    lf = LedgerFold.start(skeleton)
    tf = TaskFold()
    for e in events:
        lf.apply(e)
        tf.apply(e)
        yield e, lf, tf


def _item_rows(ledger: L.Ledger) -> list[dict[str, Any]]:
    return item_rows(ledger)


async def status_at(store: Store, task_id: str, seq: int) -> dict[str, Any]:
    """The `status --json` document as of event `seq` (its fields, plus `at`: the seq and
    time of that event). Lease, heartbeat, budget and loop limits are today's; `wall_seconds`
    is the time since the first event. `UserError` for a seq the log does not have."""
    task = await store.get_task(task_id)
    if seq < 1 or seq > task.last_seq:
        raise errors.UserError(
            f"task {task_id} has events 1 to {task.last_seq}; there is no event {seq}"
        )
    skeleton = (await store.get_ledger(task_id)).skeleton
    events = await store.read_events(task_id, limit=seq)
    lf, tf, last = LedgerFold.start(skeleton), TaskFold(), events[-1]
    for e in events:
        lf.apply(e)
        tf.apply(e)
    ledger = lf.ledger()
    return {
        "task_id": task.task_id,
        "name": task.name,
        "version": tf.version,
        "status": tf.status,
        "stop_reason": tf.stop_reason,
        "current_milestone": ledger.current_milestone(),
        "workspace": task.workspace,
        "ledger": {
            "objective": ledger.skeleton.objective,
            "version": ledger.version,
            "progress": ledger.progress().to_dict(),
            "items": _item_rows(ledger),
        },
        "waivers": [
            {"id": d.id, "status": s.status, "reason": s.note}
            for d, s in ledger.items()
            if s.status in ("waived", "skipped")
        ],
        "budget": {"limits": dict(task.spec.get("budget", {})), "used": tf.used()},
        "limits": dict(task.spec.get("limits", {})),
        "waiting": tf.waiting,
        "lease": {"owner": None, "expires_at": None, "fencing_token": last.fencing_token},
        "heartbeat_at": None,
        "created_at": task.created_at,
        "updated_at": last.at,
        "last_seq": last.seq,
        "at": {"seq": last.seq, "time": last.at, "type": last.type},
    }
