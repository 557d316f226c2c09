"""The narrow interfaces between the run of one task and the parts of a round.

The run (`run.task_run.TaskRun`) is composed of small objects, and the parts of a
round receive those objects, each typed by one of these protocols, so none of them
imports the engine and each can be driven by a fake in a test. No port exposes the
store: a part reads the task's records through `Records` and writes through `Journal`.

- `Commit`: one durable write of the run, as a value.
- `Journal`: the commit port — commit events and projections under the fencing token,
  move the task's status, stage blobs and the round's decision for the next commit,
  tell the progress display (`run.journal`).
- `TaskView`: what the run knows of its task (record, contract, ledger, run state).
- `Records`: the task's stored records, read (`run.records`).
- `ModelPort`: model calls, journaled and counted (`run.model_calls`).
- `RunConfig`: the engine's settings for this run; `RunFlow`: the lease and the stop.
- `ChecksHost`, `TurnHost`, `CompactHost`, `RoundHost`: what the checks between rounds,
  a turn's start, compaction and a round's phases receive — the objects above by name,
  each extending `RunParts` (the journal and the view).

`OpsHost`, `JudgeHost` and `PartsHost` are what `ops`, `judge` and
`recovery.deliverables` receive: the objects above by name, and the
store only through a read protocol of a few methods (`ops.ports.OpsStore`, `JudgeStore`),
never the `Store` itself (`tests/unit/test_ports.py`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tether import events as ev
from tether import ledger as L
from tether.clock import Clock
from tether.models.base import Message, Model, ModelRequest, ModelResponse, direct_init
from tether.runtime.ops.ports import OpsStore, ToolEnv
from tether.runtime.round.context import Context, Entry
from tether.runtime.run.state import RunState
from tether.spec import TaskSpec
from tether.store.base import (
    UNSET,
    ApprovalRecord,
    ArtifactRecord,
    OpRecord,
    StoredEvent,
    TaskRecord,
)
from tether.tools.registry import Tool


@runtime_checkable
class ClosableModel(Protocol):
    """A model with something to close (an HTTP client); scripted models have none."""

    async def aclose(self) -> None: ...


@dataclass
class ModelSet:
    """Models by purpose. `judge=None` means rule judging only."""

    actor: Model
    judge: Model | None = None
    compact: Model | None = None
    review: Model | None = None

    @classmethod
    def single(cls, model: Model, *, review: bool = False) -> ModelSet:
        """One model for every purpose."""
        return cls(model, model, model, model if review else None)

    async def aclose(self) -> None:
        """Close the models' HTTP clients (each distinct model once)."""
        seen: set[int] = set()
        for m in (self.actor, self.judge, self.compact, self.review):
            if m is None or id(m) in seen:
                continue
            seen.add(id(m))
            if isinstance(m, ClosableModel):
                await m.aclose()


@direct_init
@dataclass(frozen=True)
class PendingRound:
    """A round's results, built in memory and committed in one write."""

    round: int
    events: list[ev.Event]
    ops: list[OpRecord]
    artifacts: list[ArtifactRecord]
    messages: list[Message]
    non_convergent: str | None
    calls: int


@direct_init
@dataclass(frozen=True)
class Commit:
    """One durable write of a run: events and the projections that move with them, in
    one transaction under the fencing token. `UNSET` leaves `waiting` and `wake_at` as
    they are; the run's usage always goes along."""

    events: Sequence[ev.Event] = ()
    status: str | None = None
    stop_reason: str | None = None
    ledger: L.Ledger | None = None
    ops: Sequence[OpRecord] = ()
    artifacts: Sequence[ArtifactRecord] = ()
    approvals: Sequence[ApprovalRecord] = ()
    waiting: Any = UNSET
    wake_at: Any = UNSET


@dataclass(frozen=True)
class RunConfig:
    """The engine's settings for one run."""

    worker_id: str
    lease_ttl: float
    inline_wait_max: float
    max_rounds_this_run: int | None = None
    #: The naive cache policy (re-render the system tail at every turn), for benchmarks.
    epoch_every_turn: bool = False
    previous_owner: str | None = None
    #: Shared clients for the tools (`ToolContext.services`).
    services: Mapping[str, Any] = field(default_factory=dict)


class Journal(Protocol):
    """The commit port: every durable write of a run goes through it."""

    task_id: str
    #: The round's decision events, flushed by the next commit.
    staged_events: list[ev.Event]
    #: The ledger with the focus item started, committed with the decision.
    staged_ledger: L.Ledger | None

    @property
    def status(self) -> str:
        """The task's status as the run's last commit left it."""
        ...

    async def write(self, commit: Commit) -> int:
        """Commit events and projections atomically; returns the last seq."""
        ...

    async def commit(self, events: Sequence[ev.Event], **fields: Any) -> int:
        """`write(Commit(events, **fields))`."""
        ...

    async def set_status(
        self, dst: str, stop_reason: str | None = None, reason: str = "", *, also: Commit = ...
    ) -> None:
        """Move the task, with its event and what `also` carries, in one commit."""
        ...

    def stage_blob(self, data: bytes) -> str:
        """A blob stored by the next commit; returns its ref."""
        ...

    async def get_json(self, ref: str) -> Any:
        """A JSON blob (plain or packed)."""
        ...

    def snapshot(self, message: str) -> None:
        """Tell the progress display."""
        ...


class TaskView(Protocol):
    """What a run knows of its task."""

    @property
    def task(self) -> TaskRecord: ...
    @property
    def spec(self) -> TaskSpec: ...
    @property
    def ledger(self) -> L.Ledger: ...
    @property
    def state(self) -> RunState: ...
    @property
    def workspace(self) -> Path | None: ...
    @property
    def clock(self) -> Clock: ...


class Records(Protocol):
    """The task's stored records, read (this task's only; no writes)."""

    async def task(self) -> TaskRecord:
        """The task row."""
        ...

    async def ops(
        self, statuses: Collection[str] | None = None, *, op_ids: Collection[str] | None = None
    ) -> list[OpRecord]:
        """The task's op records."""
        ...

    async def artifacts(
        self, *, artifact_ids: Collection[str] | None = None
    ) -> list[ArtifactRecord]:
        """The task's artifacts."""
        ...

    async def blob(self, ref: str) -> bytes:
        """A blob (`KeyError` when missing)."""
        ...

    async def events(self, types: Collection[str]) -> list[StoredEvent]:
        """The task's events of these types."""
        ...

    async def entries(
        self, *, snapshot: str | None, after_seq: int, skip_round: int
    ) -> list[Entry]:
        """The context's history entries (see `round.history.load_entries`)."""
        ...


class ModelPort(Protocol):
    """Model calls, journaled and counted in the run state."""

    models: ModelSet

    async def call_model(self, model: Model, request: ModelRequest) -> ModelResponse:
        """One call; failures become `ModelError`."""
        ...

    async def record_call(
        self,
        purpose: str,
        model: Model,
        request: ModelRequest,
        response: ModelResponse,
        round_no: int | None,
        ref: dict[str, Any] | None = None,
    ) -> ev.ModelCalled:
        """The call's event (its response inline, its request staged as a blob or by
        reference: `ref`, `history.compact_ref`'s, when given)."""
        ...

    async def model_failed(self, purpose: str, model: Model, exc: Exception) -> None:
        """A call failed after its retries: the task waits, never dies silently."""
        ...


class RunFlow(Protocol):
    """The run's lease and how far it went: what says whether it may go on."""

    token: int
    lease_lost: bool
    rounds_this_run: int
    #: (cancel requested, version) of the task row as the run's last commit found it.
    commit_flags: tuple[bool, int | None] | None
    #: A commit found events someone else wrote since the run's last one.
    foreign: bool
    #: How far `checks.requests` read the log (None: not yet in this turn).
    scanned: int | None

    def stop_requested(self) -> bool:
        """True once the worker was asked to stop between steps."""
        ...


# --- what the parts receive: the run's objects by name (read-only) ---------------------


class RunParts(Protocol):
    """The two objects every part of a round reads: the journal and the view."""

    @property
    def journal(self) -> Journal: ...

    @property
    def view(self) -> TaskView: ...


class ChecksHost(RunParts, Protocol):
    """What the checks between rounds use (`config` is a frozen value)."""

    config: RunConfig

    @property
    def records(self) -> Records: ...

    @property
    def flow(self) -> RunFlow: ...


class CompactHost(RunParts, Protocol):
    """What compaction uses."""

    @property
    def calls(self) -> ModelPort: ...

    ctx: Context


# --- the hosts of ops/, judge/ and recovery/deliverables --------------------------------


class JudgeStore(OpsStore, Protocol):
    """The store reads of `judge` and `recovery.deliverables`: those of `ops`, with the
    task's artifacts and blobs (every write is a `journal.commit`)."""

    async def get_artifacts(
        self, task_id: str, *, artifact_ids: Collection[str] | None = None
    ) -> list[ArtifactRecord]:
        """The task's artifacts (by id)."""
        ...

    async def get_blob(self, ref: str) -> bytes:
        """A blob (`KeyError` when missing)."""
        ...


class ToolsHost(RunParts, Protocol):
    """The tools a run may call and what every call is given, with its journal and
    view: what `ops` and `recovery.deliverables` share."""

    @property
    def tools(self) -> list[Tool]:
        """The tools this task may call."""
        ...

    @property
    def tool_env(self) -> ToolEnv:
        """What every tool call of the run is given (its token, its services)."""
        ...


class OpsHost(ToolsHost, Protocol):
    """What acting on a round's tool calls uses (`runtime.ops`): the journal (every
    write is a `journal.commit`), the view (task, contract, run state), the tools, and
    the store only through the reads of `OpsStore`; the token, workspace, services,
    service guard and clock as one `ToolEnv`."""

    @property
    def known_tools(self) -> dict[str, Tool]:
        """Every tool known (a refusal names them; an op of a tool no longer allowed is
        still compensated)."""
        ...

    @property
    def store(self) -> OpsStore:
        """The store reads of `ops`."""
        ...


class JudgeHost(CompactHost, Protocol):
    """What judging a round and the completion check use: the run's objects by name,
    the store's reads, and what the turn's start read of the task (`user_words`, the
    files that were there before it, `preexisting`)."""

    @property
    def store(self) -> JudgeStore:
        """The store reads of `judge`."""
        ...

    user_words: list[str]
    preexisting: dict[str, str]

    async def commit_round(self, pending: PendingRound, **more: Any) -> None:
        """Commit a round's results with whatever `more` carries."""
        ...


class PartsHost(JudgeHost, ToolsHost, Protocol):
    """What a round hands to `judge`, and a turn's start to `recovery.deliverables`
    (which asks the tools again about the ops done items rest on)."""


class TurnHost(ChecksHost, Protocol):
    """What opening a turn (and recovering) uses: the checks' objects, and these."""

    ctx: Context
    tools: list[Tool]

    @property
    def parts(self) -> PartsHost: ...


class RoundHost(ChecksHost, CompactHost, Protocol):
    """What the phases of a round use (see `round.phases`): the checks' objects, the
    model calls and the context, and these."""

    @property
    def parts(self) -> PartsHost: ...

    @property
    def ops_host(self) -> OpsHost: ...


__all__ = [
    "ChecksHost",
    "Commit",
    "CompactHost",
    "Journal",
    "JudgeHost",
    "JudgeStore",
    "Message",
    "ModelPort",
    "ModelSet",
    "OpsHost",
    "PartsHost",
    "PendingRound",
    "Records",
    "RoundHost",
    "RunConfig",
    "RunFlow",
    "RunParts",
    "TaskView",
    "ToolsHost",
    "TurnHost",
]
