"""Every message is stored once and every request by reference, yet a stored model call
gives back, byte for byte, the request the model saw."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.loop import honest_actor, next_item, run_task, spec_of
from tether import events as ev
from tether.clock import FakeClock
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.round import history
from tether.store import open_store
from tether.store.base import Store
from tether.tools.registry import ToolRegistry, tool


def _actor(request: ModelRequest) -> ModelResponse:
    """Reads a big file (a large output: an artifact and a preview), fails a call now and
    then (an inline error message), and writes the Next item's file."""
    nxt = next_item(request)
    if nxt is None:
        return ModelResponse("all closed")
    n = int(nxt[1:])
    calls = [tool_call("read_file", path="big.txt")]
    if n % 2:
        calls.append(tool_call("read_file", path="missing.txt"))
    calls.append(tool_call("write_file", path=f"out/{nxt}.txt", content=nxt))
    return ModelResponse(f"working on {nxt}", tuple(calls))


def _compact(request: ModelRequest) -> str:
    return "Earlier rounds wrote some files; the ledger says which."


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/t.db"
    if request.param == "postgres":
        url = request.getfixturevalue("pg_url")  # skips without TETHER_TEST_PG_URL
    s = await open_store(url)
    yield s
    await s.close()


async def _stored_act_requests(store: Store, task_id: str) -> list[dict[str, Any]]:
    out = []
    for e in await store.read_events(task_id, types={"model.called"}):
        if e.data["purpose"] != "act":
            continue
        request, _response = await history.load_call(store, task_id, e.data["call_id"])
        out.append(request.to_dict())
    return out


async def test_stored_requests_rebuild_byte_identically(store: Store, tmp_path: Path) -> None:
    (tmp_path / "big.txt").write_text("line of a big file\n" * 300)
    clock = FakeClock()
    spec = spec_of(12, context={"input_budget_tokens": 1500, "preview_chars": 400})
    model = ScriptedModel(policy=_actor)
    compact = ScriptedModel(policy=_compact)
    tid, first = await run_task(
        store, spec, tmp_path, model, compact=compact, clock=clock, max_rounds_this_run=3
    )
    assert first.status == "queued"
    clock.advance(30)  # a resume inside the cache window: no new epoch
    _, second = await run_task(
        store, spec, tmp_path, model, compact=compact, clock=clock, task_id=tid
    )
    assert second.status == "satisfied"
    seen = [r.to_dict() for r in model.requests if r.purpose == "act"]
    stored = await _stored_act_requests(store, tid)
    assert len(stored) == len(seen) >= 12
    compactions = [e for e in await store.read_events(tid, types={"context.compacted"})]
    assert compactions, "the budget is small enough to compact"
    for n, (was, back) in enumerate(zip(seen, stored, strict=True)):
        assert json.dumps(back, sort_keys=True) == json.dumps(was, sort_keys=True), n
    # A compaction's request is stored by reference too (its transcript is history the
    # store holds): it reads back as it was sent.
    compact_calls = [
        e.data
        for e in await store.read_events(tid, types={"model.called"})
        if e.data["purpose"] == "compact"
    ]
    assert len(compact_calls) == len(compact.requests) >= 2
    for call, was_req in zip(compact_calls, compact.requests, strict=True):
        assert call["request"]["ref"] == history.COMPACT_REF and not call["request_blob"]
        assert len(json.dumps(call["request"])) < 600
        back_req, _ = await history.load_call(store, tid, call["call_id"])
        assert json.dumps(back_req.to_dict(), sort_keys=True) == json.dumps(
            was_req.to_dict(), sort_keys=True
        )


async def test_old_compaction_requests_stored_whole_still_load(
    store: Store, tmp_path: Path
) -> None:
    """A compaction's `model.called` of the previous version (the request packed whole
    in `request_blob`) reads back as it was sent."""
    (tmp_path / "big.txt").write_text("line of a big file\n" * 300)
    spec = spec_of(6, context={"input_budget_tokens": 1500, "preview_chars": 400})
    compact = ScriptedModel(policy=_compact)
    tid, result = await run_task(
        store, spec, tmp_path, ScriptedModel(policy=_actor), compact=compact
    )
    assert result.status == "satisfied" and compact.requests
    was = compact.requests[0]
    new_form = next(
        e.data
        for e in await store.read_events(tid, types={"model.called"})
        if e.data["purpose"] == "compact"
    )
    answer = history.called_response(new_form)
    old = ev.ModelCalled(
        call_id=f"{tid}.compact.old",
        purpose="compact",
        model="scripted",
        request_blob=await store.put_blob(history.pack(was.to_dict())),
        # Its response as a blob too, as that version stored every response.
        response_blob=await store.put_blob(json.dumps(answer).encode()),
    )
    await store.commit(tid, None, [old])
    back, response = await history.load_call(store, tid, f"{tid}.compact.old")
    assert json.dumps(back.to_dict(), sort_keys=True) == json.dumps(was.to_dict(), sort_keys=True)
    assert response == answer


async def test_a_round_is_stored_by_reference(store: Store, tmp_path: Path) -> None:
    (tmp_path / "big.txt").write_text("x" * 5000)
    model = ScriptedModel(policy=_actor)
    tid, result = await run_task(store, spec_of(2, context={"preview_chars": 200}), tmp_path, model)
    assert result.status == "satisfied"
    rounds = await store.read_events(tid, types={"round.committed"})
    for r in rounds:
        doc = r.data["messages"]
        assert doc["ref"] == history.ROUND_REF and not r.data.get("messages_blob")
        # Tool results come from the op journal; only a refused or failed call's error
        # text (not what its record holds) is inline.
        for t in doc["tools"]:
            assert ("op" in t) != ("content" in t)
            if "content" in t:
                assert t["content"].startswith("ERROR")
    calls = [e.data for e in await store.read_events(tid, types={"model.called"})]
    act = [c for c in calls if c["purpose"] == "act"]
    assert all(c["request"] and not c["request_blob"] for c in act)
    assert all(len(json.dumps(c["request"])) < 600 for c in act)


async def test_old_rows_with_whole_requests_still_load(tmp_path: Path) -> None:
    """A request stored whole (before references) is read back as it was."""
    store = await open_store("memory://")
    model = ScriptedModel(policy=honest_actor)
    tid, _ = await run_task(store, spec_of(1), tmp_path, model)
    request = ModelRequest("act", "sys", (), max_output_tokens=10)
    legacy = request.to_dict()
    back = await history.rebuild_request(store, tid, legacy)
    assert back.to_dict() == legacy


def test_pack_compresses_large_documents_only() -> None:
    small = {"a": 1}
    assert history.pack(small) == b'{"a": 1}' and history.unpack(history.pack(small)) == small
    big = {"transcript": "the same words again " * 200, "n": [1, 2, 3]}
    packed = history.pack(big)
    assert packed.startswith(b"zlib:") and len(packed) < len(json.dumps(big)) // 4
    assert history.unpack(packed) == big


def _stepper(request: ModelRequest) -> ModelResponse:
    """Calls `do_step` every round: the item (no rule) stays open and the judge's
    continuation is the same text round after round."""
    return ModelResponse("stepping", (tool_call("do_step", step=len(request.messages)),))


@tool(effect="write")
def do_step(step: int) -> str:
    """Process one record (a long output)."""
    return f"record {step} processed.\n" + "a line of the output\n" * 120


async def test_a_repeated_continuation_is_stored_once(store: Store, tmp_path: Path) -> None:
    """A continuation that is the last one's text again is left out of its verdict
    (`same_continuation`); the requests, across compactions and a resume, rebuild as
    they were sent, and a verdict of the previous version (text repeated) reads the same."""
    (tmp_path / "big.txt").write_text("line of a big file\n" * 300)
    spec = spec_of(
        1,
        items=[{"id": "work", "title": "process every record"}],
        tools=["do_step"],
        models={"judge": "rules"},
        context={"input_budget_tokens": 1500, "preview_chars": 400, "cache_ttl_seconds": 1e9},
        limits={
            "max_rounds": 14,
            "no_progress_rounds": 10**9,
            "max_attempts_per_item": 10**9,
            "max_rounds_per_item": None,
        },
    )
    model, compact = ScriptedModel(policy=_stepper), ScriptedModel(policy=_compact)
    opts: dict[str, Any] = {"compact": compact, "registry": ToolRegistry([do_step])}
    tid, _ = await run_task(store, spec, tmp_path, model, max_rounds_this_run=6, **opts)
    await run_task(store, spec, tmp_path, model, task_id=tid, **opts)
    verdicts = [e.data for e in await store.read_events(tid, types={"judge.verdict"})]
    same = [v for v in verdicts if v["same_continuation"]]
    # A compaction folds the last continuation away: the next one is stored whole.
    assert len(verdicts) >= 12 and len(same) >= 3
    assert all(v["continuation"] == "" for v in same)
    assert await store.read_events(tid, types={"context.compacted"})
    seen = [r.to_dict() for r in model.requests if r.purpose == "act"]
    stored = await _stored_act_requests(store, tid)
    assert len(stored) == len(seen) >= 12
    for n, (was, back) in enumerate(zip(seen, stored, strict=True)):
        assert json.dumps(back, sort_keys=True) == json.dumps(was, sort_keys=True), n
    # The previous version's form (the text stored again) loads the same entries.
    new_form = await history.load_entries(store, tid, snapshot=None, after_seq=0)
    text = history.last_continuation(new_form)
    old = ev.JudgeVerdict(round=99, decision="continue", continuation=text)
    again = ev.JudgeVerdict(round=100, decision="continue", same_continuation=True)
    await store.commit(tid, None, [old, again])
    entries = await history.load_entries(store, tid, snapshot=None, after_seq=0)
    assert [e.messages[0].content for e in entries[-2:]] == [text, text]
