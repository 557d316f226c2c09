"""The ledger as the model reads it when the checklist is long: a view of bounded size.

A ledger of a few items is rendered whole (`Ledger.render`). Past `FULL_VIEW_MAX_ITEMS`
items the whole list would make every request grow with the checklist, so the model is
shown a *view* instead: the objective, the counts by status (and by milestone), the
focus item in full, the next few open items, the items that changed since the model
last saw the ledger, the blocked items with their reasons (up to a bound, then a
count), and the line `Next: <id>`. Everything but the focus item fits in
`VIEW_LIMIT_CHARS` characters whatever the number of items; the model pages through
the rest with the read-only built-in tool `ledger_items` (`page` below).

Both the view and a page are pure functions of the ledger (and of the ids said to have
changed): the same state gives the same bytes, which keeps provider prompt caches warm.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from tether.ledger import ItemDef, ItemState, Ledger, item_text
from tether.ledger_tally import tally

#: Checklists longer than this are shown as a bounded view, not item by item.
FULL_VIEW_MAX_ITEMS: Final = 25
#: The most characters a view holds besides the focus item's lines.
VIEW_LIMIT_CHARS: Final = 2048
#: The name of the built-in tool that pages through the items.
LEDGER_ITEMS_TOOL: Final = "ledger_items"
#: The most items one page of `ledger_items` lists.
PAGE_MAX: Final = 100

_OPEN: Final = frozenset({"pending", "in_progress"})
_LINE_MAX: Final = 160
_OBJECTIVE_MAX: Final = 300
_NEXT_OPEN: Final = 5
_MILESTONES_MAX: Final = 8


def render(
    ledger: Ledger,
    *,
    header: str = "GOAL LEDGER",
    compact: bool = False,
    changed: Sequence[str] = (),
) -> str:
    """The ledger as a prompt shows it. A checklist of more than `FULL_VIEW_MAX_ITEMS`
    items is shown as a view of bounded size (`render_view`: counts, the focus item, the
    next few open items, the items in `changed`, the blocked ones), which the model pages
    through with the `ledger_items` tool; a shorter one is listed item by item
    (`Ledger.render`, where `compact=True` lists done items by id only)."""
    if paged(ledger):
        return render_view(ledger, header=header, changed=changed)
    return ledger.render(header=header, compact=compact)


def paged(ledger: Ledger) -> bool:
    """True when the ledger is too long to be rendered item by item: the model is
    given the bounded view and the `ledger_items` tool."""
    return len(ledger.skeleton.items) > FULL_VIEW_MAX_ITEMS


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def item_line(d: ItemDef, s: ItemState, *, full: bool = False) -> str:
    """One item on one line (cut to a bounded length unless `full`)."""
    line = item_text(d, s, milestone=full)
    return line if full else _cut(line, _LINE_MAX)


@dataclass
class _Budget:
    """Lines added while they fit in the character budget."""

    left: int
    lines: list[str]

    def add(self, line: str) -> bool:
        cost = len(line) + 1
        if cost > self.left:
            return False
        self.lines.append(line)
        self.left -= cost
        return True

    def section(self, head: str, rows: Iterator[str], total: int, more: str) -> None:
        """`head`, then rows while they fit, then how many were left out (`more` is
        formatted with `n`); rows keep room for that last line."""
        reserve = len(more.format(n=total)) + 3
        if not self.add(head):
            return
        shown = 0
        for row in rows:
            if len(row) + 1 + reserve > self.left or not self.add(row):
                break
            shown += 1
        if shown < total:
            self.add(more.format(n=total - shown))


def render_view(ledger: Ledger, *, header: str, changed: Sequence[str] = ()) -> str:
    """The bounded view of a long ledger (see the module docstring)."""
    # The counts are carried from round to round (`ledger_tally`): no walk over every item.
    tallied = tally(ledger)
    counts, by_milestone = tallied.counts, tallied.by_milestone
    blocked = [(ledger.skeleton.items[n], ledger.states[n]) for n in sorted(tallied.blocked)]
    total = len(ledger.skeleton.items)
    done, opened = counts.get("done", 0), counts.get("pending", 0) + counts.get("in_progress", 0)
    waived = counts.get("waived", 0)
    nxt = ledger.next_item()
    head = [
        f"{header} (version {ledger.version})",
        f"Objective: {_cut(ledger.skeleton.objective, _OBJECTIVE_MAX)}",
        f"Progress: {done}/{total} done, {opened} open, {counts.get('blocked', 0)} blocked, "
        f"{counts.get('skipped', 0)} skipped" + (f", {waived} waived" if waived else ""),
    ]
    tail = [
        f"Only part of the {total} items is shown; page through them with "
        f"{LEDGER_ITEMS_TOOL}(status=..., milestone=..., after=..., limit=...).",
        f"Next: {nxt}" if nxt else "Next: nothing open",
    ]
    focus: list[str] = []
    if nxt:
        d, s = ledger.definition(nxt), ledger.item(nxt)
        focus = ["Focus item (the one named Next):", "  " + item_line(d, s, full=True)]
        waiting = ledger.waiting_for(nxt)
        if d.after:
            focus.append(f"  after: {', '.join(d.after)}")
        if waiting:
            focus.append(f"  waiting for: {', '.join(waiting)}")
    fixed = sum(len(x) + 1 for x in head + tail)
    b = _Budget(VIEW_LIMIT_CHARS - fixed, [])
    titles = dict(ledger.skeleton.milestones)
    named = [(m, c) for m, c in by_milestone.items() if m is not None]
    if named:

        def milestone_rows() -> Iterator[str]:
            for m, c in named:
                t = titles.get(m, "")
                open_m = c.get("pending", 0) + c.get("in_progress", 0)
                yield "  " + _cut(
                    f"{m}{f' ({t})' if t else ''}: {c.get('done', 0)}/{sum(c.values())} "
                    f"done, {open_m} open, {c.get('blocked', 0)} blocked",
                    100,
                )

        rows = milestone_rows()
        first = [next(rows) for _ in range(min(_MILESTONES_MAX, len(named)))]
        b.section("By milestone:", iter(first), len(named), "  ... and {n} more milestones")
    if changed:
        known = [i for i in dict.fromkeys(changed) if ledger.has_item(i)]
        b.section(
            "Changed since your last view:",
            ("  " + item_line(ledger.definition(i), ledger.item(i), full=False) for i in known),
            len(known),
            "  ... and {n} more changed",
        )
    if nxt:
        upcoming = _open_after(ledger, nxt)
        b.section(
            f"Open after {nxt} (in order):",
            ("  " + item_line(d, s) for d, s in upcoming),
            opened - 1,
            "  ... and {n} more open",
        )
    if blocked:
        b.section(
            f"Blocked ({len(blocked)}):",
            ("  " + item_line(d, s) for d, s in blocked),
            len(blocked),
            "  ... and {n} more blocked (" + LEDGER_ITEMS_TOOL + "(status='blocked'))",
        )
    return "\n".join(head + focus + b.lines + tail)


def _open_after(ledger: Ledger, focus: str) -> list[tuple[ItemDef, ItemState]]:
    """Up to `_NEXT_OPEN` open items other than the focus, in contract order."""
    found: list[tuple[ItemDef, ItemState]] = []
    for d, s in ledger.items():
        if s.status in _OPEN and d.id != focus:
            found.append((d, s))
            if len(found) == _NEXT_OPEN:
                break
    return found


def page(
    ledger: Ledger,
    *,
    status: str | None = None,
    milestone: str | None = None,
    after: str | None = None,
    limit: int = 50,
) -> str:
    """One page of items in contract order: those with `status` (a status, or "open"
    for pending and in progress) and `milestone`, after the item `after`; at most
    `limit` (capped at `PAGE_MAX`). The last line says how to get the next page."""
    limit = max(1, min(limit, PAGE_MAX))
    if after is not None and not ledger.has_item(after):
        raise KeyError(after)
    started = after is None
    shown: list[str] = []
    matched = 0
    last = None
    for d, s in ledger.items():
        if not started:
            started = d.id == after
            continue
        if milestone is not None and d.milestone != milestone:
            continue
        if status is not None and not (
            s.status == status or (status == "open" and s.status in _OPEN)
        ):
            continue
        matched += 1
        if len(shown) < limit:
            shown.append(item_line(d, s, full=True))
            last = d.id
    what = ", ".join(
        f"{k}={v!r}" for k, v in (("status", status), ("milestone", milestone)) if v is not None
    )
    head = f"{len(shown)} of {matched} matching items" + (f" ({what})" if what else "")
    head += f" after {after}:" if after else ":"
    lines = [head, *shown]
    if matched > len(shown) and last is not None:
        lines.append(f"More: call {LEDGER_ITEMS_TOOL} with after={last!r}.")
    elif not shown:
        lines.append("(none)")
    return "\n".join(lines)


class LedgerData(Mapping[str, Any]):
    """`{**ledger.to_dict(), "next": next_item}` (a request's `ledger`), built on first
    read: a round whose model never looks at it does not pay for a long ledger's items."""

    def __init__(self, ledger: Ledger, next_item: str | None) -> None:
        self._ledger = ledger
        self._next = next_item
        self._data: dict[str, Any] | None = None

    def _get(self) -> dict[str, Any]:
        if self._data is None:
            self._data = {**self._ledger.to_dict(), "next": self._next}
        return self._data

    def __getitem__(self, key: str) -> Any:
        if key == "next" and self._data is None:
            return self._next  # what a model reads most: no need of the items for it
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def __bool__(self) -> bool:
        # Never empty (it has "next" at least): `request.ledger or {}` builds nothing.
        return True

    def __repr__(self) -> str:
        return f"LedgerData(version={self._ledger.version}, next={self._next!r})"


#: The most items a listing for people (`tether status`, the dashboard) shows at once.
ROWS_PER_PAGE: Final = 50


def row_page(
    rows: Sequence[Mapping[str, Any]], after: str | None, limit: int = ROWS_PER_PAGE
) -> tuple[int, list[Mapping[str, Any]]]:
    """`(start, rows)`: the item rows (`status --json`'s) a listing shows. All of them
    when they fit in `limit` and no `after` is given; else `limit` rows after the item
    `after` (from the start if it is unknown), or from the first one not finished."""
    if len(rows) <= limit and after is None:
        return 0, list(rows)
    if after is not None:
        start = next((n + 1 for n, r in enumerate(rows) if r["id"] == after), 0)
    else:
        start = next(
            (n for n, r in enumerate(rows) if r["status"] not in ("done", "skipped", "waived")),
            0,
        )
    return start, list(rows[start : start + limit])
