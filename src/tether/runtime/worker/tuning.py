"""The process settings of a worker process (`tether worker`): the garbage collector's.

A worker with many runs in flight holds a few hundred thousand container objects (each
run's state, history and ledger), and allocates tens of thousands more per second (the
rows and JSON of every round). With CPython's default thresholds (700, 10, 10) that
meant, at concurrency 64 on PostgreSQL (`benchmarks/scale_bench.py --probe`, issue 22),
about 500 young collections in 1,900 rounds and a full collection every few seconds of
about 100 ms of CPU: a pause holding the GIL during which no run's coroutine, store
thread or tool thread moves, so it lands in the p99 of every round in flight. Young
collections 4x rarer (3,000) cut the collector's CPU from ~0.8 s to ~0.3 s per 1,900
rounds, with one full collection of ~45 ms instead of four of ~100 ms; the heap does not
grow from it (cycles are still collected, a little later).

The switch interval (`sys.setswitchinterval`) is left at CPython's 5 ms: a shorter one
did not measurably cut the tail at concurrency 64 on the shared 2-core machine.

Applied by the `tether worker` command, which owns its process; a program that embeds
a `Worker` decides for its own process (it may call `tune_process` too).
"""

from __future__ import annotations

import gc

#: The collector's thresholds for a worker process (CPython's default: 700, 10, 10).
GC_THRESHOLDS = (3000, 10, 10)


def tune_process() -> None:
    """Set this process's collector thresholds to `GC_THRESHOLDS` (see the module), unless
    the collector is off or already tuned higher (the process's own choice)."""
    if not gc.isenabled():
        return
    current = gc.get_threshold()
    if current[0] >= GC_THRESHOLDS[0]:
        return
    gc.set_threshold(*GC_THRESHOLDS)


__all__ = ["GC_THRESHOLDS", "tune_process"]
