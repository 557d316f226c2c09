"""The report for people: Markdown, one self-contained HTML file, or JSON.

Both text formats are built from the same sections (a title and a table each), so they
say the same things; the HTML file adds the charts (inline SVG, see `charts`) and needs
nothing else to open, offline. User text (names, objectives, errors, notes) is escaped
for the format it lands in.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tether._extras import install_hint
from tether.redact import redact
from tether.report import charts

#: The spending tables, in order: key of the document, title.
_SPEND = (
    ("by_milestone", "Spending by milestone"),
    ("by_item", "Spending by item"),
    ("by_purpose", "Spending by purpose"),
    ("by_model", "Spending by model"),
    ("by_tool", "Spending by tool (the model calls of the rounds that called it)"),
)
_SPEND_COLUMNS = ("", "calls", "rounds", "tokens in", "cached", "tokens out", "cost $")
#: At most this many points of the progress table in Markdown.
_PROGRESS_ROWS = 25


@dataclass(frozen=True)
class Section:
    """One titled table of the report."""

    title: str
    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    empty: str = "none"


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _money(x: float) -> str:
    return f"{x:.4f}"


def _summary(doc: Mapping[str, Any]) -> Section:
    t, task, p = doc["totals"], doc["task"], doc["task"]["progress"]
    hit = t["cached_tokens"] / t["input_tokens"] if t["input_tokens"] else 0.0
    status = task["status"] + (f" ({task['stop_reason']})" if task["stop_reason"] else "")
    rows: list[tuple[Any, ...]] = [
        ("task", f"{task['task_id']} · {task['name']} · v{task['version']}"),
        ("objective", task["objective"]),
        ("status", status),
        ("ledger", f"{p['done']}/{p['total']} done, {p['blocked']} blocked, "
                   f"{p['waived']} waived, {p['skipped']} skipped"),
        ("wall time", f"{t['wall_seconds']:.1f} s ({_when(t['first_at'])} to "
                      f"{_when(t['last_at'])} UTC)"),
        ("turns, rounds", f"{t['turns']} turns, {t['rounds']} rounds"),
        ("model calls", str(t["model_calls"])),
        ("tokens", f"{t['tokens']} ({t['input_tokens']} in, {t['cached_tokens']} of them "
                   f"cached ({100 * hit:.0f}%), {t['output_tokens']} out)"),
        ("money", f"${_money(t['cost_usd'])}"),
        ("tool calls", str(t["tool_calls"])),
        ("failures", str(doc["failures"]["total"])),
        ("human interventions", str(len(doc["interventions"]))),
        ("recoveries", str(len(doc["recoveries"]))),
    ]  # fmt: skip
    return Section("Summary", ("", ""), rows)


def _spend(rows: Sequence[Mapping[str, Any]], title: str) -> Section:
    return Section(
        title,
        _SPEND_COLUMNS,
        [
            (
                r["key"],
                r["calls"],
                r["rounds"],
                r["input_tokens"],
                r["cached_tokens"],
                r["output_tokens"],
                _money(r["cost_usd"]),
            )
            for r in rows
        ],
    )


def _counts(title: str, what: str, counts: Mapping[str, int]) -> Section:
    return Section(title, (what, "count"), list(counts.items()))


def _sampled(points: Sequence[Any], n: int) -> list[Any]:
    if len(points) <= n:
        return list(points)
    step = (len(points) - 1) / (n - 1)
    return [points[round(i * step)] for i in range(n)]


def sections(doc: Mapping[str, Any]) -> list[Section]:
    """The report's tables, in reading order."""
    start = doc["totals"]["first_at"] or 0.0
    out = [
        _summary(doc),
        Section(
            "Where the budget went (top three)",
            ("where", "cost $", "tokens", "share"),
            [
                (r["where"], _money(r["cost_usd"]), r["tokens"], f"{100 * r['share']:.1f}%")
                for r in doc["top_spend"]
            ],
        ),
    ]
    out += [_spend(doc["spend"][key], title) for key, title in _SPEND]
    out.append(
        Section(
            "Prompt cache by turn (act calls)",
            ("turn", "kind", "calls", "tokens in", "cached", "hit rate"),
            [
                (
                    c["turn"],
                    c["kind"],
                    c["calls"],
                    c["input_tokens"],
                    c["cached_tokens"],
                    f"{100 * c['hit_rate']:.0f}%",
                )
                for c in doc["cache_by_turn"]
            ],
        )
    )
    fails, retries = doc["failures"], doc["retries"]
    out += [
        _counts("Failures by class", "class", fails["by_class"]),
        _counts("Failures by tool", "tool", fails["by_tool"]),
        _counts("Failures by milestone", "milestone", fails.get("by_milestone", {})),
        Section(
            "Model call failures",
            ("seq", "purpose", "error"),
            [(m["seq"], m["purpose"], m["error"]) for m in fails["model"]],
        ),
        _counts("Retries by tool", "tool", retries["by_tool"]),
        Section(
            "Breaker openings",
            ("seq", "time (UTC)", "service", "reason"),
            [
                (b["seq"], _when(b["at"]), b["service"], b["reason"])
                for b in retries["breaker_openings"]
            ],
        ),
        Section(
            "Human interventions",
            ("seq", "time (UTC)", "kind", "by", "what"),
            [
                (i["seq"], _when(i["at"]), i["kind"], i["by"], i["detail"])
                for i in doc["interventions"]
            ],
        ),
        Section(
            "Waits",
            ("seq", "kind", "reason", "waited s", "answered by"),
            [
                (
                    w["seq"],
                    w["kind"],
                    w["reason"],
                    "still waiting" if w["seconds"] is None else f"{w['seconds']:.1f}",
                    w["answered_by"] or "-",
                )
                for w in doc["waits"]
            ],
        ),
        Section(
            "Recoveries",
            ("seq", "time (UTC)", "worker", "previous owner", "steps"),
            [
                (
                    r["seq"],
                    _when(r["at"]),
                    r["worker_id"],
                    r["previous_owner"] or "-",
                    ", ".join(str(s["step"]) for s in r["steps"]),
                )
                for r in doc["recoveries"]
            ],
        ),
        Section(
            "Ledger progress over time",
            ("seq", "seconds", "finished", "blocked", "of"),
            [
                (p["seq"], f"{p['at'] - start:.1f}", p["finished"], p["blocked"], p["total"])
                for p in _sampled(doc["progress"], _PROGRESS_ROWS)
            ],
        ),
    ]
    return out


# --------------------------------------------------------------------------- Markdown


def _md_cell(value: Any) -> str:
    text = redact(str(value)).replace("\\", "\\\\").replace("|", "\\|")
    # One table row per line, whatever the text holds; control characters shown escaped.
    return "".join(
        c if c.isprintable() else ("\\n" if c == "\n" else f"\\x{ord(c):02x}") for c in text
    )


def markdown(doc: Mapping[str, Any]) -> str:
    """The report as Markdown."""
    lines = [f"# Report: {_md_cell(doc['task']['name'])} ({_md_cell(doc['task']['task_id'])})"]
    for s in sections(doc):
        lines += ["", f"## {s.title}", ""]
        if not s.rows:
            lines.append(f"_{s.empty}_")
            continue
        lines.append("| " + " | ".join(_md_cell(c) for c in s.columns) + " |")
        lines.append("|" + "---|" * len(s.columns))
        lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in s.rows]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- HTML

_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:60em;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.8em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.4em 0}td,th{padding:.15em .7em;text-align:left;
vertical-align:top;border-bottom:1px solid #eee}th{font-weight:600}
td:not(:first-child){font-variant-numeric:tabular-nums}.empty{color:#777;font-style:italic}
.charts svg{max-width:100%;height:auto;display:block;margin:.5em 0}
"""


def _esc(value: Any) -> str:
    return html.escape(redact(str(value)))


def html_sections(doc: Mapping[str, Any], *, level: int = 2) -> str:
    """The report's tables as HTML (no page around them; the dashboard embeds them)."""
    parts = []
    for s in sections(doc):
        parts.append(f"<h{level}>{_esc(s.title)}</h{level}>")
        if not s.rows:
            parts.append(f'<p class="empty">{_esc(s.empty)}</p>')
            continue
        head = "".join(f"<th>{_esc(c)}</th>" for c in s.columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{_esc(v)}</td>" for v in row) + "</tr>" for row in s.rows
        )
        parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    return "\n".join(parts)


def html_charts(doc: Mapping[str, Any]) -> str:
    """The charts as inline SVG (a note instead when matplotlib is not installed)."""
    if not charts.available():
        hint = html.escape(install_hint("report"), quote=False)
        return f'<p class="empty">charts need the report extra: {hint}</p>'
    return "\n".join(
        f'<figure class="chart" data-chart="{name}">{svg}</figure>'
        for name, svg in charts.all_charts(doc).items()
    )


def html_page(doc: Mapping[str, Any]) -> str:
    """The report as one self-contained HTML file (inline style and SVG, no script)."""
    title = f"Report: {_esc(doc['task']['name'])} ({_esc(doc['task']['task_id'])})"
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{title}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{title}</h1>"
        f'<section class="charts">{html_charts(doc)}</section>'
        f"{html_sections(doc)}"
        f'<p class="empty">generated {_when(doc["generated_at"])} UTC</p>'
        "</body></html>\n"
    )


def render(doc: Mapping[str, Any], fmt: str) -> str:
    """The report in `fmt`: `md`, `html` or `json`."""
    if fmt == "json":
        return redact(json.dumps(doc, indent=2, ensure_ascii=False))
    if fmt == "html":
        return html_page(doc)
    return markdown(doc)
