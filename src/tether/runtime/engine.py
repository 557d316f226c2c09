"""The engine: claims a task and drives it, turn by turn and round by round.

A round has six phases (docs/architecture.md): read state, assemble context, decide
(one model call, journaled and committed before any tool runs), act (each call checked
against the allowlist and journaled as an op), verify, and write back (one commit,
guarded by the fencing token). Then the judge runs and its audited verdict is committed.

Crash points are marked with fail points. On restart the engine recovers in order (see
`recovery`) and continues in a new turn; a round whose model response was committed is
finished from the recorded response, so a crash never pays twice for the same decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tether import errors, failpoints, ledger_view, lifecycle, telemetry
from tether import events as ev
from tether import ledger as L
from tether.clock import Clock, SystemClock
from tether.models import pricing
from tether.models.base import Model, ModelRequest, ModelResponse
from tether.redact import Redactor
from tether.runtime import hints
from tether.runtime.ops.ports import ToolEnv
from tether.runtime.ops.runner import INLINE_WAIT_MAX
from tether.runtime.recovery import turn as recovery
from tether.runtime.round import history
from tether.runtime.round import phases as rounds
from tether.runtime.round.context import (
    Context,
    Entry,
)
from tether.runtime.run import outcome as out
from tether.runtime.run import probe
from tether.runtime.run.outcome import Stop
from tether.runtime.run.ports import ModelSet as ModelSet  # re-exported: public
from tether.runtime.run.ports import PendingRound
from tether.runtime.run.state import RunState
from tether.runtime.takeover import owner_is_dead, process_id
from tether.spec import OpRule, TaskSpec, parse_spec, source_of
from tether.store.base import (
    UNSET,
    ApprovalRecord,
    ArtifactRecord,
    Lease,
    LedgerWrite,
    OpRecord,
    Store,
    TaskPatch,
    TaskRecord,
    blob_hash,
)
from tether.tools import files
from tether.tools.breaker import Guard
from tether.tools.builtin.files import (
    BUILTIN_READ_TOOLS,
    READ_ARTIFACT,
    default_registry,
    read_artifact_tool,
)
from tether.tools.builtin.ledger import LEDGER_ITEMS, ledger_items_tool
from tether.tools.registry import Tool, ToolRegistry, ensure_lease

log = logging.getLogger("tether.engine")


@dataclass(frozen=True)
class Snapshot:
    """What a progress display shows after each step."""

    task_id: str
    status: str
    round: int
    focus: str | None
    progress: L.Progress
    tokens: int
    #: Cached and total input tokens of the actor's calls (the cache hit rate).
    cached_tokens: int
    input_tokens: int
    cost_usd: float
    message: str

    @property
    def cache_hit_rate(self) -> float:
        """Cached share of input tokens so far."""
        return self.cached_tokens / self.input_tokens if self.input_tokens else 0.0


@dataclass(frozen=True)
class RunResult:
    """How a run ended."""

    task_id: str
    status: str
    stop_reason: str | None
    waiting: Mapping[str, Any] | None
    rounds: int
    interrupted: bool = False


def default_guard(store: Store, spec: TaskSpec, clock: Clock) -> Guard:
    """Shared breakers and concurrency limits for the services of a task's tools,
    configured from the contract (`services`, `limits`)."""
    from tether.tools.breaker import ServiceConfig, ServiceGuard

    configs = {
        name: ServiceConfig.from_spec(policy, spec.limits) for name, policy in spec.services.items()
    }
    return ServiceGuard(
        store, configs, default=ServiceConfig.from_spec(None, spec.limits), clock=clock
    )


#: Events that carry text from the outside world (errors, results, model names).
_REDACTED_EVENTS = frozenset(
    {
        "model.called",
        "model.failed",
        "op.result",
        "op.retry_scheduled",
        "round.committed",
        "audit.warning",
        "approval.requested",
        "probe.answered",
        "task.status",
    }
)


def _redacted(event: ev.Event, redactor: Redactor) -> ev.Event:
    """The event with secret values and URL userinfo masked (see `tether.redact`). Its
    JSON text (pydantic's, fast) is scanned first: most events hold nothing to mask."""
    if event.TYPE not in _REDACTED_EVENTS or redactor.clean(event.model_dump_json()):
        return event
    data = event.data()
    masked = redactor.data(data)
    return event if masked == data else type(event).model_validate(masked)


def _redacted_op(op: OpRecord, redactor: Redactor) -> OpRecord:
    if op.error is None and op.result is None:
        return op
    error, result = redactor.data(op.error), redactor.data(op.result)
    if (error, result) == (op.error, op.result):
        return op
    return replace(op, error=error, result=result)


def check_tools(spec: TaskSpec, known: Sequence[str]) -> None:
    """Refuse a contract that names a tool nobody registered (a typo would otherwise
    leave the model without the tool it needs, silently)."""
    have = set(known)
    missing = [n for n in spec.tool_names() if n not in have]
    missing += [
        f"{t} (items.{n}.evidence_from)"
        for n, item in enumerate(spec.items)
        for t in item.evidence_from.tools
        if t not in have
    ]
    if missing:
        raise errors.SpecError(
            f"the contract names tools that are not registered: {', '.join(missing)} "
            f"(known: {', '.join(sorted(have)) or 'none'}); register them "
            "(TETHER_TOOLS, or the registry in Python) or fix the tools list",
            source=source_of(spec),
        )
    for n, item in enumerate(spec.items):
        rule = item.done_when
        if isinstance(rule, OpRule) and rule.tool not in have:
            raise errors.SpecError(
                f"items.{n}.done_when: the tool {rule.tool!r} is not registered, so item "
                f"{item.id!r} could never be done",
                source=source_of(spec),
            )


def _cost(configured: str, response: ModelResponse) -> float:
    """The call's cost by the current task's price table (`pricing.set_current` in
    `TaskRun.load`): the answering model's price, else the configured model's."""
    from tether.models import pricing

    return float(
        pricing.current_table().cost_usd(response.model, response.usage, configured=configured)
    )


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
        self.worker_id = worker_id or process_id()
        self.lease_ttl = lease_ttl
        self.on_progress = on_progress
        self.stop = stop or asyncio.Event()
        self.max_rounds_this_run = max_rounds_this_run
        self.services = dict(services or {})
        # The naive cache policy (re-render the system tail at every turn), for benchmarks.
        self.epoch_every_turn = epoch_every_turn
        # Shared breakers and concurrency limits per service (None: from the contract).
        self.guard = guard
        # Ask a silent round's model how it is doing (`runtime.probe`); off for replays.
        self.status_probe = status_probe
        # Backoffs up to this long are waited out in the worker; longer ones park the
        # task as `waiting` until the stored time and release the lease.
        self.inline_wait_max = (
            inline_wait_max if inline_wait_max is not None else inline_wait_max_from_env()
        )

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
            lease, None if ours else before.lease_owner, keep_on_outage=reconnecting_allowed
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

    async def run_claimed(self, lease: Lease, previous_owner: str | None = None) -> RunResult:
        """Run a task whose lease the caller claimed (a worker's loop); the lease is
        given back at the end."""
        return await self._drive(lease, previous_owner)

    async def _drive(
        self, lease: Lease, previous_owner: str | None, *, keep_on_outage: bool = False
    ) -> RunResult:
        """Drive a claimed task with a heartbeat; give the lease back at the end (unless
        `keep_on_outage` and the store went away: see `run`)."""
        outage = False
        run = TaskRun(self, lease.task_id, lease.token, previous_owner=previous_owner)
        # The heartbeat cancels this task when a round outlives `limits.round_timeout`.
        run.driver = asyncio.current_task()
        # The run's prices, read with the contract, reach the heartbeat's probes too.
        pricing.open_scope()
        beat = asyncio.create_task(run.heartbeat())
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
                if run.overdue is None or me is None or me.uncancel() > 0:
                    raise
                if run.prober.ask_human and await run.ask_human(run.prober.escalation(run.overdue)):
                    return run.result()
                return await run.timed_out(run.overdue)
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


class TaskRun:
    """One claimed task while an engine drives it: the run's state, the commit port
    (`ports.Journal`), and the round's phases — decide, act (through `ops`), write
    back, judge (through `verdicts`) — each a method taking what it uses. The parts of
    a round see it only through the protocols of `ports`."""

    def __init__(
        self, engine: Engine, task_id: str, token: int, previous_owner: str | None = None
    ) -> None:
        self.e = engine
        self.previous_owner = previous_owner
        self.store = engine.store
        # The status probe of a silent round; its clock is the run's, with the round's
        # waits (sleeps on it) seen (see `runtime.probe`).
        self.prober = probe.Prober(self, engine.clock, enabled=engine.status_probe)
        # What the parts of a round need of the engine (see `ports`).
        self.clock: Clock = self.prober.clock
        self.models = engine.models
        self.services: Mapping[str, Any] = engine.services
        self.inline_wait_max = engine.inline_wait_max
        self.worker_id = engine.worker_id
        self.lease_ttl = engine.lease_ttl
        self.epoch_every_turn = engine.epoch_every_turn
        self.max_rounds_this_run = engine.max_rounds_this_run
        self.task_id = task_id
        self.token = token
        self.rounds_this_run = 0
        self.started = time.monotonic()
        self.wall_mark = time.monotonic()
        self.lease_lost = False
        # The task driving this run, and when its current round started (monotonic):
        # the heartbeat cancels a round that outlives `limits.round_timeout`.
        self.driver: asyncio.Task[Any] | None = None
        self.round_started: float | None = None
        self.overdue: str | None = None
        self.overdue_code = "round_timeout"
        # The environment's secrets, read once per run rather than once per document.
        self.redactor = Redactor()
        # Loaded in `load`.
        self.task: TaskRecord
        self.spec: TaskSpec
        self.ledger: L.Ledger
        self.state = RunState()
        self.ctx: Context
        self.workspace: Path | None = None
        self.user_words: list[str] = []
        self.pending_blobs: dict[str, bytes] = {}
        self.guard: Guard | None = None
        self.preexisting: dict[str, str] = {}
        self.tools: list[Tool] = []
        self.status = "queued"
        # The round's decision, staged until the round's first commit (see `decide`).
        self.staged_events: list[ev.Event] = []
        self.staged_ledger: L.Ledger | None = None
        self.commit_flags: tuple[bool, int | None] | None = None
        # (id of the tool schema tuple, its blob): the schemas change only per turn.
        self._tools_blob: tuple[int, str] | None = None
        # (the epoch's parts, its blob): most rounds of a turn share one epoch.
        self._epoch: tuple[tuple[Any, ...], str] | None = None

    # ------------------------------------------------------------ plumbing

    async def heartbeat(self) -> None:
        """Renew the lease while the run goes on; stop when it is lost, or when a round
        runs past `limits.round_timeout` (then the round is cancelled: see `timed_out`)."""
        interval = max(0.05, self.e.lease_ttl / 3)
        while True:
            await asyncio.sleep(interval)
            # (Once: a round a failed status probe cancelled is not cancelled again.)
            overdue = self.round_overdue() if self.overdue is None else None
            if overdue is not None:
                self.overdue = overdue
                log.error("task %s: %s; cancelling it", self.task_id, overdue)
                if self.driver is not None:
                    self.driver.cancel()
                return
            self.prober.tick()
            try:
                await self.store.renew(self.task_id, self.token, self.e.lease_ttl)
            except errors.StaleLease:
                self.lease_lost = True
                return
            except errors.TetherError as exc:  # a passing store fault: try again next beat
                log.warning("lease renewal failed: %s", exc)

    def round_overdue(self) -> str | None:
        """Why the round under way must be cancelled (it outlived `limits.round_timeout`),
        or None."""
        limit = self.spec.limits.round_timeout if hasattr(self, "spec") else None
        if limit is None or self.round_started is None:
            return None
        spent = time.monotonic() - self.round_started
        if spent <= limit:
            return None
        return (
            f"round {self.state.rounds + 1} ran {spent:.0f}s, "
            f"past limits.round_timeout ({limit:g}s)"
        )

    async def timed_out(self, why: str) -> RunResult:
        """After a round was cancelled for running too long: treated as a crash of this
        worker. Nothing of the round's memory is committed (a store write may still be
        under way in a thread); the warning goes in as an event of its own, the task
        stays `running`, and the next claim recovers it like any crash — op intents
        settled by reconcile or a human, the crash counted towards
        `limits.max_crash_restarts`, after which the task fails."""
        warning = ev.AuditWarning(
            code=self.overdue_code, message=why, details={"round": self.state.rounds + 1}
        )
        with contextlib.suppress(errors.TetherError):
            await self.store.commit(self.task_id, self.token, [warning])
        task = await self.store.get_task(self.task_id)
        return RunResult(
            self.task_id, task.status, None, task.waiting, self.rounds_this_run, interrupted=True
        )

    def cancel_round(self, why: str, code: str) -> None:
        """Cancel the round in flight (the status probe's `fail`): `timed_out` or
        `ask_human` records it, with `code`."""
        self.overdue = why
        self.overdue_code = code
        if self.driver is not None:
            self.driver.cancel()

    async def ask_human(self, ask: probe.AskHuman) -> bool:
        """Apply a failed probe's `AskHuman`: the task waits for a person. False if the
        wait cannot be stored (the task was cancelled or taken over meanwhile, the store
        is away): then the round ends like one past its `round_timeout`."""
        try:
            task = await self.store.get_task(self.task_id)
            change, patch = lifecycle.transition(
                task, "waiting", ask.reason, waiting=self.redactor.data(ask.waiting)
            )
            await self.store.commit(
                self.task_id, self.token, [ask.warning, change], task=TaskPatch(**patch)
            )
            self.task = await self.store.get_task(self.task_id)
        except errors.TetherError as exc:
            log.warning(
                "task %s: could not ask a person after the status probe: %s", self.task_id, exc
            )
            return False
        self.status = self.task.status
        return True

    def _tick_wall(self, milestone: str | None) -> None:
        now = time.monotonic()
        spent = now - self.wall_mark
        self.state.wall_seconds += spent
        self.state.count_for_milestone(milestone, wall_seconds=spent)
        self.wall_mark = now

    async def commit(
        self,
        events: Sequence[ev.Event],
        *,
        status: str | None = None,
        stop_reason: str | None = None,
        ledger: L.Ledger | None = None,
        ops: Sequence[OpRecord] = (),
        artifacts: Sequence[ArtifactRecord] = (),
        approvals: Sequence[ApprovalRecord] = (),
        waiting: Any = UNSET,
        wake_at: Any = UNSET,
    ) -> int:
        """Commit events and projections (usage always) under our fencing token.

        A staged decision (see `decide`) goes first, in the same transaction."""
        if self.staged_events:
            events = [*self.staged_events, *events]
            self.staged_events = []
        if self.staged_ledger is not None:
            if ledger is None:
                ledger = self.staged_ledger
            self.staged_ledger = None
        milestone = self.ledger.current_milestone()
        self._tick_wall(milestone)
        write = None
        if ledger is not None and ledger.version != self.ledger.version:
            write = LedgerWrite.of(ledger, self.ledger.version)
        patch = TaskPatch(
            status=status,
            stop_reason=stop_reason,
            usage=self.state.to_dict(),
            waiting=self.redactor.data(waiting) if isinstance(waiting, dict) else waiting,
            wake_at=wake_at,
            current_milestone=ledger.current_milestone() if ledger is not None else milestone,
        )
        res = await self.store.commit(
            self.task_id,
            self.token,
            [_redacted(e, self.redactor) for e in events],
            task=patch,
            ledger=write,
            ops=[_redacted_op(o, self.redactor) for o in ops],
            artifacts=artifacts,
            approvals=approvals,
            blobs=list(self.pending_blobs.values()),
        )
        self.pending_blobs.clear()
        self.prober.heard()
        # What the task row said as this commit found it: the guards read it instead of
        # the task row itself (a cancel request is seen at the next step after a commit).
        self.commit_flags = (res.cancel_requested, res.version)
        if ledger is not None:
            self.ledger = ledger
        if status is not None:
            self.status = status
        self.state.last_seq = res.last_seq
        return res.last_seq

    async def commit_aside(self, events: Sequence[ev.Event], blobs: Sequence[bytes]) -> None:
        """Commit events (redacted) and the run's usage next to the round in flight,
        leaving its staged decision and blobs for its own commit (the status probe).
        The usage may then count a staged call of the round: over, never under."""
        await self.store.commit(
            self.task_id,
            self.token,
            [_redacted(e, self.redactor) for e in events],
            task=TaskPatch(usage=self.state.to_dict()),
            blobs=blobs,
        )

    def stop_requested(self) -> bool:
        """True once the worker was asked to stop between steps."""
        return self.e.stop.is_set()

    async def set_status(
        self,
        dst: str,
        stop_reason: str | None = None,
        reason: str = "",
        *,
        extra: Sequence[ev.Event] = (),
        waiting: Any = UNSET,
        wake_at: Any = UNSET,
        ops: Sequence[OpRecord] = (),
        approvals: Sequence[ApprovalRecord] = (),
    ) -> None:
        """Move the task (with its event) in one commit."""
        if waiting is UNSET:
            waiting = lifecycle.KEEP if dst == "waiting" else None
        change, patch = lifecycle.transition(
            self,
            dst,
            reason,
            stop_reason=stop_reason,
            waiting=waiting,
            wake_at=lifecycle.KEEP if wake_at is UNSET else wake_at,
        )
        await self.commit([*extra, change], **patch, ops=ops, approvals=approvals)

    def snapshot(self, message: str) -> None:
        """Tell the progress display."""
        if self.e.on_progress is None:
            return
        st = self.state
        act = st.by_purpose.get("act")
        self.e.on_progress(
            Snapshot(
                task_id=self.task_id,
                status=self.status,
                round=st.rounds,
                focus=self.ledger.next_item(),
                progress=self.ledger.progress(),
                tokens=st.tokens,
                # The cache hit rate that matters is the actor's: judge and compaction
                # calls have prompts of their own and are not meant to share a prefix.
                cached_tokens=act.cached if act else 0,
                input_tokens=act.input if act else 0,
                cost_usd=st.cost_usd,
                message=message,
            )
        )

    @property
    def tool_env(self) -> ToolEnv:
        """What every tool call of this run is given (`ports.OpsHost`)."""
        return ToolEnv(
            token=self.token,
            workspace=self.workspace,
            services=self.services,
            guard=self.guard,
            clock=self.clock,
            inline_wait_max=self.inline_wait_max,
            owner_check=functools.partial(ensure_lease, self.store, self.task_id, self.token),
            # A SQLite store kept inside the workspace: no file tool may reach it.
            private_files=files.database_files(getattr(self.store, "path", None)),
        )

    def stage_blob(self, data: bytes) -> str:
        """A blob that goes into the store with the next commit (the one whose events
        reference it): one transaction instead of one per blob."""
        ref = blob_hash(data)
        self.pending_blobs[ref] = data
        return ref

    def tools_blob(self, request: ModelRequest) -> str:
        """The blob of the request's tool schemas, staged once per set of schemas."""
        key = id(request.tools)
        if self._tools_blob is None or self._tools_blob[0] != key:
            data = json.dumps(
                [t.to_dict() for t in request.tools], ensure_ascii=False, sort_keys=True
            ).encode("utf-8")
            ref = blob_hash(data)
            if self.state.tools_blob != ref:
                self.stage_blob(data)
                self.state.tools_blob = ref
            self._tools_blob = (key, ref)
        return self._tools_blob[1]

    def stage_epoch(self, obj: Any) -> str:
        """Stage the epoch document unless it is the one staged last (the same epoch is
        recognised without serializing it again)."""
        key = tuple(sorted(obj.items()))
        if self._epoch is not None and self._epoch[0] == key:
            return self._epoch[1]
        data = json.dumps(obj, ensure_ascii=False, sort_keys=True).encode("utf-8")
        ref = blob_hash(data)
        if self.state.epoch_blob != ref:
            self.stage_blob(data)
            self.state.epoch_blob = ref
        self._epoch = (key, ref)
        return ref

    def stage_json(self, obj: Any) -> str:
        """Stage a JSON document as a blob (stored by the next commit)."""
        return self.stage_blob(json.dumps(obj, ensure_ascii=False, sort_keys=True).encode("utf-8"))

    async def get_json(self, ref: str) -> Any:
        """Read a JSON blob (plain or packed)."""
        return history.unpack(await self.store.get_blob(ref))

    def stage_packed(self, obj: Any) -> str:
        """Stage a JSON document, compressed when large (see `history.pack`)."""
        return self.stage_blob(history.pack(obj))

    # ------------------------------------------------------------ the drive

    async def drive(self) -> RunResult:
        """Load the task, open its MCP sources if any, and run it."""
        await self.load()
        if self.spec.mcp_servers and not lifecycle.is_terminal(self.status):
            from tether.tools.mcp import McpSources

            # MCP servers live as long as this run; their tools join the registry.
            async with McpSources(self.spec.mcp_servers) as sources:
                self.add_tools(sources.tools())
                return await self.drive_loaded()
        return await self.drive_loaded()

    def add_tools(self, tools: Sequence[Tool]) -> None:
        """Tools from a source opened for this run (MCP), filtered by the allowlist.

        Nothing shadows anything: a source's tool named like a built-in or registered
        tool, or like another source's, is a `SpecError` naming both. A contract may name
        an MCP tool `<prefix>.<tool>` as well as `<prefix>__<tool>` (the name the model
        sees); the run's spec is read with the former spelling normalised.
        """

        def source_of(tool: Tool) -> str:
            server = getattr(tool, "server", "")
            return f"MCP server {server!r}" if server else "a tool source"

        registered = set(self.e.registry.names())
        by_name: dict[str, Tool] = {}
        for t in tools:
            if t.name in registered:
                kind = "built-in" if t.name in BUILTIN_READ_TOOLS else "registered"
                raise errors.SpecError(
                    f"the tool {t.name!r} of {source_of(t)} clashes with the {kind} tool "
                    f"{t.name!r}; give the server a prefix (do not set `prefix: ''`), or "
                    "leave the tool out with the server's `tools:`",
                    source=f"task {self.task_id}",
                )
            if t.name in by_name:
                raise errors.SpecError(
                    f"the tool {t.name!r} of {source_of(t)} clashes with the tool {t.name!r} "
                    f"of {source_of(by_name[t.name])}; give the servers different prefixes",
                    source=f"task {self.task_id}",
                )
            by_name[t.name] = t
        names = {
            f"{t.name[: -len(remote) - 2]}.{remote}": t.name
            for t in by_name.values()
            if (remote := str(getattr(t, "remote_name", "") or ""))
            and t.name.endswith(f"__{remote}")
            and len(t.name) > len(remote) + 2
        }
        if names:
            # `<prefix>.<tool>` in the contract means `<prefix>__<tool>`.
            def rename(name: str) -> str:
                return names.get(name, name)

            items = []
            for item in self.spec.items:
                update: dict[str, Any] = {}
                if any(n in names for n in item.evidence_from.tools):
                    update["evidence_from"] = item.evidence_from.model_copy(
                        update={"tools": [rename(n) for n in item.evidence_from.tools]}
                    )
                rule = item.done_when
                if isinstance(rule, OpRule) and rule.tool in names:
                    update["done_when"] = rule.model_copy(update={"tool": rename(rule.tool)})
                items.append(item.model_copy(update=update) if update else item)
            allow = [
                rename(t) if isinstance(t, str) else t.model_copy(update={"name": rename(t.name)})
                for t in self.spec.tools
            ]
            self.spec = self.spec.model_copy(update={"tools": allow, "items": items})
        # Without an allowlist only the built-in read tools run: none of a source's.
        extra = [by_name[n] for n in dict.fromkeys(self.spec.tool_names()) if n in by_name]
        check_tools(self.spec, [*registered, *by_name])
        self.tools.extend(extra)
        self.known_tools.update(by_name)

    async def drive_loaded(self) -> RunResult:
        """Start a turn and run rounds until the task stops, waits or is interrupted."""
        try:
            if lifecycle.is_terminal(self.status):
                return self.result()
            outcome = await recovery.start_turn(self)
            self.round_started = time.monotonic()
            if outcome is None:
                outcome = await rounds.finish_interrupted(self)
            while outcome is None:
                self.round_started = time.monotonic()
                outcome = await rounds.run_round(self)
            self.round_started = None
            # The one place a round's end becomes a status change.
            await out.apply(self, outcome)
        except errors.StaleLease:
            # Another worker owns the task now; nothing we tried was stored.
            log.warning("task %s: lease lost, stopping", self.task_id)
            self.task = await self.store.get_task(self.task_id)
            return RunResult(
                self.task_id,
                self.task.status,
                self.task.stop_reason,
                self.task.waiting,
                self.rounds_this_run,
                interrupted=True,
            )
        self.task = await self.store.get_task(self.task_id)
        return self.result()

    def result(self) -> RunResult:
        """How this run ended."""
        return RunResult(
            self.task_id,
            self.status,
            self.task.stop_reason if lifecycle.is_terminal(self.status) else None,
            self.task.waiting,
            self.rounds_this_run,
            interrupted=self.status in ("queued", "running") and self.e.stop.is_set(),
        )

    async def load(self) -> None:
        """Phase 1: read state from projections (never from chat memory)."""
        self.task = await self.store.get_task(self.task_id)
        self.status = self.task.status
        try:
            self.spec = parse_spec(self.task.spec, source=f"task {self.task_id}", stored=True)
        except errors.SpecError as exc:
            raise errors.StoreError(
                f"stored spec of task {self.task_id} is invalid: {exc}"
            ) from exc
        self.ledger = (await self.store.get_ledger(self.task_id)).to_ledger()
        self.state = RunState.from_dict(self.task.usage)
        self.state.last_seq = self.state.last_seq or self.task.last_seq
        self.workspace = Path(self.task.workspace) if self.task.workspace else None
        # No allowlist permits the read-only tools only: anything that writes, or has a
        # risky effect, must be named in the contract.
        allow = self.spec.tool_names() if self.spec.tools else list(BUILTIN_READ_TOOLS)
        if not self.spec.mcp_servers:
            check_tools(self.spec, self.e.registry.names())
        # A money budget needs prices: refused here too (the Python API's start), and the
        # task's table is the one every call of this run is counted by (probes too).
        prices = pricing.table_for(pricing.spec_prices(self.spec))
        models = self.models
        pricing.check_prices(
            self.spec, [models.actor, models.judge, models.compact, models.review], prices
        )
        pricing.set_current(prices)
        if READ_ARTIFACT not in allow:
            allow.append(READ_ARTIFACT)
        if ledger_view.paged(self.ledger) and LEDGER_ITEMS not in allow:
            allow.append(LEDGER_ITEMS)  # a long ledger is shown as a view: page through it
        self.tools = self.e.registry.allowed(allow)
        self.guard = self.e.guard or default_guard(self.store, self.spec, self.clock)
        self.known_tools: dict[str, Tool] = {
            n: t for n in self.e.registry.names() if (t := self.e.registry.get(n))
        }
        words = await self.store.read_events(self.task_id, types={"user.message"})
        self.user_words = [str(w.data.get("text", "")) for w in words]
        created = await self.store.read_events(self.task_id, limit=1, types={"task.created"})
        self.preexisting = dict(created[0].data.get("preexisting", {})) if created else {}

    # ------------------------------------------------------------ turns and recovery

    # ------------------------------------------------------------ the round

    async def call_model(self, model: Model, request: ModelRequest) -> ModelResponse:
        """One model call with latency measured; errors become `ModelError`. A stop
        request (Ctrl-C, a worker's shutdown) cancels a call in flight at once: the
        round ends interrupted, and a resume asks the model again."""
        t0 = time.perf_counter()
        attrs = telemetry.model_call_attributes(request.purpose, model.name, self.task_id)
        with telemetry.span(f"chat {model.name}", attrs) as span:
            try:
                resp = await self._unless_stopped(model.complete(request), request.purpose)
            except (errors.ModelError, Stop):
                raise
            except Exception as exc:
                raise errors.ModelError(f"{type(exc).__name__}: {exc}", transient=False) from exc
            u = resp.usage
            telemetry.set_attributes(
                span,
                telemetry.usage_attributes(
                    resp.model, u.input_tokens, u.output_tokens, u.cached_input_tokens
                ),
            )
        if not resp.latency_ms:
            resp = replace(
                resp,
                model=resp.model or model.name,
                latency_ms=(time.perf_counter() - t0) * 1000,
            )
        return resp

    async def _unless_stopped(self, call: Awaitable[ModelResponse], purpose: str) -> ModelResponse:
        """`await call`, cancelled when a stop is requested meanwhile (in this task, so
        what the call raises, a `SystemExit` included, stays its own)."""
        if self.e.stop.is_set():
            raise Stop(out.interrupted("interrupted; resume to continue"))
        me = asyncio.current_task()
        triggered = False

        def interrupt(_: object) -> None:
            nonlocal triggered
            if me is not None and not me.done():
                triggered = True
                me.cancel()

        watcher = asyncio.ensure_future(self.e.stop.wait())
        watcher.add_done_callback(interrupt)
        try:
            return await call
        except BaseException:
            # An SDK may turn the cancellation into an error of its own: either way the
            # call was abandoned because of the stop.
            if not triggered:
                raise
        finally:
            watcher.remove_done_callback(interrupt)
            watcher.cancel()
        if me is not None:
            me.uncancel()
        if purpose == "act":
            # The round never happened: its focus item's start is not kept.
            self.staged_events = []
            self.staged_ledger = None
        raise Stop(out.interrupted("interrupted during a model call; resume to continue"))

    async def record_call(
        self,
        purpose: str,
        model: Model,
        request: ModelRequest,
        response: ModelResponse,
        round_no: int | None,
    ) -> ev.ModelCalled:
        """The request (by reference for the actor's calls: see `history`) and the
        response as blobs; the event keeps a summary."""
        req_blob: str | None = None
        req_ref: dict[str, Any] | None = None
        if purpose == "act" and self.state.system_blob:
            epoch = history.epoch_doc(
                system_blob=self.state.system_blob,
                tools_blob=self.tools_blob(request),
                snapshot=self.state.ctx_blob,
                after_seq=self.state.ctx_after_seq,
            )
            req_ref = history.request_ref(
                request,
                epoch_blob=self.stage_epoch(epoch),
                upto_seq=self.state.last_seq,
            )
        else:
            req_blob = self.stage_packed(request.to_dict())
        resp_blob = self.stage_json(response.to_dict())
        cost = _cost(model.name, response)
        u = response.usage
        st = self.state
        st.count_call(purpose, u, cost, self.ledger.current_milestone())
        st.last_call_at = self.e.clock.now()
        names = ", ".join(c.name for c in response.tool_calls)
        # A summary for the timeline: the response itself is in its blob.
        summary = (response.text[:100] + (f" [calls: {names}]" if names else "")).strip()
        return ev.ModelCalled(
            call_id=f"{self.task_id}.{purpose}.{st.model_calls}",
            purpose=purpose,
            model=response.model or model.name,
            round=round_no,
            request_blob=req_blob,
            request=req_ref,
            response_blob=resp_blob,
            input_tokens=u.input_tokens,
            output_tokens=u.output_tokens,
            cached_tokens=u.cached_input_tokens,
            cache_write_tokens=u.cache_write_tokens,
            latency_ms=response.latency_ms,
            cost_usd=cost,
            summary=summary,
            tool_calls=len(response.tool_calls),
            attempts=response.attempts,
        )

    async def model_failed(self, purpose: str, model: Model, exc: Exception) -> None:
        """A model call failed after its retries: wait, never die silently."""
        transient = isinstance(exc, errors.ModelError) and exc.transient
        event = ev.ModelFailed(
            call_id=f"{self.task_id}.{purpose}.failed",
            purpose=purpose,
            model=model.name,
            error=str(exc),
            transient=transient,
            attempts=exc.attempts if isinstance(exc, errors.ModelError) else 1,
        )
        if transient:
            raise Stop(
                out.waiting(
                    "external",
                    f"model provider failed: {exc}; a worker tries again in a minute, or "
                    f"now: {hints.resume(self.task_id)}",
                    why="model provider unavailable",
                    until=self.clock.now() + 60.0,
                    events=[event],
                    # `tether run`/`resume` exit 4 on it: stopped on infrastructure.
                    unavailable="model provider",
                )
            )
        raise Stop(
            out.waiting(
                "human",
                f"model provider refused the call: {exc}",
                why="model provider error",
                events=[event],
            )
        )

    async def commit_round(self, pending: PendingRound, **more: Any) -> None:
        """Commit a round's results (with whatever else `more` carries) and show it."""
        await self.commit(
            [*pending.events, *more.pop("events", ())],
            ops=pending.ops,
            artifacts=[*pending.artifacts, *more.pop("artifacts", ())],
            **more,
        )
        failpoints.hit("after_round_commit")
        self.rounds_this_run += 1
        self.ctx.append(Entry("round", pending.messages, pending.round))
        self.snapshot(f"round {pending.round}: {pending.calls} tool calls")
