"""The worker: claim a task, run it, repeat, until told to stop.

Modelled on procrastinate's worker: the library owns the loop, the claiming, the
waiting when there is nothing to do and the shutdown; `tether worker` only builds a
`Worker` and calls `run()`.

What is claimable is decided in one place, the store's `claim` (the same call
`Engine.run_next` makes): a queued task, a running or stalled one whose lease is gone or
has expired (its worker died), and a `waiting` task whose `wake_at` has come (a backoff
or an open breaker parked it), never a task someone asked to cancel. Nothing else here
filters tasks.

Each task runs with the models its own spec asks for (`models` may be a function of the
spec), and the engine takes its models when it is built, so the worker claims with the
store, reads the task, builds its models, hands the lease back and lets `Engine.run`
take it again for the run. If another worker takes the task in between, that is fine:
the run is theirs and this worker goes on (`TaskBusy`). A recovery therefore names no
previous owner, as with `Engine.run_next`.

With `concurrency` N above 1 the same loop keeps up to N runs going at once on the
event loop, each an asyncio task of its own with its own engine, lease, heartbeat,
fencing token and models: the loop claims (one claim at a time, oldest first, as the
store orders them) whenever a slot is free, each once the run started before it has
started its first turn (`Slots.start_paced`), and the runs share the store (its pool of
connections on PostgreSQL, its one connection and thread on SQLite).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tether import errors, placement, telemetry
from tether.runtime import launch
from tether.runtime.engine import (
    Engine,
    ModelSet,
    RunResult,
)
from tether.runtime.run.task_run import Preread
from tether.runtime.takeover import process_id
from tether.runtime.watch.schedules import start_due
from tether.runtime.watch.sweep import Notifier, SweepReport, WatchPolicy, sweep
from tether.runtime.worker.dead import take_from_dead
from tether.runtime.worker.drain import Drain, set_pool_size
from tether.runtime.worker.held import (
    HeldBack,
    PassedOver,
    lacks_tools,
    placement_refusal,
    record_pass_over,
)
from tether.runtime.worker.reverify import Reverify
from tether.runtime.worker.slots import START_PACE, Slots
from tether.spec import TaskSpec, parse_spec
from tether.store.base import Lease, Store
from tether.tools.builtin.files import READ_ARTIFACT, default_registry
from tether.tools.registry import ToolRegistry

log = logging.getLogger("tether.worker")

#: The models of a task: one set for every task, or chosen from each task's spec.
ModelsFor = ModelSet | Callable[[TaskSpec], ModelSet]


@dataclass(frozen=True)
class WorkerStats:
    """What a worker did before `run()` returned."""

    #: Runs that ended (terminal, waiting or interrupted by the stop event).
    ran: int
    #: Tasks that raised instead, each held back for a while (see `Worker`).
    failed: int


class Worker:
    """Claims tasks from a store and runs them, up to `concurrency` at once, until stopped.

    `run()` loops: claim (the store's `claim`, see the module docstring) → choose the
    task's models → `Engine.run` → report → repeat. When nothing is claimable it waits
    `poll_interval` seconds (or until `stop` is set or `notify()` is called) and claims
    again, so a parked task is picked up within one interval of its `wake_at`.

    - **Concurrency**: up to `concurrency` tasks at once (1 by default: the next claim
      happens when the run returns). Each run is an asyncio task with its own engine,
      lease and renewals, fencing token and models; a free slot is filled by the next
      claim, oldest first. A run that raises (its round crashed, its models could not be
      built) is reported and held back as below and touches no other run. Run more
      workers (processes, or `Worker`s with their own `worker_id`) for more still;
      leases and fencing tokens keep them apart, and the shared service limits of the
      contract hold across all of them.
    - **Shutdown** is graceful (`worker.drain`): setting `stop` ends the claiming, and
      every run finishes the round it is in (its model call included) and commits it,
      records where it is (`interrupted`) and gives its lease back; `run()` returns once
      all have. What still runs after `grace` seconds (0 by default: at once) stops at
      its next safe point (a model call in flight abandoned, a tool call finished) and
      hands its task back. `handle_signals=True` sets `stop` on SIGINT and SIGTERM (a
      second one ends the grace); `on_stopping` gets the lines said about the stop.
    - **`start_pace`**: the most seconds a claim waits for the run before it to start
      its first turn (`Slots.start_paced`; 0: no wait).
    - **`pool_size`**: the connections the store's pool may hold (PostgreSQL; 8 when it
      was opened), shared by the runs.
    - **`once`**: return as soon as nothing is claimable; **`max_tasks`**: return after
      taking that many tasks (runs and failures).
    - **Errors never end the loop silently.** An exception from one task (a stored spec
      that no longer parses, a model that cannot be built, a store fault) is logged,
      passed to `on_error`, and the task is held back: the worker keeps a lease on it,
      without running it, for `retry_delay` seconds, doubled at each further failure up
      to `max_retry_delay`, so that no worker retries it in a tight loop and the other
      tasks go first. A `claim` that fails (the database away) is retried after
      `poll_interval`, doubled at each further failure (with `once` it raises instead).
    - **Tools, folders and hosts** may differ between workers: a task whose contract
      names a tool this worker lacks (`TETHER_TOOLS`), is pinned by `runs_on` to host
      tags it lacks (`host_tags`), or whose workspace is not here or is another folder
      (`tether.placement`) is handed back at once, untouched, and passed over for
      `retry_delay` seconds, for a worker that can run it (not a failure).
    - **A dead worker's task** on this machine (its pid is gone, two renewals of its
      lease missed) is taken over when nothing else is claimable, without waiting for
      the lease to expire.

    `models` is a `ModelSet` for every task (owned by the caller) or a function from a
    task's `TaskSpec` to its `ModelSet` (built for the run and closed after it); the
    spec it gets carries what the task's launch record remembers (`runtime.launch`: the
    model the task was started with). `remembered_tools`: a task started with
    `TETHER_TOOLS` runs with those tools when this process sets none. Other
    keyword arguments go to each `Engine` (`clock`, `services`, `inline_wait_max`, ...).
    """

    def __init__(
        self,
        store: Store,
        models: ModelsFor,
        *,
        registry: ToolRegistry | None = None,
        worker_id: str | None = None,
        lease_ttl: float = 60.0,
        poll_interval: float = 2.0,
        once: bool = False,
        max_tasks: int | None = None,
        stop: asyncio.Event | None = None,
        on_result: Callable[[RunResult], None] | None = None,
        on_error: Callable[[str, Exception], None] | None = None,
        retry_delay: float = 30.0,
        max_retry_delay: float = 600.0,
        handle_signals: bool = False,
        remembered_tools: bool = False,
        watch_every: float | None = 60.0,
        watch_policy: WatchPolicy | None = None,
        notifier: Notifier | None = None,
        concurrency: int = 1,
        verify_every: float | None = None,
        host_tags: Sequence[str] = (),
        grace: float = 0.0,
        pool_size: int | None = None,
        on_stopping: Callable[[str], None] | None = None,
        start_pace: float = START_PACE,
        **engine_options: Any,
    ) -> None:
        if concurrency < 1:
            raise errors.UserError("the concurrency must be at least 1")
        if poll_interval < 0:
            raise errors.UserError("the poll interval cannot be negative")
        if max_tasks is not None and max_tasks < 1:
            raise errors.UserError("max_tasks must be at least 1")
        self.store = store
        self.models = models
        self.registry = registry
        self.worker_id = worker_id or process_id()
        self.lease_ttl = lease_ttl
        self.poll_interval = poll_interval
        self.once = once
        self.max_tasks = max_tasks
        self.concurrency = concurrency
        self.start_pace = start_pace
        self.stop = stop or asyncio.Event()
        self.on_result = on_result
        self.on_error = on_error
        self.retry_delay = retry_delay
        self.max_retry_delay = max_retry_delay
        self.held = HeldBack(store, self.worker_id, retry_delay, max_retry_delay)
        self.passed = PassedOver()
        self.host_tags = placement.host_tags(host_tags)
        self.handle_signals = handle_signals
        # A task started with TETHER_TOOLS of its own runs with them here too, unless
        # this worker names its own (see `runtime.launch.registry_for`).
        self.remembered_tools = remembered_tools
        self._launch_registries: dict[tuple[str, ...], ToolRegistry] = {}
        self.engine_options = engine_options
        # Every worker also sweeps for tasks that wait for a person or went silent
        # (`runtime.watch`); None turns it off.
        self.watch_every = watch_every
        self.watch_policy = watch_policy
        self.notifier = notifier
        self._last_sweep: float | None = None
        self._last_schedules: float | None = None
        # Delivered tasks verified again every `verify_every` seconds (None: never).
        self.reverify = Reverify(store, verify_every, f"worker {self.worker_id}")
        self.ran = 0
        self.failed = 0
        self._wake = asyncio.Event()
        self._claim_failures = 0
        self._tool_names: list[str] | None = None
        self.slots = Slots(self.worker_id, self.stop)  # the runs under way
        self.drain = Drain(self.stop, grace, lambda: len(self.slots), on_stopping)
        set_pool_size(store, pool_size)

    def notify(self) -> None:
        """Claim again now instead of at the end of the current wait (a task was queued)."""
        self._wake.set()

    async def run(self) -> WorkerStats:
        """Claim and run tasks until `stop` is set (or `once`/`max_tasks` says so)."""
        self.drain.start(self.handle_signals)
        log.info("worker %s started (concurrency %d)", self.worker_id, self.concurrency)
        try:
            while not self.stop.is_set():
                self.slots.reap()
                if self.max_tasks is not None and self._taken() >= self.max_tasks:
                    if not self.slots:
                        break
                    await self.slots.wait()
                    continue
                await self.watch()
                await self.start_scheduled()
                await self.reverify()
                if len(self.slots) >= self.concurrency:
                    await self.slots.wait()
                    continue
                took = await self._claim_next()
                if took is None:  # the claim failed: wait, longer each time
                    delay = self.poll_interval * 2 ** min(10, self._claim_failures - 1)
                    await self._idle(min(self.max_retry_delay, delay))
                elif took is False:
                    if self.once:
                        if not self.slots:
                            break
                        await self.slots.wait()  # a run that ends may free a task
                    else:
                        await self._idle(self.poll_interval)
                else:
                    lease, previous_owner = took
                    await self.slots.start_paced(
                        functools.partial(self._go, lease, previous_owner),
                        f"task {lease.task_id}",
                        self.start_pace,
                    )
        finally:
            try:
                await self.slots.drain()  # within the grace: see `worker.drain`
            finally:
                await self.drain.close()
            await self.held.release()
        log.info("worker %s stopped: ran %d, failed %d", self.worker_id, self.ran, self.failed)
        return WorkerStats(self.ran, self.failed)

    def _taken(self) -> int:
        """Tasks taken so far for `max_tasks`: runs ended or failed, and runs under way."""
        return self.ran + self.failed + len(self.slots)

    async def watch(self) -> SweepReport | None:
        """Sweep (notices, reminders, escalations, stalled tasks) when one is due; a
        failure is logged, never fatal to the worker."""
        now = time.monotonic()
        if self.watch_every is None or (
            self._last_sweep is not None and now - self._last_sweep < self.watch_every
        ):
            return None
        self._last_sweep = now
        try:
            return await sweep(self.store, notifier=self.notifier, policy=self.watch_policy)
        except errors.TetherError as exc:
            log.warning("watch sweep failed: %s", exc)
            return None

    async def start_scheduled(self) -> list[str]:
        """Start the due occurrences of recurring tasks (`runtime.watch.schedules`), at
        most once per poll interval; the tasks started. A failure is logged, never fatal."""
        now = time.monotonic()
        if self._last_schedules is not None and now - self._last_schedules < self.poll_interval:
            return []
        self._last_schedules = now
        try:
            return await start_due(self.store)
        except errors.TetherError as exc:
            log.warning("starting scheduled tasks failed: %s", exc)
            return []

    async def step(self) -> bool | None:
        """Claim one task and run it: True if a task was taken (run or failed), False if
        nothing was claimable, None if the claim itself failed."""
        took = await self._claim_next()
        if not took:
            return took
        await self._go(*took)
        return True

    async def _claim_next(self) -> tuple[Lease, str | None] | Literal[False] | None:
        """Claim the next task (a dead owner's on this machine when nothing else is
        claimable): its lease and previous owner, False if nothing was claimable, None
        if the claim itself failed (raised with `once`)."""
        try:
            with telemetry.span(telemetry.CLAIM_SPAN):  # its time: a worker's claim latency
                lease = await self.store.claim(
                    self.worker_id, self.lease_ttl, exclude=self.passed.now()
                )
        except errors.TetherError as exc:
            if self.once:
                raise
            self._claim_failures += 1
            log.warning("worker %s: claiming failed: %s", self.worker_id, exc)
            return None
        self._claim_failures = 0
        previous_owner = None
        if lease is None:
            taken = await take_from_dead(
                self.store, self.worker_id, self.lease_ttl, self.passed.now()
            )
            if taken is None:
                return False
            lease, previous_owner = taken
        self.held.claimed(lease.task_id)
        return lease, previous_owner

    async def _go(
        self, lease: Lease, previous_owner: str | None, started: Callable[[], None] | None = None
    ) -> None:
        """A claimed task: its spec, tools and models, then its run (see `_run`), which
        calls `started` once its first turn has started (`Slots.start_paced`)."""
        task_id = lease.task_id
        try:
            task = await self.store.get_task(task_id)
            spec = stored = parse_spec(task.spec, source=f"task {task_id}", stored=True)
            if await self._elsewhere(task_id, spec, task.workspace):
                await self.store.release(task_id, lease.token)
                return
            # The launch record is read before the tool check only when it may name
            # tools here: a task handed back is handed back at once.
            created = await launch.created(self.store, task_id) if self.remembered_tools else None
            registry = self._registry_for(launch.record_in(created or ()))
            lacks = self._lacks_tools(spec, registry)
            if lacks is not None:
                await self._pass_over(task_id, lacks)
                await self.store.release(task_id, lease.token)
                return
            if created is None:
                created = await launch.created(self.store, task_id)
            spec = launch.apply(spec, launch.record_in(created))
            models = self.models if isinstance(self.models, ModelSet) else self.models(spec)
        except Exception as exc:
            await self._failed(task_id, exc, lease)
            return
        try:
            pre = Preread(task, created, stored)
            await self._run(lease, models, previous_owner, registry, pre, started)
        finally:
            if models is not self.models:
                await models.aclose()

    def _registry_for(self, record: dict[str, Any] | None) -> ToolRegistry | None:
        """The tools of a task: this worker's, or (`remembered_tools`) those its launch
        record names when this worker sets no `TETHER_TOOLS`."""
        if not self.remembered_tools:
            return self.registry
        refs = tuple(launch.remembered_tools(record))
        if not refs:
            return self.registry
        if refs not in self._launch_registries:
            found = launch.registry_for(lambda: self.store, record)
            if found is None:
                return self.registry
            self._launch_registries[refs] = found
        return self._launch_registries[refs]

    async def _run(
        self,
        lease: Lease,
        models: ModelSet,
        previous_owner: str | None = None,
        registry: ToolRegistry | None = None,
        preread: Preread | None = None,
        started: Callable[[], None] | None = None,
    ) -> None:
        """Hand the lease to an engine for the run (no release and claim again: another
        worker could take the task in between), and report how it ended."""
        task_id = lease.task_id
        try:
            engine = Engine(
                self.store,
                models,
                registry=registry or self.registry,
                worker_id=self.worker_id,
                lease_ttl=self.lease_ttl,
                stop=self.drain.runs,
                **self.engine_options,
            )
            result = await engine.run_claimed(
                lease, previous_owner, preread=preread, on_started=started
            )
        except (errors.TaskBusy, errors.StaleLease):
            log.debug("task %s: another worker took it first", task_id)
            return
        except errors.StoreUnavailable as exc:
            # The database, not the task: no failure to count; the next claim (backed
            # off while the database stays away) takes the task up again.
            self._claim_failures += 1
            log.warning("task %s: the database is unavailable: %s", task_id, exc)
            return
        except Exception as exc:
            await self._failed(task_id, exc, None)
            return
        self.ran += 1
        self.held.ran(task_id)
        log.info(
            "task %s: %s%s%s",
            result.task_id,
            result.status,
            f" ({result.stop_reason})" if result.stop_reason else "",
            " (interrupted)" if result.interrupted else "",
        )
        if self.on_result is not None:
            self.on_result(result)

    async def _elsewhere(self, task_id: str, spec: TaskSpec, workspace: str | None) -> bool:
        """Must the task run on another machine (`held.placement_refusal`)? Then it is
        passed over as for a missing tool (below), never failed."""
        reason = await placement_refusal(self.store, task_id, spec, workspace, self.host_tags)
        if reason is not None:
            await self._pass_over(task_id, reason)
        return reason is not None

    async def _pass_over(self, task_id: str, reason: str) -> None:
        """Pass the task over for `retry_delay` seconds; a new pass-over is logged and
        recorded for `tether status` (`record_pass_over`)."""
        if self.passed.pass_over(task_id, self.retry_delay):
            log.warning("task %s: left to another worker: %s", task_id, reason)
            await record_pass_over(self.store, task_id, self.worker_id, reason)

    def _lacks_tools(self, spec: TaskSpec, registry: ToolRegistry | None = None) -> str | None:
        """Why the task's contract names a tool (or needs a secret) this worker lacks, or
        None (`held.lacks_tools`); `registry`: the task's own tools, if not this worker's."""
        if registry is not None and registry is not self.registry:
            return lacks_tools(spec, lambda: [*registry.names(), READ_ARTIFACT])
        return lacks_tools(spec, self._own_tool_names)

    def _own_tool_names(self) -> list[str]:
        if self._tool_names is None:
            own = self.registry or default_registry(lambda: self.store)
            self._tool_names = [*own.names(), READ_ARTIFACT]
        return self._tool_names

    async def _failed(self, task_id: str, exc: Exception, lease: Lease | None) -> None:
        """Report a task that raised and hold it back for a while (see the class)."""
        self.failed += 1
        delay = self.held.failed(task_id)
        if isinstance(exc, errors.TetherError):
            log.warning("task %s failed to run: %s (retry in %.0f s)", task_id, exc, delay)
        else:
            log.exception("task %s failed to run (retry in %.0f s)", task_id, delay)
        await self.held.hold(task_id, lease, delay)
        if self.on_error is not None:
            self.on_error(task_id, exc)

    async def _idle(self, seconds: float) -> None:
        """Wait `seconds`, or less if `stop` is set or `notify()` is called."""
        self._wake.clear()
        waits = [
            asyncio.ensure_future(self.stop.wait()),
            asyncio.ensure_future(self._wake.wait()),
        ]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
