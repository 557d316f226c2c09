"""The execution report: what a run did to reach its goal, for the person who signs off.

Folded from the task's event log and its ledger, never from the conversation: the steps
(turns, rounds, tool calls by item), each item's status and evidence, the waivers, the
deviations from the goal (items skipped, waived or blocked on the way, edits of the
contract during the run, acceptance checks that failed before they passed, items a
reviewer or a person sent back) and the cost (tokens, money, wall time).

The completion check attaches it to a sign-off request (`review: human`); `tether report
TASK --execution` builds it for any task.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from tether import ledger as L
from tether.spec import TaskSpec
from tether.store.base import StoredEvent


def tool_calls(events: Sequence[StoredEvent]) -> dict[str, tuple[str, int | None]]:
    """`{op_id: (tool, round)}` of every tool call (a read-only call has no intent
    event: its round comes from `op.committed`)."""
    tool: dict[str, str] = {}
    rnd: dict[str, int] = {}
    for e in events:
        d = e.data
        if e.type in ("op.intended", "op.result"):
            tool.setdefault(str(d["op_id"]), str(d["tool"]))
            if e.type == "op.intended":
                rnd[str(d["op_id"])] = int(d.get("round", 0))
        elif e.type == "op.committed":
            rnd.setdefault(str(d["op_id"]), int(d["round"]))
    return {op: (t, rnd.get(op)) for op, t in tool.items()}


def _steps(events: Sequence[StoredEvent], ledger: L.Ledger) -> dict[str, Any]:
    item_of: dict[int, str | None] = {}
    for e in events:
        if e.type == "round.started":
            item_of[int(e.data["round"])] = e.data.get("item")
    rounds: Counter[str] = Counter(i or "(none)" for i in item_of.values())
    tools: dict[str, Counter[str]] = defaultdict(Counter)
    for tool, rnd in tool_calls(events).values():
        tools[(item_of.get(rnd) if rnd is not None else None) or "(none)"][tool] += 1
    order = [d.id for d, _ in ledger.items()]
    keys = [k for k in order if k in rounds or k in tools]
    keys += sorted(k for k in set(rounds) | set(tools) if k not in order)
    return {
        "turns": sum(1 for e in events if e.type == "turn.started"),
        "rounds": sum(1 for e in events if e.type == "round.committed"),
        "model_calls": sum(1 for e in events if e.type == "model.called"),
        "tool_calls": sum(sum(c.values()) for c in tools.values()),
        "by_item": [
            {
                "item": k,
                "rounds": rounds.get(k, 0),
                "tool_calls": sum(tools[k].values()),
                "tools": dict(sorted(tools[k].items())),
            }
            for k in keys
        ],
    }


def _items(ledger: L.Ledger) -> list[dict[str, Any]]:
    return [
        {"id": d.id, "title": d.title, "milestone": d.milestone, **s.to_dict()}
        for d, s in ledger.items()
    ]


def _went(events: Iterable[StoredEvent], status: str) -> list[str]:
    """Items the ledger moved to `status` at some point of the run, in order."""
    seen: list[str] = []
    for e in events:
        if e.type != "ledger.updated":
            continue
        for c in e.data.get("diff", []):
            if c.get("field") == "status" and c.get("after") == status and c["item"] not in seen:
                seen.append(str(c["item"]))
    return seen


def _deviations(
    events: Sequence[StoredEvent], ledger: L.Ledger, checks: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    waived = {d.id: s.note for d, s in ledger.items() if s.status == "waived"}
    skipped = {d.id: s.note for d, s in ledger.items() if s.status == "skipped"}
    failed: dict[str, dict[str, Any]] = {}
    reopened: list[dict[str, Any]] = []
    for e in events:
        d = e.data
        if e.type == "completion.checked":
            for r in d.get("results", []):
                if not r.get("passed") and r.get("id") not in failed:
                    failed[str(r["id"])] = {"id": r["id"], "detail": r.get("detail", "")}
        elif e.type == "ledger.updated" and d.get("cause") in ("review", "signoff"):
            reopened += [
                {"item": c["item"], "by": d.get("cause")}
                for c in d.get("diff", [])
                if c.get("field") == "status" and c.get("after") == "pending"
            ]
    passing = {str(r["id"]) for r in checks if r.get("passed")}
    return {
        "skipped": [{"item": k, "reason": v} for k, v in skipped.items()],
        "waived": [{"item": k, "reason": v} for k, v in waived.items()],
        "blocked": _went(events, "blocked"),
        "edits": [
            {
                "seq": e.seq,
                "at": e.at,
                "by": e.data.get("by", "user"),
                "version": e.data.get("new_version"),
                "changed": sorted(e.data.get("changes", {})),
            }
            for e in events
            if e.type == "task.edited"
        ],
        "checks_failed_before_passing": [v for k, v in failed.items() if k in passing],
        "reopened": reopened,
    }


def _cost(events: Sequence[StoredEvent]) -> dict[str, Any]:
    calls = [e.data for e in events if e.type == "model.called"]
    inp = sum(int(c.get("input_tokens", 0)) for c in calls)
    outp = sum(int(c.get("output_tokens", 0)) for c in calls)
    wall = (events[-1].at - events[0].at) if events else 0.0
    return {
        "input_tokens": inp,
        "output_tokens": outp,
        "cached_tokens": sum(int(c.get("cached_tokens", 0)) for c in calls),
        "tokens": inp + outp,
        "cost_usd": round(sum(float(c.get("cost_usd", 0.0)) for c in calls), 6),
        "wall_seconds": round(wall, 3),
    }


def execution_report(
    spec: TaskSpec,
    ledger: L.Ledger,
    events: Sequence[StoredEvent],
    checks: Sequence[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The execution report of a run (JSON-ready). `checks`: the acceptance results of
    the completion check that asks for sign-off (else the last one in the log)."""
    if checks is None:
        last = next((e for e in reversed(events) if e.type == "completion.checked"), None)
        checks = list(last.data.get("results", [])) if last else []
    items = _items(ledger)
    return {
        "objective": spec.objective,
        "progress": ledger.progress().to_dict(),
        "steps": _steps(events, ledger),
        "items": items,
        "waivers": [
            {"item": i["id"], "status": i["status"], "reason": i["note"]}
            for i in items
            if i["status"] in ("waived", "skipped")
        ],
        "acceptance": list(checks),
        "deviations": _deviations(events, ledger, checks),
        "cost": _cost(events),
    }
