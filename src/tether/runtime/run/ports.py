"""The narrow interfaces between the engine and the parts of a round.

The engine's run of one task (`engine.TaskRun`) is the only implementation; the parts
(`round`, `ops`, `recovery`, `verdicts`, `guards`, `compaction`) are typed against these
protocols instead, each against the smallest one that covers what it uses, so none of
them imports the engine and each can be driven by a fake in a test.

- `Journal`: the commit port — commit events and projections under the fencing token,
  move the task's status, stage blobs for the next commit, tell the progress display.
- `TaskView`: what the run knows of its task (record, contract, ledger, run state).
- `ModelPort`: model calls, journaled and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tether import events as ev
from tether import ledger as L
from tether.clock import Clock
from tether.models.base import Message, Model, ModelRequest, ModelResponse
from tether.runtime.ops.ports import OpsStore, ToolEnv
from tether.runtime.round.context import Context
from tether.runtime.run.state import RunState
from tether.spec import TaskSpec
from tether.store.base import (
    ApprovalRecord,
    ArtifactRecord,
    OpRecord,
    Store,
    TaskRecord,
)
from tether.tools.registry import Tool


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
            close = getattr(m, "aclose", None)
            if close is not None:
                await close()


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


class Journal(Protocol):
    """The commit port: every durable write of a run goes through it."""

    task_id: str
    token: int
    store: Store
    state: RunState
    status: str

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
        waiting: Any = ...,
        wake_at: Any = ...,
    ) -> int:
        """Commit events and projections atomically; returns the last seq."""
        ...

    async def set_status(
        self,
        dst: str,
        stop_reason: str | None = None,
        reason: str = "",
        *,
        extra: Sequence[ev.Event] = (),
        waiting: Any = ...,
        wake_at: Any = ...,
        ops: Sequence[OpRecord] = (),
        approvals: Sequence[ApprovalRecord] = (),
    ) -> None:
        """Move the task, with its event, in one commit."""
        ...

    def stage_blob(self, data: bytes) -> str:
        """A blob stored by the next commit; returns its ref."""
        ...

    def snapshot(self, message: str) -> None:
        """Tell the progress display."""
        ...


class TaskView(Protocol):
    """What a run knows of its task."""

    task: TaskRecord
    spec: TaskSpec
    ledger: L.Ledger
    workspace: Path | None
    clock: Clock


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
    ) -> ev.ModelCalled:
        """The call's event (its request and response staged as blobs)."""
        ...

    async def model_failed(self, purpose: str, model: Model, exc: Exception) -> None:
        """A call failed after its retries: the task waits, never dies silently."""
        ...


class GuardHost(Journal, TaskView, Protocol):
    """What the checks between rounds use."""

    rounds_this_run: int
    lease_lost: bool
    max_rounds_this_run: int | None
    #: (cancel requested, version) of the task row as the run's last commit found it.
    commit_flags: tuple[bool, int | None] | None

    def stop_requested(self) -> bool:
        """True once the worker was asked to stop between steps."""
        ...


class OpsHost(Protocol):
    """What acting on a round's tool calls uses (`runtime.ops`): ten members. The store
    only through the reads of `OpsStore` (every write is a `commit`); the token,
    workspace, services, service guard and clock as one `ToolEnv`."""

    @property
    def task_id(self) -> str: ...
    @property
    def task(self) -> TaskRecord: ...
    @property
    def spec(self) -> TaskSpec: ...
    @property
    def state(self) -> RunState: ...

    @property
    def tools(self) -> list[Tool]:
        """The tools this task may call."""
        ...

    @property
    def known_tools(self) -> dict[str, Tool]:
        """Every tool known (a refusal names them; an op of a tool no longer allowed is
        still compensated)."""
        ...

    @property
    def store(self) -> OpsStore:
        """The store reads of `ops`."""
        ...

    @property
    def tool_env(self) -> ToolEnv:
        """What every tool call of the run is given."""
        ...

    async def commit(
        self,
        events: Sequence[ev.Event],
        *,
        ops: Sequence[OpRecord] = (),
        artifacts: Sequence[ArtifactRecord] = (),
        approvals: Sequence[ApprovalRecord] = (),
    ) -> int:
        """Commit events with op records, artifacts and approvals in one transaction."""
        ...

    def stage_blob(self, data: bytes) -> str:
        """A blob stored by the next commit; returns its ref."""
        ...


class CompactHost(Journal, TaskView, ModelPort, Protocol):
    """What compaction uses."""

    ctx: Context


class JudgeHost(Journal, TaskView, ModelPort, Protocol):
    """What judging a round and the completion check use."""

    ctx: Context
    user_words: list[str]
    preexisting: dict[str, str]

    async def commit_round(self, pending: PendingRound, **more: Any) -> None:
        """Commit a round's results with whatever `more` carries."""
        ...


class TurnHost(JudgeHost, Protocol):
    """What opening a turn (and recovering) uses."""

    tools: list[Tool]
    previous_owner: str | None
    worker_id: str
    lease_ttl: float
    epoch_every_turn: bool
    ctx: Context

    async def get_json(self, ref: str) -> Any:
        """A JSON blob."""
        ...


class RoundHost(GuardHost, TurnHost, OpsHost, Protocol):
    """What the phases of a round use (see `round`): everything above, plus the
    decision staged for the round's first commit."""

    #: The round's decision events, flushed by the next commit.
    staged_events: list[ev.Event]
    #: The ledger with the focus item started, committed with the decision.
    staged_ledger: L.Ledger | None


__all__ = [
    "CompactHost",
    "GuardHost",
    "Journal",
    "JudgeHost",
    "Message",
    "ModelPort",
    "ModelSet",
    "OpsHost",
    "PendingRound",
    "RoundHost",
    "TaskView",
    "TurnHost",
]
