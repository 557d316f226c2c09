"""`replay` through a run whose journal holds notices: a notice a sweeper sent is not a
person's action (the replay went on), and neither it nor its absence in the replay is a
divergence. A need_help notice quotes the model's question; one the person answered
before any sweep ran is not sent (`notices.ASKS`)."""

from __future__ import annotations

from pathlib import Path

from tests.support.loop import next_item, run_task, spec_of
from tether.edits import tell
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.report.replay import replay_task
from tether.runtime.watch.sinks import LogNotifier
from tether.runtime.watch.sweep import sweep
from tether.store.memory import MemoryStore

QUESTION = "NEED_HELP: which folder do the files go in?"


def _asks_first(request: ModelRequest) -> ModelResponse:
    if not any("Message from the user" in m.content for m in request.messages):
        return ModelResponse(QUESTION)
    nxt = next_item(request)
    if nxt is None:
        return ModelResponse("closed")
    return ModelResponse(
        f"writing {nxt}", (tool_call("write_file", path=f"out/{nxt}.txt", content=nxt),)
    )


async def test_a_notice_is_no_human_action_for_replay(tmp_path: Path) -> None:
    store = MemoryStore()
    model = ScriptedModel(policy=_asks_first)
    tid, first = await run_task(store, spec_of(1), tmp_path, model)
    assert first.status == "waiting"
    report = await sweep(store, notifier=LogNotifier())
    assert report.notices == [(tid, "need_help")]
    (sent,) = await store.read_events(tid, types={"notice.sent"})
    assert QUESTION in sent.data["text"] and f"tether tell {tid}" in sent.data["text"]
    await tell(store, tid, "they go in out/")
    assert (await sweep(store, notifier=LogNotifier())).notices == []
    _, done = await run_task(store, spec_of(1), tmp_path, model, task_id=tid)
    assert done.status == "satisfied", done.waiting

    result = await replay_task(store, tid)
    assert result.stopped_at is None, result.stopped_at
    assert result.divergence is None, result.divergence


async def test_a_question_answered_before_any_sweep_is_not_sent(tmp_path: Path) -> None:
    store = MemoryStore()
    tid, first = await run_task(store, spec_of(1), tmp_path, ScriptedModel(policy=_asks_first))
    assert first.status == "waiting"
    await tell(store, tid, "they go in out/")
    assert (await sweep(store, notifier=LogNotifier())).notices == []
    assert await store.read_events(tid, types={"notice.sent"}) == []
