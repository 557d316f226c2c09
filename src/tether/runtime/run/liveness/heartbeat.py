"""The run's heartbeat: the lease renewed while the run goes on, and a round that
outlives `limits.round_timeout` cancelled (then treated like a crash of this worker).

`Flow` (`ports.RunFlow`) is what says whether the run may go on: the lease (its token,
lost or not), the stop request, how many rounds this run did, and the task row's flags
as the last commit found them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Protocol

from tether import errors
from tether import events as ev
from tether.runtime.run.state import RunView
from tether.store.base import CommitResult, Store, TaskRecord

log = logging.getLogger("tether.engine")


class Flow:
    """The lease and the stop of one run (`ports.RunFlow`)."""

    def __init__(self, token: int, stop: asyncio.Event) -> None:
        self.token = token
        self.stop = stop
        self.lease_lost = False
        self.rounds_this_run = 0
        self.commit_flags: tuple[bool, int | None] | None = None
        #: The last seq of the run's last commit; `foreign` once a commit found events
        #: written by someone else since (a message, a pause or an edit request).
        self.last_seq: int | None = None
        self.foreign = False
        #: How far `checks.requests` read the log (None: not yet in this run).
        self.scanned: int | None = None

    def stop_requested(self) -> bool:
        """True once the worker was asked to stop between steps."""
        return self.stop.is_set()

    def committed(self, res: CommitResult) -> None:
        """What the task row said as a commit found it: the round's checks read it instead of
        the task row itself (a cancel request is seen at the next step after a commit)."""
        self.commit_flags = (res.cancel_requested, res.version)
        if self.last_seq is not None and res.first_seq > self.last_seq + 1:
            self.foreign = True
        self.last_seq = max(res.last_seq, self.last_seq or 0)


class _Ticks(Protocol):
    def tick(self) -> None: ...


class Heartbeat:
    """Renews the lease; cancels the driving task when a round runs too long."""

    def __init__(
        self, store: Store, task_id: str, flow: Flow, view: RunView, lease_ttl: float
    ) -> None:
        self._store = store
        self.task_id = task_id
        self.flow = flow
        self.view = view
        self.lease_ttl = lease_ttl
        # The task driving the run, and when its current round started (monotonic).
        self.driver: asyncio.Task[Any] | None = None
        self.round_started: float | None = None
        #: Why the round under way was cancelled (past its timeout, a failed probe).
        self.overdue: str | None = None
        self.overdue_code = "round_timeout"

    async def run(self, prober: _Ticks) -> None:
        """Renew the lease while the run goes on; stop when it is lost, or when a round
        runs past `limits.round_timeout` (then the round is cancelled: see `timed_out`)."""
        interval = max(0.05, self.lease_ttl / 3)
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
            prober.tick()
            try:
                await self._store.renew(self.task_id, self.flow.token, self.lease_ttl)
            except errors.StaleLease:
                self.flow.lease_lost = True
                return
            except errors.TetherError as exc:  # a passing store fault: try again next beat
                log.warning("lease renewal failed: %s", exc)

    def cancel_round(self, why: str, code: str) -> None:
        """Cancel the round in flight (the status probe's `fail`): `timed_out` or the
        run's `ask_human` records it, with `code`."""
        self.overdue = why
        self.overdue_code = code
        if self.driver is not None:
            self.driver.cancel()

    def round_overdue(self) -> str | None:
        """Why the round under way must be cancelled (it outlived `limits.round_timeout`),
        or None."""
        limit = self.view.spec.limits.round_timeout if self.view.loaded else None
        if limit is None or self.round_started is None:
            return None
        spent = time.monotonic() - self.round_started
        if spent <= limit:
            return None
        return (
            f"round {self.view.state.rounds + 1} ran {spent:.0f}s, "
            f"past limits.round_timeout ({limit:g}s)"
        )

    async def timed_out(self, why: str) -> TaskRecord:
        """After a round was cancelled for running too long: treated as a crash of this
        worker. Nothing of the round's memory is committed (a store write may still be
        under way in a thread); the warning goes in as an event of its own, the task
        stays `running`, and the next claim recovers it like any crash — op intents
        settled by reconcile or a human, the crash counted towards
        `limits.max_crash_restarts`, after which the task fails. Returns the task row."""
        warning = ev.AuditWarning(
            code=self.overdue_code, message=why, details={"round": self.view.state.rounds + 1}
        )
        with contextlib.suppress(errors.TetherError):
            await self._store.commit(self.task_id, self.flow.token, [warning])
        return await self._store.get_task(self.task_id)


__all__ = ["Flow", "Heartbeat"]
