"""The memory store encodes an event holding containers when it is first read, from
its own copies of them taken at the commit: what is read is what was committed, however
the caller changes its containers (or reads) in between.

Each test builds the data the event had at its commit (`ev.encode` of a deep copy made
then) and compares what a later read gives with it.
"""

from __future__ import annotations

import copy
from typing import Any

from tether import events as ev
from tether import ledger as L
from tether.store.memory import MemoryStore


async def _store() -> MemoryStore:
    store = await MemoryStore.open()
    await store.create_task(
        task_id="t", name="t", spec={}, ledger=L.from_spec("o", [("a", "a", None)]), events=[]
    )
    return store


def _committed(event: ev.Event) -> tuple[str, dict[str, Any]]:
    """The event's type and data as of now (a deep copy, encoded)."""
    type_name, _, data = ev.encode(copy.deepcopy(event))
    return type_name, data


async def test_nested_containers_changed_after_the_commit_are_not_read() -> None:
    store = await _store()
    request: dict[str, Any] = {"ref": 2, "metadata": {"prefix": 9}, "tags": ["a"]}
    response: dict[str, Any] = {
        "text": "t",
        "tool_calls": [{"id": "c", "name": "n", "arguments": {"step": 1}}],
    }
    event = ev.ModelCalled(
        call_id="c", purpose="act", model="m", round=1, request=request, response=response
    )
    want = _committed(event)
    held = (event.request, event.response)  # (the top dicts: pydantic's copies)
    await store.commit("t", None, [event])
    request["metadata"]["prefix"] = 10
    request["tags"].append("b")
    response["tool_calls"][0]["arguments"]["step"] = 2
    response["tool_calls"].append({"id": "d"})
    del request["ref"]
    (got,) = await store.read_events("t")
    assert (got.type, got.data) == want
    assert got.data["request"]["metadata"] == {"prefix": 9}
    # The caller's event is left as it was: the store encoded its own copy.
    assert (event.request, event.response) == held
    assert event.request is held[0] and event.response is held[1]


async def test_lists_of_a_verdict_changed_after_the_commit_are_not_read() -> None:
    store = await _store()
    changes: list[Any] = [{"item": "a", "to": "done"}]
    judges, marks = ["rules"], ["m1"]
    verdict = ev.JudgeVerdict(
        round=1, decision="continue", changes=changes, judges=judges, marks=marks
    )
    intended_args: dict[str, Any] = {"step": 1, "path": ["x", "y"]}
    intended = ev.OpIntended(op_id="o", tool="t", args=intended_args, round=1)
    wants = [_committed(verdict), _committed(intended)]
    await store.commit("t", None, [verdict, intended])
    changes[0]["to"] = "open"
    changes.append("more")
    judges.clear()
    marks.append("m2")
    intended_args["path"].pop()
    intended_args["step"] = 2
    got = await store.read_events("t")
    assert [(e.type, e.data) for e in got] == wants


async def test_values_of_exact_types_are_read_with_their_types() -> None:
    store = await _store()
    args: dict[str, Any] = {"i": 1, "f": 1.0, "b": True, "n": None, "s": "1", "l": [0, 0.0, False]}
    event = ev.OpIntended(op_id="o", tool="t", args=args, round=1)
    want = _committed(event)
    await store.commit("t", None, [event])
    args.clear()
    (got,) = await store.read_events("t")
    assert (got.type, got.data) == want
    assert repr(got.data["args"]) == repr(want[1]["args"])


async def test_an_event_holding_a_tuple_is_encoded_at_its_commit() -> None:
    """Not plain JSON data: encoded at once (as a list), as before."""
    store = await _store()
    inner = ["x"]
    args: dict[str, Any] = {"pair": (1, inner)}
    event = ev.OpIntended(op_id="o", tool="t", args=args, round=1)
    want = _committed(event)
    await store.commit("t", None, [event])
    inner.append("y")
    args["pair"] = None
    (got,) = await store.read_events("t")
    assert (got.type, got.data) == want
    assert got.data["args"] == {"pair": [1, ["x"]]}


async def test_a_read_between_changes_gives_what_each_commit_held() -> None:
    store = await _store()
    args: dict[str, Any] = {"log": ["a"]}
    first = ev.OpIntended(op_id="o1", tool="t", args=args, round=1)
    wants = [_committed(first)]
    await store.commit("t", None, [first])
    args["log"].append("b")  # the same dict, changed, in the next event
    second = ev.OpIntended(op_id="o2", tool="t", args=args, round=2)
    wants.append(_committed(second))
    await store.commit("t", None, [second])
    args["log"].append("c")
    assert [(e.type, e.data) for e in await store.read_events("t")] == wants
    args["log"].clear()
    again = await store.read_events("t")
    assert [(e.type, e.data) for e in again] == wants
    assert [e.data["args"]["log"] for e in again] == [["a"], ["a", "b"]]
