"""Agent-loop benchmark: rounds 1 to 2,000 of ONE task, and what the harness costs.

A zero-latency scripted model makes one tool call per round (`read_page`, a registered
read tool that returns 1,024 characters of text; each page is read twice, so the
ledger's counters change every round); an LLM judge (the same scripted model,
`judge` purpose) answers "no change, continue" after every round and the compressor
(`compact` purpose) writes a short summary. The task's two checklist items never
complete (`limits.max_rounds` = rounds, `no_progress_rounds` and
`max_attempts_per_item` huge, no `max_rounds_per_item` cap), so the loop keeps going.
The task lives on the embedded SQLite store (synchronous FULL, the default) in a
temporary folder and is driven in segments of `--segment` rounds
(`Engine(max_rounds_this_run=...)`): every segment is a new run of the engine, so each
one claims the lease, recovers and opens a new *turn* (a resume).
`context.cache_ttl_seconds` is set to 1e9, so a resume is not an epoch
boundary (docs/architecture.md) and only compactions re-render the system prompt.
`context.preview_chars` is 2,000, so the 1 KB outputs go into the context whole (not
as artifacts). `context.input_budget_tokens` is the default 32,000.

The same task runs twice, one after the other, on its own database: with the default
cache policy and with the naive one (`Engine(epoch_every_turn=True)`, which re-renders
the system tail at every turn start).

What is measured, and how:

- **Harness overhead per round.** A round's interval runs from the start of its act
  model call to the start of the next round's act call (for the last round: to the
  return of the last `Engine.run`). It therefore holds everything the runtime does per
  round: committing the decision, dispatch, write-back, the judge (rule + LLM) and its
  commit, the guard, compaction when due, request assembly, and at a segment boundary
  the end of one `Engine.run` and the claim, recovery and turn start of the next.
  Overhead = interval - time inside `Model.complete` (all purposes; a wrapper times
  each call, including the scripted model's own token counting and this benchmark's
  prefix bookkeeping) - time inside the tool function. Reported as median and p99 over
  a window of rounds around 100 and the last window of the run (around 2,000).
- **Input tokens per act request**, from the `model.called` events in the store
  (purpose `act`; the scripted model counts with the runtime's estimator).
- **Unchanged-prefix fraction.** Each act request is serialized as a provider's prefix
  cache sees it: the list [tools JSON, system text, message 1 JSON, message 2 JSON, ...]
  (canonical JSON, sorted keys). The fraction is the characters of the leading parts
  that are identical to the previous act request's parts, over the characters of the
  whole request. Averaged over every act request of the run (the first request, turn
  starts and compactions included).
- **Memory.** `tracemalloc` runs only during two windows of rounds (one near round
  100, one near the end; never during a timing window, as tracing slows Python down):
  the peak of memory allocated during the window, and what was still allocated at its
  end. The scripted model keeps only its last 2 requests (`keep_requests=2`) and every
  per-round figure is kept in preallocated arrays. The process RSS (psutil) is read at
  the end of each timing window.

    .venv/bin/python benchmarks/loop_bench.py                # 2,000 rounds
    .venv/bin/python benchmarks/loop_bench.py --quick        # 300 rounds, a smoke test
    .venv/bin/python benchmarks/loop_bench.py --rounds 120 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import random
import shlex
import statistics
import sys
import tempfile
import time
import tracemalloc
from array import array
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tether import tokens
from tether.models.base import Message, ModelRequest, ModelResponse, Usage
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.tasks import create_task
from tether.spec import parse_spec
from tether.store.sqlite import SQLiteStore
from tether.tools.registry import Tool, ToolContext, ToolRegistry

try:  # in the `bench` extra
    import psutil  # type: ignore[import-untyped, unused-ignore]
except ImportError:  # pragma: no cover - reported as "n/a"
    psutil = None

OUTPUT_CHARS = 1024
PREVIEW_CHARS = 2000
TARGET_PREFIX = 0.95
_TEXT = (
    "the runtime keeps a ledger of goals and evidence while the agent reads pages "
    "of records notes tables reports figures dates names sources and summaries for "
    "each section of the collection with care about numbers units and references"
)
_WORDS = tuple(_TEXT.split(" "))


# --- the task ------------------------------------------------------------------------


def bench_spec(rounds: int, budget: int | None = None) -> dict[str, Any]:
    """A spec whose items never complete and whose limits never stop the loop early."""
    context: dict[str, Any] = {"preview_chars": PREVIEW_CHARS, "cache_ttl_seconds": 1e9}
    if budget is not None:
        context["input_budget_tokens"] = budget
    return {
        "name": "loop-bench",
        "objective": "Read the document collection page by page and keep notes on it",
        "instructions": "Read one page per round with read_page; pages are numbered from 1.",
        "items": [
            {"id": "read-pages", "title": "Read every page of the collection"},
            {"id": "notes", "title": "Write notes on what the pages say"},
        ],
        "tools": ["read_page"],
        "limits": {
            "max_rounds": rounds,
            "no_progress_rounds": 10**9,
            "max_attempts_per_item": 10**9,
            "max_rounds_per_item": None,
        },
        "context": context,
    }


def page_text(page: int) -> str:
    """Exactly OUTPUT_CHARS characters of deterministic text for a page."""
    rng = random.Random(page)
    head = f"Page {page}.\n"
    words: list[str] = []
    size = len(head)
    while size < OUTPUT_CHARS:
        w = rng.choice(_WORDS)
        words.append(w)
        size += len(w) + 1
    return (head + " ".join(words))[:OUTPUT_CHARS]


# --- measurement -----------------------------------------------------------------------


def _parts(request: ModelRequest) -> list[str]:
    """The request as a provider's prefix cache sees it: tools, system, then messages."""
    dump = json.dumps
    parts = [
        dump([t.to_dict() for t in request.tools], sort_keys=True, ensure_ascii=False),
        request.system,
    ]
    parts += [dump(m.to_dict(), sort_keys=True, ensure_ascii=False) for m in request.messages]
    return parts


@dataclass
class Windows:
    """Which rounds are timed and which are traced (1-based, inclusive)."""

    early_t: tuple[int, int]
    late_t: tuple[int, int]
    early_m: tuple[int, int]
    late_m: tuple[int, int]

    @classmethod
    def for_rounds(cls, rounds: int) -> Windows:
        w = max(4, min(100, rounds // 4))
        m = max(2, w // 2)
        center = min(100, rounds // 4 + w // 2)
        early_t = (max(2, center - w // 2 + 1), max(2, center - w // 2 + 1) + w - 1)
        early_m = (early_t[1] + 1, early_t[1] + m)
        late_t = (rounds - w + 1, rounds)
        late_m = (max(early_m[1] + 1, late_t[0] - m), late_t[0] - 1)
        if late_m[0] > late_m[1]:  # too few rounds to keep them apart
            late_m = early_m
        return cls(early_t, late_t, early_m, late_m)


@dataclass
class Probe:
    """Per-round figures of one run, in preallocated arrays (no growth during the run)."""

    rounds: int
    windows: Windows
    start: array[float] = field(init=False)  # perf_counter at the start of round r's act call
    model_s: array[float] = field(init=False)  # seconds inside Model.complete, by round
    tool_s: array[float] = field(init=False)
    prefix_same: array[int] = field(init=False)  # characters of unchanged leading parts
    prefix_total: array[int] = field(init=False)
    compacted: array[int] = field(init=False)  # 1 when a compaction preceded round r's request
    turn_start: array[int] = field(init=False)  # 1 when round r is the first of a new turn
    act_calls: int = 0
    same_parts: int = 0  # leading parts of the current act request equal to the last one's
    resent_whole: int = 0  # act requests that begin with the whole previous one
    appended: list[int] = field(default_factory=list)  # characters they add to it
    end: float = 0.0
    prev_parts: list[str] = field(default_factory=list)
    mem: dict[str, dict[str, float]] = field(default_factory=dict)
    rss: dict[str, float] = field(default_factory=dict)
    resume_s: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = self.rounds + 2
        self.start = array("d", [0.0]) * n
        self.model_s = array("d", [0.0]) * n
        self.tool_s = array("d", [0.0]) * n
        self.prefix_same = array("q", [0]) * n
        self.prefix_total = array("q", [0]) * n
        self.compacted = array("b", [0]) * n
        self.turn_start = array("b", [0]) * n
        self.resume_s = []

    @property
    def current(self) -> int:
        """The round whose interval is open (0 before the first act call)."""
        return self.act_calls

    def on_act(self, request: ModelRequest, t0: float) -> None:
        """Called at the start of each act call (its time counts as model time)."""
        r = self.act_calls + 1
        if r <= self.rounds:
            self.start[r] = t0
        w = self.windows
        # Memory windows: trace from the start of the first round to the start of the
        # round after the last one.
        for name, (a, b) in (("early", w.early_m), ("late", w.late_m)):
            if r == b + 1 and tracemalloc.is_tracing() and name not in self.mem:
                cur, peak = tracemalloc.get_traced_memory()
                tracemalloc.stop()
                self.mem[name] = {"from": a, "to": b, "peak": peak, "retained": cur}
        for name, (a, _b) in (("early", w.early_m), ("late", w.late_m)):
            if r == a and name not in self.mem and not tracemalloc.is_tracing():
                gc.collect()
                tracemalloc.start()
        for name, (_a, b) in (("early", w.early_t), ("late", w.late_t)):
            if r == b + 1 and psutil is not None:
                self.rss[name] = psutil.Process().memory_info().rss
        self.act_calls = r
        parts = _parts(request)
        prev = self.prev_parts
        same = 0
        k = 0
        n = min(len(parts), len(prev))
        while k < n and parts[k] == prev[k]:
            same += len(parts[k])
            k += 1
        self.same_parts = k
        if prev and k == len(prev):  # the previous request re-sent whole, then appends
            self.resent_whole += 1
            self.appended.append(sum(len(p) for p in parts[k:]))
        if r <= self.rounds:
            self.prefix_same[r] = same
            self.prefix_total[r] = sum(len(p) for p in parts)
        self.prev_parts = parts

    def finish(self) -> None:
        self.end = time.perf_counter()
        if tracemalloc.is_tracing():
            cur, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            for name, (a, b) in (("early", self.windows.early_m), ("late", self.windows.late_m)):
                if name not in self.mem:
                    self.mem[name] = {"from": a, "to": b, "peak": peak, "retained": cur}
        if psutil is not None and "late" not in self.rss:
            self.rss["late"] = psutil.Process().memory_info().rss

    def interval(self, r: int) -> float:
        nxt = self.start[r + 1] if r < self.rounds else self.end
        return nxt - self.start[r]

    def overhead_ms(self, r: int) -> float:
        return (self.interval(r) - self.model_s[r] - self.tool_s[r]) * 1000.0

    def fraction(self, r: int) -> float:
        return self.prefix_same[r] / self.prefix_total[r] if self.prefix_total[r] else 0.0


class TimedModel:
    """Wraps the scripted model: times every call and keeps the prefix bookkeeping."""

    def __init__(self, inner: ScriptedModel, probe: Probe) -> None:
        self.inner = inner
        self.name = inner.name
        self.probe = probe

    async def complete(self, request: ModelRequest) -> ModelResponse:
        t0 = time.perf_counter()
        p = self.probe
        if request.purpose == "act":
            p.on_act(request, t0)  # opens the next round's interval at t0
        elif request.purpose == "compact":
            p.compacted[min(p.current + 1, p.rounds + 1)] = 1  # precedes the next act call
        try:
            return await self.inner.complete(request)
        finally:
            # Judge and compaction calls run inside the open round's interval.
            p.model_s[p.current] += time.perf_counter() - t0


class TokenCounter:
    """The runtime's estimator (`tether.tokens`), memoized per message and bounded.

    The scripted model would count every request from scratch (a character loop over
    ~40 KB per call); the policy hands it the usage instead, computed with the same
    functions, so the benchmark's own cost stays small. Same numbers, less time.
    """

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self.messages: OrderedDict[tuple[str, tuple[tuple[str, str], ...]], int] = OrderedDict()
        self.texts: OrderedDict[str, int] = OrderedDict()
        self.tools: tuple[Any, int] | None = None

    def _memo(self, cache: OrderedDict[Any, int], key: Any, fn: Any) -> int:
        hit = cache.get(key)
        if hit is not None:
            cache.move_to_end(key)
            return hit
        value = int(fn(key))
        cache[key] = value
        if len(cache) > self.size:
            cache.popitem(last=False)
        return value

    def message(self, m: Message) -> int:
        # What `estimate_message` reads: the content and each call's name and arguments.
        key = (m.content, tuple((c.name, c.raw_arguments) for c in m.tool_calls))
        hit = self.messages.get(key)
        if hit is None:
            hit = self.messages[key] = tokens.estimate_message(m)
            if len(self.messages) > self.size:
                self.messages.popitem(last=False)
        else:
            self.messages.move_to_end(key)
        return hit

    def text(self, t: str) -> int:
        return self._memo(self.texts, t, tokens.estimate_text)

    def tool_schemas(self, ts: tuple[Any, ...]) -> int:
        if self.tools is None or self.tools[0] is not ts:
            self.tools = (ts, tokens.estimate_tools(ts))
        return self.tools[1]

    def usage(self, request: ModelRequest, response: ModelResponse, same_parts: int) -> Usage:
        fixed = self.tool_schemas(request.tools) + self.text(request.system)
        msgs = [self.message(m) for m in request.messages]
        cached = 0
        if request.purpose == "act" and same_parts >= 2:  # as ScriptedModel counts it
            cached = fixed + sum(msgs[: same_parts - 2])
        out = response.text + "".join(c.raw_arguments for c in response.tool_calls)
        return Usage(
            input_tokens=fixed + sum(msgs),
            output_tokens=tokens.estimate_text(out),
            cached_input_tokens=cached,
        )


def make_policy(probe: Probe) -> Any:
    counter = TokenCounter()

    def answer(request: ModelRequest) -> ModelResponse:
        if request.purpose == "act":
            # Each page twice: the second read brings nothing new, so the item's breaker
            # (and with it the ledger) changes every round, as a real task's ledger does.
            page = (probe.act_calls + 1) // 2
            return ModelResponse(f"Reading page {page}.", (tool_call("read_page", page=page),))
        if request.purpose == "judge":
            return ModelResponse(
                json.dumps(
                    {"changes": [], "decision": "continue", "reason": "a page was read; items open"}
                )
            )
        if request.purpose == "compact":
            return ModelResponse(
                f"Pages 1 to {(probe.act_calls + 1) // 2} of the collection were read, "
                "each twice, one read per round "
                "with read_page; each page is about a kilobyte of notes-worthy text. No "
                "notes have been written yet. The ledger says what is still open."
            )
        return ModelResponse('{"passed": false, "gaps": ["benchmark"], "reopen": []}')

    def policy(request: ModelRequest) -> ModelResponse:
        r = answer(request)
        usage = counter.usage(request, r, probe.same_parts if request.purpose == "act" else 0)
        finish = "tool_calls" if r.tool_calls else "stop"
        return ModelResponse(r.text, r.tool_calls, usage, "scripted-bench", 0.0, finish)

    return policy


def make_registry(probe: Probe) -> ToolRegistry:
    async def read_page(args: Mapping[str, Any], ctx: ToolContext) -> str:
        t0 = time.perf_counter()
        text = page_text(int(args.get("page", 0)))
        probe.tool_s[probe.current] += time.perf_counter() - t0
        return text

    tool = Tool(
        name="read_page",
        description="Read one page of the document collection (about 1 KB of text).",
        parameters={
            "type": "object",
            "properties": {"page": {"type": "integer", "minimum": 1}},
            "required": ["page"],
        },
        fn=read_page,
        effect="read",
        # A document collection does not change by itself: reading a page again is no
        # progress (the measured policy's rounds), not waiting on the world.
        volatile=False,
    )
    return ToolRegistry([tool])


# --- one run ----------------------------------------------------------------------------


@dataclass
class RunStats:
    policy: str
    rounds: int
    wall_s: float
    segments: int
    compactions: int
    turns: int
    probe: Probe
    act_tokens: list[tuple[int, int]]  # (round, input tokens) from model.called events
    cached_share: float
    status: str


async def run_policy(
    rounds: int, segment: int, naive: bool, folder: Path, budget: int | None = None
) -> RunStats:
    windows = Windows.for_rounds(rounds)
    probe = Probe(rounds, windows)
    scripted = ScriptedModel(policy=make_policy(probe), name="scripted-bench", keep_requests=2)
    model = TimedModel(scripted, probe)
    models = ModelSet(actor=model, judge=model, compact=model)
    registry = make_registry(probe)
    db = folder / ("naive.db" if naive else "default.db")
    store = await SQLiteStore.open(db)  # synchronous FULL, the default
    try:
        spec = parse_spec(bench_spec(rounds, budget), source="loop_bench")
        task = await create_task(store, spec)
        t_start = time.perf_counter()
        segments = 0
        status = "queued"
        while probe.act_calls < rounds:
            segments += 1
            engine = Engine(
                store,
                models,
                registry=registry,
                max_rounds_this_run=min(segment, rounds - probe.act_calls),
                epoch_every_turn=naive,
                worker_id="loop-bench",
            )
            before = probe.act_calls
            t_run = time.perf_counter()
            if before:
                probe.turn_start[before + 1] = 1  # round before+1 opens a new turn
            result = await engine.run(task.task_id)
            status = result.status
            if segments > 1 and probe.act_calls > before:
                probe.resume_s.append(probe.start[before + 1] - t_run)
            if probe.act_calls == before or result.status != "queued":
                task_now = await store.get_task(task.task_id)
                raise RuntimeError(
                    f"the benchmark task stopped after {probe.act_calls} rounds: {result} "
                    f"waiting={task_now.waiting}"
                )
        probe.finish()
        wall = time.perf_counter() - t_start
        final = await store.get_task(task.task_id)
        calls = await store.read_events(task.task_id, types={"model.called"})
        act = [
            (int(c.data.get("round") or 0), int(c.data["input_tokens"]))
            for c in calls
            if c.data.get("purpose") == "act"
        ]
        u = final.usage.get("by_purpose", {}).get("act", {})
        cached = int(u.get("cached", 0)) / int(u["input"]) if u.get("input") else 0.0
        return RunStats(
            policy="naive (epoch_every_turn)" if naive else "default",
            rounds=rounds,
            wall_s=wall,
            segments=segments,
            compactions=int(final.usage.get("compactions", 0)),
            turns=int(final.usage.get("turns", 0)),
            probe=probe,
            act_tokens=act,
            cached_share=cached,
            status=status,
        )
    finally:
        await store.close()


# --- report -----------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(q * (len(s) - 1))))
    return s[k]


def summarize(st: RunStats, budget: int) -> dict[str, Any]:
    p = st.probe
    w = p.windows
    out: dict[str, Any] = {"policy": st.policy, "rounds": st.rounds, "wall_s": st.wall_s}
    for name, (a, b) in (("early", w.early_t), ("late", w.late_t)):
        ov = [p.overhead_ms(r) for r in range(a, b + 1)]
        out[f"overhead_{name}"] = {
            "from": a,
            "to": b,
            "median_ms": statistics.median(ov),
            "p99_ms": _pct(ov, 0.99),
            "max_ms": max(ov),
        }
    allov = [p.overhead_ms(r) for r in range(1, st.rounds + 1)]
    out["overhead_all_median_ms"] = statistics.median(allov)
    out["resume_ms_median"] = statistics.median(p.resume_s) * 1000 if p.resume_s else None
    toks = [t for _, t in st.act_tokens]
    out["act_calls"] = len(toks)
    out["tokens"] = {
        "min": min(toks),
        "median": statistics.median(toks),
        "max": max(toks),
        "over_budget": sum(1 for t in toks if t > budget),
    }
    by_round = dict(st.act_tokens)
    step = 250 if st.rounds >= 1000 else max(1, st.rounds // 8)
    out["token_points"] = {r: by_round.get(r) for r in range(step, st.rounds + 1, step)}
    # Buckets long enough to hold a few compaction cycles each.
    size = 250 if st.rounds >= 1000 else max(1, st.rounds // 4)
    # Flatness: 250-round buckets after the first compaction.
    first_c = next((r for r in range(1, st.rounds + 1) if p.compacted[r]), None)
    out["first_compaction_round"] = first_c
    buckets = []
    if first_c is not None:
        r0 = first_c
        while r0 <= st.rounds:
            vals = [
                by_round[r] for r in range(r0, min(st.rounds, r0 + size - 1) + 1) if r in by_round
            ]
            if len(vals) >= max(2, size // 2):
                buckets.append((r0, statistics.median(vals), max(vals)))
            r0 += size
    out["token_buckets"] = buckets
    if len(buckets) >= 2:
        meds = [m for _, m, _ in buckets]
        out["flat_spread"] = (max(meds) - min(meds)) / statistics.mean(meds)
    else:
        out["flat_spread"] = None
    fr = [p.fraction(r) for r in range(1, st.rounds + 1)]
    turn_r = [r for r in range(2, st.rounds + 1) if p.turn_start[r] and not p.compacted[r]]
    comp_r = [r for r in range(1, st.rounds + 1) if p.compacted[r]]
    plain = set(range(2, st.rounds + 1)) - set(turn_r) - set(comp_r)
    out["prefix"] = {
        "mean": statistics.mean(fr),
        "mean_in_turn": statistics.mean(p.fraction(r) for r in plain) if plain else None,
        "mean_turn_start": statistics.mean(p.fraction(r) for r in turn_r) if turn_r else None,
        "mean_compaction": statistics.mean(p.fraction(r) for r in comp_r) if comp_r else None,
        "min": min(fr),
        # Within an epoch every request re-sends the previous one whole: what it adds
        # (the last round's messages) is what bounds the fraction there.
        "resent_whole": p.resent_whole,
        "requests_after_first": max(0, p.act_calls - 1),
        "appended_chars_median": statistics.median(p.appended) if p.appended else None,
    }
    out["cached_share"] = st.cached_share
    out["compactions"] = st.compactions
    out["turns"] = st.turns
    out["segments"] = st.segments
    out["status"] = st.status
    out["memory"] = p.mem
    out["rss"] = p.rss
    return out


def _mb(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 1e6:.2f} MB"


def _f(x: float | None, fmt: str = "{:.3f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def _win(w: Mapping[str, Any]) -> str:
    return f"r{w.get('from')}-{w.get('to')}"


def render(command: str, results: list[dict[str, Any]], budget: int, console: Console) -> None:
    """The table: one column per policy."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    title = f"tether loop benchmark\n$ {command}"
    if load is not None:
        title += (
            f"\n(load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs)"
        )
    table = Table(title=title, title_justify="left")
    table.add_column("metric")
    for res in results:
        table.add_column(f"{res['policy']}\n{res['rounds']} rounds", justify="right")

    def row(label: str, f: Any) -> None:
        table.add_row(label, *(f(res) for res in results))

    row(
        "segments (turns) / compactions",
        lambda s: f"{s['segments']} ({s['turns']}) / {s['compactions']}",
    )
    row("wall time of the run", lambda s: f"{s['wall_s']:.1f} s")
    for name, label in (("early", "around round 100"), ("late", "at the end of the run")):
        row(
            f"overhead per round {label}: median / p99 (window)",
            lambda s, k=name: (
                f"{s[f'overhead_{k}']['median_ms']:.2f} / {s[f'overhead_{k}']['p99_ms']:.2f} ms "
                f"({_win(s[f'overhead_{k}'])})"
            ),
        )
    row("overhead per round, whole run: median", lambda s: f"{s['overhead_all_median_ms']:.2f} ms")
    row(
        "turn start (run end + claim + recovery + turn): median",
        lambda s: _f(s["resume_ms_median"], "{:.1f} ms"),
    )
    row(
        f"act input tokens min / median / max (budget {budget})",
        lambda s: f"{s['tokens']['min']} / {s['tokens']['median']:.0f} / {s['tokens']['max']}",
    )
    row(
        "act requests over the budget",
        lambda s: f"{s['tokens']['over_budget']} of {s['act_calls']}",
    )
    points = sorted({r for res in results for r in res["token_points"]})
    for r in points:
        row(f"  input tokens at round {r}", lambda s, k=r: _f(s["token_points"].get(k), "{}"))
    row("first compaction before round", lambda s: str(s["first_compaction_round"]))
    row(
        "after it, median tokens per bucket (spread)",
        lambda s: (
            " ".join(f"{m:.0f}" for _, m, _ in s["token_buckets"])
            + (f" ({s['flat_spread']:.1%})" if s["flat_spread"] is not None else "")
        ),
    )
    row(
        f"unchanged-prefix fraction, mean over the run (target >= {TARGET_PREFIX})",
        lambda s: _f(s["prefix"]["mean"]),
    )
    row("  within a turn (no turn start, no compaction)", lambda s: _f(s["prefix"]["mean_in_turn"]))
    row("  first request of a turn (resume)", lambda s: _f(s["prefix"]["mean_turn_start"]))
    row("  first request after a compaction", lambda s: _f(s["prefix"]["mean_compaction"]))
    row(
        "  requests that re-send the previous one whole (+ chars appended, median)",
        lambda s: (
            f"{s['prefix']['resent_whole']} of {s['prefix']['requests_after_first']} "
            f"(+{_f(s['prefix']['appended_chars_median'], '{:.0f}')})"
        ),
    )
    row("cached share of act input tokens (usage)", lambda s: f"{s['cached_share']:.3f}")
    for name, label in (("early", "near round 100"), ("late", "near the end")):
        row(
            f"tracemalloc peak {label} (window)",
            lambda s, k=name: (
                f"{_mb(s['memory'].get(k, {}).get('peak'))} ({_win(s['memory'].get(k, {}))})"
            ),
        )
        row(
            "  still allocated at the window's end",
            lambda s, k=name: _mb(s["memory"].get(k, {}).get("retained")),
        )
    row(
        "RSS after the early / the late timing window",
        lambda s: f"{_mb(s['rss'].get('early'))} / {_mb(s['rss'].get('late'))}",
    )
    console.print(table)


def checks(results: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    """Pass/fail lines under the table (reported, never turned into an exit code)."""
    d, n = results[0], results[-1]
    out = [
        (
            "no act request over the input budget",
            all(s["tokens"]["over_budget"] == 0 for s in results),
        ),
        (f"default prefix fraction >= {TARGET_PREFIX}", d["prefix"]["mean"] >= TARGET_PREFIX),
        ("default prefix fraction above the naive one", d["prefix"]["mean"] > n["prefix"]["mean"]),
    ]
    if d["flat_spread"] is not None:
        out.append(
            (
                "input tokens flat once compaction starts (bucket medians within 10%)",
                d["flat_spread"] <= 0.10,
            )
        )
    e, la = d["overhead_early"]["median_ms"], d["overhead_late"]["median_ms"]
    out.append(("median overhead at the end within 1.5x of round ~100", la <= 1.5 * e))
    me = d["memory"].get("early", {}).get("peak")
    ml = d["memory"].get("late", {}).get("peak")
    if me and ml:
        out.append(("tracemalloc peak at the end within 1.5x of round ~100", ml <= 1.5 * me))
    return out


async def demo_cache(folder: Path) -> dict[str, Any]:
    """`tether demo` (offline) in a subprocess, and its act calls' prompt-cache hit
    rate from its store, with what limits it: the requests that follow a compaction or
    open an epoch (nothing of them cached) and each round's new messages."""
    import subprocess

    where = folder / "demo"
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "tether.cli", "demo", "--json", "--dir", str(where)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if proc.returncode != 0:
        return {"error": (proc.stdout + proc.stderr)[-800:]}
    task_id = json.loads(proc.stdout)["status"]["task_id"]
    store = await SQLiteStore.open(where / ".tether" / "tether.db")
    try:
        evs = await store.read_events(task_id, types={"model.called"})
    finally:
        await store.close()
    acts = [e.data for e in evs if e.data.get("purpose") == "act"]
    total = sum(int(a["input_tokens"]) for a in acts)
    cached = sum(int(a["cached_tokens"]) for a in acts)
    cold = [int(a["input_tokens"]) for a in acts[1:] if not a["cached_tokens"]]
    whole, added = 0, []
    for prev, cur in itertools.pairwise(acts):
        if cur["cached_tokens"] and cur["cached_tokens"] == prev["input_tokens"]:
            whole += 1
            added.append(int(cur["input_tokens"]) - int(prev["input_tokens"]))
    return {
        "act_calls": len(acts),
        "hit": cached / total if total else 0.0,
        "cold_after_first": len(cold),
        "cold_share": sum(cold) / total if total else 0.0,
        "first_share": int(acts[0]["input_tokens"]) / total if total else 0.0,
        "resent_whole": whole,
        "appended_tokens_median": statistics.median(added) if added else None,
        "input_tokens_median": statistics.median(int(a["input_tokens"]) for a in acts),
    }


def demo_line(d: Mapping[str, Any]) -> str:
    """The demo's cache-hit rate and what limits it, in a sentence."""
    if "error" in d:
        return f"tether demo failed: {d['error']}"
    return (
        f"tether demo (offline): act prompt-cache hit {d['hit']:.1%} over {d['act_calls']} "
        f"act calls; {d['resent_whole']} of {d['act_calls'] - 1} re-send the previous "
        f"request whole and add the last round's messages (median +"
        f"{_f(d['appended_tokens_median'], '{:.0f}')} tokens on a median request of "
        f"{d['input_tokens_median']:.0f}); {d['cold_after_first']} follow a compaction or "
        f"open an epoch and hit nothing ({d['cold_share']:.1%} of act input tokens), the "
        f"first request {d['first_share']:.1%}."
    )


def command_line(argv: list[str]) -> str:
    """The command as typed from the repository root."""
    exe, script = sys.executable, os.path.abspath(__file__)
    for_display = []
    for path in (exe, script):
        rel = os.path.relpath(path)
        for_display.append(path if rel.startswith("..") else rel)
    return " ".join(shlex.quote(x) for x in [*for_display, *argv])


async def bench(
    rounds: int, naive_rounds: int, segment: int, budget: int | None = None, demo: bool = True
) -> list[dict[str, Any]]:
    """Both policies, one after the other, each on its own database."""
    results = []
    limit = parse_spec(bench_spec(rounds, budget)).context.input_budget_tokens
    with tempfile.TemporaryDirectory(prefix="tether-loop-bench-") as tmp:
        for naive, n in ((False, rounds), (True, naive_rounds)):
            st = await run_policy(n, segment, naive, Path(tmp), budget)
            results.append(summarize(st, limit))
            gc.collect()
        if demo:
            results[0]["demo"] = await demo_cache(Path(tmp))
    return results


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table; always exits 0 unless the run breaks."""
    args_list = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=None, help="rounds of the task (default 2000)")
    ap.add_argument("--quick", action="store_true", help="a smoke test: 300 rounds")
    ap.add_argument(
        "--naive-rounds",
        type=int,
        default=None,
        help="rounds of the naive-policy run (default: the same, at most 1000)",
    )
    ap.add_argument("--segment", type=int, default=50, help="rounds per engine run (turn)")
    ap.add_argument("--budget", type=int, default=None, help="context.input_budget_tokens")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--no-demo", action="store_true", help="skip the demo's cache-hit rate")
    args = ap.parse_args(args_list)
    rounds = args.rounds or (300 if args.quick else 2000)
    naive_rounds = args.naive_rounds or min(rounds, 1000)
    if min(rounds, naive_rounds) < 20:
        ap.error("--rounds and --naive-rounds must be at least 20")
    console = Console(width=None if sys.stdout.isatty() else 150)
    command = command_line(args_list)
    budget = parse_spec(bench_spec(rounds, args.budget)).context.input_budget_tokens
    console.print(f"$ {command}")
    console.print(
        f"{rounds} rounds (default policy) and {naive_rounds} rounds (naive policy), "
        f"{args.segment} rounds per turn, SQLite synchronous=FULL in a temp folder; tool "
        f"output {OUTPUT_CHARS} chars, preview_chars {PREVIEW_CHARS}, input budget {budget}",
        highlight=False,
    )
    results = asyncio.run(
        bench(rounds, naive_rounds, args.segment, args.budget, demo=not args.no_demo)
    )
    render(command, results, budget, console)
    if "demo" in results[0]:
        console.print(demo_line(results[0]["demo"]), highlight=False)
    for label, ok in checks(results):
        console.print(f"  [{'green' if ok else 'red'}]{'PASS' if ok else 'FAIL'}[/] {label}")
    if args.json is not None:
        doc = {"command": command, "budget": budget, "results": results}
        args.json.write_text(json.dumps(doc, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
