"""What `ops` needs from the run besides its host (`run.ports.OpsHost`): the few store
reads it makes (`OpsStore`, declared with the store: `store.base.OpsStore`), the
environment every tool call of the run is given, and the bookkeeping the parts of one
round's acting share.

This module imports nothing of the runtime, so the run's ports may name it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tether import events as ev
from tether.clock import Clock
from tether.models.base import direct_init
from tether.store.base import OpsStore
from tether.tools.breaker import Guard

__all__ = ["INLINE_WAIT_MAX", "OpsStore", "RoundOps", "ToolEnv"]

#: Backoffs up to this long are waited out in the worker; longer ones park the task as
#: `waiting` until the stored time, releasing the lease.
INLINE_WAIT_MAX = 30.0


@direct_init
@dataclass(frozen=True)
class ToolEnv:
    """What every tool call of a run is given, fixed for the run."""

    #: The run's fencing token (`ToolContext.fencing_token`).
    token: int
    workspace: Path | None
    services: Mapping[str, Any]
    #: The shared breakers and concurrency limits of services (None: none).
    guard: Guard | None
    clock: Clock
    #: Backoffs up to this long are waited out in the worker; longer ones park the task.
    inline_wait_max: float
    #: Raises `StaleLease` unless the run still holds the task (`ctx.ensure_owner()`).
    owner_check: Callable[[], Awaitable[None]] | None = None
    #: Files no tool may touch: the store's own database (`ToolContext.private_files`).
    private_files: frozenset[Path] = frozenset()


@dataclass
class RoundOps:
    """The bookkeeping one round's acting shares between the parts of `ops`."""

    #: Op ids whose intent was committed with the round's decision (see `OpRunner.plan`).
    journaled: set[str] = field(default_factory=set)
    #: Op ids a human approved (the tool sees `ctx.approved`).
    approved: set[str] = field(default_factory=set)
    #: Op ids stored before this run took them up (a crash, a pause): a request of an
    #: earlier run may have carried their key, so none of their attempts is a first.
    recovered: set[str] = field(default_factory=set)
    #: Ops decided under a version below this one are of an older goal.
    goal_version: int = 0
    #: Events for the round's next commit (breaker transitions).
    events: list[ev.Event] = field(default_factory=list)
