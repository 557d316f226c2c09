"""One configuration in a fresh process: a timed block, a run to kill, or its resume.

`run.py` starts this script once per block and twice per crash trial, and reads the
JSON it writes to `--out`. A block measures, in this order: half of the floor samples,
the system's run of N steps (the database size is read once the system has set up its
tables, before step 1), the database size again after the run, the other half of
the floor samples, and the process's peak RSS.

    python benchmarks/peers/child.py --system tether --config sqlite-full --n 100 \
        --workdir /tmp/x --out /tmp/x/out.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from harness import Probe, Setup, create_schema, med_p99, peak_rss, windows

RUNNERS = {"tether": "tether_runner", "langgraph": "langgraph_runner", "dbos": "dbos_runner"}


def runner(system: str) -> Any:
    """The runner module of a system."""
    return importlib.import_module(RUNNERS[system])


def block(setup: Setup, floor_n: int) -> dict[str, Any]:
    """Run N steps with the probe; floors and sizes around it."""
    mod = runner(setup.system)
    store = mod.storage(setup)
    floor: list[float] = store.floor(floor_n // 2) if store else []
    sizes: dict[str, int] = {}

    def ready() -> None:
        if store is not None:
            sizes["before"] = store.size()

    probe = Probe(setup.n)
    t0 = time.perf_counter()
    info = mod.run(setup, probe, ready)
    wall = time.perf_counter() - t0
    if store is not None:
        sizes["after"] = store.size()
        floor += store.floor(floor_n - floor_n // 2)
    overheads = probe.overheads()
    cpu = [probe.cpu_ms(k) for k in range(1, len(overheads) + 1)]
    wins = {}
    for name, (a, b) in windows(setup.n).items():
        sample = overheads[a - 1 : b]
        med, p99 = med_p99(sample)
        wins[name] = {
            "from": a,
            "to": b,
            "median_ms": med,
            "p99_ms": p99,
            "samples": sample,
            "cpu_loop_ms": [c[0] for c in cpu[a - 1 : b]],
            "cpu_proc_ms": [c[1] for c in cpu[a - 1 : b]],
        }
    counts = setup.effects.counts()
    return {
        **info,
        "steps": probe.steps,
        "wall_s": wall,
        "windows": wins,
        "overhead_ms": overheads,
        "floor_ms": [f * 1000 for f in floor],
        "floor_kind": store.describe() if store else None,
        "sizes": sizes,
        "bytes_per_step": (
            (sizes["after"] - sizes["before"]) / setup.n if "before" in sizes else None
        ),
        "peak_rss": peak_rss(),
        "effects": sum(counts.values()),
        "repeated": sum(c - 1 for c in counts.values() if c > 1),
    }


def resume(setup: Setup, spawned_at: float) -> dict[str, Any]:
    """Continue a killed run; how long until it did real work again."""
    mod = runner(setup.system)
    probe = Probe(setup.n)
    info = mod.run(setup, probe, lambda: None)
    out: dict[str, Any] = {**info, "steps_this_process": probe.steps}
    if probe.first_call is not None and setup.resume_called_at is not None:
        out["resume_ms"] = (probe.first_call - setup.resume_called_at) * 1000
    if probe.first_call_wall is not None:
        out["spawn_to_resumed_ms"] = (probe.first_call_wall - spawned_at) * 1000
    out["peak_rss"] = peak_rss()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--system", required=True, choices=sorted(RUNNERS))
    ap.add_argument("--config", required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--mode", choices=["bench", "crash", "resume"], default="bench")
    ap.add_argument("--crash-at", type=int, default=None)
    ap.add_argument("--pg", default=None, help="PostgreSQL server URL")
    ap.add_argument("--schema", default=None, help="this block's PostgreSQL schema")
    ap.add_argument("--floor", type=int, default=200, help="floor samples")
    ap.add_argument("--spawned-at", type=float, default=None, help="time.time() at spawn")
    args = ap.parse_args(argv)
    spawned_at = args.spawned_at or time.time()
    setup = Setup(
        system=args.system,
        config=args.config,
        n=args.n,
        workdir=args.workdir,
        pg_url=args.pg,
        schema=args.schema,
        crash_at=args.crash_at if args.mode == "crash" else None,
        resume=args.mode == "resume",
    )
    if args.pg and args.schema:
        create_schema(args.pg, args.schema)  # LangGraph's saver expects it to exist
    if args.mode == "bench":
        out = block(setup, args.floor)
    elif args.mode == "crash":
        out = runner(setup.system).run(setup, Probe(setup.n), lambda: None)
        out["not_killed"] = True  # reaching this line means the crash point was missed
    else:
        out = resume(setup, spawned_at)
    setup.effects.close()
    args.out.write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
