"""What a run knows of its task (`ports.TaskView`): the task row, the contract, the
ledger and the run's state, as loaded at the run's start and kept by its commits."""

from __future__ import annotations

from pathlib import Path

from tether import ledger as L
from tether.clock import Clock
from tether.runtime.run.state import RunState
from tether.spec import TaskSpec
from tether.store.base import TaskRecord


class RunView:
    """The run's view of its task. `task`, `spec` and `ledger` are set by the run's
    `load`; the journal keeps `ledger` and `state` as its commits move them."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.task: TaskRecord
        self.spec: TaskSpec
        self.ledger: L.Ledger
        self.state = RunState()
        self.workspace: Path | None = None

    @property
    def loaded(self) -> bool:
        """True once the task was read (its contract is known)."""
        return hasattr(self, "spec")


__all__ = ["RunView"]
