"""The memory store keeps what a commit gave it, whatever the caller does afterwards.

It avoids work where it can (issue 22): an event whose fields are all immutable is
encoded when first read, not at its commit. These tests pin what no such shortcut may
change (and what one that shares the run state's containers between commits would have
to keep): a later change of the caller's objects is not a change of the store, a value
is stored with its exact types, and a read gives what was committed, in order.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tether import events as ev
from tether import ledger as L
from tether.store.base import OpRecord, StoredEvent, TaskPatch
from tether.store.memory import MemoryStore


async def _store() -> MemoryStore:
    store = await MemoryStore.open()
    await store.create_task(
        task_id="t", name="t", spec={}, ledger=L.from_spec("o", [("a", "a", None)]), events=[]
    )
    return store


async def _usage(store: MemoryStore, usage: dict[str, Any]) -> dict[str, Any]:
    await store.commit("t", None, [], task=TaskPatch(usage=usage))
    return (await store.get_task("t")).usage


async def test_a_container_changed_in_place_is_stored_as_it_is_now() -> None:
    store = await _store()
    usage: dict[str, Any] = {"rounds": 1, "keys": {"k": 1}, "log": [[1, "a"]]}
    assert await _usage(store, usage) == {"rounds": 1, "keys": {"k": 1}, "log": [[1, "a"]]}
    usage["keys"]["k"] = 2  # the caller's own container, sent again the next commit
    usage["log"][0].append("b")
    assert await _usage(store, usage) == {"rounds": 1, "keys": {"k": 2}, "log": [[1, "a", "b"]]}
    usage["keys"]["k"] = 3  # after the commit: not stored
    usage["log"].clear()
    assert (await store.get_task("t")).usage == {
        "rounds": 1,
        "keys": {"k": 2},
        "log": [[1, "a", "b"]],
    }


@pytest.mark.parametrize(
    ("first", "then"),
    [
        ({"a": 1}, {"a": 1.0}),
        ({"a": 1}, {"a": True}),
        ({"a": 0.0}, {"a": -0.0}),
        ([1, 2], [1.0, 2]),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
    ],
)
async def test_an_equal_value_of_other_types_is_stored_with_its_types(
    first: Any, then: Any
) -> None:
    store = await _store()
    await _usage(store, {"x": first})
    got = (await _usage(store, {"x": then}))["x"]
    assert repr(got) == repr(then)


async def test_a_tuple_is_stored_as_a_list_and_a_set_refused_after_an_equal_list() -> None:
    store = await _store()
    await _usage(store, {"x": [1, 2]})
    assert (await _usage(store, {"x": (1, 2)}))["x"] == [1, 2]
    assert type((await store.get_task("t")).usage["x"]) is list
    with pytest.raises(TypeError):
        await store.commit("t", None, [], task=TaskPatch(usage={"x": {1, 2}}))
    assert (await store.get_task("t")).usage == {"x": [1, 2]}


async def test_a_record_changed_by_its_reader_does_not_outlive_the_next_commit() -> None:
    store = await _store()
    usage: dict[str, Any] = {"keys": {"k": 1}}
    await _usage(store, usage)
    (await store.get_task("t")).usage["keys"]["k"] = 99  # a reader's bug
    assert await _usage(store, usage) == {"keys": {"k": 1}}


async def test_an_op_is_stored_apart_from_the_caller_s_containers() -> None:
    """The op's JSON fields are copied into the merged record: what the caller changes
    after the commit is not stored, and a later write keeps the stored args."""
    store = await _store()
    args: dict[str, Any] = {"step": 1, "tags": ["a"]}
    op = OpRecord("o1", "t", 1, 0, "tool", args, "h", "write", "intended")
    await store.commit("t", None, [], ops=[op])
    args["tags"].append("b")
    (first,) = await store.get_ops("t")
    assert first.args == {"step": 1, "tags": ["a"]} and first.result is None
    result: dict[str, Any] = {"content": "x", "items": [1]}
    error: dict[str, Any] = {"class": "E", "notes": ["n"]}
    done = dataclasses.replace(
        op, args={"other": True}, status="failed", attempts=1, result=result, error=error
    )
    await store.commit("t", None, [], ops=[done])
    result["items"].append(2)
    error["notes"].clear()
    (stored,) = await store.get_ops("t")
    assert stored.args == {"step": 1, "tags": ["a"]}
    assert stored.result == {"content": "x", "items": [1]}
    assert stored.error == {"class": "E", "notes": ["n"]}
    assert (stored.status, stored.attempts) == ("failed", 1)
    assert stored.args is not args and stored.result is not result and stored.error is not error


async def test_events_read_back_as_committed_in_order() -> None:
    store = await _store()
    args: dict[str, Any] = {"step": 1, "tags": ["a"]}
    events: list[ev.Event] = [
        ev.RoundStarted(round=1, turn=1),  # immutable fields only: encoded when read
        ev.OpIntended(op_id="o1", tool="t", args=args, round=1),  # holds the caller's dict
        ev.ModelCalled(call_id="c", purpose="act", model="m", round=1),
        ev.ModelCalled(call_id="d", purpose="act", model="m", round=1, request={"x": [1]}),
    ]
    result = await store.commit("t", None, events)
    args["step"] = 2
    args["tags"].append("b")
    stored = await store.read_events("t")
    assert [e.seq for e in stored] == list(range(result.first_seq, result.last_seq + 1))
    assert [(e.type, e.data) for e in stored] == [ev.encode(e)[::2] for e in events[:1]] + [
        ("op.intended", {**ev.encode(events[1])[2], "args": {"step": 1, "tags": ["a"]}}),
        ev.encode(events[2])[::2],
        ev.encode(events[3])[::2],
    ]
    await store.commit("t", None, [ev.RoundStarted(round=2, turn=1)])
    again = await store.read_events("t", after=result.last_seq)
    assert [(e.type, e.data["round"]) for e in again] == [("round.started", 2)]
    assert await store.read_events("t", limit=len(stored)) == stored


async def test_an_event_the_store_cannot_write_is_refused_at_the_commit() -> None:
    store = await _store()
    with pytest.raises(TypeError, match="UnknownEvent"):
        await store.commit("t", None, [ev.RoundStarted(round=1, turn=1), ev.UnknownEvent()])
    assert await store.read_events("t") == []
    assert (await store.get_task("t")).last_seq == 0


async def test_a_stored_event_is_the_record_its_class_makes() -> None:
    store = await _store()
    await store.commit("t", None, [ev.RoundStarted(round=1, turn=2)])
    (got,) = await store.read_events("t")
    want = StoredEvent("t", 1, "round.started", ev.EVENT_SCHEMA_VERSION, got.data, 1, None, got.at)
    assert got == want and vars(got) == vars(want)
    assert got.data == {"round": 1, "turn": 2, "item": None}
