"""The process settings of a worker process (`tether worker`): the garbage collector's.

A worker with many runs in flight holds a few hundred thousand container objects (each
run's state, history and ledger), and allocates tens of thousands more per second (the
rows and JSON of every round). With CPython's default thresholds (700, 10, 10) that
meant, at concurrency 64 on PostgreSQL (`benchmarks/scale_bench.py --probe`, issue 22),
about 500 young collections in 1,900 rounds and a full collection every few seconds of
about 100 ms of CPU: a pause holding the GIL during which no run's coroutine, store
thread or tool thread moves, so it lands in the p99 of every round in flight. Young
collections 4x rarer (3,000) cut the collector's CPU from ~0.8 s to ~0.3 s per 1,900
rounds. What was left in the slowest 1% were the automatic generation-1 collections
(15–30 ms each, about one round in twenty holding one), which free nothing in a worker:
since then the older generations are collected by a `QuietCollector` instead, a full
collection every 100 young ones at a quiet moment of the loop (`worker.collector`).

The switch interval (`sys.setswitchinterval`) is left at CPython's 5 ms: a shorter one
did not measurably cut the tail at concurrency 64 on the shared 2-core machine.

Once the store is open and before the first claim (`settle_process`), the modules a
round imports lazily are imported, the models whose validators pydantic defers are
built (`build_models`), and what the process holds then (its modules, the
store's pool, the price tables: tens of thousands of objects that live as long as the
process) is collected once and frozen (`gc.freeze`): the collector no longer walks it
again at every full collection while runs are in flight, and the first round of the
first runs does not pay for the imports while the other runs wait.

Applied by the `tether worker` command, which owns its process; a program that embeds
a `Worker` decides for its own process (it may call `tune_process` and
`settle_process` too). The process's owner chooses with `TETHER_WORKER_GC`:

- `quiet` (the default): the thresholds, the settling, and the `QuietCollector`;
- `thresholds`: the thresholds and the settling, the older generations left to
  CPython's automatic collections (the behaviour before the `QuietCollector`);
- `python`: the collector left exactly as the process has it (the modules are still
  imported before the first claim).

A process that turned its collector off, or set thresholds of its own, is left alone
whatever the variable says.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import os

from tether import errors
from tether.runtime.worker.collector import QuietCollector

#: The collector's thresholds for a worker process (CPython's default: 700, 10, 10).
GC_THRESHOLDS = (3000, 10, 10)
#: CPython's own thresholds: a process still at them made no choice of its own.
PYTHON_THRESHOLDS = (700, 10, 10)
#: The variable that chooses a worker process's collector policy (see the module).
GC_ENV = "TETHER_WORKER_GC"
GC_POLICIES = ("quiet", "thresholds", "python")


def gc_policy() -> str:
    """`TETHER_WORKER_GC` (`quiet` when unset); any other value is a `UserError`."""
    raw = os.environ.get(GC_ENV, "").strip().lower() or "quiet"
    if raw not in GC_POLICIES:
        raise errors.UserError(f"{GC_ENV}={raw[:40]!r} is not one of {', '.join(GC_POLICIES)}")
    return raw


def tune_process() -> None:
    """Set this process's collector thresholds to `GC_THRESHOLDS` (see the module), unless
    `TETHER_WORKER_GC=python`, or the collector is off or already tuned higher (the
    process's own choice). A value of the variable that is not a policy is refused by
    `settle_process`, inside the command (a `UserError` there is a message, not a
    traceback)."""
    if os.environ.get(GC_ENV, "").strip().lower() == "python" or not gc.isenabled():
        return
    current = gc.get_threshold()
    if current[0] >= GC_THRESHOLDS[0]:
        return
    gc.set_threshold(*GC_THRESHOLDS)


#: Modules a round imports on first use (a provider's price table among them; and
#: OpenTelemetry's API, which `telemetry` imports at the first span and model call
#: whenever it is installed).
WARM_MODULES = (
    "tether.runtime.round.phases",
    "tether.runtime.judge.completion",
    "tether.models.pricing",
    "genai_prices",
    "genai_prices.data",
    "opentelemetry.trace",
    "opentelemetry.metrics",
)


def build_models() -> None:
    """Build now the validators pydantic defers (`defer_build`: a command that reads no
    contract or event starts sooner) of tether's models loaded: built on first use, the
    contract's (at the first claim) and the events of a round's commits (in the first
    runs' first rounds) held the event loop for about 100 ms, the other runs' rounds
    with it. A model that cannot be built yet is left to its first use, as before."""
    from pydantic import BaseModel

    seen: set[type[BaseModel]] = set()
    todo = list(BaseModel.__subclasses__())
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        todo.extend(model.__subclasses__())
        if model.__module__.startswith("tether.") and not model.__pydantic_complete__:
            with contextlib.suppress(Exception):  # a forward reference not defined yet
                model.model_rebuild()


_settled = False
#: The `QuietCollector` `settle_process` started (None: none in this process).
collector: QuietCollector | None = None


def settle_process() -> None:
    """Import `WARM_MODULES`, then (see the module) set the thresholds, collect, freeze
    what the process holds, and hand the older generations to a `QuietCollector` on the
    running event loop: when the worker's store is open and before its first claim,
    once per process (a second worker in the same process finds it done). Objects
    frozen are never collected: only what lives as long as the process should be
    there by then. The thresholds are set here as well as by `tune_process`: a command
    may keep the collector off while it starts (`tether` does), which `tune_process`
    takes for the process's choice."""
    global _settled, collector
    if _settled:
        return
    _settled = True
    for name in WARM_MODULES:
        with contextlib.suppress(ImportError):  # an optional extra not installed
            importlib.import_module(name)
    build_models()
    policy = gc_policy()
    if policy == "python" or not gc.isenabled():
        return
    if gc.get_threshold() == PYTHON_THRESHOLDS:
        gc.set_threshold(*GC_THRESHOLDS)
    gc.collect()
    gc.freeze()
    if policy != "quiet" or gc.get_threshold() != GC_THRESHOLDS:
        return  # thresholds of the process's own: its older generations left to them
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # no loop to collect from: CPython's automatic collections
        return
    collector = QuietCollector(loop)
    collector.start()


__all__ = [
    "GC_ENV",
    "GC_POLICIES",
    "GC_THRESHOLDS",
    "WARM_MODULES",
    "build_models",
    "gc_policy",
    "settle_process",
    "tune_process",
]
