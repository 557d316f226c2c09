"""A provider that refuses a call for good (a wrong key, an unknown model) makes the task
wait with the command that goes on once it is fixed, as every wait does; and a stop
requested before a model call leaves no coroutine un-awaited behind it."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import pytest

from tests.support.adversarial import contract, op_rule_items
from tests.support.loop import run_task
from tether import errors
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel
from tether.runtime.run.model_calls import ModelCalls
from tether.runtime.run.outcome import Stop
from tether.store.base import Store


async def test_a_refused_call_names_the_command_that_goes_on(store: Store, tmp_path: Path) -> None:
    def refuse(request: ModelRequest) -> ModelResponse:
        raise errors.ModelError("HTTP 401: invalid API key", transient=False)

    spec = contract(op_rule_items("a"), models={"judge": "rules"})
    tid, result = await run_task(store, spec, tmp_path, ScriptedModel(policy=refuse))
    assert result.status == "waiting"
    reason = (result.waiting or {})["reason"]
    assert "model provider refused the call: HTTP 401: invalid API key" in reason
    assert f"then: tether resume {tid} (its --model picks another model)" in reason


async def test_a_stop_before_the_call_closes_it() -> None:
    """The call's coroutine is closed, not left to be collected un-awaited (which
    printed "coroutine ... was never awaited" after a Ctrl-C)."""

    async def complete() -> ModelResponse:
        return ModelResponse("never")

    calls = ModelCalls.__new__(ModelCalls)
    calls.stop = asyncio.Event()
    calls.stop.set()
    call = complete()
    with pytest.raises(Stop) as info:
        await calls._unless_stopped(call, "act")
    assert info.value.outcome.status == "queued"  # back to the queue
    assert inspect.getcoroutinestate(call) == inspect.CORO_CLOSED
