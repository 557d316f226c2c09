"""The tasks a worker holds back after they raised, and those it passes over (and why)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from tether import errors, placement
from tether.store.base import Lease, Store

if TYPE_CHECKING:
    from tether.spec import TaskSpec

log = logging.getLogger("tether.worker")


class HeldBack:
    """Tasks that raised, each held back by a lease this worker keeps without running it:
    for `retry_delay` seconds, doubled at each further failure up to `max_retry_delay`."""

    def __init__(
        self, store: Store, worker_id: str, retry_delay: float, max_retry_delay: float
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.retry_delay = retry_delay
        self.max_retry_delay = max_retry_delay
        self.failures: dict[str, int] = {}
        self.held: dict[str, int] = {}  # task id -> token of the lease holding it back

    def delay(self, failures: int) -> float:
        return float(min(self.max_retry_delay, self.retry_delay * 2 ** max(0, failures - 1)))

    def failed(self, task_id: str) -> float:
        """Count a failure of the task: how long it is now held back."""
        n = self.failures[task_id] = self.failures.get(task_id, 0) + 1
        return self.delay(n)

    def ran(self, task_id: str) -> None:
        """The task ran: its next failure is held back for `retry_delay` again."""
        self.failures.pop(task_id, None)

    def claimed(self, task_id: str) -> None:
        """The task was claimed again (its hold ran out): no lease to give back."""
        self.held.pop(task_id, None)

    async def hold(self, task_id: str, lease: Lease | None, delay: float) -> None:
        """Keep a lease on the task for `delay` seconds: `lease` renewed, or a new claim."""
        try:
            if lease is not None:
                await self.store.renew(task_id, lease.token, delay)
                self.held[task_id] = lease.token
            else:
                got = await self.store.claim(self.worker_id, delay, task_id=task_id)
                if got is not None:
                    self.held[task_id] = got.token
        except errors.TetherError as exc:  # only a courtesy to the other tasks
            log.warning("task %s: could not hold it back: %s", task_id, exc)

    async def release(self) -> None:
        """Give back the leases that hold tasks back, so that they need not wait for
        this worker's delay once it is gone."""
        for task_id, token in self.held.items():
            with contextlib.suppress(errors.TetherError):
                await self.store.release(task_id, token)
        self.held.clear()


class PassedOver:
    """Tasks handed back untouched (this worker lacks a tool), each passed over until
    a time of `time.monotonic()`."""

    def __init__(self) -> None:
        self.until: dict[str, float] = {}

    def now(self) -> list[str]:
        """The tasks passed over now."""
        now = time.monotonic()
        for task_id in [t for t, until in self.until.items() if until <= now]:
            del self.until[task_id]
        return list(self.until)

    def pass_over(self, task_id: str, seconds: float) -> bool:
        """Pass the task over for `seconds`; False if it was passed over already."""
        new = task_id not in self.until
        self.until[task_id] = time.monotonic() + seconds
        return new


async def record_pass_over(store: Store, task_id: str, worker_id: str, reason: str) -> None:
    """Note in the shared document `placement.passed_key(task_id)` that this worker
    passed the task over, why and when (by the store's clock), for `tether status`.
    Only a courtesy: a store fault is logged."""

    def note(doc: dict[str, Any] | None, now: float) -> tuple[dict[str, Any], None]:
        workers = dict((doc or {}).get("workers") or {})
        workers[worker_id] = {"reason": reason, "at": now}
        newest = sorted(workers.items(), key=lambda w: -float(w[1]["at"]))[:20]
        return {"workers": dict(newest)}, None

    try:
        await store.update_shared(placement.passed_key(task_id), note)
    except errors.TetherError as exc:
        log.warning("task %s: could not record why it was passed over: %s", task_id, exc)


async def forget_pass_overs(store: Store, task_id: str) -> None:
    """The task runs: drop the record of the workers that passed it over, if any."""
    try:
        if await store.get_shared(placement.passed_key(task_id)) is not None:
            await store.update_shared(placement.passed_key(task_id), lambda doc, now: (None, None))
    except errors.TetherError as exc:
        log.warning("task %s: could not forget who passed it over: %s", task_id, exc)


async def placement_refusal(
    store: Store,
    task_id: str,
    spec: TaskSpec,
    workspace: str | None,
    host_tags: Collection[str],
) -> str | None:
    """Why the task must run on another machine (`tether.placement`), or None: pinned
    to host tags this worker lacks, or its workspace missing here or another folder.
    A task that may run here forgets who passed it over before."""
    if workspace is None and not spec.runs_on:
        return None
    workspace_id = None
    if workspace is not None:
        from tether.runtime import launch

        workspace_id = launch.workspace_id_in(await launch.created(store, task_id))
    reason = placement.refusal(workspace, workspace_id, spec.runs_on, host_tags)
    if reason is None:
        await forget_pass_overs(store, task_id)
    return reason


def lacks_tools(spec: TaskSpec, names: Callable[[], Sequence[str]]) -> str | None:
    """Why the task's contract names a tool not among `names()` (this worker's), or None.
    Workers may register different tools (`TETHER_TOOLS`): such a task is handed back
    at once, untouched, and passed over for `retry_delay` seconds (its contract may be
    edited meanwhile), so that a worker with the tool runs it. Not a failure: held back
    as one, it would wait for this worker's delay with a worker able to run it idle. An
    MCP server's tools are known only once it runs: not checked here. So with a secret
    the tools need that is not set here (`launch.missing_env`)."""
    from tether.runtime import launch
    from tether.tools.allowlist import check_tools

    missing = launch.missing_env(spec)
    if missing:
        return launch.env_problem(missing)
    if spec.mcp_servers:
        return None
    try:
        check_tools(spec, names())
    except errors.SpecError as exc:
        return str(exc)
    return None
