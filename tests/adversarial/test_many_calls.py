"""A response with more tool calls than a round runs (`limits.max_calls_per_round`):
the first ones run, the rest are left out before the response is journaled, the model
is told which, and the run goes on within its context budget — on every store.

Before the limit, 300 calls in one response stopped the run: their messages overflowed
the context, and compaction raised a budget error out of `Engine.run`."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from tests.support.adversarial import (
    act_requests,
    contract,
    first_then,
    op_rule_items,
    say,
    write,
)
from tests.support.loop import run_task
from tether import tokens
from tether.errors import SpecError
from tether.models.base import ToolCall
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.round import history
from tether.runtime.round.round_calls import admit_calls
from tether.spec import parse_spec
from tether.store.base import Store


def _reads(n: int, arg_chars: int = 10) -> list[object]:
    return [tool_call("read_file", path=f"notes/{i}-" + "p" * arg_chars) for i in range(n)]


async def _warnings(store: Store, task_id: str) -> list[dict[str, object]]:
    events = await store.read_events(task_id, types={"audit.warning"})
    return [e.data for e in events if e.data["code"] == "too_many_calls"]


async def test_thousands_of_calls_run_the_first_and_the_task_finishes(
    store: Store, tmp_path: Path
) -> None:
    spec = contract(op_rule_items("a"), models={"judge": "rules"})
    model = ScriptedModel(
        policy=first_then(say("reading everything", *_reads(2000)), say("writing", write("a")))
    )
    tid, res = await run_task(store, spec, tmp_path, model)
    assert res.status == "satisfied", res
    ops = await store.get_ops(tid)
    assert sum(o.tool == "read_file" for o in ops) == 64
    (warning,) = await _warnings(store, tid)
    assert warning["details"] == {"asked": 2000, "run": 64, "left_out": {"read_file": 1936}}
    # The model is told, in its own message as the context keeps it, what was not run.
    second = act_requests(model)[1]
    mine = next(m for m in second.messages if m.role == "assistant")
    assert len(mine.tool_calls) == 64
    assert "asked for 2000 tool calls; only the first 64 were run" in mine.content
    assert "read_file x1936" in mine.content
    # The journal holds the response the round ran (a resume or a replay sees the same).
    called = [e.data for e in await store.read_events(tid, types={"model.called"})]
    first_act = next(c for c in called if c["purpose"] == "act")
    response = history.called_response(first_act)
    assert response is not None and len(response["tool_calls"]) == 64
    # And the request the model saw next rebuilds from the store as it was sent.
    back, _ = await history.load_call(
        store, tid, [c for c in called if c["purpose"] == "act"][1]["call_id"]
    )
    assert json.dumps(back.to_dict(), sort_keys=True) == json.dumps(
        second.to_dict(), sort_keys=True
    )


async def test_calls_with_huge_arguments_still_fit_the_budget(store: Store, tmp_path: Path) -> None:
    """At the default limit, each call with 30,000 characters of arguments: the latest round is
    cut down further than one cut of 2,000 characters per part, and every request fits."""
    budget = 8000
    spec = contract(
        op_rule_items("a"),
        models={"judge": "rules"},
        context={"input_budget_tokens": budget},
    )
    # One call's argument is not text: a list whose JSON is 60,000 characters long.
    calls = [*_reads(63, 30_000), tool_call("read_file", path="n", lines=list(range(12_000)))]
    model = ScriptedModel(policy=first_then(say("x" * 50_000, *calls), say("writing", write("a"))))
    tid, res = await run_task(store, spec, tmp_path, model)
    assert res.status == "satisfied", res
    acts = act_requests(model)
    assert len(acts) == 2
    assert tokens.estimate_request(acts[1]) <= budget
    # What an adapter sends as the arguments object is cut too, not only their text.
    sent = [c for m in acts[1].messages for c in m.tool_calls]
    assert len(sent) == 64
    assert sum(len(json.dumps(c.arguments)) for c in sent) < budget * 4
    assert not await _warnings(store, tid)
    assert sum(o.tool == "read_file" for o in await store.get_ops(tid)) == 64


async def test_the_limit_is_the_contracts(store: Store, tmp_path: Path) -> None:
    spec = contract(
        op_rule_items("a"), models={"judge": "rules"}, limits={"max_calls_per_round": 2}
    )
    calls = [*_reads(3), write("a")]
    model = ScriptedModel(policy=first_then(say("", *calls), say("again", write("a"))))
    tid, res = await run_task(store, spec, tmp_path, model)
    assert res.status == "satisfied", res
    ops = await store.get_ops(tid)
    assert [o.tool for o in ops].count("read_file") == 2
    assert [o.tool for o in ops].count("write_file") == 1
    (warning,) = await _warnings(store, tid)
    assert warning["details"] == {
        "asked": 4,
        "run": 2,
        "left_out": {"read_file": 1, "write_file": 1},
    }
    mine = next(m for m in act_requests(model)[1].messages if m.role == "assistant")
    # A response without text gets the note alone.
    assert mine.content.startswith("[tether: this response asked for 4 tool calls")


def test_admit_calls_leaves_a_usual_response_alone() -> None:
    response = say("hi", *_reads(3))
    assert admit_calls(response, 3, 1) == (response, [])
    shorter, warnings = admit_calls(say("hi", *_reads(30)), 3, 1)
    assert len(shorter.tool_calls) == 3 and [w.code for w in warnings] == ["too_many_calls"]
    assert shorter.text.startswith("hi\n\n[tether:")
    many_names = say("", *[tool_call(f"t{i}") for i in range(40)])
    shorter, _ = admit_calls(many_names, 1, 1)
    assert "t1, t2" in shorter.text and "19 more tools" in shorter.text


_paths = itertools.count()


def _call(id_: str, name: str = "read_file") -> ToolCall:
    """A call under this id, of a path no other call reads (one round's calls failing
    the same way would block the item)."""
    path = f"notes/{next(_paths)}.txt"
    return ToolCall(id_, name, {"path": path}, json.dumps({"path": path}))


def test_unusable_ids_are_replaced_by_distinct_ones() -> None:
    calls = [
        _call("call_1"),
        _call("call_1"),
        _call(""),
        _call("has space"),
        _call("i" * 200),
        _call("tether_7_5"),  # a model's id that looks like the runtime's
        _call("ok", "n" * 10_000),
    ]
    fixed, warnings = admit_calls(say("", *calls), 32, 7)
    ids = [c.id for c in fixed.tool_calls]
    assert ids[0] == "call_1" and ids[5] == "tether_7_5" and ids[6] == "ok"
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,128}", i) for i in ids)
    # A name no provider takes: cut to 64 characters, the call refused as malformed.
    assert len(fixed.tool_calls[6].name) == 64 and fixed.tool_calls[6].error
    (warning,) = warnings
    assert warning.code == "call_ids_replaced" and warning.details["replaced"] == 4


async def test_odd_call_ids_and_names_never_stop_a_run(store: Store, tmp_path: Path) -> None:
    """Repeated, empty and unusable ids, and a name of 100,000 characters (it stopped
    the run with a budget error before): the run goes on, and what is journaled pairs
    each result with one call."""
    spec = contract(op_rule_items("a"), models={"judge": "rules"})
    odd = [_call("same"), _call("same"), _call(""), _call("a b/c"), _call("c", "n" * 100_000)]
    model = ScriptedModel(policy=first_then(say("odd", *odd), say("writing", write("a"))))
    tid, res = await run_task(store, spec, tmp_path, model)
    assert res.status == "satisfied", res
    called = [e.data for e in await store.read_events(tid, types={"model.called"})]
    response = history.called_response(next(c for c in called if c["purpose"] == "act"))
    assert response is not None
    ids = [c["id"] for c in response["tool_calls"]]
    assert len(ids) == 5 and len(set(ids)) == 5 and "" not in ids
    second = act_requests(model)[1]
    results = [m.tool_call_id for m in second.messages if m.role == "tool"]
    assert sorted(results) == sorted(ids)


@pytest.mark.parametrize("value", [0, -1, 1001, "many"])
def test_the_limit_must_be_a_sensible_count(value: object) -> None:
    data = {
        "name": "x",
        "objective": "y",
        "items": [{"id": "a", "title": "a"}],
        "limits": {"max_calls_per_round": value},
    }
    with pytest.raises(SpecError, match="max_calls_per_round"):
        parse_spec(data)


async def test_an_honest_batch_of_calls_runs_whole(store: Store, tmp_path: Path) -> None:
    """An agent that writes 60 deliverables in one response (a real batcher) is not cut:
    every call runs, the task finishes in that round, and no warning is written."""
    ids = [f"f{n}" for n in range(60)]
    spec = contract(op_rule_items(*ids), models={"judge": "rules"})
    model = ScriptedModel(policy=lambda request: say("writing them all", *map(write, ids)))
    tid, res = await run_task(store, spec, tmp_path, model)
    assert res.status == "satisfied", res
    assert res.rounds == 1
    assert sum(o.tool == "write_file" for o in await store.get_ops(tid)) == 60
    assert not await _warnings(store, tid)


def test_a_name_providers_refuse_is_replaced_unless_it_is_a_tool_of_the_task() -> None:
    """`multi_tool_use.parallel` is no tool's: made usable and refused as malformed. A
    tool the task itself registered under such a name (offline, a scripted model) is
    kept: a provider would have refused its definition already."""
    odd = [_call("a", "multi_tool_use.parallel"), _call("b", "fs.read")]
    fixed, warnings = admit_calls(say("", *odd), 32, 3, {"fs.read"})
    first, second = fixed.tool_calls
    assert first.name == "multi_tool_use_parallel" and first.error
    assert "multi_tool_use.parallel" in first.error
    assert second is odd[1]
    (warning,) = warnings
    assert warning.code == "call_ids_replaced"
