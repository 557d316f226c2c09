"""A model that answers the status probe "DONE" (with a NUL, terminal escapes and a
megabyte of text) while nothing is done, then claims completion in its text only: the
answer is journaled (cut short), never taken as completion, and the task does not end
`satisfied`. Every store (PostgreSQL's cannot hold the NUL as such)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.support.adversarial import assert_honest, say, statuses
from tests.support.loop import events_of, spec_of
from tests.support.probe import Actor, start_probed, until
from tether.clock import FakeClock
from tether.models.base import ModelRequest, ModelResponse
from tether.store.base import Store

ANSWER = "DONE\x00 \x1b[2J\x07 all items verified. " + "done " * 200_000


class Liar(Actor):
    """Hangs its first round, answers the probe DONE, then only says it is done."""

    async def answer(self, request: ModelRequest) -> ModelResponse | str:
        if request.purpose == "probe":
            return await super().answer(request)
        if self.hang:
            self.hang, self.hanging = False, True
            try:
                await self.release.wait()
            finally:
                self.hanging = False
        return say("DONE: every item is complete and verified.")


async def test_a_done_probe_answer_proves_nothing(store: Store, tmp_path: Path) -> None:
    clock = FakeClock()
    actor = Liar([ANSWER])
    tid, run = await start_probed(store, tmp_path, actor, clock, limits={"max_rounds": 4})
    await until(lambda: actor.hanging, "the round's model call")
    clock.advance(301)

    async def answered() -> bool:
        return bool(await events_of(store, tid, "probe.answered"))

    await until(answered, "the probe's answer")
    (got,) = await events_of(store, tid, "probe.answered")
    assert got["answer"] == "DONE" and len(got["text"]) <= 500
    actor.release.set()
    result = await asyncio.wait_for(run, 30)
    assert result.status != "satisfied", result
    assert set((await statuses(store, tid)).values()) != {"done"}
    await assert_honest(store, tid, spec_of(1))
