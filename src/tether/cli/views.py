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
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from rich.console import Group
from rich.highlighter import JSONHighlighter
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tether.redact import redact

STATUS_STYLE = {
    "queued": "cyan",
    "running": "blue",
    "waiting": "yellow",
    "suspended": "yellow",
    "stalled": "red",
    "satisfied": "green",
    "abandoned": "magenta",
    "cancelled": "dim",
    "failed": "red",
}


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


def json_view(doc: Any) -> Text:
    """`--json` output: `json.dumps(doc, indent=2)` with non-ASCII text kept, except what
    would act on a terminal, which is written as a `\\uNNNN` escape (the same JSON)."""
    return JSONHighlighter()(Text(clean_json_text(json.dumps(doc, indent=2, ensure_ascii=False))))


def ts(t: float | None) -> str:
    """A unix time as `YYYY-MM-DD HH:MM:SS` (UTC), `-` for none."""
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


# --------------------------------------------------------------------------- status


def ledger_bar(progress: Mapping[str, Any], width: int = 40) -> Text:
    """The ledger's items as a coloured bar, with counts."""
    total = max(1, int(progress["total"]))
    parts = [
        ("done", "green", "█"),
        ("in_progress", "blue", "█"),
        ("blocked", "red", "█"),
        ("skipped", "magenta", "█"),
        ("waived", "magenta", "▓"),
        ("pending", "grey50", "░"),
    ]
    bar = Text()
    used = 0
    for key, style, ch in parts:
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


def sources_line(doc: Mapping[str, Any]) -> Text:
    """The contract's sources with their versions, and how many artifacts are invalid."""
    text = "sources: " + ", ".join(
        f"{clean(s['id'])} {clean(s['version'])} ({clean(s['pin'])})" for s in doc["sources"]
    )
    arts = doc.get("artifacts") or {}
    if arts.get("invalid_count"):
        text += f"; {arts['invalid_count']} invalid artifacts (tether artifacts TASK --invalid)"
    return Text(text)


def status_view(doc: Mapping[str, Any]) -> Group:
    """A task from its `status --json` document: state, ledger, budget, waiting."""
    style = STATUS_STYLE.get(doc["status"], "white")
    head = Text.assemble(
        ("task ", "bold"),
        (clean(doc["task_id"]), "bold cyan"),
        f"  {clean(doc['name'])}  v{doc['version']}  ",
        (clean(doc["status"]), f"bold {style}"),
        (f" ({clean(stop_text(doc))})" if doc["stop_reason"] else "", style),
    )
    lines: list[Any] = [head, Text(f"goal: {clean(doc['ledger']['objective'], lines=True)}")]
    if doc.get("at"):
        at = doc["at"]
        lines.insert(0, Text(f"as of event {at['seq']} ({clean(at['type'])}, {ts(at['time'])})"))
    lines.append(ledger_bar(doc["ledger"]["progress"]))
    if doc.get("waiting"):
        reason = doc["waiting"].get("reason", doc["waiting"])
        lines.append(Text(f"waiting: {clean(reason, lines=True)}", "yellow"))
        partial = doc["waiting"].get("partial")
        if partial:
            lines.append(partial_view(partial))
    if doc.get("waivers"):
        lines.append(
            Text(
                "waived: "
                + "; ".join(f"{clean(w['id'])} ({clean(w['reason'])})" for w in doc["waivers"]),
                "magenta",
            )
        )
    if doc.get("sources"):
        lines.append(sources_line(doc))
    if doc.get("compensations"):
        undo = doc["compensations"]
        shown = "; ".join(f"{clean(c['op_id'])} {clean(c['outcome'])}" for c in undo[:6])
        more = f" (+{len(undo) - 6} more)" if len(undo) > 6 else ""
        lines.append(Text(f"compensations: {shown}{more}", "yellow"))
    used = doc["budget"]["used"]
    lines.append(
        Text(
            f"rounds {used['rounds']}  model calls {used['model_calls']}  tokens {used['tokens']}"
            f" (cached {used['cached_tokens']})  cost ${used['money_usd']:.4f}  "
            f"wall {used['wall_seconds']:.1f}s"
        )
    )
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for col in ("item", "status", "attempts", "evidence / note"):
        table.add_column(col)
    for it in doc["ledger"]["items"]:
        st = it["status"]
        colour = {
            "done": "green",
            "blocked": "red",
            "in_progress": "blue",
            "skipped": "magenta",
            "waived": "magenta",
        }
        detail = ", ".join(it["evidence"][:2]) if st == "done" else (it["note"] or "")
        table.add_row(
            Text(clean(it["id"])),
            Text(clean(st), colour.get(st, "white")),
            str(it["attempts"]),
            Text(clean(detail, lines=True)),
        )
    lines.append(table)
    return Group(*lines)


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


def task_rows(tasks: Sequence[Any]) -> list[dict[str, Any]]:
    """`list --json`: one object per task record."""
    return [
        {
            "task_id": t.task_id,
            "name": t.name,
            "status": t.status,
            "stop_reason": t.stop_reason,
            "version": t.version,
            "created_at": t.created_at,
        }
        for t in tasks
    ]


def task_table(tasks: Sequence[Any]) -> Table:
    """`list`: task, name, status (with the stop reason), created."""
    table = Table("task", "name", "status", "created", box=None, header_style="bold")
    for t in tasks:
        st = t.status + (f" ({t.stop_reason})" if t.stop_reason else "")
        table.add_row(
            Text(clean(t.task_id)),
            Text(clean(t.name)),
            Text(clean(st), STATUS_STYLE.get(t.status, "")),
            ts(t.created_at),
        )
    return table


def approvals_table(items: Sequence[Any]) -> Table:
    """`approvals`: request, status, what, decided by."""
    table = Table("request", "status", "what", "decided by", box=None, header_style="bold")
    for a in items:
        table.add_row(
            Text(clean(a.request_id)),
            Text(clean(a.status)),
            Text(clean(str(a.request.get("what", ""))[:80])),
            Text(clean(a.decided_by or "")),
        )
    return table


# --------------------------------------------------------------------------- events


def event_line(e: Any) -> Text:
    """`events`: seq, time, type and the data as JSON."""
    return Text(
        clean(f"{e.seq:>6} {ts(e.at)} {e.type:<22} {json.dumps(e.data, ensure_ascii=False)}")
    )


def describe_event(e: Any) -> tuple[str, str]:
    """(style, text): one event in words."""
    d = e.data
    t = e.type
    if t == "task.status":
        why = f" — {d.get('reason')}" if d.get("reason") else ""
        stop = f" ({d['stop_reason']})" if d.get("stop_reason") else ""
        return STATUS_STYLE.get(d["dst"], "white"), f"{d['src']} → {d['dst']}{stop}{why}"
    if t == "model.called":
        return "cyan", (
            f"{d['purpose']} call to {d['model']}: {d['input_tokens']} in "
            f"({d['cached_tokens']} cached) / {d['output_tokens']} out, "
            f"{d['latency_ms']:.0f} ms — {d.get('summary', '')[:80]}"
        )
    if t == "op.result":
        style = "green" if d["status"] == "succeeded" else "red"
        msg = d.get("summary") or d.get("error") or ""
        return style, f"{d['tool']} {d['status']}: {msg[:100]}"
    if t == "op.intended":
        return "dim", f"intent {d['op_id']} {d['tool']}"
    if t == "op.exhausted":
        undo = d.get("compensate") or []
        then = (
            f"compensate {len(undo)} applied op(s), newest first"
            if d.get("policy") == "compensate"
            else str(d.get("policy"))
        )
        return "bold red", (
            f"{d['tool']} {d['op_id']} gave up after {d['attempts']} attempts → {then}"
        )
    if t == "op.compensated":
        return "yellow", f"{d['op_id']} {d['outcome']} by {d['by']}"
    if t == "judge.verdict":
        return "magenta", (
            f"round {d['round']} verdict {d['decision']}: {d['done']}/{d['total']} done "
            f"({d['percent']}%){' — ' + d['reason'] if d.get('reason') else ''}"
        )
    if t == "ledger.updated":
        changes = [
            f"{c.get('item')}.{c.get('field')}→{c.get('after')}"
            for c in d.get("diff", [])
            if c.get("field") in ("status", "breaker")
        ]
        return "green", f"ledger v{d['version']}: {', '.join(changes[:6]) or 'updated'}"
    if t == "audit.warning":
        return "bold yellow", f"AUDIT {d['code']}: {d['message']}"
    if t == "probe.answered":
        style = "yellow" if d.get("answer") in ("STUCK", "unusable") else "cyan"
        return style, (
            f"status probe of round {d.get('round')} on {d.get('item')} after "
            f"{float(d.get('silent_for', 0)):.0f}s silent: {d.get('answer')}"
            + (f" ({str(d.get('text', ''))[:60]!r})" if d.get("answer") == "unusable" else "")
        )
    if t == "turn.started":
        return (
            "bold",
            f"turn {d['turn']} ({d['kind']}) epoch={d['epoch']} {d.get('epoch_reason', '')}",
        )
    if t == "round.started":
        return "bold blue", f"round {d['round']} on {d.get('item')}"
    if t == "context.compacted":
        return "yellow", (
            f"compacted {d['rounds_compacted']} rounds: {d['tokens_before']} → "
            f"{d['tokens_after']} tokens"
        )
    if t == "completion.checked":
        return ("green" if d["passed"] else "red"), (
            f"completion check {'passed' if d['passed'] else 'failed'}"
            + (f": {'; '.join(d['gaps'])[:120]}" if d.get("gaps") else "")
        )
    return "white", json.dumps(d, ensure_ascii=False)[:140]


def timeline_line(e: Any, *, full: bool = False) -> Text:
    """`timeline`: seq, time of day, type and the event in words, coloured — one line
    (newlines shown as `\\n`); with `full`, the event's whole data follows, indented."""
    style, text = describe_event(e)
    line = Text.assemble(
        (f"{e.seq:>6} ", "dim"),
        (ts(e.at)[11:] + " ", "dim"),
        (f"{clean(e.type):<20} ", style),
        clean(text),
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


def summary_table(summary: Mapping[str, Any]) -> Table:
    """The demo's 'what happened' table."""
    table = Table(title="what happened", show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()
    for k, v in summary.items():
        table.add_row(Text(clean(k)), Text(clean(v, lines=True)))
    return table
