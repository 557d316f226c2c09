"""Which items the rule judge checks after a round, so that a round's cost does not grow
with the checklist.

On a short ledger (`ledger_view.paged` is false) every open item's `done_when` rule is
checked after every round, as before. On a long one only the items the round can have
moved are: the focus item, the first `RULE_WINDOW` open items in checklist order (so an
item finished by other means is found before or when it becomes the focus), the items
the round's calls name (an argument that is an item's id or its file rule's path) and
the items whose op rule is about a tool the round called. No open item goes unchecked
for good: it enters the window before it becomes the focus.
"""

from __future__ import annotations

import posixpath
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Final, NamedTuple

from tether import ledger_view
from tether._by_object import keep
from tether.jsonwalk import strings_in
from tether.ledger import OPEN_STATUSES, Ledger
from tether.spec import ChecklistItem, FileRule, OpRule, TaskSpec

#: Open items, in checklist order, checked after every round on a long ledger.
RULE_WINDOW: Final = 25


class _SpecIndex(NamedTuple):
    """What the rule judge looks up in one contract, made once per spec object (it
    holds no reference to the spec: it is dropped with it)."""

    #: Items with a file rule, by the rule's normalised path; with an op rule, by tool.
    paths: dict[str, list[str]]
    tools: dict[str, list[str]]
    #: Each item's position in contract order.
    where: dict[str, int]
    #: The items with a `done_when` rule, in contract order (most contracts: a few).
    ruled: tuple[ChecklistItem, ...]
    #: Whether a source is pinned by fingerprint (a re-read may invalidate artifacts).
    fingerprinted: bool


#: Each live spec's rule index, by object id (dropped with the spec). A worker judges
#: many runs in turn, each with its own spec: a one-entry cache was rebuilt at every
#: judging (twice a round, a walk over the contract each time) once two runs alternated.
_INDEX: dict[int, _SpecIndex] = {}


def _index(spec: TaskSpec) -> _SpecIndex:
    hit = _INDEX.get(id(spec))
    if hit is not None:
        return hit
    paths: dict[str, list[str]] = {}
    tools: dict[str, list[str]] = {}
    where: dict[str, int] = {}
    for n, item in enumerate(spec.items):
        where[item.id] = n
        rule = item.done_when
        if isinstance(rule, FileRule):
            paths.setdefault(posixpath.normpath(rule.path), []).append(item.id)
        elif isinstance(rule, OpRule):
            tools.setdefault(rule.tool, []).append(item.id)
    ruled = tuple(i for i in spec.items if i.done_when is not None)
    fingerprinted = any(src.pin == "fingerprint" for src in spec.sources)
    return keep(_INDEX, spec, _SpecIndex(paths, tools, where, ruled, fingerprinted))


def spec_items(spec: TaskSpec, ids: Collection[str]) -> list[ChecklistItem]:
    """The contract's items with these ids, in contract order (unknown ids left out)."""
    where = _index(spec).where
    return [spec.items[n] for n in sorted(where[i] for i in ids if i in where)]


def ruled_items(spec: TaskSpec, ids: Collection[str] | None = None) -> Sequence[ChecklistItem]:
    """The contract's items with a `done_when` rule (of those with these ids, when
    given), in contract order: what the rule judge checks, without a walk over every
    item of a contract whose items have no rule."""
    ruled = _index(spec).ruled
    if ids is None or not ruled:
        return ruled
    return [i for i in spec_items(spec, ids) if i.done_when is not None]


def fingerprinted(spec: TaskSpec) -> bool:
    """Whether some source of the contract is pinned by fingerprint."""
    return _index(spec).fingerprinted


def ruleless(spec: TaskSpec) -> bool:
    """Whether no item of the contract has a `done_when` rule and no source is pinned
    by fingerprint (`not ruled_items(spec) and not fingerprinted(spec)`, one lookup)."""
    index = _index(spec)
    return not index.ruled and not index.fingerprinted


#: The open window of each live ledger, by object id (`open_window`).
_WINDOWS: dict[int, tuple[str, ...]] = {}


def open_window(ledger: Ledger) -> tuple[str, ...]:
    """The first `RULE_WINDOW` open items in checklist order. Kept per ledger object (a
    ledger is immutable): most rounds keep the ledger of the round before, and the walk
    passes every finished item before the first open one. Kept while the ledger lives
    (not the last few: a worker judges many runs in turn)."""
    hit = _WINDOWS.get(id(ledger))
    if hit is not None:
        return hit
    found: list[str] = []
    for d, s in ledger.items():
        if s.status in OPEN_STATUSES:
            found.append(d.id)
            if len(found) >= RULE_WINDOW:
                break
    return keep(_WINDOWS, ledger, tuple(found))


def rule_scope(
    spec: TaskSpec,
    ledger: Ledger,
    focus: str | None,
    calls: Iterable[tuple[str, Mapping[str, Any]]],
) -> set[str] | None:
    """The ids of the items to check after a round whose calls were `calls` (tool name,
    arguments) on `focus`; None for every open item (a short ledger)."""
    if not ledger_view.paged(ledger):
        return None
    scope: set[str] = {focus} if focus else set()
    scope.update(open_window(ledger))
    index = _index(spec)
    paths, tools = index.paths, index.tools
    for tool, args in calls:
        scope.update(tools.get(tool, ()))
        for text in strings_in(args):
            if ledger.has_item(text):
                scope.add(text)
            scope.update(paths.get(posixpath.normpath(text), ()) if text else ())
    return scope
