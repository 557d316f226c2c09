"""The report's charts, drawn on the server as inline SVG (matplotlib, no network).

Each function takes the report document (see `figures.build_report`) and returns one
`<svg>` element as text, ready to inline in an HTML page. matplotlib comes with the
`report` or `web` extra; `available()` says whether it is installed.
"""

from __future__ import annotations

import importlib.util
import io
import re
from collections.abc import Mapping, Sequence
from typing import Any

from tether._extras import needs

#: Colours of the charts (the dashboard's palette).
_DONE, _BLOCKED, _BAR, _FAIL = "#2e7d32", "#c62828", "#1565c0", "#ef6c00"
_XML_HEAD = re.compile(r"^.*?(?=<svg)", re.S)


def available() -> bool:
    """True when matplotlib is installed."""
    return importlib.util.find_spec("matplotlib") is not None


def _figure(height: float = 2.6) -> Any:
    with needs("report", "the report's charts"):
        from matplotlib.figure import Figure

    # Figure() without pyplot: no global state, safe in a server's threads.
    fig = Figure(figsize=(7.0, height), dpi=96)
    fig.set_layout_engine("constrained")
    return fig


def _svg(fig: Any, title: str) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Title": title})
    # The XML declaration and DOCTYPE cannot stand inside an HTML page.
    return _XML_HEAD.sub("", buf.getvalue(), count=1)


def progress_chart(doc: Mapping[str, Any]) -> str:
    """Items done (and blocked) over the task's wall time."""
    points = doc["progress"]
    start = doc["totals"]["first_at"] or 0.0
    fig = _figure()
    ax = fig.add_subplot()
    xs = [p["at"] - start for p in points]
    ax.step(xs, [p["finished"] for p in points], where="post", color=_DONE, label="finished")
    ax.step(xs, [p["blocked"] for p in points], where="post", color=_BLOCKED, label="blocked")
    total = points[-1]["total"] if points else 0
    ax.axhline(total, color="#999999", linewidth=0.8, linestyle="--", label=f"all {total} items")
    ax.set_xlabel("seconds since the task started")
    ax.set_ylabel("items")
    ax.set_title("Ledger progress over time")
    ax.legend(loc="upper left", fontsize="small")
    return _svg(fig, "progress over time")


def _barh(rows: Sequence[tuple[str, float]], title: str, xlabel: str, colour: str) -> str:
    fig = _figure(height=max(1.6, 0.35 * len(rows) + 1.0))
    ax = fig.add_subplot()
    if not rows:
        ax.text(0.5, 0.5, "nothing to show", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    else:
        labels = [r[0][:40] for r in rows][::-1]
        ax.barh(labels, [r[1] for r in rows][::-1], color=colour)
        ax.set_xlabel(xlabel)
    ax.set_title(title)
    return _svg(fig, title)


def cost_chart(doc: Mapping[str, Any]) -> str:
    """Money by milestone (tokens when no call cost money)."""
    rows = doc["spend"]["by_milestone"]
    money = doc["totals"]["cost_usd"] > 0
    key, unit = ("cost_usd", "US dollars") if money else ("tokens", "tokens (no call cost money)")
    data = [(r["key"], float(r[key])) for r in rows]
    return _barh(data, "Spending by milestone", unit, _BAR)


def failures_chart(doc: Mapping[str, Any]) -> str:
    """Failed tool calls by tool."""
    data = [(k, float(v)) for k, v in doc["failures"]["by_tool"].items()]
    return _barh(data, "Failures by tool", "failed calls", _FAIL)


def all_charts(doc: Mapping[str, Any]) -> dict[str, str]:
    """Every chart of the report by name: progress, cost, failures."""
    return {
        "progress": progress_chart(doc),
        "cost": cost_chart(doc),
        "failures": failures_chart(doc),
    }
