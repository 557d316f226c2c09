"""The engine: claims a task and drives it, turn by turn and round by round.

A round has six phases (docs/architecture.md): read state, assemble context, decide
(one model call, journaled and committed before any tool runs), act (each call checked
against the allowlist and journaled as an op), verify, and write back (one commit,
guarded by the fencing token). Then the judge runs and its audited verdict is committed.

Crash points are marked with fail points. On restart the engine recovers in order (see
`recovery`) and continues in a new turn; a round whose model response was committed is
finished from the recorded response, so a crash never pays twice for the same decision.

The engine claims and gives back leases; the run of one claimed task is a `TaskRun`
(`runtime/run/task_run.py`, re-exported here with `RunResult` and `Snapshot`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from tether import errors, lifecycle, telemetry
from tether.clock import Clock, SystemClock
from tether.models import pricing
from tether.runtime import launch
from tether.runtime.ops.ports import INLINE_WAIT_MAX
from tether.runtime.run.journal import Snapshot as Snapshot  # re-exported: public
from tether.runtime.run.ports import ModelSet as ModelSet  # re-exported: public
from tether.runtime.run.ports import RunConfig
from tether.runtime.run.task_run import Preread
from tether.runtime.run.task_run import RunResult as RunResult  # re-exported: public
from tether.runtime.run.task_run import TaskRun as TaskRun
from tether.runtime.run.task_run import default_guard as default_guard
from tether.runtime.takeover import owner_is_dead as owner_is_dead  # re-exported
from tether.runtime.takeover import process_id as process_id  # re-exported
from tether.store.base import Lease, Store, StoredEvent
from tether.tools.allowlist import check_tools as check_tools
from tether.tools.breaker import Guard
from tether.tools.builtin.files import READ_ARTIFACT, default_registry, read_artifact_tool
from tether.tools.builtin.ledger import LEDGER_ITEMS, ledger_items_tool
from tether.tools.registry import ToolRegistry

log = logging.getLogger("tether.engine")


def inline_wait_max_from_env() -> float:
    """`TETHER_INLINE_WAIT_MAX` (seconds, 0 to a day), else `INLINE_WAIT_MAX`; a value
    that is not such a number is a `UserError`, not a traceback."""
    raw = os.environ.get("TETHER_INLINE_WAIT_MAX", "").strip()
    if not raw:
        return INLINE_WAIT_MAX
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= 86400:  # also refuses NaN
        raise errors.UserError(
            f"TETHER_INLINE_WAIT_MAX={raw[:40]!r} is not a number of seconds from 0 to 86400"
        )
    return seconds


class Engine:
    """Claims tasks and runs them. One engine instance runs one task at a time."""

    def __init__(
        self,
        store: Store,
        models: ModelSet,
        *,
        registry: ToolRegistry | None = None,
        clock: Clock | None = None,
        worker_id: str | None = None,
        lease_ttl: float = 60.0,
        on_progress: Callable[[Snapshot], None] | None = None,
        stop: asyncio.Event | None = None,
        max_rounds_this_run: int | None = None,
        services: Mapping[str, Any] | None = None,
        epoch_every_turn: bool = False,
        guard: Guard | None = None,
        inline_wait_max: float | None = None,
        status_probe: bool = True,
    ) -> None:
        self.store = store
        self.models = models
        self.registry = registry or default_registry(lambda: self.store)
        if self.registry.get(READ_ARTIFACT) is None:  # the model reads long outputs with it
            self.registry.add(read_artifact_tool(lambda: self.store))
        if self.registry.get(LEDGER_ITEMS) is None:  # and pages through a long ledger
            self.registry.add(ledger_items_tool(lambda: self.store))
        self.clock: Clock = clock or SystemClock()
        #: The settings of every run (`previous_owner` is set per claim). Backoffs up to
        #: `inline_wait_max` are waited out in the worker; longer ones park the task as
        #: `waiting` until the stored time and release the lease.
        self.config = RunConfig(
            worker_id=worker_id or process_id(),
            lease_ttl=lease_ttl,
            inline_wait_max=(
                inline_wait_max if inline_wait_max is not None else inline_wait_max_from_env()
            ),
            max_rounds_this_run=max_rounds_this_run,
            epoch_every_turn=epoch_every_turn,
            services=dict(services or {}),
        )
        self.on_progress = on_progress
        self.stop = stop or asyncio.Event()
        # Shared breakers and concurrency limits per service (None: from the contract).
        self.guard = guard
        # Ask a silent round's model how it is doing (`runtime.probe`); off for replays.
        self.status_probe = status_probe

    @property
    def worker_id(self) -> str:
        """The owner of this engine's leases."""
        return self.config.worker_id

    @property
    def lease_ttl(self) -> float:
        """Seconds a lease of this engine lasts unless renewed."""
        return self.config.lease_ttl

    # ---------------------------------------------------------------- entry point

    async def run(
        self, task_id: str, *, force: bool = False, reconnect_for: float = 0.0
    ) -> RunResult:
        """Claim `task_id` and drive it until it is terminal, waiting or interrupted.

        A lease held by a dead process on this machine is taken over; `force` takes over
        any lease (for a worker known to be gone). Fencing keeps that safe.

        `reconnect_for`: for how many seconds a lost database (`StoreUnavailable`) is
        waited out. A lost connection may cut a commit off after it was sent, so whether
        it happened is unknown and it is never sent again: the engine waits, with
        backoff, until the store answers, then claims the task again and goes on from
        what the store holds, as after a crash (the recovery of the new turn settles the
        commit and any op it left in doubt). After that long without an answer, or once
        `stop` is set, the error is raised. 0 raises at once.
        """
        reconnecting = False
        while True:
            try:
                return await self._run_once(task_id, force, reconnecting, reconnect_for > 0)
            except errors.StoreUnavailable as exc:
                # A held lock (`StoreBusy`) is a peer's doing, not an outage: said at once.
                if reconnect_for <= 0 or isinstance(exc, errors.StoreBusy):
                    raise
                await self._await_store(task_id, exc, reconnect_for)
                reconnecting = True

    async def _run_once(
        self, task_id: str, force: bool, reconnecting: bool, reconnecting_allowed: bool
    ) -> RunResult:
        before = await self.store.get_task(task_id)
        created = None  # the task's `task.created` event, when read here
        if before.workspace is not None and not lifecycle.is_terminal(before.status):
            # A folder renamed or not mounted is refused before the claim (a worker
            # passes such a task over); the event read for it is the run's.
            created = await launch.workspace_here(
                self.store, task_id, before.workspace, "nothing was run"
            )
        # After an outage this engine's own lease may still stand (its release, or a
        # claim whose answer was lost, could not be settled): it is ours to take again.
        ours = reconnecting and before.lease_owner == self.worker_id
        lease = await self.store.claim(self.worker_id, self.lease_ttl, task_id=task_id)
        if lease is None:
            task = await self.store.get_task(task_id)
            if lifecycle.is_terminal(task.status):
                return RunResult(task_id, task.status, task.stop_reason, task.waiting, 0)
            if force or ours or owner_is_dead(task.lease_owner):
                # Only the lease seen here: a worker that took the task since keeps it.
                lease = await self.store.claim(
                    self.worker_id,
                    self.lease_ttl,
                    task_id=task_id,
                    force=True,
                    from_token=task.fencing_token,
                )
            if lease is None:
                raise errors.TaskBusy(
                    task_id, task.lease_owner, task.lease_expiry, self.clock.now()
                )
        # With a reconnect to come, a lease the outage cut off is kept, not given back
        # (that would wait out the store's own retries first): it is taken up again above.
        return await self._drive(
            lease,
            None if ours else before.lease_owner,
            keep_on_outage=reconnecting_allowed,
            created=created,
        )

    async def _await_store(
        self, task_id: str, lost: errors.StoreUnavailable, seconds: float
    ) -> None:
        """Wait until the store answers again (for `run`'s `reconnect_for`); raise a
        `StoreUnavailable` saying so after `seconds`, or at once when `stop` is set."""
        deadline = time.monotonic() + seconds
        delay = 0.1
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or self.stop.is_set():
                waited = "" if self.stop.is_set() else f" and did not come back in {seconds:g} s"
                raise errors.StoreUnavailable(
                    f"{lost.message} — the database went away{waited}; the task stays as "
                    f"the store last recorded it: `tether resume {task_id}` goes on from there"
                ) from lost
            log.warning("task %s: %s; reconnecting (for up to %.0f s)", task_id, lost, left)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), min(delay, left))
            delay = min(2.0, delay * 2)
            if self.stop.is_set():
                continue
            try:
                # A read is safe to send again; its own retries are cut at the deadline.
                await asyncio.wait_for(
                    self.store.get_task(task_id), max(0.1, deadline - time.monotonic())
                )
                return
            except errors.StoreUnavailable as exc:
                lost = exc
            except TimeoutError:
                pass

    async def run_next(self) -> RunResult | None:
        """Claim any claimable task and run it; None when there is nothing to do."""
        lease = await self.store.claim(self.worker_id, self.lease_ttl)
        if lease is None:
            return None
        return await self._drive(lease, None)

    async def run_claimed(
        self,
        lease: Lease,
        previous_owner: str | None = None,
        *,
        preread: Preread | None = None,
        on_started: Callable[[], None] | None = None,
    ) -> RunResult:
        """Run a task whose lease the caller claimed (a worker's loop); the lease is
        given back at the end. `preread`: what the caller read of the task under this
        lease, not read again (`TaskRun`); `on_started`: called once the run's first
        turn has started (its recovery and turn start stored), if it gets that far."""
        return await self._drive(lease, previous_owner, preread=preread, on_started=on_started)

    async def _drive(
        self,
        lease: Lease,
        previous_owner: str | None,
        *,
        keep_on_outage: bool = False,
        preread: Preread | None = None,
        on_started: Callable[[], None] | None = None,
        created: Sequence[StoredEvent] | None = None,
    ) -> RunResult:
        """Drive a claimed task with a heartbeat; give the lease back at the end (unless
        `keep_on_outage` and the store went away: see `run`). `created`: the task's
        `task.created` event if read already."""
        outage = False
        config = replace(self.config, previous_owner=previous_owner)
        run = TaskRun(
            self.store,
            lease.task_id,
            lease.token,
            models=self.models,
            registry=self.registry,
            config=config,
            clock=self.clock,
            stop=self.stop,
            guard=self.guard,
            on_progress=self.on_progress,
            status_probe=self.status_probe,
            preread=preread,
            on_started=on_started,
            created=created,
        )
        # The heartbeat cancels this task when a round outlives `limits.round_timeout`.
        run.beat.driver = asyncio.current_task()
        # The run's prices, read with the contract, reach the heartbeat's probes too.
        pricing.open_scope()
        beat = asyncio.create_task(run.beat.run(run.prober))
        try:
            try:
                with telemetry.span(
                    telemetry.AGENT_SPAN, telemetry.agent_attributes(lease.task_id)
                ):
                    return await run.drive()
            except asyncio.CancelledError:
                me = asyncio.current_task()
                # Only the heartbeat's own cancellation is turned into a result; any
                # other (Ctrl-C, a caller's timeout) goes on up.
                if run.beat.overdue is None or me is None or me.uncancel() > 0:
                    raise
                if run.prober.ask_human and await run.ask_human(
                    run.prober.escalation(run.beat.overdue)
                ):
                    return run.result()
                return await run.timed_out(run.beat.overdue)
        except errors.StoreUnavailable:
            outage = keep_on_outage
            raise
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
            await run.prober.close()
            if not outage:
                with contextlib.suppress(errors.StaleLease, errors.TaskNotFound):
                    await self.store.release(lease.task_id, lease.token)
