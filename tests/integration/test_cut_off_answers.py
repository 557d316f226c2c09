"""An answer the output token limit cut off (`finish_reason` `length` / `max_tokens`)
with no tool call is the model's failure to end it, not an agent idling: the runtime
tells the model (`verdicts.CUT_OFF_NOTE`, in the next progress update) and the round
does not count toward `limits.no_progress_rounds`; the item's rounds stay bounded by
`limits.max_rounds_per_item`. An answer in words that was not cut still counts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.loop import events_of, ledger_of, run_task, spec_of
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.judge.verdicts import CUT_OFF_NOTE
from tether.store.memory import MemoryStore


@pytest.fixture
async def store() -> MemoryStore:
    return await MemoryStore.open()


def _drafts(cuts: int, finish: str | None) -> tuple[Any, list[ModelRequest]]:
    """`cuts` answers in words ending with `finish`, then the file written."""
    seen: list[ModelRequest] = []

    def policy(request: ModelRequest) -> ModelResponse:
        seen.append(request)
        if len(seen) <= cuts:
            return ModelResponse(
                "Here is the draft of the report: " + "x " * 50, (), finish_reason=finish
            )
        return ModelResponse("writing", (tool_call("write_file", path="out/i1.txt", content="r"),))

    return policy, seen


@pytest.mark.parametrize("finish", ["length", "max_tokens"])
async def test_answers_cut_off_in_words_do_not_block_the_item(
    store: MemoryStore, tmp_path: Path, finish: str
) -> None:
    policy, seen = _drafts(5, finish)
    tid, result = await run_task(store, spec_of(1), tmp_path, ScriptedModel(policy=policy))
    assert result.status == "satisfied"
    assert await events_of(store, tid, "item.blocked") == []
    # Each answer after a cut was told of it, in its progress update.
    assert len(seen) == 6
    assert CUT_OFF_NOTE not in seen[0].messages[-1].content
    for request in seen[1:]:
        assert CUT_OFF_NOTE in request.messages[-1].content


async def test_answers_in_words_not_cut_still_count(store: MemoryStore, tmp_path: Path) -> None:
    policy, seen = _drafts(5, "stop")
    tid, _ = await run_task(store, spec_of(1), tmp_path, ScriptedModel(policy=policy))
    ledger = await ledger_of(store, tid)
    assert ledger.item("i1").status == "blocked"
    assert "no progress in 3 rounds" in (ledger.item("i1").note or "")
    assert all(CUT_OFF_NOTE not in r.messages[-1].content for r in seen)


async def test_a_model_cut_off_forever_is_bounded_by_the_items_cap(
    store: MemoryStore, tmp_path: Path
) -> None:
    policy, seen = _drafts(10**6, "length")
    spec = spec_of(1, limits={"max_rounds_per_item": 8})
    tid, _ = await run_task(store, spec, tmp_path, ScriptedModel(policy=policy))
    ledger = await ledger_of(store, tid)
    assert ledger.item("i1").status == "blocked"
    assert "not finished in 8 rounds" in (ledger.item("i1").note or "")
    assert len(seen) == 8
