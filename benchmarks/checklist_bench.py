"""Checklist benchmark: what a round costs at 10, 1,000 and 10,000 checklist items.

One task per size, on the embedded SQLite store (synchronous FULL, the default) in a
temporary folder, with the default limits and context budget (32,000 tokens) except
`limits.max_rounds`, raised so that only `--rounds` stops the run
(`Engine(max_rounds_this_run=...)`). Item `f-NNNNN` ("migrate file NNNNN") is done when
`out/f-NNNNN.txt` exists (a file rule), and takes `--calls` honest calls (10 by
default, one per round): the scripted model writes drafts `work/f-NNNNN.partK` first,
then the file, so that the task of 10 items runs the same 100 rounds as the others.
The model follows the ledger as a model would: it works on the item the latest ledger
it was given names as `Next`.
The compressor (`compact` purpose) writes a short summary; there is no LLM judge (the
rules decide). The model's tool results are small (a line), so the conversation grows
by a few hundred characters per round and compaction is driven by it.

Measured per size:

- **per-round time**: the median interval between the starts of consecutive act calls
  (everything the runtime does per round: commits, dispatch, the rule judge, request
  assembly, compaction when due), and the whole run divided by the rounds;
- **bytes per round**: growth of the database file over the run (after a checkpoint,
  the store closed before and after), divided by the rounds;
- **request size**: characters of each act request (system prompt, messages, tool
  calls' arguments; tools' schemas left out), median and largest, and the largest
  estimated input tokens;
- **compactions per 100 rounds** (`context.compacted` events);
- **task creation**: `parse_spec` and `create_task` (wall and CPU time);
- the time of `tether status` (the `status --json` document and its terminal view),
  the report (`build_report` and its Markdown), the dashboard's task page (an HTTP GET
  through FastAPI's test client) and `rebuild` (the log folded and compared), each
  once, at the end of the run; and `get_ledger` (the stored ledger read whole, the
  median of five reads).

    .venv/bin/python benchmarks/checklist_bench.py                     # 10, 1,000, 10,000
    .venv/bin/python benchmarks/checklist_bench.py --sizes 10,1000 --rounds 50
    .venv/bin/python benchmarks/checklist_bench.py --json out.json

    .venv/bin/python benchmarks/checklist_bench.py --sizes 10,10000 --profile rounds.prof

Wall time is noisy on a shared machine: the CPU time of the process per round (the
median interval between act calls, and the run's CPU time divided by the rounds) is
shown beside it and held to the same target.

Targets: per-round time and bytes at 10,000 items at most 1.5 times those at 10 items;
`tether status`, the report, the dashboard's task page and `rebuild` each under
2 seconds at every size on a 2-core machine (they page through items: the task page
and `status` show a page of them, `--after`/`--limit` and `?items_after=` the rest).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import re
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tether import tokens
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.tasks import create_task
from tether.spec import parse_spec
from tether.store.sqlite import SQLiteStore

NEXT = re.compile(r"^Next: (\S+)", re.M)
TARGET_RATIO = 1.5
#: The most seconds `status`, the report, the task page and `rebuild` may take.
TARGET_READ_S = 2.0
TOKEN = "bench-token-0123456789"


def checklist_spec(n_items: int, max_rounds: int) -> dict[str, Any]:
    """`n_items` items, each done when its file exists; default limits otherwise."""
    return {
        "name": f"checklist-{n_items}",
        "objective": f"Migrate {n_items} files: draft each one, then write it to out/",
        "instructions": "For each item write its parts work/<id>.partK first, then out/<id>.txt.",
        "items": [
            {
                "id": f"f-{k:05d}",
                "title": f"migrate file {k:05d}",
                "done_when": {"kind": "file", "path": f"out/f-{k:05d}.txt"},
            }
            for k in range(1, n_items + 1)
        ],
        "tools": ["write_file"],
        "limits": {"max_rounds": max_rounds},
    }


def latest_ledger(request: ModelRequest) -> str:
    """The newest ledger text the runtime gave the model."""
    for m in reversed(request.messages):
        if m.role == "user" and "GOAL LEDGER" in m.content:
            return m.content
    return request.system


def request_chars(request: ModelRequest) -> int:
    """Characters of a request's system prompt, messages and tool calls."""
    n = len(request.system)
    for m in request.messages:
        n += len(m.content) + sum(len(c.raw_arguments) + len(c.name) for c in m.tool_calls)
    return n


@dataclass
class HonestModel:
    """Follows the ledger: `calls` calls per item (drafts, then the file), in order."""

    calls: int = 10
    drafted: dict[str, int] = field(default_factory=dict)
    sizes: list[int] = field(default_factory=list)
    token_sizes: list[int] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)
    cpu_starts: list[float] = field(default_factory=list)

    def policy(self, request: ModelRequest) -> Any:
        if request.purpose == "compact":
            return "Files were drafted and written one by one, in the ledger's order."
        if request.purpose != "act":
            return '{"changes": [], "decision": "continue", "reason": "rules decide"}'
        self.starts.append(time.perf_counter())
        self.cpu_starts.append(time.process_time())
        self.sizes.append(request_chars(request))
        self.token_sizes.append(tokens.estimate_request(request))
        found = NEXT.findall(latest_ledger(request))
        nxt = found[-1] if found and found[-1] != "nothing" else None
        if nxt is None:
            return ModelResponse("Everything in the ledger is closed.")
        part = self.drafted.get(nxt, 0) + 1
        if part < self.calls:
            self.drafted[nxt] = part
            return ModelResponse(
                f"drafting {nxt}, part {part}",
                (
                    tool_call(
                        "write_file", path=f"work/{nxt}.part{part}", content=f"part {part} of {nxt}"
                    ),
                ),
            )
        return ModelResponse(
            f"writing {nxt}",
            (tool_call("write_file", path=f"out/{nxt}.txt", content=f"migrated {nxt}"),),
        )


@dataclass
class SizeResult:
    items: int
    rounds: int
    round_ms_median: float
    round_ms_mean: float
    round_cpu_ms_median: float
    round_cpu_ms_mean: float
    bytes_per_round: float
    request_chars_median: float
    request_chars_max: int
    request_tokens_max: int
    compactions_per_100: float
    create_s: float
    create_cpu_s: float
    status_s: float
    report_s: float
    web_task_page_s: float
    web_task_page_bytes: int
    rebuild_s: float
    get_ledger_ms: float = 0.0
    error: str = ""


def _db_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


async def _status(store: SQLiteStore, task_id: str) -> float:
    from rich.console import Console

    from tether.cli import views
    from tether.runtime.tasks import status_dict

    t0 = time.perf_counter()
    doc = await status_dict(store, task_id)
    console = Console(file=io.StringIO(), width=120, color_system=None)
    console.print(views.status_view(doc))
    return time.perf_counter() - t0


async def _report(store: SQLiteStore, task_id: str) -> float:
    from tether.report import build_report
    from tether.report.render import render

    t0 = time.perf_counter()
    render(await build_report(store, task_id), "md")
    return time.perf_counter() - t0


def _web(db: Path, task_id: str) -> tuple[float, int]:
    from fastapi.testclient import TestClient

    from tether.web import create_app

    with TestClient(
        create_app(f"sqlite:///{db}", token=TOKEN), base_url="http://127.0.0.1"
    ) as client:
        client.cookies.update({"tether_token": TOKEN})
        client.get(f"/tasks/{task_id}?token={TOKEN}")  # signs in (sets the cookie)
        t0 = time.perf_counter()
        r = client.get(f"/tasks/{task_id}")
        took = time.perf_counter() - t0
        if r.status_code != 200:
            raise RuntimeError(f"task page: HTTP {r.status_code}")
        return took, len(r.content)


async def _rebuild(store: SQLiteStore, task_id: str) -> float:
    from tether.rebuild import rebuild

    t0 = time.perf_counter()
    report = await rebuild(store, task_id)
    if report.get("ledger"):
        raise RuntimeError(f"rebuild found the ledger differs: {report['ledger']}")
    return time.perf_counter() - t0


async def _get_ledger(store: SQLiteStore, task_id: str) -> float:
    """Milliseconds of `get_ledger` (the stored ledger read whole), the median of five."""
    took = []
    for _ in range(5):
        t0 = time.perf_counter()
        await store.get_ledger(task_id)
        took.append(time.perf_counter() - t0)
    return 1000 * statistics.median(took)


async def run_size(
    n_items: int, rounds: int, calls: int, folder: Path, profile: cProfile.Profile | None = None
) -> SizeResult:
    db, ws = folder / f"bench-{n_items}.db", folder / f"ws-{n_items}"
    ws.mkdir()
    store = await SQLiteStore.open(db)
    t0, c0 = time.perf_counter(), time.process_time()
    task = await create_task(store, parse_spec(checklist_spec(n_items, rounds * 10)), workspace=ws)
    create_s, create_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    await store.close()
    size0 = _db_size(db)
    honest = HonestModel(calls)
    model = ScriptedModel(policy=honest.policy, keep_requests=1)
    store = await SQLiteStore.open(db)
    engine = Engine(store, ModelSet(actor=model, compact=model), max_rounds_this_run=rounds)
    t0, c0 = time.perf_counter(), time.process_time()
    error = ""
    try:
        if profile is not None:
            profile.enable()
        try:
            result = await engine.run(task.task_id)
        finally:
            if profile is not None:
                profile.disable()
        if result.status not in ("queued", "satisfied"):
            error = f"the run ended {result.status}: {result.stop_reason} {result.waiting or ''}"
    except Exception as exc:  # reported: the old code could not run at all
        error = f"{type(exc).__name__}: {exc}"
    run_s, run_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    done_rounds = len(await store.read_events(task.task_id, types={"round.committed"}))
    compactions = len(await store.read_events(task.task_id, types={"context.compacted"}))
    await store.close()
    size1 = _db_size(db)
    store = await SQLiteStore.open(db)
    try:
        status_s = await _status(store, task.task_id)
        report_s = await _report(store, task.task_id)
        rebuild_s = await _rebuild(store, task.task_id)
        get_ledger_ms = await _get_ledger(store, task.task_id)
    finally:
        await store.close()
    web_s, web_bytes = await asyncio.to_thread(_web, db, task.task_id)
    gaps = [b - a for a, b in zip(honest.starts, honest.starts[1:], strict=False)]
    cpu_gaps = [b - a for a, b in zip(honest.cpu_starts, honest.cpu_starts[1:], strict=False)]
    return SizeResult(
        items=n_items,
        rounds=done_rounds,
        round_ms_median=1000 * statistics.median(gaps) if gaps else float("nan"),
        round_ms_mean=1000 * run_s / max(1, done_rounds),
        round_cpu_ms_median=1000 * statistics.median(cpu_gaps) if cpu_gaps else float("nan"),
        round_cpu_ms_mean=1000 * run_cpu_s / max(1, done_rounds),
        bytes_per_round=(size1 - size0) / max(1, done_rounds),
        request_chars_median=statistics.median(honest.sizes) if honest.sizes else float("nan"),
        request_chars_max=max(honest.sizes, default=0),
        request_tokens_max=max(honest.token_sizes, default=0),
        compactions_per_100=100 * compactions / max(1, done_rounds),
        create_s=create_s,
        create_cpu_s=create_cpu_s,
        status_s=status_s,
        report_s=report_s,
        web_task_page_s=web_s,
        web_task_page_bytes=web_bytes,
        rebuild_s=rebuild_s,
        get_ledger_ms=get_ledger_ms,
        error=error,
    )


def _table(results: list[SizeResult]) -> str:
    rows = [
        ("items", lambda r: f"{r.items:,}"),
        ("rounds run", lambda r: f"{r.rounds}"),
        ("per-round time, median (ms)", lambda r: f"{r.round_ms_median:.1f}"),
        ("per-round time, run / rounds (ms)", lambda r: f"{r.round_ms_mean:.1f}"),
        ("per-round CPU, median (ms)", lambda r: f"{r.round_cpu_ms_median:.1f}"),
        ("per-round CPU, run / rounds (ms)", lambda r: f"{r.round_cpu_ms_mean:.1f}"),
        ("bytes per round (database growth)", lambda r: f"{r.bytes_per_round:,.0f}"),
        ("act request, median (chars)", lambda r: f"{r.request_chars_median:,.0f}"),
        ("act request, largest (chars)", lambda r: f"{r.request_chars_max:,}"),
        ("act request, largest (est. tokens)", lambda r: f"{r.request_tokens_max:,}"),
        ("compactions per 100 rounds", lambda r: f"{r.compactions_per_100:.1f}"),
        ("create task (s)", lambda r: f"{r.create_s:.2f}"),
        ("create task, CPU (s)", lambda r: f"{r.create_cpu_s:.2f}"),
        ("status (s)", lambda r: f"{r.status_s:.2f}"),
        ("report (s)", lambda r: f"{r.report_s:.2f}"),
        ("web task page (s)", lambda r: f"{r.web_task_page_s:.2f}"),
        ("web task page (bytes)", lambda r: f"{r.web_task_page_bytes:,}"),
        ("rebuild (s)", lambda r: f"{r.rebuild_s:.2f}"),
        ("get_ledger (ms)", lambda r: f"{r.get_ledger_ms:.1f}"),
    ]
    width = max(len(name) for name, _ in rows)
    lines = []
    for name, cell in rows:
        lines.append(name.ljust(width) + "".join(cell(r).rjust(12) for r in results))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,1000,10000")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--calls", type=int, default=10, help="calls per item")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="write a cProfile of the rounds (the run, not the task's creation) of the "
        "largest size to this file (pstats format)",
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="tether-checklist-") as tmp:
        for n in sizes:
            profile = cProfile.Profile() if args.profile and n == max(sizes) else None
            results.append(asyncio.run(run_size(n, args.rounds, args.calls, Path(tmp), profile)))
            if profile is not None:
                profile.dump_stats(args.profile)
            print(f"{n:,} items done", file=sys.stderr)
    print(_table(results))
    for r in results:
        if r.error:
            print(f"{r.items:,} items: {r.error}")
    ok = True
    base = results[0]
    for r in results[1:]:
        for what, a, b in (
            ("per-round time", r.round_ms_median, base.round_ms_median),
            ("per-round CPU", r.round_cpu_ms_median, base.round_cpu_ms_median),
            ("bytes per round", r.bytes_per_round, base.bytes_per_round),
        ):
            ratio = a / b if b else float("inf")
            verdict = "ok" if ratio <= TARGET_RATIO else "OVER TARGET"
            ok = ok and ratio <= TARGET_RATIO
            print(f"{what} at {r.items:,} items: {ratio:.2f}x that at {base.items:,} ({verdict})")
    for r in results:
        for what, secs in (
            ("status", r.status_s),
            ("report", r.report_s),
            ("web task page", r.web_task_page_s),
            ("rebuild", r.rebuild_s),
        ):
            if secs > TARGET_READ_S:
                ok = False
                print(f"{what} at {r.items:,} items: {secs:.2f} s (OVER {TARGET_READ_S:g} s)")
    slowest = max(results, key=lambda r: r.items)
    reads = (slowest.status_s, slowest.report_s, slowest.web_task_page_s, slowest.rebuild_s)
    print(f"status, report, task page, rebuild at {slowest.items:,} items: at most "
          f"{max(reads):.2f} s (target < {TARGET_READ_S:g} s)")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
