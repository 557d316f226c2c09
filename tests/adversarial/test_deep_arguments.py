"""Tool arguments nested too deeply or too large (a model's answer, or its JSON text):
the call goes back to the model as unusable, as arguments that are not a JSON object
do, and the run goes on on every store. Before, nesting of a few hundred levels
overflowed the stack of a recursive walk (`RecursionError`) and stopped the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.adversarial import (
    act_requests,
    all_text,
    contract,
    first_then,
    nested,
    op_rule_items,
    say,
    write,
)
from tests.support.loop import run_task
from tether.models._sdk import decode_arguments
from tether.models.base import ModelResponse, ToolCall, clean_response
from tether.models.scripted import ScriptedModel, tool_call
from tether.spec_values import MAX_DEPTH, MAX_NODES, shape_problem
from tether.store.base import Store


def test_shape_problem_bounds_depth_and_size_without_recursion() -> None:
    assert shape_problem({"a": nested(MAX_DEPTH - 1)}) is None
    assert shape_problem({"a": nested(MAX_DEPTH + 1)}) == (
        f"are nested deeper than {MAX_DEPTH} levels"
    )
    assert shape_problem({"a": nested(100_000)}) is not None  # no RecursionError
    assert shape_problem({"a": list(range(MAX_NODES))}) is not None
    loop: list[Any] = []
    loop.append(loop)
    assert shape_problem({"a": loop}) is not None  # a cycle is too deep, not a hang


def test_a_response_with_deep_arguments_hands_the_model_an_error() -> None:
    resp = ModelResponse("x", (ToolCall("c1", "list_files", {"path": ".", "x": nested(500)}),))
    call = clean_response(resp).tool_calls[0]
    assert call.arguments is None
    assert call.error is not None and f"nested deeper than {MAX_DEPTH} levels" in call.error
    flat = ModelResponse("x", (ToolCall("c1", "list_files", {"path": ".", "x": [1, {"y": 2}]}),))
    assert clean_response(flat) is flat


def test_a_providers_deeply_nested_argument_text_is_not_json_to_the_model() -> None:
    text = '{"a":' + "[" * 100_000 + "]" * 100_000 + "}"
    args, raw, error = decode_arguments("list_files", text)
    assert args is None and raw == text
    assert error is not None and "nested too deeply" in error


async def test_deep_arguments_never_stop_a_run(store: Store, tmp_path: Path) -> None:
    spec = contract(op_rule_items("a"), limits={"max_rounds": 4})
    model = ScriptedModel(
        policy=first_then(
            say("looking", tool_call("list_files", path=".", extra=nested(500))),
            say("writing", write("a")),
        )
    )
    _, res = await run_task(store, spec, tmp_path, model)
    assert res.status == "satisfied", res
    assert f"nested deeper than {MAX_DEPTH} levels" in all_text(act_requests(model)[1])


def test_arguments_a_model_of_ones_own_hands_over_that_are_not_json_go_back_to_it() -> None:
    """The `Model` protocol is open: an adapter may hand over arguments of any type."""
    for arguments, why in (
        (["a"], "are not a JSON object"),
        ({1: "a", "path": "."}, "have a key that is not text"),
        ({"path": ".", "x": {2: "b"}}, "have a key that is not text"),
        ({"path": ".", "x": [{"a", "b"}]}, "hold a set, which is not JSON"),
        ({"path": ".", "x": b"raw"}, "hold a bytes, which is not JSON"),
    ):
        resp = ModelResponse("x", (ToolCall("c1", "list_files", arguments),))  # type: ignore[arg-type]
        call = clean_response(resp).tool_calls[0]
        assert call.arguments is None, arguments
        assert call.error is not None and why in call.error, (arguments, call.error)


async def test_arguments_that_are_not_json_never_stop_a_run(store: Store, tmp_path: Path) -> None:
    spec = contract(op_rule_items("a"), limits={"max_rounds": 4})
    actor = first_then(
        ModelResponse(
            "odd",
            (
                ToolCall("c1", "list_files", ["."]),  # type: ignore[arg-type]
                ToolCall("c2", "list_files", {1: "a", "path": "."}),  # type: ignore[dict-item]
            ),
        ),
        say("writing", write("a")),
    )

    _, res = await run_task(store, spec, tmp_path, ScriptedModel(policy=actor))
    assert res.status == "satisfied", res
