"""The retrospective report's numbers, folded from a task's event log.

Spending is read from `model.called` events (tokens, cached tokens, cost, purpose,
model, round); a round's item is the focus its `round.started` named, an item's
milestone is the contract's. A tool's share of the spending is the cost of the model
calls of the rounds that called it, split evenly among that round's calls (a model
call is paid for the whole round, not per tool). Calls outside a round (a compaction
between turns, the completion review) count under `(outside rounds)`.

Every total is a plain sum over the log, so `report --format json` can be checked
against `events --json`.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tether import ledger as L
from tether.report.timetravel import replay
from tether.runtime.judge.execution import tool_calls
from tether.runtime.run.state import Spend
from tether.store.base import Store, StoredEvent

#: Where a call outside any round is counted.
OUTSIDE = "(outside rounds)"
#: Events that are a person acting on the task.
HUMAN_EVENTS = {
    "approval.decided": "approval",
    "item.retried": "retry",
    "item.waived": "waive",
    "task.edited": "edit",
    "user.message": "tell",
    "task.cancel_requested": "cancel",
    "signoff.decided": "signoff",
}


@dataclass
class _Bucket:
    """The spend of one bucket (a milestone, an item, a purpose...): the runtime's
    `Spend` value, and the rounds it was spent in."""

    spend: Spend = field(default_factory=Spend)
    rounds: set[int] = field(default_factory=set)

    def add(self, d: Mapping[str, Any], share: float = 1.0) -> None:
        """Count (a share of) one `model.called` event."""
        s = self.spend
        s.calls += 1
        s.input += round(share * int(d.get("input_tokens", 0)))
        s.output += round(share * int(d.get("output_tokens", 0)))
        s.cached += round(share * int(d.get("cached_tokens", 0)))
        s.cost_usd += share * float(d.get("cost_usd", 0.0))
        if d.get("round") is not None:
            self.rounds.add(int(d["round"]))

    def row(self, key: str) -> dict[str, Any]:
        """JSON-ready, under `key`."""
        s = self.spend
        return {
            "key": key,
            "calls": s.calls,
            "rounds": len(self.rounds),
            "input_tokens": s.input,
            "output_tokens": s.output,
            "cached_tokens": s.cached,
            "tokens": s.input + s.output,
            "cost_usd": round(s.cost_usd, 6),
        }


def _rows(buckets: Mapping[str, _Bucket]) -> list[dict[str, Any]]:
    rows = [s.row(k) for k, s in buckets.items()]
    return sorted(rows, key=lambda r: (-r["cost_usd"], -r["tokens"], r["key"]))


@dataclass
class _Rounds:
    """What each round was about and what it called (one entry per op)."""

    item: dict[int, str | None] = field(default_factory=dict)
    tools: dict[int, list[str]] = field(default_factory=lambda: defaultdict(list))


def _ops(events: Sequence[StoredEvent]) -> dict[str, tuple[str, int | None]]:
    """`{op_id: (tool, round)}` of every tool call in the log."""
    return tool_calls(events)


def _rounds(events: Sequence[StoredEvent]) -> _Rounds:
    r = _Rounds()
    for e in events:
        if e.type == "round.started":
            r.item[int(e.data["round"])] = e.data.get("item")
    for tool, rnd in _ops(events).values():
        if rnd is not None:
            r.tools[rnd].append(tool)
    return r


def _spending(events: Sequence[StoredEvent], skeleton: L.Skeleton) -> dict[str, Any]:
    milestone = {d.id: d.milestone for d in skeleton.items}
    rounds = _rounds(events)
    by: dict[str, dict[str, _Bucket]] = {
        k: defaultdict(_Bucket) for k in ("milestone", "item", "purpose", "model", "tool", "place")
    }
    for e in events:
        if e.type != "model.called":
            continue
        d = e.data
        rnd = d.get("round")
        item = rounds.item.get(int(rnd)) if rnd is not None else None
        item_key = item or OUTSIDE
        by["item"][item_key].add(d)
        by["milestone"][(milestone.get(item) or "(none)") if item else OUTSIDE].add(d)
        by["purpose"][str(d.get("purpose"))].add(d)
        by["model"][str(d.get("model"))].add(d)
        by["place"][f"{d.get('purpose')} on {item_key}"].add(d)
        tools = rounds.tools.get(int(rnd), []) if rnd is not None else []
        for tool in tools:
            by["tool"][tool].add(d, share=1.0 / len(tools))
    return {f"by_{key}": _rows(buckets) for key, buckets in by.items()}


def _cache_by_turn(events: Sequence[StoredEvent]) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    for e in events:
        if e.type == "turn.started":
            turns.append(
                {
                    "turn": e.data.get("turn"),
                    "kind": e.data.get("kind"),
                    "seq": e.seq,
                    "calls": 0,
                    "input_tokens": 0,
                    "cached_tokens": 0,
                }
            )
        elif e.type == "model.called" and e.data.get("purpose") == "act" and turns:
            t = turns[-1]
            t["calls"] += 1
            t["input_tokens"] += int(e.data.get("input_tokens", 0))
            t["cached_tokens"] += int(e.data.get("cached_tokens", 0))
    for t in turns:
        t["hit_rate"] = round(t["cached_tokens"] / t["input_tokens"], 4) if t["input_tokens"] else 0
    return turns


def _failures(events: Sequence[StoredEvent], skeleton: L.Skeleton) -> dict[str, Any]:
    milestone = {d.id: d.milestone or "(none)" for d in skeleton.items}
    rounds = _rounds(events)
    op_round = {op: rnd for op, (_, rnd) in _ops(events).items()}
    by_class: Counter[str] = Counter()
    by_tool: Counter[str] = Counter()
    by_milestone: Counter[str] = Counter()
    current: int | None = None

    def phase(rnd: int | None) -> str:
        item = rounds.item.get(rnd) if rnd is not None else None
        return milestone.get(item, "(none)") if item else OUTSIDE

    retries_by_tool: Counter[str] = Counter()
    tool_of: dict[str, str] = {}
    model_failures: list[dict[str, Any]] = []
    breakers: list[dict[str, Any]] = []
    for e in events:
        d = e.data
        if e.type == "round.started":
            current = int(d["round"])
        if e.type in ("op.intended", "op.result"):
            tool_of[str(d["op_id"])] = str(d["tool"])
        if e.type == "op.result" and d.get("status") != "succeeded":
            by_class[str(d.get("error_class") or d.get("status"))] += 1
            by_tool[str(d.get("tool"))] += 1
            by_milestone[phase(op_round.get(str(d["op_id"]), current))] += 1
        elif e.type == "op.retry_scheduled":
            retries_by_tool[tool_of.get(str(d.get("op_id")), "?")] += 1
        elif e.type == "model.failed":
            by_class["model_transient" if d.get("transient") else "model_error"] += 1
            by_milestone[phase(current) if d.get("purpose") == "act" else OUTSIDE] += 1
            model_failures.append(
                {"seq": e.seq, "at": e.at, "purpose": d.get("purpose"), "error": d.get("error")}
            )
        elif e.type == "breaker.changed" and d.get("dst") == "open":
            breakers.append(
                {"seq": e.seq, "at": e.at, "service": d.get("service"), "reason": d.get("reason")}
            )
    return {
        "failures": {
            "total": sum(by_class.values()),
            "by_class": dict(by_class.most_common()),
            "by_tool": dict(by_tool.most_common()),
            "by_milestone": dict(by_milestone.most_common()),
            "model": model_failures,
        },
        "retries": {
            "op_retries": sum(retries_by_tool.values()),
            "by_tool": dict(retries_by_tool.most_common()),
            "breaker_openings": breakers,
        },
    }


def _intervention(e: StoredEvent) -> dict[str, Any]:
    d = e.data
    detail = {
        "approval": f"{d.get('decision')} {d.get('request_id')}",
        "retry": f"{d.get('item')}: {d.get('hint', '')}",
        "waive": f"{d.get('item')}: {d.get('reason', '')}",
        "edit": f"v{d.get('old_version')} → v{d.get('new_version')}",
        "tell": str(d.get("text", ""))[:200],
        "cancel": str(d.get("reason", "")),
        "signoff": f"{d.get('decision')} {' '.join(d.get('reopen', []))} {d.get('hint', '')}",
    }[HUMAN_EVENTS[e.type]]
    return {
        "seq": e.seq,
        "at": e.at,
        "kind": HUMAN_EVENTS[e.type],
        "by": d.get("by", "user"),
        "detail": detail,
    }


def _humans(events: Sequence[StoredEvent], skeleton: Mapping[str, Any]) -> dict[str, Any]:
    interventions: list[dict[str, Any]] = []
    waits: list[dict[str, Any]] = []
    open_wait: dict[str, Any] | None = None
    for e, _, tf in replay(skeleton, events):
        if e.type in HUMAN_EVENTS:
            interventions.append(_intervention(e))
            if open_wait is not None and open_wait["answered_by"] is None:
                open_wait["answered_by"] = HUMAN_EVENTS[e.type]
        if e.type != "task.status":
            continue
        if open_wait is not None:
            open_wait.update(until_seq=e.seq, seconds=round(e.at - open_wait["at"], 3))
            waits.append(open_wait)
            open_wait = None
        if tf.status == "waiting":
            open_wait = {
                "seq": e.seq,
                "at": e.at,
                "kind": (tf.waiting or {}).get("kind", "other"),
                "reason": e.data.get("reason", ""),
                "until_seq": None,
                "seconds": None,
                "answered_by": None,
            }
    if open_wait is not None:
        waits.append(open_wait)
    return {"interventions": interventions, "waits": waits}


def _recoveries(events: Sequence[StoredEvent]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for e in events:
        if e.type == "recovery.started":
            out.append(
                {
                    "seq": e.seq,
                    "at": e.at,
                    "worker_id": e.data.get("worker_id"),
                    "previous_owner": e.data.get("previous_owner"),
                    "steps": [],
                }
            )
        elif e.type == "recovery.step" and out:
            out[-1]["steps"].append({"step": e.data.get("step"), **e.data.get("details", {})})
    return out


def _progress(events: Sequence[StoredEvent], skeleton: Mapping[str, Any]) -> list[dict[str, Any]]:
    points: list[dict[str, Any]] = []
    counts: Counter[str] = Counter()
    for e, lf, _ in replay(skeleton, events):
        if not points or e.type == "task.edited":
            counts = Counter(str(st.get("status", "pending")) for st in lf.states.values())
        elif e.type == "ledger.updated":
            # Counted from the diff: a long checklist is not walked at every update.
            for change in e.data.get("diff", []):
                if change.get("field") == "status":
                    counts[str(change.get("before"))] -= 1
                    counts[str(change.get("after"))] += 1
        if not points or e.type in ("ledger.updated", "task.edited"):
            p = L.Progress.of(counts)
            points.append(
                {
                    "seq": e.seq,
                    "at": e.at,
                    "done": p.done,
                    "blocked": p.blocked,
                    "finished": p.done + p.skipped + p.waived,
                    "total": p.total,
                    "percent": p.percent,
                }
            )
    return points


def _totals(events: Sequence[StoredEvent]) -> dict[str, Any]:
    calls = [e.data for e in events if e.type == "model.called"]
    first, last = (events[0].at, events[-1].at) if events else (None, None)
    inp = sum(int(c.get("input_tokens", 0)) for c in calls)
    outp = sum(int(c.get("output_tokens", 0)) for c in calls)
    return {
        "events": len(events),
        "first_at": first,
        "last_at": last,
        "wall_seconds": round((last or 0.0) - (first or 0.0), 3),
        "turns": sum(1 for e in events if e.type == "turn.started"),
        "rounds": sum(1 for e in events if e.type == "round.committed"),
        "model_calls": len(calls),
        "input_tokens": inp,
        "output_tokens": outp,
        "cached_tokens": sum(int(c.get("cached_tokens", 0)) for c in calls),
        "tokens": inp + outp,
        "cost_usd": round(sum(float(c.get("cost_usd", 0.0)) for c in calls), 6),
        "tool_calls": len(_ops(events)),
    }


def _top(places: Sequence[Mapping[str, Any]], total_cost: float, total_tokens: int) -> list[Any]:
    """The three biggest places, by money (by tokens when nothing cost money)."""
    by_money = total_cost > 0
    ranked = sorted(places, key=lambda r: -(r["cost_usd"] if by_money else r["tokens"]))
    whole = total_cost if by_money else total_tokens
    return [
        {
            "where": r["key"],
            "cost_usd": r["cost_usd"],
            "tokens": r["tokens"],
            "share": round((r["cost_usd"] if by_money else r["tokens"]) / whole, 4) if whole else 0,
        }
        for r in ranked[:3]
    ]


async def build_report(store: Store, task_id: str) -> dict[str, Any]:
    """The report document (`report --format json`): totals, spending by milestone,
    item, purpose, model and tool, cache hits per turn, failures, retries and breaker
    openings, human interventions and waits, recoveries, ledger progress over time and
    the top three places the budget went."""
    task = await store.get_task(task_id)
    rec = await store.get_ledger(task_id)
    events = await store.read_events(task_id)
    skeleton = L.Skeleton.from_dict(rec.skeleton)
    totals = _totals(events)
    spend = _spending(events, skeleton)
    places = spend.pop("by_place")
    return {
        "task": {
            "task_id": task.task_id,
            "name": task.name,
            "objective": skeleton.objective,
            "status": task.status,
            "stop_reason": task.stop_reason,
            "version": task.version,
            "progress": rec.to_ledger().progress().to_dict(),
        },
        "generated_at": time.time(),
        "totals": totals,
        "spend": spend,
        "top_spend": _top(places, totals["cost_usd"], totals["tokens"]),
        "cache_by_turn": _cache_by_turn(events),
        **_failures(events, skeleton),
        **_humans(events, rec.skeleton),
        "recoveries": _recoveries(events),
        "progress": _progress(events, rec.skeleton),
    }
