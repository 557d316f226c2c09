"""The shorter stored forms of events and op results (issue 22) read back as written.

The SQL stores leave an event's fields at their plain defaults out of its row and keep
an op result's summary that starts its content as a length; every store must still
hand back the data `ev.encode` gave and the record that was written, and rows written
whole (by an older tether) must load as they are.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tests.integration.test_store_conformance import ALL_KINDS, inject_event, op_record
from tether import events as ev
from tether.store import Store
from tether.store import _rules as rules

if TYPE_CHECKING:
    from conftest import Backend, MakeTask

OUTPUT = "step 1 done. " + "word " * 300


def _with_defaults(event: ev.Event) -> list[ev.Event]:
    """`event`, and the same with each optional field at its default spelled out."""
    return [event, type(event).model_validate(event.data())]


async def test_events_read_back_as_encoded(
    backend: Backend, store: Store, make_task: MakeTask
) -> None:
    await make_task("t", events=[])
    called = ev.ModelCalled(call_id="c", purpose="act", model="m", request_blob=None)
    events = [*ALL_KINDS, called]
    await store.commit("t", None, events)
    stored = await store.read_events("t")
    for s, e in zip(stored, events, strict=True):
        data = ev.encode(e)[2]
        assert s.data == data
        if backend.kind != "postgres":  # (jsonb keeps keys in its own order)
            assert list(s.data) == list(data)  # in field order too
        assert s.typed() == e


async def test_sqlite_rows_leave_default_fields_out(
    backend: Backend, store: Store, make_task: MakeTask
) -> None:
    # (PostgreSQL writes its event rows in its own statement, whole.)
    if backend.kind != "sqlite":
        return
    await make_task("t", events=[])
    called = ev.ModelCalled(call_id="c", purpose="act", model="m", input_tokens=3)
    await store.commit("t", None, [called])
    conn = backend.raw()
    try:
        raw = conn.execute("SELECT data FROM events WHERE type = 'model.called'").fetchone()[0]
    finally:
        conn.close()
    row = raw if isinstance(raw, dict) else json.loads(raw)
    assert row == {"call_id": "c", "purpose": "act", "model": "m", "input_tokens": 3}


async def test_old_whole_event_rows_load(
    backend: Backend, store: Store, make_task: MakeTask
) -> None:
    await make_task("t")
    whole = ev.encode(ev.ModelCalled(call_id="c", purpose="act", model="m"))[2]
    inject_event(backend, store, "t", 2, "model.called", whole)
    older = {"call_id": "c", "purpose": "act", "model": "m", "latency_ms": 1.5}
    inject_event(backend, store, "t", 3, "model.called", older)
    got = await store.read_events("t")
    assert got[1].data == whole
    assert got[2].typed() == ev.ModelCalled(call_id="c", purpose="act", model="m", latency_ms=1.5)


async def test_op_results_read_back_as_written(store: Store, make_task: MakeTask) -> None:
    await make_task("t", events=[])
    results: list[dict[str, Any] | None] = [
        {"summary": OUTPUT[:200], "content": OUTPUT, "artifact_id": None},
        {"summary": OUTPUT, "content": OUTPUT},
        {"summary": "", "content": OUTPUT},
        {"summary": "not the start", "content": OUTPUT},
        {"content": OUTPUT},
        {"summary": 3, "other": 1},
        None,
    ]
    ops = [
        op_record("t", f"o{i}", idx=i, status="succeeded", result=r) for i, r in enumerate(results)
    ]
    await store.commit("t", None, [], ops=ops)
    got = {o.op_id: o.result for o in await store.get_ops("t")}
    assert [got[f"o{i}"] for i in range(len(results))] == results


def test_op_result_stored_forms() -> None:
    result = {"summary": OUTPUT[:200], "content": OUTPUT, "artifact_id": None}
    stored = rules.op_result_stored(result)
    assert stored == {"summary": 200, "content": OUTPUT, "artifact_id": None}
    assert rules.op_result_read(stored) == result
    # A row written whole before the summary was shortened loads as it is.
    assert rules.op_result_read(dict(result)) == result
    assert rules.op_result_read(None) is None
    assert rules.op_result_stored({"summary": "x", "content": "y"}) == {
        "summary": "x",
        "content": "y",
    }


def test_compact_and_expand_invert_for_every_event_type() -> None:
    for event in ALL_KINDS:
        for e in _with_defaults(event):
            t, _, data = ev.encode(e)
            small = rules.compact(t, data)
            assert len(json.dumps(small)) <= len(json.dumps(data))
            back = rules.expand(t, json.loads(json.dumps(small)))
            assert back == data and list(back) == list(data)
            assert ev.decode(t, back) == e
    # A value equal to a default but of another JSON type is kept.
    assert rules.compact("model.called", {"call_id": "c", "tool_calls": False}) == {
        "call_id": "c",
        "tool_calls": False,
    }
    # Unknown types and fields pass through; a default list is a fresh one each time.
    assert rules.expand("future.thing", {"a": 1}) == {"a": 1}
    assert rules.expand("round.started", {"round": 1, "turn": 1, "new": 2})["new"] == 2
    a = rules.expand("judge.verdict", {"round": 1, "decision": "continue"})
    b = rules.expand("judge.verdict", {"round": 1, "decision": "continue"})
    assert a["changes"] == [] and a["changes"] is not b["changes"]
