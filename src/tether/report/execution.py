"""`tether report TASK --execution`: the execution report of any task, for people (plain
text that fits the width it is given, a terminal or a pipe) or as JSON.

The report is `runtime.judge.execution`'s, the one a sign-off request (`review: human`)
carries; here it is built from the store for a task in any state.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping
from typing import Any

from tether.runtime.judge.execution import execution_report
from tether.spec import parse_spec
from tether.store.base import Store
from tether.text import counted


async def build_execution(store: Store, task_id: str) -> dict[str, Any]:
    """The execution report of `task_id` (JSON-ready), with the task's id and status."""
    task = await store.get_task(task_id)
    ledger = (await store.get_ledger(task_id)).to_ledger()
    events = await store.read_events(task_id)
    spec = parse_spec(task.spec, source=f"task {task_id}", stored=True)
    return {
        "task_id": task.task_id,
        "name": task.name,
        "status": task.status,
        "stop_reason": task.stop_reason,
        "signoff": bool((task.waiting or {}).get("signoff")),
        **execution_report(spec, ledger, events),
    }


def _wrap(text: str, width: int, indent: str = "") -> list[str]:
    return textwrap.wrap(
        text, width, initial_indent=indent, subsequent_indent=indent + "  ", break_on_hyphens=False
    ) or [indent]


def _section(title: str, lines: Iterable[str], width: int) -> list[str]:
    body = list(lines)
    return ["", title, "-" * min(len(title), width), *(body or ["  none"])]


def _steps(doc: Mapping[str, Any], width: int) -> list[str]:
    st = doc["steps"]
    lines = _wrap(
        f"{counted(st['turns'], 'turn')}, {counted(st['rounds'], 'round')}, "
        f"{counted(st['model_calls'], 'model call')}, {counted(st['tool_calls'], 'tool call')}",
        width,
        "  ",
    )
    for row in st["by_item"]:
        tools = ", ".join(f"{k} x{v}" for k, v in row["tools"].items()) or "no tools"
        lines += _wrap(
            f"{row['item']}: {counted(row['rounds'], 'round')}, "
            f"{counted(row['tool_calls'], 'tool call')} ({tools})",
            width,
            "  ",
        )
    return lines


def _items(doc: Mapping[str, Any], width: int) -> list[str]:
    lines: list[str] = []
    for i in doc["items"]:
        where = f" [{i['milestone']}]" if i["milestone"] else ""
        lines += _wrap(f"{i['id']}{where}: {i['status']} - {i['title']}", width, "  ")
        for ref in i["evidence"]:
            lines += _wrap(f"evidence {ref}", width, "    ")
        if i["note"] and i["status"] != "done":
            lines += _wrap(f"note: {i['note']}", width, "    ")
    return lines


def _deviations(doc: Mapping[str, Any], width: int) -> list[str]:
    dv = doc["deviations"]
    lines: list[str] = []
    for kind in ("skipped", "waived"):
        for w in dv[kind]:
            lines += _wrap(f"{kind} {w['item']}: {w['reason'] or '(no reason)'}", width, "  ")
    if dv["blocked"]:
        lines += _wrap(f"blocked on the way: {', '.join(dv['blocked'])}", width, "  ")
    for e in dv["edits"]:
        changed = ", ".join(e["changed"]) or "nothing"
        lines += _wrap(f"contract edited by {e['by']} (v{e['version']}): {changed}", width, "  ")
    for c in dv["checks_failed_before_passing"]:
        lines += _wrap(f"acceptance {c['id']} failed before passing: {c['detail']}", width, "  ")
    for r in dv["reopened"]:
        lines += _wrap(f"{r['item']} sent back to work by the {r['by']}", width, "  ")
    return lines


def render_text(doc: Mapping[str, Any], width: int = 80) -> str:
    """The execution report as text no wider than `width` (at least 40)."""
    width = max(40, width)
    done = doc["progress"]["done"]
    status = doc["status"] + (f" ({doc['stop_reason']})" if doc["stop_reason"] else "")
    if doc.get("signoff"):
        status = "waiting for sign-off"
    head = [
        *_wrap(f"Execution report of {doc['task_id']} ({doc['name']})", width),
        *_wrap(f"objective: {doc['objective']}", width, "  "),
        *_wrap(f"status: {status}; {done}/{doc['progress']['total']} items done", width, "  "),
    ]
    checks = [
        f"{c['id']}: {'passed' if c['passed'] else 'failed'}"
        + (f" ({c['detail']})" if c.get("detail") else "")
        for c in doc["acceptance"]
    ]
    c = doc["cost"]
    cost = _wrap(
        f"{c['tokens']} tokens ({c['input_tokens']} in, {c['cached_tokens']} cached, "
        f"{c['output_tokens']} out), ${c['cost_usd']:.4f}, {c['wall_seconds']:.1f} s wall time",
        width,
        "  ",
    )
    waivers = [
        line
        for w in doc["waivers"]
        for line in _wrap(f"{w['item']} ({w['status']}): {w['reason']}", width, "  ")
    ]
    out = [
        *head,
        *_section("Steps", _steps(doc, width), width),
        *_section("Items and evidence", _items(doc, width), width),
        *_section("Waivers", waivers, width),
        *_section("Acceptance checks", (x for s in checks for x in _wrap(s, width, "  ")), width),
        *_section("Deviations from the goal", _deviations(doc, width), width),
        *_section("Cost", cost, width),
    ]
    return "\n".join(out) + "\n"
