"""A ledger's counts, kept from round to round instead of recounted over every item.

With ten thousand items, counting statuses (for the prompt's ledger view, the
progress a verdict reports, whether anything is still open) was a walk over every item
several times a round: the round's cost grew with the checklist, not with the work.
A `Tally` is counted once per ledger and then carried: `ledger.apply` hands the new
ledger its predecessor's tally moved by the few items that changed (`carry`), so a
round costs what it changes.

The same holds for the evidence index (`Refs`: which items cite which evidence ref,
the op refs of done items), which the judges read every round.

Tallies are kept beside the ledgers they count (by object, dropped with it), so a
ledger stays a plain frozen value that compares by its contents.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar


@dataclass(frozen=True)
class Tally:
    """Items by status, by milestone and status, the blocked ones (positions in contract
    order), and skipped items the contract does not let be skipped."""

    counts: Mapping[str, int]
    by_milestone: Mapping[str | None, Mapping[str, int]]
    blocked: frozenset[int]
    stuck_skipped: int

    def count(self, status: str) -> int:
        """Items in `status`."""
        return self.counts.get(status, 0)

    @property
    def open(self) -> int:
        """Items pending or in progress."""
        return self.count("pending") + self.count("in_progress")

    @property
    def gaps(self) -> int:
        """Items that keep the task from being delivered (see `Ledger.gaps`)."""
        total = sum(self.counts.values())
        return (
            total
            - self.count("done")
            - self.count("waived")
            - self.count("skipped")
            + (self.stuck_skipped)
        )


def _count(ledger: Any) -> Tally:
    counts: dict[str, int] = {}
    by_milestone: dict[str | None, dict[str, int]] = {}
    blocked: list[int] = []
    stuck = 0
    for n, (d, s) in enumerate(zip(ledger.skeleton.items, ledger.states, strict=True)):
        counts[s.status] = counts.get(s.status, 0) + 1
        m = by_milestone.setdefault(d.milestone, {})
        m[s.status] = m.get(s.status, 0) + 1
        if s.status == "blocked":
            blocked.append(n)
        elif s.status == "skipped" and not d.optional:
            stuck += 1
    return Tally(counts, by_milestone, frozenset(blocked), stuck)


@dataclass(frozen=True)
class Refs:
    """Who holds which evidence ref: `holders` maps each ref to the positions (contract
    order, ascending) of the items citing it, `done_ops` each done item's position to
    the `op:` refs it cites (only items citing some)."""

    holders: Mapping[str, tuple[int, ...]]
    done_ops: Mapping[int, tuple[str, ...]]


def _index(ledger: Any) -> Refs:
    holders: dict[str, tuple[int, ...]] = {}
    done_ops: dict[int, tuple[str, ...]] = {}
    for n, s in enumerate(ledger.states):
        for ref in s.evidence:
            held = holders.get(ref, ())
            if not held or held[-1] != n:
                holders[ref] = (*held, n)
        if s.status == "done":
            ops = tuple(r for r in s.evidence if r.startswith("op:"))
            if ops:
                done_ops[n] = ops
    return Refs(holders, done_ops)


class Owners:
    """Who holds each evidence ref: the first item in contract order that cites it in
    the ledger (from its carried index, without a walk over every item), else the item
    it was given to since (`setdefault`)."""

    def __init__(self, ledger: Any) -> None:
        self._items = ledger.skeleton.items
        self._held = refs(ledger).holders
        self._given: dict[str, str] = {}

    def get(self, ref: str, default: str | None = None) -> str | None:
        """The item holding `ref`, or `default`."""
        held = self._held.get(ref)
        return str(self._items[held[0]].id) if held else self._given.get(ref, default)

    def __getitem__(self, ref: str) -> str:
        found = self.get(ref)
        if found is None:
            raise KeyError(ref)
        return found

    def setdefault(self, ref: str, item_id: str) -> str:
        """The item holding `ref`; `item_id` (which holds it from now on) if none did."""
        found = self.get(ref)
        if found is None:
            self._given[ref] = found = item_id
        return found


_TALLIES: dict[int, Tally] = {}
_REFS: dict[int, Refs] = {}
_NEXT: dict[int, tuple[str | None, str | None]] = {}
_COUNTED: dict[int, tuple[Any]] = {}
_T = TypeVar("_T")


def _keep(ledger: Any, table: dict[int, Any], value: Any) -> Any:
    key = id(ledger)
    if key not in table:
        weakref.finalize(ledger, table.pop, key, None)
    table[key] = value
    return value


def tally(ledger: Any) -> Tally:
    """The ledger's tally: carried from its predecessor, or counted now (once)."""
    found = _TALLIES.get(id(ledger))
    return found if found is not None else _keep(ledger, _TALLIES, _count(ledger))


def counted(ledger: Any, make: Callable[[Mapping[str, int]], _T]) -> _T:
    """`make(tally(ledger).counts)`, made once per ledger: `Ledger.progress` (its one
    `make`, `Progress.of`) is asked a few times a round, and most rounds keep the
    ledger of the round before."""
    found = _COUNTED.get(id(ledger))
    if found is None:
        found = _keep(ledger, _COUNTED, (make(tally(ledger).counts),))
    return found[0]  # type: ignore[no-any-return]


def first_ready(ledger: Any) -> str | None:
    """`Ledger.next_item`, worked out once per ledger: a round asks for it a dozen times
    (the view, the focus, the milestone, the checks), and each walk passes every
    finished item before it, so asking again would cost more as the task goes on."""
    return _next(ledger)[0]


def ready_milestone(ledger: Any) -> str | None:
    """`Ledger.current_milestone` (the milestone of `first_ready`), kept with it: the
    journal asks at each commit, the checks and the decision once a round."""
    return _next(ledger)[1]


def _next(ledger: Any) -> tuple[str | None, str | None]:
    """`(first_ready, its milestone)` of `ledger`, kept for the ledger object."""
    found = _NEXT.get(id(ledger))
    if found is None:
        nxt = _first_ready(ledger)
        found = _keep(ledger, _NEXT, (nxt, ledger.definition(nxt).milestone if nxt else None))
    return found


def _first_ready(ledger: Any) -> str | None:
    for wanted in ("in_progress", "pending"):
        if not tally(ledger).count(wanted):
            continue
        for d, s in ledger.items():
            if s.status == wanted and ledger.is_ready(d.id):
                return str(d.id)
    return None


def refs(ledger: Any) -> Refs:
    """The ledger's evidence index: carried from its predecessor, or built now (once).
    The judges read it every round instead of walking every item's evidence."""
    found = _REFS.get(id(ledger))
    return found if found is not None else _keep(ledger, _REFS, _index(ledger))


def carry(before: Any, after: Any, touched: Sequence[int]) -> None:
    """Give `after` (which differs from `before` only at the positions `touched`) the
    tally and evidence index of `before` moved by those items, where `before` has them."""
    _carry_refs(before, after, touched)
    old = _TALLIES.get(id(before))
    if old is None:
        return
    counts = dict(old.counts)
    by_milestone = {m: dict(c) for m, c in old.by_milestone.items()}
    blocked = set(old.blocked)
    stuck = old.stuck_skipped
    for n in touched:
        d, was, now = after.skeleton.items[n], before.states[n].status, after.states[n].status
        if was == now:
            continue
        m = by_milestone.setdefault(d.milestone, {})
        for table in (counts, m):
            table[was] -= 1
            table[now] = table.get(now, 0) + 1
        blocked.discard(n)
        if now == "blocked":
            blocked.add(n)
        if not d.optional:
            stuck += (now == "skipped") - (was == "skipped")
    _keep(after, _TALLIES, Tally(counts, by_milestone, frozenset(blocked), stuck))


def _carry_refs(before: Any, after: Any, touched: Sequence[int]) -> None:
    old = _REFS.get(id(before))
    if old is None:
        return
    holders = dict(old.holders)  # a copy in C: far cheaper than a walk over the items
    done_ops = dict(old.done_ops)
    for n in touched:
        was, now = before.states[n], after.states[n]
        for ref in was.evidence:
            left = tuple(p for p in holders.get(ref, ()) if p != n)
            if left:
                holders[ref] = left
            else:
                holders.pop(ref, None)
        for ref in now.evidence:
            held = holders.get(ref, ())
            if n not in held:
                holders[ref] = tuple(sorted((*held, n)))
        ops = tuple(r for r in now.evidence if r.startswith("op:"))
        if now.status == "done" and ops:
            done_ops[n] = ops
        else:
            done_ops.pop(n, None)
    _keep(after, _REFS, Refs(holders, done_ops))


__all__ = [
    "Owners",
    "Refs",
    "Tally",
    "carry",
    "counted",
    "first_ready",
    "ready_milestone",
    "refs",
    "tally",
]
