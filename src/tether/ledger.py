"""The goal ledger: the runtime-owned truth about a task's progress.

The ledger has a *skeleton* (objective, acceptance criteria, milestones and items; it
changes only when the goal changes) and a *state* (per item: status, evidence refs,
attempts, breaker count, note). It lives in the store, outside the conversation, so
no compaction can reach it.

Every transition is a pure function returning a `LedgerUpdate` (the new ledger and the
diff). The version rises exactly when the diff is non-empty, and an item may become
`done` only with at least one evidence ref. Rendering is deterministic: the same state
renders byte-identically, which keeps provider prompt caches warm.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import Any, Final, Literal, get_args

from tether import errors
from tether.ledger_tally import carry, counted, first_ready, ready_milestone, tally

ItemStatus = Literal["pending", "in_progress", "done", "blocked", "skipped", "waived"]
ITEM_STATUSES: Final[tuple[str, ...]] = get_args(ItemStatus)
OPEN_STATUSES: Final[frozenset[str]] = frozenset({"pending", "in_progress"})
#: The mark of each status, in front of an item's line.
MARK: Final[dict[str, str]] = {
    "pending": "[ ]",
    "in_progress": "[~]",
    "done": "[x]",
    "blocked": "[!]",
    "skipped": "[-]",
    "waived": "[w]",
}


@dataclass(frozen=True)
class ItemDef:
    """A checklist item as the contract declares it."""

    id: str
    title: str
    milestone: str | None = None
    #: The contract lets this item end `skipped` (with a reason) instead of `done`.
    optional: bool = False
    #: Items that must be finished before this one starts (the contract's `after`).
    after: tuple[str, ...] = ()


@dataclass(frozen=True)
class Skeleton:
    """The stable part of the ledger: rewritten only when the goal changes."""

    objective: str
    items: tuple[ItemDef, ...]
    acceptance: tuple[tuple[str, str], ...] = ()
    milestones: tuple[tuple[str, str], ...] = ()

    @cached_property
    def ordered(self) -> bool:
        """True when some item must wait for others (the contract's `after`)."""
        return any(d.after for d in self.items)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "objective": self.objective,
            "acceptance": [{"id": i, "description": d} for i, d in self.acceptance],
            "milestones": [{"id": i, "title": t} for i, t in self.milestones],
            "items": [
                {"id": i.id, "title": i.title, "milestone": i.milestone}
                | ({"optional": True} if i.optional else {})
                | ({"after": list(i.after)} if i.after else {})
                for i in self.items
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Skeleton:
        """Inverse of `to_dict`."""
        return cls(
            objective=data["objective"],
            acceptance=tuple((a["id"], a["description"]) for a in data.get("acceptance", [])),
            milestones=tuple((m["id"], m["title"]) for m in data.get("milestones", [])),
            items=tuple(
                ItemDef(
                    i["id"],
                    i["title"],
                    i.get("milestone"),
                    bool(i.get("optional", False)),
                    tuple(i.get("after", ())),
                )
                for i in data.get("items", [])
            ),
        )


@dataclass(frozen=True)
class ItemState:
    """The audited state of one item."""

    status: ItemStatus = "pending"
    evidence: tuple[str, ...] = ()
    attempts: int = 0
    breaker: int = 0
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "status": self.status,
            "evidence": list(self.evidence),
            "attempts": self.attempts,
            "breaker": self.breaker,
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ItemState:
        """Inverse of `to_dict`."""
        status = data.get("status", "pending")
        if status not in ITEM_STATUSES:
            raise errors.LedgerError(f"unknown item status {status!r}")
        return cls(
            status=status,
            evidence=tuple(data.get("evidence", ())),
            attempts=int(data.get("attempts", 0)),
            breaker=int(data.get("breaker", 0)),
            note=str(data.get("note", "")),
        )


@dataclass(frozen=True)
class FieldChange:
    """One field of one item that changed."""

    item_id: str
    field: str
    before: Any
    after: Any

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        before = list(self.before) if isinstance(self.before, tuple) else self.before
        after = list(self.after) if isinstance(self.after, tuple) else self.after
        return {"item": self.item_id, "field": self.field, "before": before, "after": after}


@dataclass(frozen=True)
class LedgerDiff:
    """What a transition changed; empty when nothing did."""

    changes: tuple[FieldChange, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.changes)

    def to_list(self) -> list[dict[str, Any]]:
        """JSON-ready form."""
        return [c.to_dict() for c in self.changes]

    def status_changes(self) -> dict[str, tuple[str, str]]:
        """`{item_id: (before, after)}` for status changes only."""
        return {c.item_id: (c.before, c.after) for c in self.changes if c.field == "status"}


#: `Progress`'s fields after `total`, in order.
_PROGRESS_ORDER = ("done", "pending", "in_progress", "blocked", "skipped", "waived")
#: The empty diff (frozen: one serves every transition that changes nothing).
_NO_DIFF: Final = LedgerDiff()


@dataclass(frozen=True)
class Progress:
    """Counts of items by status."""

    total: int
    done: int
    pending: int
    in_progress: int
    blocked: int
    skipped: int
    waived: int = 0

    @classmethod
    def of(cls, counts: Mapping[str, int]) -> Progress:
        """The progress of items counted by status (a status missing counts 0)."""
        return cls(sum(counts.values()), *(counts.get(s, 0) for s in _PROGRESS_ORDER))

    @cached_property  # (a ledger's progress is made once, then asked every round)
    def percent(self) -> float:
        """Share of items done, 0-100."""
        return round(100.0 * self.done / self.total, 1) if self.total else 100.0

    @property
    def open(self) -> int:
        """Items still to work on (pending or in progress)."""
        return self.pending + self.in_progress

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {**asdict(self), "percent": self.percent}


@dataclass(frozen=True)
class Ledger:
    """Skeleton plus state, with a version that rises on every non-empty diff."""

    skeleton: Skeleton
    states: tuple[ItemState, ...]
    version: int = 0
    _index: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.states) != len(self.skeleton.items):
            raise errors.LedgerError("ledger state does not match its skeleton")
        if not self._index:
            object.__setattr__(self, "_index", {d.id: n for n, d in enumerate(self.skeleton.items)})

    # -- reading --------------------------------------------------------------------

    def item(self, item_id: str) -> ItemState:
        """The state of one item; `LedgerError` if the id is unknown."""
        try:
            return self.states[self._index[item_id]]
        except KeyError:
            raise errors.LedgerError(f"unknown ledger item {item_id!r}") from None

    def has_item(self, item_id: str) -> bool:
        """True if the skeleton declares this item."""
        return item_id in self._index

    def definition(self, item_id: str) -> ItemDef:
        """The contract's definition of one item."""
        self.item(item_id)
        return self.skeleton.items[self._index[item_id]]

    def items(self) -> Iterable[tuple[ItemDef, ItemState]]:
        """Items in contract order."""
        return zip(self.skeleton.items, self.states, strict=True)

    def progress(self, milestone: str | None = None) -> Progress:
        """Counts by status, for the whole ledger or one milestone."""
        if milestone is None:
            return counted(self, Progress.of)  # carried from round to round, made once
        counts = dict.fromkeys(ITEM_STATUSES, 0)
        for d, s in self.items():
            if milestone is None or d.milestone == milestone:
                counts[s.status] += 1
        return Progress.of(counts)

    def open_items(self) -> list[str]:
        """Ids of items still pending or in progress, in contract order, except items held
        by a predecessor that is blocked (see `held_by`): nothing can be done on those
        until a human decides about the predecessor."""
        held = self._held()
        return [d.id for d, s in self.items() if s.status in OPEN_STATUSES and d.id not in held]

    def has_open(self) -> bool:
        """`bool(open_items())`, without a walk over every item when no item waits."""
        return tally(self).open > 0 and (not self.skeleton.ordered or bool(self.open_items()))

    def waiting_for(self, item_id: str) -> list[str]:
        """The item's predecessors (`after`) that are not finished yet."""
        return [
            p
            for p in self.definition(item_id).after
            if self.has_item(p) and not self.is_finished(p)
        ]

    def is_ready(self, item_id: str) -> bool:
        """True when every predecessor of the item is finished: work on it may start."""
        return not self.waiting_for(item_id)

    def held_by(self, item_id: str) -> list[str]:
        """The unfinished, not open items (blocked, or skipped without the contract's
        leave) that keep this item from ever starting, directly or through a chain of
        predecessors; empty when nothing holds it."""
        return self._held().get(item_id, [])

    def _held(self) -> dict[str, list[str]]:
        """`{item: [stuck predecessors]}` for every item a stuck predecessor holds."""
        if not self.skeleton.ordered:
            return {}
        held: dict[str, list[str]] = {}
        # Predecessors first (Kahn's order; iterative, so a long chain cannot overflow
        # the stack). An item in a cycle (only a hand-built ledger has one) is skipped.
        preds = {d.id: [p for p in d.after if self.has_item(p)] for d in self.skeleton.items}
        succs: dict[str, list[str]] = {d.id: [] for d in self.skeleton.items}
        missing = {k: len(v) for k, v in preds.items()}
        for k, v in preds.items():
            for p in v:
                succs[p].append(k)
        ready = [k for k, n in missing.items() if n == 0]
        while ready:
            item_id = ready.pop()
            found: list[str] = []
            for p in self.waiting_for(item_id):
                found.extend([p] if self.item(p).status not in OPEN_STATUSES else held.get(p, []))
            if found:
                held[item_id] = list(dict.fromkeys(found))
            for s in succs[item_id]:
                missing[s] -= 1
                if missing[s] == 0:
                    ready.append(s)
        return held

    def is_finished(self, item_id: str) -> bool:
        """True when an item needs no more work for the task to be delivered: `done`,
        `waived` (by a human), or `skipped` when the contract marks it optional."""
        s = self.item(item_id)
        return s.status in ("done", "waived") or (
            s.status == "skipped" and self.definition(item_id).optional
        )

    def gaps(self) -> list[str]:
        """Ids of items that keep the task from being delivered (open, blocked, or
        skipped without the contract's leave), in contract order."""
        # `is_finished`, inlined: this runs after every round, over every item.
        return [
            d.id
            for d, s in self.items()
            if not (s.status in ("done", "waived") or (s.status == "skipped" and d.optional))
        ]

    def waivers(self) -> list[str]:
        """Ids of items finished without being done (waived, or optional and skipped)."""
        return [d.id for d, s in self.items() if s.status in ("waived", "skipped")]

    def next_item(self) -> str | None:
        """The item to work on next: the first in progress, else the first pending, among
        the items whose predecessors are all finished (`ledger_tally.first_ready`)."""
        return first_ready(self)

    def current_milestone(self) -> str | None:
        """The milestone of the next open item."""
        return ready_milestone(self)

    # -- serialization ------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The state part, JSON-ready, keyed by item id (contract order)."""
        return {d.id: s.to_dict() for d, s in self.items()}

    def to_dict(self) -> dict[str, Any]:
        """Skeleton, state and version, JSON-ready (the public JSON rendering)."""
        items = [
            {"id": d.id, "title": d.title, "milestone": d.milestone, **s.to_dict()}
            for d, s in self.items()
        ]
        return {
            "objective": self.skeleton.objective,
            "version": self.version,
            "acceptance": [{"id": i, "description": d} for i, d in self.skeleton.acceptance],
            "milestones": [{"id": i, "title": t} for i, t in self.skeleton.milestones],
            "progress": self.progress().to_dict(),
            "items": items,
        }

    @classmethod
    def from_parts(
        cls, skeleton: Mapping[str, Any], state: Mapping[str, Any], version: int
    ) -> Ledger:
        """Rebuild from stored skeleton and state dicts."""
        sk = Skeleton.from_dict(skeleton)
        states = tuple(ItemState.from_dict(state.get(d.id, {})) for d in sk.items)
        return cls(sk, states, version)

    @classmethod
    def new(cls, skeleton: Skeleton) -> Ledger:
        """A fresh ledger: every item pending, version 0."""
        return cls(skeleton, tuple(ItemState() for _ in skeleton.items), 0)

    # -- rendering ---------------------------------------------------------------------

    def render(
        self, *, header: str = "GOAL LEDGER", compact: bool = False, changed: Sequence[str] = ()
    ) -> str:
        """Compact text for prompts, item by item. Deterministic: same state, same bytes.

        `compact=True` lists done items by id only (one line per group); `changed` is not
        used (every item is shown). Prompts render through `ledger_view.render`, which
        shows a long checklist as a view of bounded size instead."""
        p = self.progress()
        lines = [
            f"{header} (version {self.version})",
            f"Objective: {self.skeleton.objective}",
            f"Progress: {p.done}/{p.total} done, {p.open} open, {p.blocked} blocked, "
            f"{p.skipped} skipped" + (f", {p.waived} waived" if p.waived else ""),
        ]
        if self.skeleton.acceptance and not compact:
            lines.append("Acceptance:")
            lines.extend(f"  - [{i}] {d}" for i, d in self.skeleton.acceptance)
        titles = dict(self.skeleton.milestones)
        groups: list[tuple[str | None, list[tuple[ItemDef, ItemState]]]] = []
        for d, s in self.items():
            if not groups or groups[-1][0] != d.milestone:
                groups.append((d.milestone, []))
            groups[-1][1].append((d, s))
        for n, (milestone, members) in enumerate(groups):
            if milestone is not None:
                lines.append(f"Milestone {milestone}: {titles.get(milestone, '')}".rstrip())
            elif n > 0:
                lines.append("Other items:")
            done_ids = [d.id for d, s in members if s.status == "done"]
            if compact and done_ids:
                lines.append(f"  [x] done ({len(done_ids)}): {', '.join(done_ids)}")
            for d, s in members:
                if compact and s.status == "done":
                    continue
                line = _render_item(d, s)
                if s.status in OPEN_STATUSES and d.after:
                    line += _render_wait(self, d.id)
                lines.append(line)
        nxt = self.next_item()
        lines.append(f"Next: {nxt}" if nxt else "Next: nothing open")
        return "\n".join(lines)

    def render_json(self) -> str:
        """Canonical JSON (sorted keys, no spaces)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))


def _render_wait(ledger: Ledger, item_id: str) -> str:
    """What an open item waits for, or nothing when it may start."""
    held = ledger.held_by(item_id)
    if held:
        return f" [held: {', '.join(held)} blocked]"
    waiting = ledger.waiting_for(item_id)
    return f" [after {', '.join(waiting)}]" if waiting else ""


def _render_item(d: ItemDef, s: ItemState) -> str:
    return "  " + item_text(d, s)


def item_text(d: ItemDef, s: ItemState, *, milestone: bool = False) -> str:
    """An item's mark, id and title, with what its state says about it in brackets
    (its evidence, why it is blocked, its attempts); its milestone too if `milestone`."""
    line = f"{MARK[s.status]} {d.id}: {d.title}"
    extra = []
    if milestone and d.milestone:
        extra.append(f"milestone {d.milestone}")
    if s.status == "done" and s.evidence:
        extra.append("evidence " + ", ".join(s.evidence[:3]))
    if s.status in ("blocked", "skipped", "waived") and s.note:
        extra.append(f"{s.status}: {s.note}")
    elif s.status in OPEN_STATUSES and s.attempts:
        extra.append(f"attempts {s.attempts}")
        if s.note:
            extra.append(f"last: {s.note}")
    if extra:
        line += " (" + "; ".join(extra) + ")"
    return line


@dataclass(frozen=True)
class LedgerUpdate:
    """The result of a transition: the new ledger and what changed."""

    ledger: Ledger
    diff: LedgerDiff

    @property
    def changed(self) -> bool:
        """True when the diff is non-empty."""
        return bool(self.diff)


@dataclass(frozen=True)
class ItemChange:
    """A proposed change to one item, as a judge would propose it."""

    item_id: str
    status: ItemStatus | None = None
    evidence: tuple[str, ...] = ()
    note: str | None = None
    attempts_delta: int = 0
    breaker: int | None = None
    #: Its evidence replaces the item's (a `done_when` rule's acceptance: its check is the proof).
    evidence_replaces: bool = False


def from_spec(
    objective: str,
    items: Sequence[
        tuple[str, str, str | None]
        | tuple[str, str, str | None, bool]
        | tuple[str, str, str | None, bool, tuple[str, ...]]
    ],
    acceptance: Sequence[tuple[str, str]] = (),
    milestones: Sequence[tuple[str, str]] = (),
) -> Ledger:
    """A fresh ledger from plain tuples: `(id, title, milestone[, optional[, after]])` per
    item."""
    sk = Skeleton(
        objective=objective,
        items=tuple(ItemDef(*i) for i in items),
        acceptance=tuple(acceptance),
        milestones=tuple(milestones),
    )
    return Ledger.new(sk)


def _changed(old: ItemState, ch: ItemChange) -> ItemState:
    """One item's state after one change (`LedgerError` for an impossible one)."""
    new = old
    if ch.evidence:
        kept = () if ch.evidence_replaces else old.evidence
        new = replace(new, evidence=tuple(dict.fromkeys((*kept, *ch.evidence))))
    if ch.status is not None:
        if ch.status not in ITEM_STATUSES:
            raise errors.LedgerError(f"unknown item status {ch.status!r}")
        if ch.status == "done" and not new.evidence:
            raise errors.LedgerError(f"item {ch.item_id!r} cannot become done without evidence")
        if ch.status == "pending" and old.status == "done":
            # Re-opened work: its old evidence no longer proves anything.
            new = replace(new, evidence=())
        new = replace(new, status=ch.status)
    # A field set to the value it has is left alone: most rounds set the breaker it
    # already has (0 while the item moves), and each `replace` costs microseconds.
    if ch.note is not None and ch.note != new.note:
        new = replace(new, note=ch.note)
    if ch.attempts_delta:
        new = replace(new, attempts=max(0, new.attempts + ch.attempts_delta))
    if ch.breaker is not None and max(0, ch.breaker) != new.breaker:
        new = replace(new, breaker=max(0, ch.breaker))
    return new


def apply(ledger: Ledger, changes: Sequence[ItemChange]) -> LedgerUpdate:
    """Apply proposed changes; all-or-nothing.

    Raises `LedgerError` (and changes nothing) for an unknown item or a `done` without
    evidence. The version rises by one iff something changed."""
    if not changes:  # most rounds: no copy of every item's state
        return LedgerUpdate(ledger, _NO_DIFF)
    states = list(ledger.states)
    touched: list[int] = []
    for ch in changes:
        if not ledger.has_item(ch.item_id):
            raise errors.LedgerError(f"unknown ledger item {ch.item_id!r}")
        idx = ledger._index[ch.item_id]
        states[idx] = _changed(states[idx], ch)
        if idx not in touched:
            touched.append(idx)
    # The diff is the net change per item, so changes that cancel out are no change.
    diff: list[FieldChange] = []
    for idx in touched:
        before, after = ledger.states[idx], states[idx]
        item_id = ledger.skeleton.items[idx].id
        for fname in ("status", "evidence", "attempts", "breaker", "note"):
            b, a = getattr(before, fname), getattr(after, fname)
            if b != a:
                diff.append(FieldChange(item_id, fname, b, a))
    if not diff:
        return LedgerUpdate(ledger, _NO_DIFF)
    new_ledger = Ledger(ledger.skeleton, tuple(states), ledger.version + 1, ledger._index)
    carry(ledger, new_ledger, touched)
    return LedgerUpdate(new_ledger, LedgerDiff(tuple(diff)))


def diff(before: Ledger, after: Ledger) -> LedgerDiff:
    """Every field that differs between two states of one ledger, item by item (items
    only one of them has are left out): the full diff an event must carry for the
    ledger to be folded back from the log."""
    changes: list[FieldChange] = []
    for d, b in before.items():
        if not after.has_item(d.id):
            continue
        a = after.item(d.id)
        for fname in ("status", "evidence", "attempts", "breaker", "note"):
            if getattr(b, fname) != getattr(a, fname):
                changes.append(FieldChange(d.id, fname, getattr(b, fname), getattr(a, fname)))
    return LedgerDiff(tuple(changes))


# Small named transitions: each is `apply` with one change.


def start(ledger: Ledger, item_id: str) -> LedgerUpdate:
    """Mark an open item in progress."""
    if ledger.item(item_id).status != "pending":
        return LedgerUpdate(ledger, _NO_DIFF)
    return apply(ledger, [ItemChange(item_id, status="in_progress")])


def complete(ledger: Ledger, item_id: str, evidence: Sequence[str], note: str = "") -> LedgerUpdate:
    """Mark an item done with evidence refs (at least one, old or new)."""
    change = ItemChange(item_id, status="done", evidence=tuple(evidence), note=note or None)
    return apply(ledger, [change])


def block(ledger: Ledger, item_id: str, reason: str) -> LedgerUpdate:
    """Mark an item blocked with its reason."""
    return apply(ledger, [ItemChange(item_id, status="blocked", note=reason)])


def skip(ledger: Ledger, item_id: str, reason: str) -> LedgerUpdate:
    """Mark an item skipped with its reason."""
    return apply(ledger, [ItemChange(item_id, status="skipped", note=reason)])


def waive(ledger: Ledger, item_id: str, reason: str) -> LedgerUpdate:
    """Mark an item waived (a human's decision) with its reason."""
    return apply(ledger, [ItemChange(item_id, status="waived", note=reason)])


def retry(ledger: Ledger, item_id: str, note: str) -> LedgerUpdate:
    """Return an item to pending with its counters reset (a human's decision)."""
    change = ItemChange(item_id, status="pending", note=note, breaker=0, attempts_delta=-(10**9))
    return apply(ledger, [change])


def reopen(ledger: Ledger, item_id: str, reason: str) -> LedgerUpdate:
    """Return an item to pending (its evidence is dropped if it was done)."""
    return apply(ledger, [ItemChange(item_id, status="pending", note=reason, breaker=0)])


def record_attempt(ledger: Ledger, item_id: str, note: str | None = None) -> LedgerUpdate:
    """Count one more attempt at an item."""
    return apply(ledger, [ItemChange(item_id, attempts_delta=1, note=note)])


def set_breaker(ledger: Ledger, item_id: str, value: int) -> LedgerUpdate:
    """Set an item's no-progress breaker counter."""
    return apply(ledger, [ItemChange(item_id, breaker=value)])


def check_invariants(ledger: Ledger) -> None:
    """Raise `LedgerError` if a stored ledger breaks an invariant (done ⇒ evidence)."""
    for d, s in ledger.items():
        if s.status == "done" and not s.evidence:
            raise errors.LedgerError(f"item {d.id!r} is done without evidence")
