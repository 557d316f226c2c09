"""The status probe's test setup: a round whose model call hangs until the test lets it
go, probe answers from a list, and a wait on a condition (never a fixed sleep).

Shared by `tests/integration/test_status_probe.py` and the adversarial probe answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tests.support.loop import events_of, honest_actor, spec_of
from tether.clock import FakeClock
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel
from tether.runtime.engine import Engine, ModelSet, RunResult
from tether.runtime.tasks import create_task
from tether.store import Store


async def until(check: Callable[[], Awaitable[bool] | bool], what: str) -> None:
    """Wait for a condition (never a fixed sleep), 30 s at most."""
    for _ in range(3000):
        got = check()
        if not isinstance(got, bool):
            got = await got
        if got:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


class Actor:
    """A scripted actor whose first round call hangs until `release` is set, and whose
    probe answers come from a list (then WORKING)."""

    def __init__(self, answers: list[str | Exception], *, hang: bool = True) -> None:
        self.answers = list(answers)
        self.release = asyncio.Event()
        self.hang = hang
        self.hanging = False
        self.cancelled = 0
        self.probes: list[ModelRequest] = []
        self.model = ScriptedModel(policy=self.answer, name="actor")

    async def answer(self, request: ModelRequest) -> ModelResponse | str:
        if request.purpose == "probe":
            self.probes.append(request)
            answer = self.answers.pop(0) if self.answers else "WORKING"
            if isinstance(answer, Exception):
                raise answer
            return answer
        if self.hang:
            self.hang = False
            self.hanging = True
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            finally:
                self.hanging = False
        return honest_actor(request)


async def start_probed(
    store: Store,
    tmp_path: Path,
    actor: Actor,
    clock: FakeClock,
    limits: dict[str, Any] | None = None,
    **engine: Any,
) -> tuple[str, asyncio.Task[RunResult]]:
    """Start the run of a one-item task probed after 300 s of silence; its id and the
    running engine."""
    spec = spec_of(1, limits={"probe_after": 300, **(limits or {})}, **engine.pop("spec", {}))
    tid = (await create_task(store, spec, workspace=tmp_path)).task_id
    # A short lease: the heartbeat that checks for silence runs every 0.1 s.
    eng = Engine(store, ModelSet(actor.model), lease_ttl=0.3, clock=clock, **engine)
    return tid, asyncio.create_task(eng.run(tid))


class Beats:
    """Counts the lease renewals of a store (each heartbeat renews once)."""

    def __init__(self, store: Store) -> None:
        self.n = 0
        renew = store.renew

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.n += 1
            return await renew(*args, **kwargs)

        store.renew = counted  # type: ignore[method-assign]

    async def wait(self, more: int = 3) -> None:
        """Let `more` heartbeats pass."""
        goal = self.n + more
        await until(lambda: self.n >= goal, f"{more} heartbeats")


async def probe_answers(store: Store, tid: str) -> list[str]:
    """The answers the task's probes got, in order."""
    return [str(a["answer"]) for a in await events_of(store, tid, "probe.answered")]


async def probe_answered(store: Store, tid: str, n: int) -> bool:
    """Did the task's probes get `n` answers yet?"""
    return len(await probe_answers(store, tid)) >= n
