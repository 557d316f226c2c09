"""Scale benchmark: M tasks x R rounds through `Worker(concurrency=N)` processes.

Every task has R checklist items; each round the fake model waits a fixed latency
(`--model-ms`, 300 by default, an `asyncio.sleep`: a provider call) and asks for one call
of the tool `work` (sync, `time.sleep` of `--tool-ms`, 20 by default, so it runs in a
thread as any sync tool does; effect `write`, idempotent: the round commits twice, its
decision with the op's intent and then its result with the verdict), whose `done_when`
rule closes the item. After R rounds the ledger is closed and the task ends `satisfied`.

The workers are child processes of this script (`--child`), each a `Worker` with
`once=True` on the same database, started together once every child has opened its
store. For each configuration (processes x concurrency, on PostgreSQL or SQLite) it
reports:

- **tasks/min**: M over the time from the start signal to the last child's end;
- **added latency per round**, p50 and p99: the time from one act call of a task to its
  next, less the model's own time (inside `complete`) and the tool's (inside its
  function): what the runtime, the database and the event loop's queueing add;
- **RSS per in-flight task**: (the child's highest RSS while running less its RSS
  before the first claim) / the most runs it had in flight, and, across
  configurations of one backend, (RSS at concurrency 64 - RSS at 1) / 63, the
  marginal cost of one more run;
- **database connections**: the most connections the workers held at once
  (PostgreSQL: `pg_stat_activity` by the benchmark's `application_name`, sampled every
  0.2 s; SQLite: one per process by design);
- **worker CPU per round**: the worker processes' CPU time (every thread) over their
  model calls: one process cannot run more rounds per second than 1,000 / this on one
  core, whatever its concurrency.

M is `--waves` x processes x concurrency (3 waves by default), so every configuration
runs the same number of tasks per slot. The machine's load average is printed before
and after each configuration: on a shared machine the figures move with it.

    .venv/bin/python benchmarks/scale_bench.py --pg postgresql://postgres@127.0.0.1:5432/test
    .venv/bin/python benchmarks/scale_bench.py --quick --json out.json   # a smoke run

The children set their collector as `tether worker` does (`runtime.worker.tuning`: its
thresholds, then, once the store is open, a round's modules imported, the heap frozen
and the older generations handed to the `QuietCollector`); they inherit
`TETHER_WORKER_GC` (`thresholds`: without the `QuietCollector`, for a before/after
comparison); `--no-tune` leaves CPython's defaults, and `--gc-thresholds A,B,C` (or
`off`) sets others (experiments); `--start-pace 0` turns the workers' claim pacing
off (`Worker(start_pace=)`, for an A/B). `--probe` breaks the added latency down (`Probe`,
`breakdown`, `mechanism`): the store calls a round awaits (waiting for a thread, in it,
handed back) by call, the pool's waits for a connection, the event loop's lag, the
collector's pauses and the cyclic garbage it freed per 1,000 rounds, how many rounds
held an older generation's collection, and which rounds the slowest 1% were, when,
and how much of such a collection fell inside them.

Without `--pg` (or `TETHER_TEST_PG_URL`) the PostgreSQL configurations are skipped.
Each PostgreSQL configuration runs in a schema of its own, dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether.models.base import ModelRequest, ModelResponse, Usage
from tether.models.scripted import tool_call
from tether.runtime.engine import ModelSet
from tether.runtime.tasks import create_task
from tether.runtime.worker import Worker, tuning
from tether.runtime.worker.tuning import settle_process, tune_process
from tether.spec import TaskSpec, parse_spec
from tether.store import open_store
from tether.tools.registry import ToolContext, ToolRegistry, tool

ROOT = Path(__file__).resolve().parents[1]
NEXT = re.compile(r"^Next: (\S+)", re.M)


@dataclass(frozen=True)
class Config:
    backend: str  # "postgres" | "sqlite"
    processes: int
    concurrency: int

    @property
    def label(self) -> str:
        return f"{self.backend} {self.processes}x{self.concurrency}"


FULL = [
    Config("postgres", 1, 1),
    Config("postgres", 1, 16),
    Config("postgres", 1, 64),
    Config("postgres", 4, 16),
    Config("sqlite", 1, 1),
    Config("sqlite", 1, 16),
    Config("sqlite", 1, 64),
]
QUICK = [Config("sqlite", 1, 1), Config("sqlite", 1, 4), Config("postgres", 1, 4)]
#: The issue's targets (reported against, never asserted).
TARGETS = {"pg_c64_speedup": 40.0, "sqlite_c64_speedup": 20.0, "rss_mb": 2.0, "p99_ms": 50.0}


def bench_spec(name: str, rounds: int) -> dict[str, Any]:
    return {
        "name": name,
        "objective": f"do {rounds} pieces of work, one per round",
        "items": [
            {"id": f"w{k}", "title": f"do piece {k}",
             "done_when": {"kind": "op", "tool": "work", "args": {"item": f"w{k}"}}}
            for k in range(1, rounds + 1)
        ],
        "tools": ["work"],
        "models": {"judge": "rules"},
        "limits": {"max_rounds": rounds + 5},
    }  # fmt: skip


# --- the child: one worker process --------------------------------------------------


class Probe:
    """`--probe`: where a round's added time goes (off by default: it costs CPU).

    - the event loop's lag: a callback due every 5 ms, how late it ran;
    - every store call (`store._run`): its wait for a thread (submit to the thread's
      first line: executor queue, thread wake-up, the GIL), its time in the thread (the
      query, the pool), and its hand-back (the thread's last line to the awaiting
      coroutine running again: the loop's queue and the GIL), per asyncio task;
    - the tool's hops: model return to tool start, tool end to the next act call.
    """

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.lag_cpu: list[tuple[float, float]] = []
        #: (generation, CPU, wall start, wall seconds, objects freed) of each collection
        self.gc: list[tuple[int, float, float, float, int]] = []
        #: asyncio task name -> [(submit, thread start, thread end, resumed, fn name)]
        self.calls: dict[str, list[tuple[float, float, float, float, str]]] = {}
        self.model_end: dict[str, list[float]] = {}
        self.tool_span: dict[str, list[tuple[float, float]]] = {}
        self.heap = 0

    def watch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        period = 0.005

        last = [time.thread_time()]

        def tick(due: float) -> None:
            now = time.perf_counter()
            cpu = time.thread_time()
            self.lags.append(now - due)
            # The loop thread's own CPU since the last tick: a late tick with little of
            # it was the GIL or the OS scheduler, not the loop's own work.
            self.lag_cpu.append((now - due, cpu - last[0]))
            last[0] = cpu
            loop.call_at(loop.time() + period, tick, now + period)

        loop.call_at(loop.time() + period, tick, time.perf_counter() + period)
        started: list[float] = []

        def on_gc(phase: str, info: dict[str, Any]) -> None:
            # The collecting thread's CPU (it holds the GIL throughout): the load's noise
            # left out.
            if phase == "start":
                started[:] = [time.thread_time(), time.perf_counter()]
            elif started:
                cpu, wall = time.thread_time() - started[0], time.perf_counter() - started[1]
                gen, freed = info.get("generation", -1), info.get("collected", 0)
                self.gc.append((gen, cpu, started[1], wall, freed))

        gc.callbacks.append(on_gc)
        self.on_gc = on_gc

        def heap() -> None:
            # What a full collection walks mid-run (the objects not frozen).
            self.heap = len(gc.get_objects())

        loop.call_later(4.0, heap)

    def unwatch(self) -> None:
        """Stop recording the collector's pauses (the benchmark's own collection after)."""
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self.on_gc)

    def wrap(self, store: Any) -> None:
        real = store._run

        async def _run(fn: Any, *args: Any) -> Any:
            task = asyncio.current_task()
            name = task.get_name() if task is not None else "?"
            stamps: list[float] = []

            def timed(*a: Any) -> Any:
                stamps.append(time.perf_counter())
                try:
                    return fn(*a)
                finally:
                    stamps.append(time.perf_counter())

            timed.__name__ = getattr(fn, "__name__", "call")  # the store's retry rule
            t0 = time.perf_counter()
            try:
                return await real(timed, *args)
            finally:
                t3 = time.perf_counter()
                if len(stamps) >= 2:
                    self.calls.setdefault(name, []).append(
                        (t0, stamps[0], stamps[-1], t3, timed.__name__)
                    )

        store._run = _run

    def doc(self) -> dict[str, Any]:
        return {
            "lags": self.lags,
            "lag_cpu": self.lag_cpu,
            "gc": self.gc,
            "calls": self.calls,
            "model_end": self.model_end,
            "tool_span": self.tool_span,
            "heap": self.heap,
        }


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def child(args: argparse.Namespace) -> None:
    model_s = args.model_ms / 1000
    tool_s = args.tool_ms / 1000
    # per task: act call starts, model seconds and tool seconds per round
    starts: dict[str, list[float]] = {}
    model_time: dict[str, list[float]] = {}
    tool_time: dict[str, list[float]] = {}
    lock = threading.Lock()
    probe = Probe() if args.probe else None

    def work(item: str, ctx: ToolContext) -> str:
        """Do one piece of work."""
        t0 = time.perf_counter()
        time.sleep(tool_s)
        t1 = time.perf_counter()
        with lock:
            tool_time.setdefault(ctx.task_id, []).append(t1 - t0)
            if probe is not None:
                probe.tool_span.setdefault(ctx.task_id, []).append((t0, t1))
        return f"done {item}"

    registry = ToolRegistry([tool(work, effect="write", idempotent=True)])

    class FakeModel:
        def __init__(self) -> None:
            self.name = "fake"

        async def complete(self, request: ModelRequest) -> ModelResponse:
            t0 = time.perf_counter()
            task = request.task_id or "?"
            if request.purpose == "act":
                starts.setdefault(task, []).append(t0)
            await asyncio.sleep(model_s)
            nxt = (request.ledger or {}).get("next")
            item = nxt.get("id") if isinstance(nxt, Mapping) else nxt
            if not item:
                resp = ModelResponse("All done.", usage=Usage(100, 5))
            else:
                resp = ModelResponse(
                    f"doing {item}", (tool_call("work", item=item),), usage=Usage(100, 10)
                )
            if request.purpose == "act":
                t1 = time.perf_counter()
                model_time.setdefault(task, []).append(t1 - t0)
                if probe is not None:
                    probe.model_end.setdefault(task, []).append(t1)
            return resp

        async def aclose(self) -> None:
            return None

    def models_for(spec: TaskSpec) -> ModelSet:
        return ModelSet(actor=FakeModel())

    if not args.no_tune:
        tune_process()  # as `tether worker` does
    if args.gc_thresholds == "off":
        gc.disable()
    elif args.gc_thresholds:
        gc.set_threshold(*(int(x) for x in args.gc_thresholds.split(",")))
    store = await open_store(args.db)
    if probe is not None:
        probe.wrap(store)
    worker = Worker(
        store,
        models_for,
        registry=registry,
        concurrency=args.concurrency,
        once=True,
        poll_interval=0.05,
        watch_every=None,
        lease_ttl=60,
        pool_size=args.pool_size,
        **({} if args.start_pace is None else {"start_pace": args.start_pace}),
    )
    if not args.no_tune:
        settle_process()  # as `tether worker` does once its store is open
    samples: list[tuple[float, int, int]] = []
    rss_idle = _rss()
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)  # the start signal
    go = time.time()
    cpu0 = time.process_time()

    async def sample() -> None:
        while True:
            samples.append((time.time(), _rss(), len(worker.slots)))
            await asyncio.sleep(0.2)

    slots = worker.slots
    real_start = slots.start

    def start(run: Any, name: str) -> None:
        # Also sampled at each start: a short run may end between two periodic samples.
        real_start(run, name)
        samples.append((time.time(), _rss(), len(slots)))

    slots.start = start  # type: ignore[method-assign]
    sampler = asyncio.create_task(sample())
    if probe is not None:
        probe.watch_loop()
    try:
        stats = await worker.run()
    finally:
        sampler.cancel()
        ended = time.time()
        cpu = time.process_time() - cpu0
        # The cyclic garbage left for the collector (all of it with the collector off).
        if probe is not None:
            probe.unwatch()
        garbage = gc.collect() if probe is not None else 0
        pool = getattr(store, "_pool", None)  # PostgreSQL's: its waits for a connection
        pool_stats = pool.get_stats() if pool is not None else {}
        await store.close()
    added: list[float] = []
    for task, ts in starts.items():
        models = model_time.get(task, [])
        tools = tool_time.get(task, [])
        for k in range(1, len(ts)):
            gap = ts[k] - ts[k - 1]
            m = models[k - 1] if k - 1 < len(models) else 0.0
            t = tools[k - 1] if k - 1 < len(tools) else 0.0
            added.append((gap - m - t) * 1000)
    busy = [s for s in samples if s[2] > 0]
    doc = {
        "go": go,
        "ended": ended,
        "ran": stats.ran,
        "failed": stats.failed,
        "added_ms": added,
        "rss_idle": rss_idle,
        "rss_max": max([s[1] for s in busy], default=rss_idle),
        "inflight_max": max([s[2] for s in busy], default=0),
        "cpu_s": cpu,
        "act_calls": sum(len(ts) for ts in starts.values()),
        "starts": starts if probe is not None else {},
        "probe": probe.doc() if probe is not None else None,
        "pool": pool_stats,
        "garbage_at_end": garbage,
        # The worker's full collections at quiet moments (`worker.collector`): how many,
        # and how many came with the loop busy.
        "quiet_gc": [tuning.collector.collections, tuning.collector.forced]
        if tuning.collector is not None
        else None,
    }
    Path(args.out).write_text(json.dumps(doc))


# --- the parent: configurations -----------------------------------------------------


def _pg_count(pg_url: str, app: str) -> int:
    import psycopg

    base = re.sub(r"[?&]schema=[^&]*", "", pg_url)
    with psycopg.connect(base, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)
        ).fetchone()
    return int(row[0]) if row else 0


def _with_params(url: str, **params: str) -> str:
    sep = "&" if "?" in url else "?"
    return url + sep + "&".join(f"{k}={v}" for k, v in params.items())


def _queue(url: str, n: int, rounds: int) -> list[str]:
    async def go() -> list[str]:
        store = await open_store(url)
        try:
            spec = parse_spec(bench_spec("scale", rounds))
            return [(await create_task(store, spec)).task_id for _ in range(n)]
        finally:
            await store.close()

    return asyncio.run(go())


def _statuses(url: str, ids: list[str]) -> dict[str, int]:
    async def go() -> dict[str, int]:
        store = await open_store(url)
        try:
            out: dict[str, int] = {}
            for t in ids:
                s = (await store.get_task(t)).status
                out[s] = out.get(s, 0) + 1
            return out
        finally:
            await store.close()

    return asyncio.run(go())


def _drop_schema(pg_url: str, schema: str) -> None:
    import psycopg

    base = re.sub(r"[?&]schema=[^&]*", "", pg_url)
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def run_config(cfg: Config, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    app = f"tether-scale-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    schema = None
    if cfg.backend == "postgres":
        schema = f"scale_{uuid.uuid4().hex[:10]}"
        url = _with_params(args.pg, schema=schema, application_name=app)
    else:
        url = f"sqlite:///{work / f'{cfg.backend}-{cfg.processes}x{cfg.concurrency}.db'}"
    n_tasks = args.waves * cfg.processes * cfg.concurrency
    try:
        ids = _queue(url, n_tasks, args.rounds)
        load_before = os.getloadavg()[0]
        procs = []
        outs = []
        for k in range(cfg.processes):
            out = work / f"{app}-{k}.json"
            outs.append(out)
            procs.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--child", "--db", url,
                     "--concurrency", str(cfg.concurrency), "--out", str(out),
                     "--model-ms", str(args.model_ms), "--tool-ms", str(args.tool_ms),
                     *(["--probe"] if args.probe else []),
                     *(["--no-tune"] if args.no_tune else []),
                     *(["--gc-thresholds", args.gc_thresholds] if args.gc_thresholds else []),
                     *(["--pool-size", str(args.pool_size)] if args.pool_size else []),
                     *(["--start-pace", str(args.start_pace)]
                       if args.start_pace is not None else [])],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                )
            )  # fmt: skip
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"a worker did not start: {line!r}")
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        conns = 0
        while any(p.poll() is None for p in procs):
            if cfg.backend == "postgres":
                conns = max(conns, _pg_count(args.pg, app))
            with contextlib.suppress(subprocess.TimeoutExpired):
                procs[0].wait(timeout=0.2)
        for p in procs:
            if p.wait() != 0:
                raise RuntimeError(f"a worker exited {p.returncode}")
        load_after = os.getloadavg()[0]
        docs = [json.loads(o.read_text()) for o in outs]
        statuses = _statuses(url, ids)
    finally:
        if schema is not None:
            _drop_schema(args.pg, schema)
    wall = max(d["ended"] for d in docs) - min(d["go"] for d in docs)
    added = sorted(x for d in docs for x in d["added_ms"])

    def pct(q: float) -> float:
        if not added:
            return float("nan")
        return added[min(len(added) - 1, int(q * len(added)))]

    per_task = [
        (d["rss_max"] - d["rss_idle"]) / d["inflight_max"] / 2**20
        for d in docs
        if d["inflight_max"]
    ]
    probed = breakdown(docs) if args.probe else None
    return {
        "probe": probed,
        "config": cfg.label,
        "backend": cfg.backend,
        "processes": cfg.processes,
        "concurrency": cfg.concurrency,
        "tasks": n_tasks,
        "rounds_per_task": args.rounds,
        "satisfied": statuses.get("satisfied", 0),
        "statuses": statuses,
        "ran": sum(d["ran"] for d in docs),
        "failed": sum(d["failed"] for d in docs),
        "wall_s": wall,
        "tasks_per_min": n_tasks / wall * 60,
        "rounds_per_s": n_tasks * args.rounds / wall,
        "added_p50_ms": pct(0.50),
        "added_p99_ms": pct(0.99),
        "rounds_timed": len(added),
        "rss_mb_per_inflight": statistics.mean(per_task) if per_task else float("nan"),
        "rss_max_mb": max(d["rss_max"] for d in docs) / 2**20,
        "inflight_max": sum(d["inflight_max"] for d in docs),
        # The worker processes' own CPU (all threads) per round: what bounds one
        # process's rounds per second at one core.
        "worker_cpu_ms_per_round": sum(d["cpu_s"] for d in docs)
        * 1000
        / max(1, sum(d["act_calls"] for d in docs)),
        "db_connections": conns if cfg.backend == "postgres" else cfg.processes,
        "load_before": load_before,
        "load_after": load_after,
    }


def breakdown(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """`--probe`: the added time of the rounds, all of them and the slowest 1%, split into
    the store calls the run awaited (waiting for a thread, in the thread, handed back)
    before and after the tool, and the rest (the loop's own work and queue, the tool's
    thread hops); plus the event loop's lag and the store calls per round by name."""
    rows: list[dict[str, float]] = []
    names: dict[str, int] = {}
    lags: list[float] = []
    late: list[tuple[float, float]] = []
    gcs: list[tuple[int, float, float, float, int]] = []
    for d in docs:
        pr = d["probe"]
        lags.extend(pr["lags"])
        late.extend(x for x in pr["lag_cpu"] if x[0] > 0.01)
        gcs.extend(pr["gc"])
        for task, ts in d["starts"].items():
            calls = sorted(pr["calls"].get(f"task {task}", []))
            ends = pr["model_end"].get(task, [])
            spans = pr["tool_span"].get(task, [])
            for k in range(1, len(ts)):
                if k - 1 >= len(spans) or k - 1 >= len(ends):
                    continue
                a0, a1 = ts[k - 1], ts[k]
                m_end = ends[k - 1]
                t_start, t_end = spans[k - 1]
                row = {
                    "round": k,
                    "start": a0,
                    "model_end": m_end,
                    "span": a1 - a0,
                    "added": (a1 - a0 - (m_end - a0) - (t_end - t_start)) * 1000,
                    "pre_tool": (t_start - m_end) * 1000,
                    "post_tool": (a1 - t_end) * 1000,
                }
                for part, lo, hi in (("pre", m_end, t_start), ("post", t_end, a1)):
                    inside = [c for c in calls if lo <= c[0] < hi]
                    row[f"{part}_calls"] = len(inside)
                    row[f"{part}_wait"] = sum(c[1] - c[0] for c in inside) * 1000
                    row[f"{part}_exec"] = sum(c[2] - c[1] for c in inside) * 1000
                    row[f"{part}_back"] = sum(c[3] - c[2] for c in inside) * 1000
                    for c in inside:
                        names[c[4]] = names.get(c[4], 0) + 1
                rows.append(row)
    if not rows:
        return {}
    rows.sort(key=lambda r: r["added"])
    tail = rows[int(0.99 * len(rows)) :]

    def mean(rs: list[dict[str, float]]) -> dict[str, float]:
        keys = [k for k in rs[0] if k not in ("round", "start", "model_end", "span")]
        return {k: round(statistics.mean(r[k] for r in rs), 2) for k in keys}

    lags.sort()
    t0 = min(r["start"] for r in rows)
    # The slowest 1% that had an older generation's collection (1 or 2) inside them.
    old_gcs = [g for g in gcs if g[0] >= 1]
    tail_gc = [
        sum(g[3] for g in old_gcs if r["start"] <= g[2] < r["start"] + r["span"]) for r in tail
    ]
    return {
        "rounds": len(rows),
        # Which rounds of their task the slowest 1% were, and when (seconds into the run).
        "p99_tail_rounds": sorted(int(r["round"]) for r in tail),
        "p99_tail_at_s": sorted(round(r["start"] - t0, 1) for r in tail),
        "p99_tail_gc": {
            "rounds_with_gen1_2": sum(1 for x in tail_gc if x),
            "mean_ms": round(statistics.mean(tail_gc) * 1000, 1),
        },
        "all_mean": mean(rows),
        "p99_tail_mean": mean(tail),
        "loop_lag_ms": {
            q: round(lags[min(len(lags) - 1, int(f * len(lags)))] * 1000, 2)
            for q, f in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))
        }
        if lags
        else {},
        # Ticks over 10 ms late: how many, their total lateness, and the loop thread's
        # own CPU over those intervals (the rest: waiting for the GIL or a core).
        "late_ticks": {
            "n": len(late),
            "late_s": round(sum(x[0] for x in late), 3),
            "loop_cpu_s": round(sum(x[1] for x in late), 3),
        },
        "gc": {
            f"gen{g}": {
                "n": sum(1 for x in gcs if x[0] == g),
                "total_ms": round(sum(x[1] for x in gcs if x[0] == g) * 1000, 1),
                "max_ms": round(max((x[1] for x in gcs if x[0] == g), default=0) * 1000, 1),
            }
            for g in (0, 1, 2)
        },
        "store_calls_per_round": {k: round(v / len(rows), 2) for k, v in sorted(names.items())},
        **mechanism(docs, rows, tail, gcs),
    }


def _p50_p99(seconds: list[float]) -> tuple[float, float]:
    xs = sorted(seconds)
    if not xs:
        return (0.0, 0.0)
    return tuple(round(xs[min(len(xs) - 1, int(f * len(xs)))] * 1000, 2) for f in (0.5, 0.99))  # type: ignore[return-value]


def mechanism(
    docs: list[dict[str, Any]],
    rows: list[dict[str, float]],
    tail: list[dict[str, float]],
    gcs: list[tuple[int, float, float, float, int]],
) -> dict[str, Any]:
    """`--probe`: the shared stalls, counted per 1,000 rounds so that runs of different
    lengths compare: the collector's pauses by generation, how many rounds an older
    generation's collection fell inside, the store calls' waits (for a thread, in it,
    handed back) by call, the pool's waits for a connection, and the slowest 1%'s
    share of each."""
    per = 1000 / len(rows)
    old = sorted((g[2], g[2] + g[3]) for g in gcs if g[0] >= 1)

    def hit(r: dict[str, float]) -> float:
        # From the model's return to the next act call: what a pause can delay.
        lo, hi = r["model_end"], r["start"] + r["span"]
        return sum(min(hi, b) - max(lo, a) for a, b in old if a < hi and b > lo)

    calls: dict[str, list[tuple[float, float, float, float, str]]] = {}
    for d in docs:
        for cs in d["probe"]["calls"].values():
            for c in cs:
                calls.setdefault(c[4], []).append(c)
    pool: dict[str, int] = {}
    for d in docs:
        for k, v in (d.get("pool") or {}).items():
            pool[k] = pool.get(k, 0) + v
    return {
        "gc_per_1000_rounds": {
            f"gen{g}": {
                "n": round(sum(1 for x in gcs if x[0] == g) * per, 1),
                "ms": round(sum(x[1] for x in gcs if x[0] == g) * 1000 * per, 1),
                # Objects in cycles it freed: garbage only the collector reclaims.
                "freed": round(sum(x[4] for x in gcs if x[0] == g) * per),
            }
            for g in (0, 1, 2)
        },
        # Rounds with a gen-1 or gen-2 collection inside their added time: all of them (per 1,000)
        # and of the slowest 1% (a share), and the pause they held on average.
        "rounds_holding_old_gc_per_1000": round(sum(1 for r in rows if hit(r)) * per, 1),
        "tail_holding_old_gc": f"{sum(1 for r in tail if hit(r))}/{len(tail)}",
        "tail_old_gc_ms": round(statistics.mean(hit(r) for r in tail) * 1000, 1),
        "store_call_ms": {
            name: {
                "n_per_1000_rounds": round(len(cs) * per),
                "wait_p50_p99": _p50_p99([c[1] - c[0] for c in cs]),
                "exec_p50_p99": _p50_p99([c[2] - c[1] for c in cs]),
                "back_p50_p99": _p50_p99([c[3] - c[2] for c in cs]),
            }
            for name, cs in sorted(calls.items())
            if len(cs) * per >= 50
        },
        "heap_objects_at_4s": [d["probe"].get("heap", 0) for d in docs],
        "quiet_gc_made_forced": [d.get("quiet_gc") for d in docs],
        "garbage_at_end_per_1000_rounds": round(
            sum(d.get("garbage_at_end", 0) for d in docs) * per
        ),
        "pool": {
            k: pool[k]
            for k in ("requests_num", "requests_queued", "requests_wait_ms", "connections_num")
            if k in pool
        },
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The ratios the targets speak of, where both rows ran."""
    out: dict[str, Any] = {}
    by = {(r["backend"], r["processes"], r["concurrency"]): r for r in rows}
    for backend, key in (("postgres", "pg_c64_speedup"), ("sqlite", "sqlite_c64_speedup")):
        one, many = by.get((backend, 1, 1)), by.get((backend, 1, 64))
        if one and many:
            out[key] = many["tasks_per_min"] / one["tasks_per_min"]
            out[f"{backend}_rss_marginal_mb"] = (
                (many["rss_max_mb"] - one["rss_max_mb"]) / 63 if many["inflight_max"] else None
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--db", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--concurrency", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument(
        "--pg",
        default=os.environ.get("TETHER_TEST_PG_URL"),
        help="PostgreSQL URL (default: TETHER_TEST_PG_URL); without one: SQLite only",
    )
    ap.add_argument("--rounds", type=int, default=None, help="rounds per task (10; quick 3)")
    ap.add_argument("--waves", type=int, default=None, help="tasks per slot (3; quick 1)")
    ap.add_argument("--model-ms", type=float, default=None, help="model latency (300; quick 50)")
    ap.add_argument("--tool-ms", type=float, default=None, help="tool time (20; quick 5)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, three configurations")
    ap.add_argument("--only", default=None, help="comma-separated labels, e.g. 'sqlite 1x16'")
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument(
        "--pool-size", type=int, default=None, help="each worker's pool (the store's: 8)"
    )
    ap.add_argument(
        "--no-tune",
        action="store_true",
        help="leave the workers' GC thresholds at CPython's (a before/after comparison)",
    )
    ap.add_argument(
        "--gc-thresholds",
        default=None,
        help="the workers' collector thresholds, e.g. '3000,10,10', or 'off' (an experiment)",
    )
    ap.add_argument(
        "--start-pace",
        type=float,
        default=None,
        help="the workers' Worker(start_pace=) in seconds (0: claims not paced; an A/B)",
    )
    ap.add_argument("--probe", action="store_true", help="break the added latency down (costs CPU)")
    args = ap.parse_args()
    if args.child:
        args.model_ms = 300.0 if args.model_ms is None else args.model_ms
        args.tool_ms = 20.0 if args.tool_ms is None else args.tool_ms
        asyncio.run(child(args))
        return
    args.rounds = args.rounds or (3 if args.quick else 10)
    args.waves = args.waves or (1 if args.quick else 3)
    args.model_ms = args.model_ms if args.model_ms is not None else (50 if args.quick else 300)
    args.tool_ms = args.tool_ms if args.tool_ms is not None else (5 if args.quick else 20)
    configs = QUICK if args.quick else FULL
    if args.only:
        wanted = {s.strip() for s in args.only.split(",")}
        configs = [c for c in configs if c.label in wanted]
    command = "benchmarks/scale_bench.py " + shlex.join(sys.argv[1:])
    print(f"tether scale benchmark: {command}")
    print(
        f"{args.rounds} rounds per task, model {args.model_ms:g} ms, tool {args.tool_ms:g} ms,"
        f" {args.waves} task(s) per slot; {os.cpu_count()} CPUs"
    )
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tether-scale-") as tmp:
        for cfg in configs:
            if cfg.backend == "postgres" and not args.pg:
                skipped.append(cfg.label)
                continue
            row = run_config(cfg, args, Path(tmp))
            rows.append(row)
            print(
                f"{row['config']:>16}: {row['tasks_per_min']:8.1f} tasks/min"
                f" ({row['rounds_per_s']:.1f} rounds/s), added p50 {row['added_p50_ms']:.1f}"
                f" / p99 {row['added_p99_ms']:.1f} ms, RSS {row['rss_mb_per_inflight']:.2f}"
                f" MB/in-flight task, worker CPU {row['worker_cpu_ms_per_round']:.1f}"
                f" ms/round, {row['db_connections']} connection(s),"
                f" {row['satisfied']}/{row['tasks']} satisfied,"
                f" load {row['load_before']:.1f}->{row['load_after']:.1f}",
                flush=True,
            )
            if row["probe"]:
                print(json.dumps(row["probe"], indent=1), flush=True)
    summary = summarize(rows)
    for key, value in summary.items():
        if value is not None:
            print(f"{key}: {value:.2f}")
    print("targets: " + ", ".join(f"{k} {v:g}" for k, v in TARGETS.items()))
    if skipped:
        print(f"skipped (no PostgreSQL URL): {', '.join(skipped)}")
    if args.json:
        doc = {
            "command": command,
            "rounds": args.rounds,
            "waves": args.waves,
            "model_ms": args.model_ms,
            "tool_ms": args.tool_ms,
            "cpus": os.cpu_count(),
            "results": rows,
            "summary": summary,
            "targets": TARGETS,
            "skipped": skipped,
        }
        Path(args.json).write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
