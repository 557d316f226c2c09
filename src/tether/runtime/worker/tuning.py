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

Once the store is open and before the first claim (`settle_process`), the modules a
round imports lazily are imported, and what the process holds then (its modules, the
store's pool, the price tables: tens of thousands of objects that live as long as the
process) is collected once and frozen (`gc.freeze`): the collector no longer walks it
again at every full collection while runs are in flight, and the first round of the
first runs does not pay for the imports while the other runs wait.

Applied by the `tether worker` command, which owns its process; a program that embeds
a `Worker` decides for its own process (it may call `tune_process` and
`settle_process` too).
"""

from __future__ import annotations

import contextlib
import gc
import importlib

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


#: Modules a round imports on first use (a provider's price table among them).
WARM_MODULES = (
    "tether.runtime.round.phases",
    "tether.runtime.judge.completion",
    "tether.models.pricing",
    "genai_prices",
    "genai_prices.data",
)


_settled = False


def settle_process() -> None:
    """Import `WARM_MODULES`, collect, and freeze what the process holds (see the module):
    when the worker's store is open and before its first claim, once per process (a
    second worker in the same process finds it done). Objects frozen are never
    collected: only what lives as long as the process should be there by then."""
    global _settled
    if _settled:
        return
    _settled = True
    for name in WARM_MODULES:
        with contextlib.suppress(ImportError):  # an optional extra not installed
            importlib.import_module(name)
    if gc.isenabled():
        gc.collect()
        gc.freeze()


__all__ = ["GC_THRESHOLDS", "WARM_MODULES", "settle_process", "tune_process"]
