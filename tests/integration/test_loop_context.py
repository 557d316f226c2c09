"""Cache stability, the context budget, and the ledger's three refresh channels."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.support.loop import (
    by_purpose,
    events_of,
    honest_actor,
    ledger_of,
    run_task,
    serialized,
    spec_of,
)
from tether import tokens
from tether.clock import FakeClock
from tether.decisions import waive_item
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.round import progress as P
from tether.runtime.round.context import SUMMARY_PREFIX
from tether.store.memory import MemoryStore


@pytest.fixture
async def store() -> MemoryStore:
    return await MemoryStore.open()


def _is_prefix(a: list[str], b: list[str]) -> bool:
    return len(a) <= len(b) and b[: len(a)] == a


@pytest.mark.parametrize("n_items", [6, 10_000])
async def test_requests_in_a_turn_are_byte_identical_prefixes(
    store: MemoryStore, tmp_path: Path, n_items: int
) -> None:
    model = ScriptedModel(policy=honest_actor)
    rounds = min(n_items, 6)
    spec = spec_of(n_items)
    tid, result = await run_task(store, spec, tmp_path, model, max_rounds_this_run=rounds)
    assert result.status == ("satisfied" if n_items == rounds else "queued")
    acts = [r for r in model.requests if r.purpose == "act"]
    assert len(acts) == rounds
    for prev, cur in itertools.pairwise(acts):
        # Everything the previous request sent is sent again, byte for byte, first.
        assert _is_prefix(serialized(prev), serialized(cur))
        assert cur.system == prev.system
    # The ledger sits at the very tail of the system prompt at the epoch start...
    assert acts[0].system.rstrip().endswith("Next: i1")
    cut = acts[0].system.rindex("GOAL LEDGER (version")
    assert cut > acts[0].system.index("CONTRACT")
    assert acts[0].metadata["system_stable_prefix"] == cut - 2
    # ...small whatever the number of items (a view past 25 of them)...
    assert len(acts[0].system) - cut <= 2048 + 200
    # ...and every continuation message carries the judged, current ledger.
    for n, req in enumerate(acts[1:], start=1):
        last = req.messages[-1]
        assert last.role == "user" and "CURRENT GOAL LEDGER" in last.content
        assert f"Progress: {n}/{n_items} done" in last.content
        assert f"Next: i{n + 1}" in last.content
        assert len(last.content) <= 2048 + 400
    turns = await events_of(store, tid, "turn.started")
    assert len(turns) == 1 and turns[0]["epoch"] is True


async def test_across_compactions_and_resumes_only_the_ledger_tail_and_the_history_change(
    store: MemoryStore, tmp_path: Path
) -> None:
    """Over rounds with compactions and a resume: the tool schemas and the system
    prompt up to its ledger (instructions, contract) are byte-identical in every act
    request (no timestamp, counter or reordering ever enters them); every request
    re-sends the whole previous one first, except the one after each compaction; and
    at each compaction the ledger is re-rendered at the system tail, current."""
    clock = FakeClock()
    (tmp_path / "data.txt").write_text("abcdefghij" * 150)

    def policy(request: ModelRequest) -> object:
        if request.purpose == "act":
            return ModelResponse("reading", (tool_call("read_file", path="data.txt"),))
        if request.purpose == "compact":
            return "Read data.txt again and again; nothing else done."
        return "{}"

    spec = spec_of(
        2,
        context={"input_budget_tokens": 3000, "preview_chars": 2000, "cache_ttl_seconds": 300},
        limits={"max_rounds": 60, "no_progress_rounds": 10_000, "max_rounds_per_item": None},
    )
    model = ScriptedModel(policy=policy)
    tid, _ = await run_task(
        store, spec, tmp_path, model, compact=model, clock=clock, max_rounds_this_run=25
    )
    clock.advance(30)  # a resume inside the cache window: not an epoch
    await run_task(store, spec, tmp_path, model, task_id=tid, compact=model, clock=clock)
    acts = [r for r in model.requests if r.purpose == "act"]
    assert len(acts) == 60
    stable = acts[0].metadata["system_stable_prefix"]
    assert stable > 0
    broken = 0
    for prev, cur in itertools.pairwise(acts):
        assert serialized(cur)[0] == serialized(acts[0])[0]  # the tools, as first sent
        assert cur.metadata["system_stable_prefix"] == stable
        assert cur.system[:stable] == acts[0].system[:stable]
        if _is_prefix(serialized(prev), serialized(cur)):
            assert cur.system == prev.system
            continue
        broken += 1  # a compaction: the ledger tail re-rendered with the current ledger
        assert cur.system != prev.system and cur.system.rstrip().endswith("Next: i1")
        assert any(m.content.startswith(SUMMARY_PREFIX) for m in cur.messages)
    compactions = await events_of(store, tid, "context.compacted")
    assert broken == len(compactions) >= 3
    turns = await events_of(store, tid, "turn.started")
    assert [t["epoch"] for t in turns] == [True, False]


async def test_resume_inside_the_cache_window_keeps_the_system_prompt(
    store: MemoryStore, tmp_path: Path
) -> None:
    clock = FakeClock()
    spec = spec_of(6, context={"cache_ttl_seconds": 300})
    model = ScriptedModel(policy=honest_actor)
    tid, first = await run_task(store, spec, tmp_path, model, clock=clock, max_rounds_this_run=2)
    assert first.status == "queued"
    before = [r for r in model.requests if r.purpose == "act"]
    clock.advance(30)  # well inside the provider's cache lifetime
    _, _second = await run_task(
        store, spec, tmp_path, model, task_id=tid, clock=clock, max_rounds_this_run=2
    )
    after = [r for r in model.requests if r.purpose == "act"][len(before) :]
    # Not an epoch boundary: the system prompt is byte-identical (its ledger is stale)...
    assert after[0].system == before[0].system
    assert "Progress: 0/6 done" in after[0].system
    # ...the history is kept as a prefix, and the ledger arrives as an appended message.
    assert _is_prefix(serialized(before[-1]), serialized(after[0]))
    opener = after[0].messages[-1]
    assert "CURRENT GOAL LEDGER" in opener.content and "Progress: 2/6 done" in opener.content
    turns = await events_of(store, tid, "turn.started")
    assert [t["epoch"] for t in turns] == [True, False]

    clock.advance(3600)  # the provider cache has expired: a new epoch
    before = [r for r in model.requests if r.purpose == "act"]
    _, third = await run_task(store, spec, tmp_path, model, task_id=tid, clock=clock)
    after = [r for r in model.requests if r.purpose == "act"][len(before) :]
    assert third.status == "satisfied"
    assert "Progress: 4/6 done" in after[0].system  # re-rendered with the current ledger
    turns = await events_of(store, tid, "turn.started")
    assert turns[-1]["epoch"] is True and "expired" in turns[-1]["epoch_reason"]


async def test_five_hundred_rounds_stay_within_the_input_budget(
    store: MemoryStore, tmp_path: Path
) -> None:
    budget = 4000
    (tmp_path / "data.txt").write_text("abcdefghij" * 200)  # 2 KB

    def actor(request: ModelRequest) -> ModelResponse:
        return ModelResponse("reading again", (tool_call("read_file", path="data.txt"),))

    sizes: list[int] = []
    ledger_seen: list[bool] = []

    def policy(request: ModelRequest) -> object:
        if request.purpose == "act":
            sizes.append(tokens.estimate_request(request))
            text = request.system + "".join(m.content for m in request.messages)
            ledger_seen.append("GOAL LEDGER" in text and "Next: i1" in text)
            return actor(request)
        if request.purpose == "compact":
            return "Read data.txt many times; nothing written yet."
        return "{}"

    spec = spec_of(
        2,
        context={"input_budget_tokens": budget, "preview_chars": 2000},
        limits={"max_rounds": 500, "no_progress_rounds": 10_000, "max_rounds_per_item": None},
    )
    model = ScriptedModel(policy=policy, keep_requests=1)
    tid, result = await run_task(store, spec, tmp_path, model, compact=model)
    assert len(sizes) == 500
    assert max(sizes) <= budget
    assert all(ledger_seen)
    compactions = await events_of(store, tid, "context.compacted")
    assert len(compactions) > 10
    assert result.status == "waiting"  # max_rounds: a loop guard, never a silent stop


async def test_a_looping_model_gets_its_item_blocked_and_the_task_moves_on(
    store: MemoryStore, tmp_path: Path
) -> None:
    def actor(request: ModelRequest) -> ModelResponse:
        text = request.messages[-1].content if request.messages else ""
        if (
            "Next: i1" in text
            or "Next (i1)" in text
            or ("Next: i1" in request.system and len(request.messages) < 2)
        ):
            # Always the same failing call for i1.
            return ModelResponse("trying again", (tool_call("read_file", path="missing.txt"),))
        return honest_actor(request)

    spec = spec_of(3, limits={"no_progress_rounds": 10, "max_attempts_per_item": 3})
    tid, result = await run_task(store, spec, tmp_path, ScriptedModel(policy=actor))
    ledger = (await store.get_ledger(tid)).to_ledger()
    state = ledger.item("i1")
    assert state.status == "blocked"
    # The first failure is no attempt; each repeat of it is, and the third is non-convergent.
    assert state.attempts == 2 and "non-convergent: read_file failed 3 times" in state.note
    assert "missing.txt" in state.note  # the last error is kept
    assert ledger.item("i2").status == "done" and ledger.item("i3").status == "done"
    # A blocked item is not delivered work: the task waits for a human's decision.
    assert result.status == "waiting"
    task = await store.get_task(tid)
    assert task.waiting is not None and task.waiting["kind"] == "decision"
    assert [b["id"] for b in task.waiting["partial"]["blocked"]] == ["i1"]
    warnings = [w["code"] for w in await events_of(store, tid, "audit.warning")]
    assert "item_blocked" in warnings
    await waive_item(store, tid, "i1", reason="the input is missing", by="ops")
    _, again = await run_task(store, spec, tmp_path, ScriptedModel(policy=actor), task_id=tid)
    task = await store.get_task(tid)
    assert again.status == "satisfied" and task.stop_reason == "delivered_with_waivers"
    assert (await ledger_of(store, tid)).item("i1").status == "waived"


async def test_malformed_and_unknown_tool_calls_go_back_to_the_model(
    store: MemoryStore, tmp_path: Path
) -> None:
    from tether.models.base import ToolCall

    script = [
        ModelResponse(
            "bad json", (ToolCall("c1", "write_file", None, "{not json", "invalid JSON"),)
        ),
        ModelResponse("unknown", (tool_call("delete_everything", path="/"),)),
        ModelResponse("not allowed", (tool_call("append_file", path="x", content="y"),)),
        ModelResponse("wrong types", (tool_call("write_file", path=3, content=None),)),
    ]
    seen: list[ModelRequest] = []

    def actor(request: ModelRequest) -> ModelResponse:
        seen.append(request)
        if script:
            return script.pop(0)
        return honest_actor(request)

    spec = spec_of(1, limits={"no_progress_rounds": 10, "max_attempts_per_item": 10})
    tid, result = await run_task(store, spec, tmp_path, ScriptedModel(policy=actor))
    assert result.status == "satisfied"
    tool_msgs = [m.content for m in seen[-1].messages if m.role == "tool"]
    assert "malformed call to write_file" in tool_msgs[0]
    assert "not permitted" in tool_msgs[1] and "delete_everything" in tool_msgs[1]
    assert "not permitted" in tool_msgs[2] and "not allowed for this task" in tool_msgs[2]
    assert tool_msgs[3].startswith("ERROR")
    ops = await events_of(store, tid, "op.result")
    assert [o["status"] for o in ops[:4]] == ["failed"] * 4
    assert [o["error_class"] for o in ops[:3]] == ["malformed", "not_permitted", "not_permitted"]
    assert not (tmp_path / "x").exists()
    # Bad JSON and wrong argument types both count as malformed calls.
    assert (await store.get_task(tid)).usage["malformed_calls"] == 2


async def test_need_help_and_max_rounds_wait_with_a_reason(
    store: MemoryStore, tmp_path: Path
) -> None:
    model = ScriptedModel(["NEED_HELP: I need the API token for the ticket system."])
    tid, result = await run_task(store, spec_of(2), tmp_path, model)
    assert result.status == "waiting"
    task = await store.get_task(tid)
    assert task.waiting is not None and "API token" in task.waiting["reason"]

    store2 = await MemoryStore.open()

    def stuck(_: ModelRequest) -> ModelResponse:
        return ModelResponse("thinking", (tool_call("list_files"),))

    spec = spec_of(2, limits={"max_rounds": 4, "no_progress_rounds": 100})
    tid2, result2 = await run_task(store2, spec, tmp_path, ScriptedModel(policy=stuck))
    assert result2.status == "waiting"
    task2 = await store2.get_task(tid2)
    assert task2.waiting is not None and "max_rounds" in task2.waiting["reason"]
    assert task2.usage["rounds"] == 4


async def test_completion_check_failures_become_work(store: MemoryStore, tmp_path: Path) -> None:
    reviews = iter(['{"passed": false, "gaps": ["i2 has the wrong text"], "reopen": ["i2"]}',
                    '{"passed": true}'])  # fmt: skip
    written: list[str] = []

    def actor(request: ModelRequest) -> ModelResponse:
        resp = honest_actor(request)
        for c in resp.tool_calls:
            written.append(str((c.arguments or {}).get("path")))
        return resp

    spec = spec_of(
        2,
        review=True,
        acceptance=[
            {
                "id": "both",
                "description": "both files",
                "check": {"command": "test -f out/i1.txt && test -f out/i2.txt"},
            }
        ],
    )
    model = ScriptedModel(
        policy=by_purpose(act=actor, judge=lambda r: "{}", review=lambda r: next(reviews))
    )
    tid, result = await run_task(store, spec, tmp_path, model, judge=None, review=model)
    assert result.status == "satisfied"
    checks = await events_of(store, tid, "completion.checked")
    assert [c["passed"] for c in checks] == [False, True]
    assert checks[0]["gaps"] == ["i2 has the wrong text"]
    assert written.count("out/i2.txt") == 2  # reopened by the reviewer, then redone


async def test_different_failing_calls_are_no_attempts_and_a_few_are_news(
    store: MemoryStore, tmp_path: Path
) -> None:
    """A different missing file every round: never the same failure (no attempt, never
    non-convergent). The first meets a wall new to the item ("no such file: <the path>")
    and the next few the same wall (`FRESH_FAILURES`, as an honest agent guessing a
    path): news; then nothing moves the item: blocked after `no_progress_rounds` more
    rounds at the default limits."""
    tries = {"n": 0}

    def actor(request: ModelRequest) -> ModelResponse:
        text = request.messages[-1].content if request.messages else ""
        if "Next: i1" in text or len(request.messages) < 2:
            tries["n"] += 1  # a different missing file every time: not the same call
            return ModelResponse("try", (tool_call("read_file", path=f"missing-{tries['n']}.txt"),))
        return honest_actor(request)

    spec = spec_of(2)
    tid, result = await run_task(store, spec, tmp_path, ScriptedModel(policy=actor))
    state = (await store.get_ledger(tid)).to_ledger().item("i1")
    assert state.status == "blocked" and state.attempts == 0
    assert state.note.startswith(f"no progress in {spec.limits.no_progress_rounds} rounds")
    assert tries["n"] == 1 + P.FRESH_FAILURES + spec.limits.no_progress_rounds
    assert result.status == "waiting"  # the blocked item waits for a human decision
    assert (await store.get_task(tid)).waiting["kind"] == "decision"


async def test_a_lost_evidence_artifact_reopens_its_item_on_recovery(tmp_path: Path) -> None:
    import sqlite3

    from tether.store.sqlite import SQLiteStore

    db = tmp_path / "t.db"
    store = await SQLiteStore.open(db)
    spec = spec_of(2)
    tid, _first = await run_task(
        store, spec, tmp_path, ScriptedModel(policy=honest_actor), max_rounds_this_run=1
    )
    led = (await store.get_ledger(tid)).to_ledger()
    (ref,) = led.item("i1").evidence
    art = await store.get_artifact(ref.partition(":")[2])
    await store.close()
    # Someone deletes the evidence behind the ledger's back.
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM blobs WHERE hash = ?", (art.blob_hash,))
    store = await SQLiteStore.open(db)
    try:
        _, result = await run_task(
            store, spec, tmp_path, ScriptedModel(policy=honest_actor), task_id=tid
        )
        steps = {e["step"]: e["details"] for e in await events_of(store, tid, "recovery.step")}
        assert steps["artifacts"]["invalid"] == [art.artifact_id]
        assert steps["ledger"]["reopened"] == ["i1"]
        lost = await store.get_artifact(art.artifact_id)
        assert lost.valid is False
        # The journal says why it went to history, not only the recovery step's details.
        (inval,) = await events_of(store, tid, "artifacts.invalidated")
        assert inval["artifacts"] == [art.artifact_id] and inval["items"] == ["i1"]
        assert "missing from the store" in inval["reason"]
        assert "missing from the store" in lost.meta["invalidated"]["reason"]
        # The rule judge proved it again with fresh evidence, and the task delivered.
        assert result.status == "satisfied"
        led = (await store.get_ledger(tid)).to_ledger()
        assert led.item("i1").status == "done" and ref not in led.item("i1").evidence
    finally:
        await store.close()
