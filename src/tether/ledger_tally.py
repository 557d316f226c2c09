"""A ledger's counts, kept from round to round instead of recounted over every item.

With ten thousand items, counting statuses (for the prompt's ledger view, the
progress a verdict reports, whether anything is still open) was a walk over every item
several times a round: the round's cost grew with the checklist, not with the work.
A `Tally` is counted once per ledger and then carried: `ledger.apply` hands the new
ledger its predecessor's tally moved by the few items that changed (`carry`), so a
round costs what it changes.

Tallies are kept beside the ledgers they count (by object, dropped with it), so a
ledger stays a plain frozen value that compares by its contents.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


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


_TALLIES: dict[int, Tally] = {}


def _keep(ledger: Any, tally: Tally) -> Tally:
    key = id(ledger)
    if key not in _TALLIES:
        weakref.finalize(ledger, _TALLIES.pop, key, None)
    _TALLIES[key] = tally
    return tally


def tally(ledger: Any) -> Tally:
    """The ledger's tally: carried from its predecessor, or counted now (once)."""
    found = _TALLIES.get(id(ledger))
    return found if found is not None else _keep(ledger, _count(ledger))


def carry(before: Any, after: Any, touched: Sequence[int]) -> None:
    """Give `after` (which differs from `before` only at the positions `touched`) the
    tally of `before` moved by those items, when `before` has one."""
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
    _keep(after, Tally(counts, by_milestone, frozenset(blocked), stuck))


__all__ = ["Tally", "carry", "tally"]
