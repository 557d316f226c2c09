"""Rendering for the command line: status, ledger bar, timeline, tables, live progress.

Pure functions of the data they are given (the `status --json` document, events,
records); nothing here reads the store.

Task names, objectives, notes, model text and tool results are user text: everything
shown goes through `clean` (control characters, escape sequences, bidirectional
overrides shown as `\\xNN` / `\\uNNNN` instead of acting on the terminal) and into
`Text` objects (never markup or emoji codes); JSON through `json_view`.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.console import Group
from rich.highlighter import JSONHighlighter
from rich.panel import Panel
from rich.text import Text

from tether import ledger_view
from tether.redact import redact
from tether.report.describe import STATUS_STYLE as STATUS_STYLE
from tether.report.describe import describe_event as describe_event
from tether.report.describe import readable_times as readable_times
from tether.report.describe import readable_until as readable_until
from tether.report.describe import shorten as shorten
from tether.report.describe import task_rows as task_rows
from tether.report.describe import ts as ts

if TYPE_CHECKING:  # the live view is made by `cli.run`; tables load when one is printed
    from rich.live import Live

# C0 and C1 controls (ESC, CSI, BEL, backspace, carriage return...), DEL, bidirectional
# marks and overrides, line and paragraph separators, unpaired surrogates.
# `json.dumps` escapes the C0 controls itself, but leaves the others raw inside strings.
_C0 = "\x00-\x08\x0b-\x1f"
_OTHERS = "\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE_IN_LINES = re.compile(f"[{_C0}{_OTHERS}]")
_UNSAFE_IN_A_LINE = re.compile(f"[\n{_C0}{_OTHERS}]")
_UNSAFE_IN_JSON = re.compile(f"[{_OTHERS}]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    c = match.group()
    code = ord(c)
    return _NAMED.get(c) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def clean(text: Any, *, lines: bool = False) -> str:
    """`text` safe to print on a terminal: control characters and the like are shown
    escaped (`\\x1b`, `\\u202e`) instead of moving the cursor, changing colours or
    reordering the line. Newlines are kept with `lines` (where the layout has room for
    several lines), else shown as `\\n`; tabs are kept."""
    s = redact(text if isinstance(text, str) else str(text))
    return (_UNSAFE_IN_LINES if lines else _UNSAFE_IN_A_LINE).sub(_escape, s)


def clean_json_text(text: str) -> str:
    """JSON text safe to print on a terminal, and the same JSON: what would act on the
    terminal and `json.dumps` leaves raw in strings is written as a `\\uNNNN` escape."""
    return _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", redact(text))


def json_text(doc: Any) -> str:
    """`--json` output: `json.dumps(doc, indent=2)` with non-ASCII text kept, except what
    would act on a terminal, which is written as a `\\uNNNN` escape (the same JSON)."""
    return clean_json_text(json.dumps(doc, indent=2, ensure_ascii=False))


def json_view(doc: Any) -> Text:
    """`json_text(doc)`, highlighted for a terminal."""
    return JSONHighlighter()(Text(json_text(doc)))


# --------------------------------------------------------------------------- tables

#: A word longer than this may be folded in a table cell; shorter ones are kept whole.
MAX_WHOLE_WORD = 32
#: The narrowest a `fold` column of a table gets (see `FittedTable`).
MIN_FOLD = 10


def _cell_text(cell: Any) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


class FittedTable:
    """A table that is never cut with `…`, however narrow the terminal or pipe.

    Columns are (header, kind): an `id` column (task, request and artifact ids, times:
    values one copies) is never wrapped nor narrower than its widest value; a `text`
    column wraps at spaces and keeps each word whole up to `MAX_WHOLE_WORD` characters (a
    longer one is folded, never cut); a `fold` column (a name, a summary) wraps too but
    may fold its words down to `MIN_FOLD` characters to leave room for the others. When
    the columns cannot fit side by side, each row is printed as a block instead: its
    first cell, then `header  value` lines."""

    def __init__(
        self,
        columns: Sequence[tuple[str, str]],
        rows: Sequence[Sequence[Any]],
        **options: Any,
    ) -> None:
        self.columns = list(columns)
        self.rows = [list(r) for r in rows]
        from rich.table import Table

        self.table = Table(**{"box": None, "header_style": "bold", "pad_edge": False, **options})
        self.min_widths: list[int] = []
        self.whole_word_widths: list[int] = []
        self.natural_widths: list[int] = []
        for i, (header, kind) in enumerate(self.columns):
            texts = [header, *(_cell_text(row[i]) for row in self.rows)]
            self.natural_widths.append(
                max((cell_len(ln) for t in texts for ln in t.splitlines()), default=0)
            )
            if kind == "id":
                widest = max((cell_len(ln) for t in texts for ln in t.splitlines()), default=0)
                self.table.add_column(header, no_wrap=True, min_width=widest)
                self.min_widths.append(widest)
                self.whole_word_widths.append(widest)
            else:
                longest = max((cell_len(w) for t in texts for w in t.split()), default=0)
                cap = MAX_WHOLE_WORD if kind == "text" else MIN_FOLD
                self.table.add_column(header, overflow="fold", min_width=min(longest, cap))
                self.min_widths.append(min(longest, cap))
                self.whole_word_widths.append(min(longest, MAX_WHOLE_WORD))
        for row in self.rows:
            self.table.add_row(*row)

    def __rich_console__(self, console: Any, options: Any) -> Any:
        """The table, or one block per row when the table cannot fit the width."""
        widths = self.widths(options.max_width)
        if widths is not None:
            for column, width in zip(self.table.columns, widths, strict=True):
                column.width = width
            yield self.table
            return
        if self.table.title:
            yield Text(str(self.table.title), "bold")
        for row in self.rows:
            head = row[0] if isinstance(row[0], Text) else Text(str(row[0]))
            yield Text.assemble(("", "bold"), head)
            from rich.table import Table

            block = Table.grid(padding=(0, 2))
            block.add_column(no_wrap=True)
            block.add_column(overflow="fold")
            for (header, _), cell in zip(self.columns[1:], row[1:], strict=True):
                block.add_row(Text(f"  {header}", "bold"), cell)
            yield block

    def widths(self, max_width: int) -> list[int] | None:
        """Each column's width in a table `max_width` wide: as wide as its content, the
        columns with the most room narrowed first, down to their longest word, then (a
        `fold` column) further down to its minimum; None when the minimums do not fit
        (then rows are printed as blocks)."""
        gaps = 2 * (len(self.columns) - 1)  # padding 1 on each side, none at the edges
        if sum(self.min_widths) + gaps > max_width:
            return None
        widths = [max(n, m) for n, m in zip(self.natural_widths, self.min_widths, strict=True)]
        excess = sum(widths) + gaps - max_width
        for floors in (self.whole_word_widths, self.min_widths):
            while excess > 0 and any(w > f for w, f in zip(widths, floors, strict=True)):
                i = max(range(len(widths)), key=lambda k: widths[k] - floors[k])
                widths[i] -= 1
                excess -= 1
        return widths

    def __rich_measure__(self, console: Any, options: Any) -> Any:
        """As wide as the table, at most the width available."""
        return self.table.__rich_measure__(console, options).with_maximum(options.max_width)


def fitted_table(
    columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]], **options: Any
) -> FittedTable:
    """`FittedTable(columns, rows, **options)`: see there."""
    return FittedTable(columns, rows, **options)


# --------------------------------------------------------------------------- status


#: The ledger bar's parts: item status, colour, glyph. Each glyph differs from the others
#: so the bar reads the same without colour (NO_COLOR, a pipe): a full block is done
#: work and nothing else.
BAR_PARTS = (
    ("done", "green", "█"),
    ("in_progress", "blue", "▒"),
    ("blocked", "red", "╳"),
    ("skipped", "magenta", "▚"),
    ("waived", "magenta", "▓"),
    ("pending", "grey50", "░"),
)


def ledger_bar(progress: Mapping[str, Any], width: int = 40) -> Text:
    """The ledger's items as a bar (one glyph per status, see `BAR_PARTS`), with counts."""
    total = max(1, int(progress["total"]))
    bar = Text()
    used = 0
    for key, style, ch in BAR_PARTS:
        n = round(width * int(progress.get(key, 0)) / total)
        n = min(n, width - used)
        bar.append(ch * n, style=style)
        used += n
    if used < width:
        bar.append("░" * (width - used), style="grey50")
    bar.append(
        f"  {progress['done']}/{progress['total']} done, {progress['blocked']} blocked, "
        f"{progress['pending'] + progress['in_progress']} open"
    )
    return bar


def sources_line(doc: Mapping[str, Any], db: str | None = None) -> Text:
    """The contract's sources with their versions; how many artifacts are invalid, how."""
    text = "sources: " + ", ".join(
        f"{clean(s['id'])} {clean(s['version'])} ({clean(s['pin'])})" for s in doc["sources"]
    )
    arts = doc.get("artifacts") or {}
    if arts.get("invalid_count"):
        told = with_db(f"tether artifacts {doc['task_id']} --invalid", db)
        text += f"; {arts['invalid_count']} invalid artifacts ({told})"
    return Text(text)


#: The commands a wait (`tether.runtime.hints`) or a status names, which take `--db`.
_VERBS = "approve|reject|retry|waive|abandon|tell|edit|resume|cancel|status|artifacts"
_HINTED = re.compile(rf"\btether ({_VERBS}) ")


def with_db(text: str, db: str | None) -> str:
    """`text` with `--db DB` put into every command it names, when the command that
    prints it was given `--db`: the runtime writes a wait's commands without it (it does
    not know how the store was named), and they must work as printed from this folder.
    (`TETHER_DB` carries over by itself.)"""
    if not db:
        return text
    flag = f"--db {shlex.quote(db)} "
    return _HINTED.sub(lambda m: f"tether {m.group(1)} {flag}", text)


#: The most ledger items `status` lists at once; a longer ledger is shown a page at a time.
STATUS_ITEMS = ledger_view.ROWS_PER_PAGE


def status_view(
    doc: Mapping[str, Any],
    db: str | None = None,
    *,
    after: str | None = None,
    limit: int = STATUS_ITEMS,
) -> Group:
    """A task from its `status --json` document: state, ledger, budget, waiting (its
    commands with `--db DB` when given, see `with_db`). A long ledger's items are listed
    `limit` at a time: after the item `after`, or from the first one not finished."""
    style = STATUS_STYLE.get(doc["status"], "white")
    head = Text.assemble(
        ("task ", "bold"),
        (clean(doc["task_id"]), "bold cyan"),
        f"  {clean(doc['name'])}  v{doc['version']}  ",
        (clean(doc["status"]), f"bold {style}"),
        (f" ({clean(stop_text(doc))})" if doc["stop_reason"] else "", style),
        (" (owner gone)" if doc.get("owner_gone") else "", "bold red"),
    )
    lines: list[Any] = [head, Text(f"goal: {clean(doc['ledger']['objective'], lines=True)}")]
    if doc.get("at"):
        at = doc["at"]
        lines.insert(0, Text(f"as of event {at['seq']} ({clean(at['type'])}, {ts(at['time'])})"))
    lines.append(ledger_bar(doc["ledger"]["progress"]))
    if doc.get("owner_gone"):
        lines.append(
            Text(
                f"owner gone: {clean(doc['owner_gone'])}; continue with: "
                + with_db(f"tether resume {doc['task_id']}", db),
                "red",
            )
        )
    elif doc["status"] == "paused":  # how it goes on (`run` ends so after a `tether pause`)
        told = with_db(f"tether resume {doc['task_id']}", db)
        lines.append(Text(f"paused until resumed; continue with: {told}", style))
    if doc.get("waiting"):
        reason = doc["waiting"].get("reason", doc["waiting"])
        told = with_db(readable_until(str(reason)), db)
        lines.append(Text(f"waiting: {clean(told, lines=True)}", "yellow"))
        partial = doc["waiting"].get("partial")
        if partial:
            lines.append(partial_view(partial))
    for seen in (doc.get("passed_over") or [])[:3]:
        told = f"not taken: {seen['reason']} (worker {seen['worker']}, {ts(seen['at'])})"
        lines.append(Text(clean(told, lines=True), "yellow"))
    if doc.get("waivers"):
        lines.append(
            Text(
                "waived: "
                + "; ".join(f"{clean(w['id'])} ({clean(w['reason'])})" for w in doc["waivers"]),
                "magenta",
            )
        )
    if doc.get("sources"):
        lines.append(sources_line(doc, db))
    if doc.get("compensations"):
        undo = doc["compensations"]
        shown = "; ".join(f"{clean(c['op_id'])} {clean(c['outcome'])}" for c in undo[:6])
        more = f" (+{len(undo) - 6} more)" if len(undo) > 6 else ""
        lines.append(Text(f"compensations: {shown}{more}", "yellow"))
    lease = lease_line(doc.get("lease") or {})
    if lease.plain:
        lines.append(lease)
    lines.append(budget_view(doc))
    limits = limits_line(doc.get("limits") or {})
    if limits.plain:
        lines.append(limits)
    colour = {
        "done": "green",
        "blocked": "red",
        "in_progress": "blue",
        "skipped": "magenta",
        "waived": "magenta",
    }
    rows = []
    listed: list[Mapping[str, Any]] = doc["ledger"]["items"]
    start, page_rows = ledger_view.row_page(listed, after, limit)
    for item in page_rows:
        st = item["status"]
        detail = ", ".join(item["evidence"][:2]) if st == "done" else (item["note"] or "")
        rows.append(
            (
                Text(clean(item["id"])),
                Text(clean(st), colour.get(st, "white")),
                str(item["attempts"]),
                Text(clean(detail, lines=True)),
            )
        )
    if after is not None and not page_rows and listed:
        first = with_db(f"tether status {doc['task_id']}", db)
        told = f"no items after {after}: it is the last of {len(listed):,} (first page: {first})"
        return Group(*lines, Text(clean(told), "dim"))
    table = fitted_table(
        [("item", "id"), ("status", "id"), ("attempts", "id"), ("evidence / note", "text")], rows
    )
    lines.append(table)
    if len(page_rows) < len(listed):
        page = f"items {start + 1:,}-{start + len(page_rows):,} of {len(listed):,}"
        nxt = (
            with_db(f"tether status {doc['task_id']} --after {page_rows[-1]['id']}", db)
            if start + len(page_rows) < len(listed) and page_rows
            else ""
        )
        lines.append(Text(clean(page + (f"; next page: {nxt}" if nxt else "")), "dim"))
    return Group(*lines)


def _amount(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key == "money_usd":
        return f"${float(value):.4f}"
    if key == "wall_seconds":
        return f"{float(value):.1f}s"
    return f"{value:,}" if isinstance(value, int) else str(value)


def budget_view(doc: Mapping[str, Any]) -> FittedTable:
    """What the task has used next to what it may use: each budget (`budget:` in the
    spec) and, for rounds, the loop limit `limits.max_rounds` too."""
    budget = doc["budget"]
    used, caps = budget["used"], budget.get("limits") or {}
    max_rounds = (doc.get("limits") or {}).get("max_rounds")
    rounds_cap = ", ".join(
        part
        for part in (
            f"max_rounds {max_rounds}" if max_rounds is not None else "",
            f"budget {caps['rounds']:,}" if caps.get("rounds") is not None else "",
        )
        if part
    )
    rows = [
        ("rounds", _amount("rounds", used["rounds"]), rounds_cap or "-"),
        (
            "tokens",
            f"{used['tokens']:,} ({used['cached_tokens']:,} cached)",
            _amount("tokens", caps.get("tokens")),
        ),
        (
            "cost",
            _amount("money_usd", used["money_usd"]),
            _amount("money_usd", caps.get("money_usd")),
        ),
        (
            "wall time",
            _amount("wall_seconds", used["wall_seconds"]),
            _amount("wall_seconds", caps.get("wall_seconds")),
        ),
        ("model calls", f"{used['model_calls']:,}", "-"),
    ]
    return fitted_table([("budget", "id"), ("used", "id"), ("limit", "text")], rows)


#: The loop limits `status` shows (the others are tuning a reader seldom needs).
SHOWN_LIMITS = (
    "max_rounds_per_milestone",
    "max_attempts_per_item",
    "no_progress_rounds",
    "same_failure_repeats",
    "max_crash_restarts",
    "round_timeout",
)


def limits_line(limits: Mapping[str, Any]) -> Text:
    """The contract's loop limits (`limits:`), beside the budget; empty without any."""
    shown = [
        f"{k} {limits[k]:g}" if isinstance(limits[k], float) else f"{k} {limits[k]}"
        for k in SHOWN_LIMITS
        if limits.get(k) is not None
    ]
    return Text("limits: " + ", ".join(shown)) if shown else Text("")


def lease_line(lease: Mapping[str, Any]) -> Text:
    """Who holds the task's lease and until when; empty when nobody does. A task left
    `running` by a process that died shows here who last held it."""
    owner = lease.get("owner")
    if not owner:
        return Text("")
    until = lease.get("expires_at")
    when = f" until {ts(until)} UTC" if isinstance(until, int | float) else ""
    return Text(f"lease: held by {clean(owner)}{when} (token {lease.get('fencing_token')})")


def stop_text(doc: Mapping[str, Any]) -> str:
    """The stop reason, with what was waived when the task was delivered without it."""
    reason = str(doc["stop_reason"])
    if reason == "delivered_with_waivers" and doc.get("waivers"):
        reason += ": " + ", ".join(w["id"] for w in doc["waivers"])
    return reason


def partial_view(partial: Mapping[str, Any]) -> Text:
    """The partial-completion record a human decides on."""
    text = Text("partial completion: ", "bold")
    text.append(f"{len(partial.get('done', []))} done")
    for key, style in (("blocked", "red"), ("waived", "magenta"), ("skipped", "magenta")):
        for it in partial.get(key, []):
            text.append(f"\n  {key} ", style)
            text.append(f"{clean(it['id'])}: {clean(it.get('reason') or '-')}")
    remaining = [clean(it["id"]) for it in partial.get("remaining", [])]
    if remaining:
        text.append(f"\n  remaining: {', '.join(remaining)}")
    for item, prop in (partial.get("proposed") or {}).items():
        text.append(
            f"\n  the judge proposed {clean(prop.get('status'))} for {clean(item)}: "
            f"{clean(prop.get('note'))}"
        )
    return text


def task_created(task_id: str, n_items: int) -> Text:
    """`task <id> created (<n> items)`."""
    return Text.assemble("task ", (clean(task_id), "bold cyan"), f" created ({n_items} items)")


def interrupted(task_id: str) -> Text:
    """The hint after a Ctrl-C."""
    return Text(f"interrupted; continue with: tether resume {clean(task_id)}", "yellow")


# --------------------------------------------------------------------------- lists


def task_table(tasks: Sequence[Any], gone: Collection[str] = ()) -> FittedTable:
    """`list`: task, name, status (with the stop reason; "running (owner gone)" for the
    tasks in `gone`), created — ids and times whole, however narrow the screen (see
    `fitted_table`)."""
    rows = [
        (
            Text(clean(t.task_id)),
            Text(clean(t.name)),
            Text(
                clean(
                    t.status
                    + (f" ({t.stop_reason})" if t.stop_reason else "")
                    + (" (owner gone)" if t.task_id in gone else "")
                ),
                STATUS_STYLE.get(t.status, ""),
            ),
            ts(t.created_at)[:16],  # to the minute: the exact time is in `list --json`
        )
        for t in tasks
    ]
    return fitted_table(
        [("task", "id"), ("name", "fold"), ("status", "text"), ("created", "id")], rows
    )


#: The most characters of a request's description `approvals` shows (`--json` has all).
MAX_WHAT = 120


def approval_what(request: Mapping[str, Any]) -> str:
    """A request's call (up to `MAX_WHAT` characters) and its impact, as the dashboard
    shows them: `write_file(...) (overwrites notes.md, which existed before ...)`."""
    what, impact = shorten(str(request.get("what", "")), MAX_WHAT), request.get("impact")
    return f"{what} ({impact})" if impact else what


def approvals_table(items: Sequence[Any]) -> FittedTable:
    """`approvals`: request, status, what (and its impact), decided by — the request id
    whole (it is what `approve` and `reject` take)."""
    rows = [
        (
            Text(clean(a.request_id)),
            Text(clean(a.status)),
            Text(clean(approval_what(a.request))),
            Text(clean(a.decided_by or "")),
        )
        for a in items
    ]
    return fitted_table(
        [("request", "id"), ("status", "id"), ("what", "fold"), ("decided by", "text")], rows
    )


# --------------------------------------------------------------------------- events


def event_line(e: Any) -> Text:
    """`events`: seq, time, type and the data as JSON, its times as dates (`--json`
    keeps them as numbers)."""
    data = json.dumps(readable_times(e.data), ensure_ascii=False)
    return Text(clean(f"{e.seq:>6} {ts(e.at)} {e.type:<22} {data}"))


def timeline_line(e: Any, *, full: bool = False) -> Text:
    """`timeline`: seq, time of day, type and the event in words, coloured — one line
    (newlines shown as `\\n`); with `full`, the event's whole data follows, indented."""
    style, text = describe_event(e)
    line = Text.assemble(
        (f"{e.seq:>6} ", "dim"),
        (ts(e.at)[11:] + " ", "dim"),
        (f"{clean(e.type):<20} ", style),
        clean(readable_until(text)),
    )
    if full:
        data = json.dumps(e.data, indent=2, ensure_ascii=False, default=str)
        line.append("\n" + clean(data, lines=True).replace("\n", "\n        "), "dim")
    return line


# --------------------------------------------------------------------------- progress


class ProgressView:
    """Live progress: ledger bar, current item, round, tokens, cost, cache hit rate."""

    def __init__(self) -> None:
        self.snap: Any = None
        self.live: Live | None = None

    def __rich__(self) -> Any:
        s = self.snap
        if s is None:
            return Text("starting…")
        p = s.progress.to_dict()
        return Panel(
            Group(
                ledger_bar(p),
                Text(
                    f"round {s.round}  status {s.status}  current item {clean(s.focus or '-')}\n"
                    f"tokens {s.tokens}  cost ${s.cost_usd:.4f}  prompt cache hit (act) "
                    f"{100 * s.cache_hit_rate:.0f}%\n{clean(s.message, lines=True)}"
                ),
            ),
            title=f"tether · {clean(s.task_id)}",
        )

    def update(self, snap: Any) -> None:
        """The engine's `on_progress`: show the latest snapshot."""
        self.snap = snap
        if self.live is not None:
            self.live.refresh()


# --------------------------------------------------------------------------- demo


def summary_table(summary: Mapping[str, Any]) -> FittedTable:
    """The demo's 'what happened' table."""
    rows = [(Text(clean(k), "bold"), Text(clean(v, lines=True))) for k, v in summary.items()]
    return fitted_table([("", "id"), ("", "text")], rows, title="what happened", show_header=False)
