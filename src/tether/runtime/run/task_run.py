"""One claimed task while an engine drives it: small objects, wired.

- `view` (`run.view`): what the run knows of its task — record, contract, ledger, state;
- `journal` (`run.journal`): commits under the fencing token, staged blobs, redaction;
- `records` (`run.records`): the task's stored records, read;
- `calls` (`run.model_calls`): model calls, journaled and counted;
- `flow` and `beat` (`run.heartbeat`): the lease, the stop request, the round timeout;
- `prober` (`run.probe`): the status probe of a silent round;
- `config` (`ports.RunConfig`): the engine's settings for the run.

The round's phases are functions of `round.phases`, a turn's start and recovery of
`recovery.turn`; they receive these objects through the protocols of `ports`, each the
one or two it uses. `judge` and `recovery.deliverables` receive the run as `parts`
(`ports.PartsHost`: these objects by name, the store's reads, `tools` and `tool_env`),
`ops` as `ops_host` (`ports.OpsHost`: the journal, the view, the tools, the store's
reads), and the probe as `run.probe.ProbedRun` (the view, the heartbeat, the journal,
the models). The run forwards nothing: a part reaches an object by its name.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tether import errors, failpoints, lifecycle
from tether._by_object import keep
from tether.clock import Clock
from tether.models import pricing
from tether.runtime.judge.rules.own import recording
from tether.runtime.ops.ports import ToolEnv
from tether.runtime.recovery import turn as recovery
from tether.runtime.round import checks
from tether.runtime.round.context import Context, Entry
from tether.runtime.run import outcome as out
from tether.runtime.run.journal import RunJournal, Snapshot
from tether.runtime.run.liveness import probe
from tether.runtime.run.liveness.heartbeat import Flow, Heartbeat
from tether.runtime.run.model_calls import ModelCalls
from tether.runtime.run.ports import Commit, ModelSet, PendingRound, RunConfig
from tether.runtime.run.records import TaskRecords
from tether.runtime.run.state import RunState, RunView
from tether.spec import OpRule, TaskSpec, parse_spec
from tether.store.base import CommitResult, Store, StoredEvent, TaskRecord
from tether.text import counted
from tether.tools import allowlist as toolset
from tether.tools import files
from tether.tools.breaker import Guard
from tether.tools.registry import Tool, ToolRegistry, ensure_lease

log = logging.getLogger("tether.engine")


@runtime_checkable
class StoreFile(Protocol):
    """A store kept in one file (SQLite): its path."""

    path: str


@dataclass(frozen=True)
class Preread:
    """What the claimer of a task read of it once it held the lease (a worker: to choose
    its models), given to the run's first load instead of reading it again: nothing of
    the run happens in between, so it is what that load would read a moment later."""

    task: TaskRecord
    #: The task's `task.created` event (`launch.created`), which never changes.
    created: Sequence[StoredEvent]
    #: `task.spec` parsed (`parse_spec`, stored, as `task T`).
    spec: TaskSpec


@dataclass(frozen=True)
class RunResult:
    """How a run ended."""

    task_id: str
    status: str
    stop_reason: str | None
    waiting: Mapping[str, Any] | None
    rounds: int
    interrupted: bool = False


class TaskRun:
    """One claimed task while an engine drives it (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        task_id: str,
        token: int,
        *,
        models: ModelSet,
        registry: ToolRegistry,
        config: RunConfig,
        clock: Clock,
        stop: asyncio.Event,
        guard: Guard | None = None,
        on_progress: Callable[[Snapshot], None] | None = None,
        status_probe: bool = True,
        preread: Preread | None = None,
        on_started: Callable[[], None] | None = None,
        created: Sequence[StoredEvent] | None = None,
    ) -> None:
        self.store = store
        self._on_started = on_started
        # Taken by the first `load` only, and only under the lease it was read with.
        self._preread = (
            preread if preread is not None and preread.task.fencing_token == token else None
        )
        # The task's `task.created` event, which never changes (the engine may have read
        # it already: `created`).
        self._created: Sequence[StoredEvent] | None = created
        self.task_id = task_id
        self.token = token
        self.config = config
        self.models = models
        self._registry = registry
        self._guard = guard
        # The status probe of a silent round; its clock is the run's, with the round's
        # waits (sleeps on it) seen (see `run.probe`).
        self.prober = probe.Prober(self, clock, enabled=status_probe)
        self.view = RunView(self.prober.clock)
        self.flow = Flow(token, stop)
        # The journal's commits are kept for the judge's indexes: what the run wrote
        # itself is not read back (`judge.rules.own`).
        self._own = recording(self)
        self.journal = RunJournal(
            store,
            task_id,
            token,
            self.view,
            on_commit=self._committed,
            on_progress=on_progress,
            on_written=self._own.add,
        )
        self.records = TaskRecords(store, task_id)
        self.calls = ModelCalls(models, self.view, self.journal, stop)
        self.beat = Heartbeat(store, task_id, self.flow, self.view, config.lease_ttl)
        # What `ops` and `judge` are handed (see the module docstring).
        self.parts = self
        self.ops_host = self
        self.ctx: Context
        self.tools: list[Tool] = []
        self.known_tools: dict[str, Tool] = {}
        self.guard: Guard | None = None
        self.user_words: list[str] = []
        self.preexisting: dict[str, str] = {}
        self.services: Mapping[str, Any] = config.services
        self.inline_wait_max = config.inline_wait_max

    def _committed(self, res: CommitResult) -> None:
        self.prober.heard()
        self.flow.committed(res)

    # ------------------------------------------------------------ the drive

    async def drive(self) -> RunResult:
        """Load the task, open its MCP sources if any, and run it."""
        await self.load()
        if self.view.spec.mcp_servers and not lifecycle.is_terminal(self.journal.status):
            from tether.tools.mcp import McpSources

            # MCP servers live as long as this run; their tools join the registry.
            async with McpSources(self.view.spec.mcp_servers) as sources:
                self.add_tools(sources.tools())
                return await self.drive_loaded()
        return await self.drive_loaded()

    def add_tools(self, tools: Sequence[Tool]) -> None:
        """Tools from a source opened for this run (MCP), filtered by the allowlist
        (see `toolset.source_tools`)."""
        spec, extra, by_name = toolset.source_tools(
            self.view.spec, self._registry.names(), tools, self.task_id
        )
        self.view.spec = spec
        self.tools.extend(extra)
        self.known_tools.update(by_name)

    async def drive_loaded(self) -> RunResult:
        """Start a turn and run rounds until the task stops, waits or is interrupted."""
        try:
            if lifecycle.is_terminal(self.journal.status):
                return self.result()
            while True:
                outcome = await self._turn()
                if not outcome.again:
                    self.beat.round_started = None
                    # The one place a round's end becomes a status change.
                    await out.apply(self.journal, outcome)
                    # What a person asked during the last round is not left for later:
                    # read when a commit since the last look found someone else's events
                    # (`Flow.foreign`; this status change's commit included), all of them
                    # when the turn never looked.
                    late = await checks.requests(self)
                    if late is None:
                        break
                    if not late.again:
                        await out.apply(self.journal, late)
                        break
                await self.load()  # an edit it applied: the new contract, a fresh turn
                self.flow.scanned = None
        except errors.StaleLease:
            # Another worker owns the task now; nothing we tried was stored.
            log.warning("task %s: lease lost, stopping", self.task_id)
            self.view.task = await self.records.task()
            return RunResult(
                self.task_id,
                self.view.task.status,
                self.view.task.stop_reason,
                self.view.task.waiting,
                self.flow.rounds_this_run,
                interrupted=True,
            )
        finally:
            self.calls.close()
        self.view.task = await self.records.task()
        return self.result()

    async def _turn(self) -> out.Outcome:
        """One turn: its start, the round a crash interrupted, then rounds — each after
        a person's requests (`checks.requests`) — until one ends the run."""
        outcome = await recovery.start_turn(self)
        if self._on_started is not None:  # the run's first turn only
            started, self._on_started = self._on_started, None
            started()
        # The rounds' code (the judges, the op runner, compaction) loads after the turn's
        # start is stored: a resume's first event does not wait for it.
        from tether.runtime.round import phases as rounds

        self.beat.round_started = time.monotonic()
        if outcome is None:
            outcome = await rounds.finish_interrupted(self)
        while outcome is None:
            self.beat.round_started = time.monotonic()
            outcome = await checks.requests(self) or await rounds.run_round(self)
        return outcome

    def result(self) -> RunResult:
        """How this run ended."""
        return RunResult(
            self.task_id,
            self.journal.status,
            self.view.task.stop_reason if lifecycle.is_terminal(self.journal.status) else None,
            self.view.task.waiting,
            self.flow.rounds_this_run,
            interrupted=self.journal.status in ("queued", "running") and self.flow.stop_requested(),
        )

    async def timed_out(self, why: str) -> RunResult:
        """After a round was cancelled for running too long (see `Heartbeat.timed_out`)."""
        task = await self.beat.timed_out(why)
        return RunResult(
            self.task_id,
            task.status,
            None,
            task.waiting,
            self.flow.rounds_this_run,
            interrupted=True,
        )

    async def ask_human(self, ask: probe.AskHuman) -> bool:
        """Apply a failed probe's `AskHuman`: the task waits for a person. False if the
        wait cannot be stored (the task was cancelled or taken over meanwhile, the store
        is away): then the round ends like one past its `round_timeout`."""
        try:
            self.view.task = await self.journal.ask_human(ask.warning, ask.waiting, ask.reason)
        except errors.TetherError as exc:
            log.warning(
                "task %s: could not ask a person after the status probe: %s", self.task_id, exc
            )
            return False
        return True

    async def load(self) -> None:
        """Read state from projections (never from chat memory)."""
        view = self.view
        pre, self._preread = self._preread, None
        view.task = pre.task if pre is not None else await self.records.task()
        self.journal.status = view.task.status
        try:
            view.spec = (
                pre.spec
                if pre is not None
                else parse_spec(view.task.spec, source=f"task {self.task_id}", stored=True)
            )
        except errors.SpecError as exc:
            raise errors.StoreError(
                f"stored spec of task {self.task_id} is invalid: {exc}"
            ) from exc
        view.ledger = (await self.store.get_ledger(self.task_id)).to_ledger()
        if any(isinstance(item.done_when, OpRule) for item in view.spec.items):
            # Its op index is built at the first judging: the ops this run intends
            # before then (that round's) are kept too, not read back at the next.
            self._own.active = True
        view.state = RunState.from_dict(view.task.usage)
        view.state.last_seq = view.state.last_seq or view.task.last_seq
        view.workspace = Path(view.task.workspace) if view.task.workspace else None
        self.tools, self.known_tools = toolset.allowed_tools(view.spec, self._registry, view.ledger)
        # A money budget needs prices: refused here too (the Python API's start), and the
        # task's table is the one every call of this run is counted by (probes too).
        prices = pricing.table_for(pricing.spec_prices(view.spec))
        models = self.models
        pricing.check_prices(
            view.spec, [models.actor, models.judge, models.compact, models.review], prices
        )
        pricing.set_current(prices)
        self.guard = self._guard or default_guard(self.store, view.spec, view.clock)
        # What a person told the task, for the LLM judge alone: a task judged by its
        # rules (no judge model) never reads them.
        words = await self.records.events({"user.message"}) if models.judge is not None else ()
        self.user_words = [str(w.data.get("text", "")) for w in words]
        if self._created is None:  # the first event: read once per run
            self._created = (
                pre.created
                if pre is not None
                else await self.store.read_events(self.task_id, limit=1, types={"task.created"})
            )
        created = self._created
        self.preexisting = dict(created[0].data.get("preexisting", {})) if created else {}

    async def commit_round(self, pending: PendingRound, **more: Any) -> None:
        """Commit a round's results (with whatever else `more` carries) and show it."""
        # `journal.write` itself, not through `commit`: one coroutine less a round.
        await self.journal.write(
            Commit(
                [*pending.events, *more.pop("events", ())],
                ops=pending.ops,
                artifacts=[*pending.artifacts, *more.pop("artifacts", ())],
                **more,
            )
        )
        failpoints.hit("after_round_commit")
        self.flow.rounds_this_run += 1
        self.ctx.append(Entry("round", pending.messages, pending.round))
        self.journal.snapshot(f"round {pending.round}: {counted(pending.calls, 'tool call')}")

    @property
    def tool_env(self) -> ToolEnv:
        """What every tool call of this run is given (`ports.ToolsHost`)."""
        return ToolEnv(
            token=self.token,
            workspace=self.view.workspace,
            services=self.services,
            guard=self.guard,
            clock=self.view.clock,
            inline_wait_max=self.inline_wait_max,
            owner_check=functools.partial(ensure_lease, self.store, self.task_id, self.token),
            private_files=self._private_files,
        )

    @functools.cached_property
    def _private_files(self) -> frozenset[Path]:
        # A SQLite store kept inside the workspace: no file tool may reach it.
        return _database_files(self.store)


#: The database files of each live store, by id: resolved once per store (ten
#: `realpath` calls, each a few `lstat`s), not once per run: a worker starts many runs
#: on one store, and its file does not move while it is open.
_DB_FILES: dict[int, frozenset[Path]] = {}


def _database_files(store: Store) -> frozenset[Path]:
    if not isinstance(store, StoreFile):
        return frozenset()
    hit = _DB_FILES.get(id(store))
    if hit is not None:
        return hit
    return keep(_DB_FILES, store, files.database_files(store.path))


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


__all__ = ["Preread", "RunResult", "TaskRun", "default_guard"]
