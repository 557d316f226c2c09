"""Deterministic replay (`tether.report.replay`, `tether replay`): a real run replays
clean on SQLite and PostgreSQL, a tampered recording diverges at the round it changed,
`--until` stops before it, and bad input is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import assert_clean_error, assert_ok, tether
from tests.support.loop import by_purpose, next_item, rules_judge, run_task, spec_of
from tests.support.old_logs import set_event_data, to_old_format
from tether import errors
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.report.calls import show_call
from tether.report.replay import replay_task
from tether.runtime.round import history
from tether.runtime.run.model_calls import inline_response
from tether.store.base import Store

from ..conftest import Backend


def _reader(request: ModelRequest) -> ModelResponse:
    """Reads a file, then writes the Next item's file; done when nothing is open."""
    nxt = next_item(request)
    if nxt is None:
        return ModelResponse("closed")
    return ModelResponse(
        f"reading then writing {nxt}",
        (
            tool_call("read_file", path="notes.txt"),
            tool_call("write_file", path=f"out/{nxt}.txt", content=nxt),
        ),
    )


async def _recorded_run(store: Store, ws: Path, *, judge: bool = False) -> str:
    (ws / "notes.txt").write_text("some notes\n")
    model = ScriptedModel(policy=by_purpose(act=_reader, judge=rules_judge))
    tid, result = await run_task(store, spec_of(3), ws, model, judge=model if judge else None)
    assert result.status == "satisfied"
    return tid


def _seq_of(events: list[Any], type_: str, **match: Any) -> int:
    return next(
        e.seq
        for e in events
        if e.type == type_ and all(e.data.get(k) == v for k, v in match.items())
    )


async def _tamper_response(backend: Backend, store: Store, task_id: str, call: int) -> int:
    """Make the recorded answer of act call `call` write another file (in the form the
    call is stored in: inline, or the blob of an older tether's log); returns the seq of
    the round's first op intent (where the replay must diverge)."""
    events = await store.read_events(task_id)
    seq = _seq_of(events, "model.called", call_id=f"{task_id}.act.{call}")
    called = next(e for e in events if e.seq == seq)
    forged = ModelResponse(
        "writing something else", (tool_call("write_file", path="x.txt", content="x"),)
    )
    if called.data.get("response") is not None:
        data = {**called.data, "response": inline_response(forged, called.data["model"])}
    else:
        blob = await store.put_blob(json.dumps(forged.to_dict(), sort_keys=True).encode())
        data = {**called.data, "response_blob": blob}
    set_event_data(backend, task_id, seq, data)
    return _seq_of(events, "op.intended", round=called.data["round"])


async def test_a_real_run_replays_clean(sql_backend: Backend, tmp_path: Path) -> None:
    store = await sql_backend.open()
    try:
        tid = await _recorded_run(store, tmp_path)
        before = await store.read_events(tid)
        result = await replay_task(store, tid)
        assert result.divergence is None, result.divergence
        assert result.rounds == 3
        decisions = [e for e in before if not e.type.startswith("lease.")]
        assert result.events == len(decisions)
        # Nothing was written to the recording, and no tool ran again.
        assert await store.read_events(tid) == before
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
            "i1.txt",
            "i2.txt",
            "i3.txt",
        ]
    finally:
        await store.close()


async def test_a_run_with_an_llm_judge_replays_clean(tmp_path: Path) -> None:
    from tether.store.memory import MemoryStore

    store = MemoryStore()
    tid = await _recorded_run(store, tmp_path, judge=True)
    calls = await store.read_events(tid, types={"model.called"})
    assert {c.data["purpose"] for c in calls} == {"act", "judge"}
    result = await replay_task(store, tid)
    assert result.divergence is None, result.divergence
    assert result.rounds == 3


async def test_an_edited_response_diverges_at_its_round(
    sql_backend: Backend, tmp_path: Path
) -> None:
    store = await sql_backend.open()
    try:
        tid = await _recorded_run(store, tmp_path)
        at = await _tamper_response(sql_backend, store, tid, call=2)
        result = await replay_task(store, tid)
        d = result.divergence
        assert d is not None
        assert (d.round, d.seq) == (2, at)
        assert result.rounds == 1
        assert d.recorded["args"]["path"] == "out/i2.txt"
        assert d.replayed["args"]["path"] == "x.txt"
    finally:
        await store.close()


async def _what_reads_back(store: Store, tid: str) -> dict[str, Any]:
    """Each call's request and response (`load_call`, `show_call`) and the history."""
    calls = await store.read_events(tid, types={"model.called"})
    shown = [await show_call(store, tid, c.data["call_id"]) for c in calls]
    loaded = [await history.load_call(store, tid, c.data["call_id"]) for c in calls]
    entries = await history.load_entries(store, tid, snapshot=None, after_seq=0)
    return {
        "shown": [{**s, "call": {k: v for k, v in s["call"].items() if k != "seq"}} for s in shown],
        "loaded": [(r.to_dict(), ModelResponse.from_dict(d)) for r, d in loaded],
        "entries": [(e.kind, e.round, [m.to_dict() for m in e.messages]) for e in entries],
    }


async def test_an_old_format_recording_reads_and_replays_clean(
    sql_backend: Backend, tmp_path: Path
) -> None:
    """A log an older tether wrote (each response a blob, each round's messages naming
    it) reads back as the same calls and history, replays clean, and a tampered answer
    in it still diverges at its round."""
    store = await sql_backend.open()
    try:
        tid = await _recorded_run(store, tmp_path, judge=True)
        new = await _what_reads_back(store, tid)
        assert await to_old_format(sql_backend, store, tid) == 3
        calls = [e.data for e in await store.read_events(tid, types={"model.called"})]
        assert calls and all(c["response_blob"] and not c["response"] for c in calls)
        assert {c["purpose"] for c in calls} == {"act", "judge"}
        rounds = await store.read_events(tid, types={"round.committed"})
        assert all(r.data["messages"]["ref"] == history.ROUND_REF_BLOB for r in rounds)
        assert await _what_reads_back(store, tid) == new
        result = await replay_task(store, tid)
        assert result.divergence is None, result.divergence
        assert result.rounds == 3
        second = [c["call_id"] for c in calls if c["purpose"] == "act"][1]
        at = await _tamper_response(sql_backend, store, tid, call=int(second.split(".")[-1]))
        d = (await replay_task(store, tid)).divergence
        assert d is not None and (d.round, d.seq) == (2, at)
        assert d.replayed["args"]["path"] == "x.txt"
    finally:
        await store.close()


async def test_an_edited_op_result_diverges_at_its_round(
    sql_backend: Backend, tmp_path: Path
) -> None:
    store = await sql_backend.open()
    try:
        tid = await _recorded_run(store, tmp_path)
        events = await store.read_events(tid)
        seq = _seq_of(events, "op.result", op_id=f"{tid}.r3.c1")
        result_event = next(e for e in events if e.seq == seq)
        failed = {"status": "failed", "error_class": "deterministic"}
        forged = {**result_event.data, **failed, "error": "disk full", "summary": "disk full"}
        set_event_data(sql_backend, tid, seq, forged)
        d = (await replay_task(store, tid)).divergence
        assert d is not None
        # The forged failure itself is replayed as recorded; what the runtime made of
        # it (the tool message the model reads, then the verdict) is not what it wrote.
        assert d.round == 3
        assert d.seq is not None and d.seq > seq
    finally:
        await store.close()


async def test_a_changed_audit_rule_diverges_at_the_first_verdict_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tether.runtime.judge import audit as judge
    from tether.store.memory import MemoryStore

    store = MemoryStore()
    tid = await _recorded_run(store, tmp_path)
    original, audits = judge.audit, 0

    def stricter(*args: Any, **kwargs: Any) -> Any:
        # The changed rule: the second audit accepts none of the judges' proposals.
        nonlocal audits
        audits += 1
        if audits == 2:
            args = (args[0], (), *args[2:])
        return original(*args, **kwargs)

    monkeypatch.setattr(judge, "audit", stricter)
    result = await replay_task(store, tid)
    d = result.divergence
    assert d is not None
    events = await store.read_events(tid)
    assert (d.round, d.seq) == (2, _seq_of(events, "judge.verdict", round=2))
    assert result.rounds == 1
    assert [c["after"] for c in d.recorded["changes"] if c["field"] == "status"] == ["done"]
    assert not [c for c in d.replayed["changes"] if c["field"] == "status"]


async def test_until_stops_before_a_later_divergence(tmp_path: Path) -> None:
    from tether.store.sqlite import SQLiteStore

    path = tmp_path / "t.db"
    backend = Backend("sqlite", f"sqlite:///{path}", path=path)
    store = await SQLiteStore.open(path)
    try:
        tid = await _recorded_run(store, tmp_path)
        await _tamper_response(backend, store, tid, call=3)
        events = await store.read_events(tid)
        end_of_round_2 = _seq_of(events, "judge.verdict", round=2)
        early = await replay_task(store, tid, until=end_of_round_2)
        assert early.divergence is None, early.divergence
        assert (early.rounds, early.until) == (2, end_of_round_2)
        assert (await replay_task(store, tid)).divergence is not None
    finally:
        await store.close()


async def test_bad_input_is_a_user_error(tmp_path: Path) -> None:
    from tether.store.memory import MemoryStore

    store = MemoryStore()
    tid = await _recorded_run(store, tmp_path)
    last = (await store.get_task(tid)).last_seq
    with pytest.raises(errors.TaskNotFound):
        await replay_task(store, "nope")
    for until in (0, last + 1):
        with pytest.raises(errors.UserError, match=f"events 1 to {last}"):
            await replay_task(store, tid, until=until)


@pytest.fixture
def recorded_db(tmp_path: Path) -> tuple[Path, str, str]:
    """A finished task in a SQLite file: (folder, db url, task id)."""
    import asyncio

    from tether.store import open_store

    url = f"sqlite:///{tmp_path}/t.db"

    async def go() -> str:
        store = await open_store(url)
        try:
            return await _recorded_run(store, tmp_path)
        finally:
            await store.close()

    return tmp_path, url, asyncio.run(go())


def test_cli_replay_clean_tampered_and_bad_input(recorded_db: tuple[Path, str, str]) -> None:
    import asyncio

    from tether.store import open_store

    root, url, tid = recorded_db
    clean = tether("replay", tid, "--db", url, cwd=root)
    assert_ok(clean)
    assert "replay matched: 3 rounds" in clean.stdout
    assert "not checked:" in clean.stdout

    async def tamper() -> None:
        store = await open_store(url)
        try:
            path = Path(url.removeprefix("sqlite:///"))
            await _tamper_response(Backend("sqlite", url, path=path), store, tid, call=2)
        finally:
            await store.close()

    asyncio.run(tamper())
    diverged = tether("replay", tid, "--db", url, cwd=root)
    assert diverged.returncode == 1, diverged.stdout + diverged.stderr
    assert "replay diverged at round 2" in diverged.stdout
    assert "x.txt" in diverged.stdout and "out/i2.txt" in diverged.stdout
    as_json = tether("replay", tid, "--db", url, "--json", cwd=root)
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["divergence"]["round"] == 2

    # An unknown task is exit 3, like every command (docs/operations.md).
    assert_clean_error(tether("replay", "nope", "--db", url, cwd=root), 3, "nope")
    assert_clean_error(
        tether("replay", tid, "--db", url, "--until", "100000", cwd=root), 2, "--until 100000"
    )


async def test_a_run_with_an_approval_replays_clean_through_the_decision(tmp_path: Path) -> None:
    from tether import approvals
    from tether.store.memory import MemoryStore
    from tether.tools.builtin.files import default_registry

    from .test_approval_required import Payments, run, setup

    store = MemoryStore()
    pay = Payments()
    tid, first = await run(store, None, pay, tmp_path)
    assert first.status == "waiting"
    (req,) = await approvals.pending(store, tid)
    await approvals.decide(store, tid, req.request_id, "approve", by="ana")
    _, done = await run(store, tid, pay, tmp_path)
    assert done.status == "satisfied" and len(pay.refunds) == 1
    registry = default_registry(lambda: store)
    registry.add(setup(pay))

    result = await replay_task(store, tid, registry=registry)
    assert result.divergence is None, result.divergence
    assert result.stopped_at is None
    assert result.events == len([e for e in await store.read_events(tid) if "lease" not in e.type])
    # The stand-in answered; the real tool was neither asked nor run again.
    assert (pay.asked, len(pay.refunds)) == (1, 1)

    # Up to just before the decision, the replay stops where the task waited.
    decided = _seq_of(await store.read_events(tid), "approval.decided")
    early = await replay_task(store, tid, until=decided - 1, registry=registry)
    assert early.divergence is None and early.rounds == 0


async def test_the_demo_replays_clean_through_the_waiver(tmp_path: Path) -> None:
    ran = tether("demo", "--dir", tmp_path / "demo", cwd=tmp_path, timeout=300)
    assert_ok(ran)
    db = f"sqlite:///{tmp_path}/demo/.tether/tether.db"
    (task,) = json.loads(tether("list", "--db", db, "--json", cwd=tmp_path).stdout)
    replayed = tether("replay", task["task_id"], "--db", db, "--json", cwd=tmp_path)
    assert_ok(replayed)
    doc = json.loads(replayed.stdout)
    assert doc["ok"] and doc["divergence"] is None and doc["stopped_at"] is None
    assert doc["rounds_matched"] > 50
    timeline = json.loads(
        tether("events", task["task_id"], "--db", db, "--json", cwd=tmp_path).stdout
    )
    assert "item.waived" in {e["type"] for e in timeline}
    assert doc["until"] == timeline[-1]["seq"]
