"""Rendering for the command line: status, ledger bar, timeline, tables, live progress.

Pure functions of the data they are given (the `status --json` document, events,
records); nothing here reads the store.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from rich.console import Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

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


def status_view(doc: Mapping[str, Any]) -> Group:
    """A task from its `status --json` document: state, ledger, budget, waiting."""
    style = STATUS_STYLE.get(doc["status"], "white")
    head = Text.assemble(
        ("task ", "bold"),
        (doc["task_id"], "bold cyan"),
        f"  {doc['name']}  v{doc['version']}  ",
        (doc["status"], f"bold {style}"),
        (f" ({stop_text(doc)})" if doc["stop_reason"] else "", style),
    )
    lines: list[Any] = [head, Text(f"goal: {doc['ledger']['objective']}")]
    lines.append(ledger_bar(doc["ledger"]["progress"]))
    if doc.get("waiting"):
        lines.append(Text(f"waiting: {doc['waiting'].get('reason', doc['waiting'])}", "yellow"))
        partial = doc["waiting"].get("partial")
        if partial:
            lines.append(partial_view(partial))
    if doc.get("waivers"):
        lines.append(
            Text(
                "waived: " + "; ".join(f"{w['id']} ({w['reason']})" for w in doc["waivers"]),
                "magenta",
            )
        )
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
        detail = ", ".join(it["evidence"][:2]) if st == "done" else it["note"]
        table.add_row(it["id"], Text(st, colour.get(st, "white")), str(it["attempts"]), detail)
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
            text.append(f"{it['id']}: {it.get('reason') or '-'}")
    remaining = [it["id"] for it in partial.get("remaining", [])]
    if remaining:
        text.append(f"\n  remaining: {', '.join(remaining)}")
    for item, prop in (partial.get("proposed") or {}).items():
        text.append(f"\n  the judge proposed {prop.get('status')} for {item}: {prop.get('note')}")
    return text


def task_created(task_id: str, n_items: int) -> Text:
    """`task <id> created (<n> items)`."""
    return Text.assemble("task ", (task_id, "bold cyan"), f" created ({n_items} items)")


def interrupted(task_id: str) -> Text:
    """The hint after a Ctrl-C."""
    return Text(f"interrupted; continue with: tether resume {task_id}", "yellow")


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
        table.add_row(t.task_id, t.name, Text(st, STATUS_STYLE.get(t.status, "")), ts(t.created_at))
    return table


def approvals_table(items: Sequence[Any]) -> Table:
    """`approvals`: request, status, what, decided by."""
    table = Table("request", "status", "what", "decided by", box=None, header_style="bold")
    for a in items:
        table.add_row(
            a.request_id, a.status, str(a.request.get("what", ""))[:80], a.decided_by or ""
        )
    return table


# --------------------------------------------------------------------------- events


def event_line(e: Any) -> str:
    """`events`: seq, time, type and the data as JSON."""
    return f"{e.seq:>6} {ts(e.at)} {e.type:<22} {json.dumps(e.data, ensure_ascii=False)}"


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


def timeline_line(e: Any) -> Text:
    """`timeline`: seq, time of day, type and the event in words, coloured."""
    style, text = describe_event(e)
    return Text.assemble(
        (f"{e.seq:>6} ", "dim"), (ts(e.at)[11:] + " ", "dim"), (f"{e.type:<20} ", style), text
    )


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
                    f"round {s.round}  status {s.status}  current item {s.focus or '-'}\n"
                    f"tokens {s.tokens}  cost ${s.cost_usd:.4f}  prompt cache hit (act) "
                    f"{100 * s.cache_hit_rate:.0f}%\n{s.message}"
                ),
            ),
            title=f"tether · {s.task_id}",
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
        table.add_row(k, str(v))
    return table
