"""A worker's periodic check of delivered work (`tether worker --verify-every`).

Every `every` seconds the worker verifies the delivered (`satisfied`) tasks
(`recovery.verify.verify_task`, what `tether verify` runs): what broke is reopened and
the task goes back to work (this worker or another claims it), or waits for a person
when nothing can rebuild it. Off by default. A failure is logged, never fatal.
"""

from __future__ import annotations

import logging
import time

from tether import errors
from tether.runtime.recovery.verify import Verification, verify_task
from tether.store.base import Store

log = logging.getLogger("tether.worker")

#: The most delivered tasks one pass verifies (the newest first).
MAX_PER_PASS = 100


class Reverify:
    """When a pass is due, verify the delivered tasks."""

    def __init__(self, store: Store, every: float | None, by: str) -> None:
        if every is not None and not every > 0:
            raise errors.UserError("the verification interval must be above 0 seconds")
        self.store, self.every, self.by = store, every, by
        self._last: float | None = None

    async def __call__(self) -> list[Verification]:
        """The verifications of this pass (none when it is not due or it is off)."""
        now = time.monotonic()
        if self.every is None or (self._last is not None and now - self._last < self.every):
            return []
        self._last = now
        found = []
        try:
            tasks = await self.store.list_tasks({"satisfied"}, limit=MAX_PER_PASS)
        except errors.TetherError as exc:
            log.warning("verification pass failed: %s", exc)
            return []
        for task in tasks:
            try:
                result = await verify_task(self.store, task.task_id, by=self.by)
            except errors.TetherError as exc:  # raced with an edit, a store error
                log.warning("verify %s failed: %s", task.task_id, exc)
                continue
            if not result.holds:
                log.warning("verify %s: %s (%s)", task.task_id, result.outcome, result.status)
            found.append(result)
        return found
