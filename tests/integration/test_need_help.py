"""The actor asks for a human with a line starting NEED_HELP, as its prompt says; the
word inside a sentence is not a request."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.loop import honest_actor, run_task, spec_of
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel
from tether.store.memory import MemoryStore


@pytest.mark.parametrize(
    "text",
    [
        "NEED_HELP: the API token is missing",
        "Working on it.\nNEED_HELP: which folder holds the invoices?",
        "> **NEED_HELP**: I cannot reach the service",
    ],
)
async def test_a_line_starting_need_help_waits_for_a_human(tmp_path: Path, text: str) -> None:
    store = await MemoryStore.open()
    _, result = await run_task(store, spec_of(1), tmp_path, ScriptedModel([ModelResponse(text)]))
    assert result.status == "waiting" and result.waiting is not None
    assert result.waiting["kind"] == "human"
    assert result.waiting["reason"].lstrip("> *").startswith("NEED_HELP")


async def test_the_word_inside_a_sentence_is_not_a_request(tmp_path: Path) -> None:
    said = {"n": 0}

    def actor(request: ModelRequest) -> ModelResponse:
        said["n"] += 1
        reply = honest_actor(request)
        return ModelResponse("I will not say NEED_HELP; " + reply.text, reply.tool_calls)

    store = await MemoryStore.open()
    _, result = await run_task(store, spec_of(2), tmp_path, ScriptedModel(policy=actor))
    assert result.status == "satisfied"
