"""Tasks and events in words, for the CLI and the dashboard alike.

The colour of each status, a unix time as a date, the `list --json` row of a task, one
event as a coloured line of text: plain data and strings (the CLI wraps them in `rich`
objects, the dashboard in HTML), so that the dashboard does not import the CLI.
Nothing here reads the store.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tether.text import ts as ts

STATUS_STYLE = {
    "queued": "cyan",
    "running": "blue",
    "waiting": "yellow",
    "suspended": "yellow",
    "stalled": "red",
    "paused": "yellow",
    "satisfied": "green",
    "abandoned": "magenta",
    "cancelled": "dim",
    "failed": "red",
}


def task_rows(tasks: Sequence[Any], now: float | None = None) -> list[dict[str, Any]]:
    """`list --json`: one object per task record; with the store's time `now`, each says
    whether it is running for an owner that is gone (`owner_gone`: why, or null)."""
    from tether.runtime.takeover import owner_gone

    return [
        {
            "task_id": t.task_id,
            "name": t.name,
            "status": t.status,
            "stop_reason": t.stop_reason,
            "version": t.version,
            "created_at": t.created_at,
            **({"owner_gone": owner_gone(t, now)} if now is not None else {}),
        }
        for t in tasks
    ]


def shorten(text: str, limit: int) -> str:
    """`text` up to `limit` characters, `…` marking a cut (for summaries, never ids;
    `timeline --full` shows an event whole)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _lease_claimed(d: Mapping[str, Any]) -> tuple[str, str]:
    return "dim", (
        f"{d.get('worker_id')} holds the lease (token {d.get('token')}) until "
        f"{ts(d.get('expires_at'))}"
    )


def _retry_scheduled(d: Mapping[str, Any]) -> tuple[str, str]:
    return "yellow", (
        f"{d.get('op_id')} attempt {d.get('attempt')} failed ({d.get('error_class')}); "
        f"next attempt at {ts(d.get('next_attempt_at'))}"
        + (f": {shorten(str(d.get('error')), 100)}" if d.get("error") else "")
    )


def _op_exhausted(d: Mapping[str, Any]) -> tuple[str, str]:
    undo = d.get("compensate") or []
    then = (
        f"compensate {len(undo)} applied op(s), newest first"
        if d.get("policy") == "compensate"
        else str(d.get("policy"))
    )
    return "bold red", f"{d['tool']} {d['op_id']} gave up after {d['attempts']} attempts → {then}"


def _probe_answered(d: Mapping[str, Any]) -> tuple[str, str]:
    style = "yellow" if d.get("answer") in ("STUCK", "unusable") else "cyan"
    return style, (
        f"status probe of round {d.get('round')} on {d.get('item')} after "
        f"{float(d.get('silent_for', 0)):.0f}s silent: {d.get('answer')}"
        + (f" ({str(d.get('text', ''))[:60]!r})" if d.get("answer") == "unusable" else "")
    )


_DESCRIBERS: dict[str, Callable[[Mapping[str, Any]], tuple[str, str]]] = {
    "lease.claimed": _lease_claimed,
    "op.retry_scheduled": _retry_scheduled,
    "op.exhausted": _op_exhausted,
    "probe.answered": _probe_answered,
}


#: Events told by their fields alone: (style, the line with `{field}` for each).
_TEMPLATES: dict[str, tuple[str, str]] = {
    "op.intended": ("dim", "intent {op_id} {tool}"),
    "op.compensated": ("yellow", "{op_id} {outcome} by {by}"),
    "audit.warning": ("bold yellow", "AUDIT {code}: {message}"),
    "context.compacted": (
        "yellow",
        "compacted {rounds_compacted} rounds: {tokens_before} → {tokens_after} tokens",
    ),
}


def describe_event(e: Any) -> tuple[str, str]:
    """(style, text): one event in words."""
    d = e.data
    t = e.type
    special = _DESCRIBERS.get(t)
    if special is not None:
        return special(d)
    if t in _TEMPLATES:
        style, line = _TEMPLATES[t]
        return style, line.format_map(d)
    if t == "task.status":
        why = f" — {d.get('reason')}" if d.get("reason") else ""
        stop = f" ({d['stop_reason']})" if d.get("stop_reason") else ""
        return STATUS_STYLE.get(d["dst"], "white"), f"{d['src']} → {d['dst']}{stop}{why}"
    if t == "model.called":
        return "cyan", (
            f"{d['purpose']} call to {d['model']}: {d['input_tokens']} in "
            f"({d['cached_tokens']} cached) / {d['output_tokens']} out, "
            f"{d['latency_ms']:.0f} ms — {shorten(d.get('summary', ''), 80)}"
        )
    if t == "op.result":
        style = "green" if d["status"] == "succeeded" else "red"
        msg = d.get("summary") or d.get("error") or ""
        return style, f"{d['tool']} {d['status']}: {shorten(msg, 100)}"
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
    if t == "turn.started":
        return (
            "bold",
            f"turn {d['turn']} ({d['kind']}) epoch={d['epoch']} {d.get('epoch_reason', '')}",
        )
    if t == "round.started":
        return "bold blue", f"round {d['round']} on {d.get('item')}"
    if t == "completion.checked":
        return ("green" if d["passed"] else "red"), (
            f"completion check {'passed' if d['passed'] else 'failed'}"
            + (f": {shorten('; '.join(d['gaps']), 120)}" if d.get("gaps") else "")
        )
    return "white", shorten(json.dumps(readable_times(d), ensure_ascii=False), 140)


#: "until 1796161988" (or with a fraction): a unix time inside a message the runtime
#: wrote (a breaker's cooling down, a service that is away).
_UNTIL_UNIX = re.compile(r"\buntil (\d{9,11}(?:\.\d+)?)\b")


def readable_until(text: str) -> str:
    """`text` with each "until <unix time>" written as "until YYYY-MM-DD HH:MM:SS UTC"."""
    return _UNTIL_UNIX.sub(lambda m: f"until {ts(float(m.group(1)))} UTC", text)


def readable_times(data: Mapping[str, Any]) -> dict[str, Any]:
    """`data` with each unix time (a number under a key ending in `_at`, or `until`)
    written as `YYYY-MM-DD HH:MM:SS` (UTC), for a line a person reads."""
    return {
        k: ts(v)
        if (k.endswith("_at") or k == "until")
        and isinstance(v, int | float)
        and not isinstance(v, bool)
        else v
        for k, v in data.items()
    }
