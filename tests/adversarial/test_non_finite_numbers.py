"""NaN and infinities, which Python's JSON decoder takes and JSON has not: a provider's
tool arguments spelling `NaN` are refused back to the model as not JSON; a model plugged
in through the `Model` protocol that hands such floats over anyway never stops a run,
on any store (PostgreSQL's `json` refuses the token: they are stored as null there)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.support.adversarial import (
    assert_honest,
    contract,
    first_then,
    op_rule_items,
    say,
    write,
)
from tests.support.loop import run_task
from tether.models._sdk import decode_arguments
from tether.models.scripted import ScriptedModel, tool_call
from tether.store._rows import dumps, strict_dumps
from tether.store._sql import _dumps_no_nul
from tether.store.base import Store


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_providers_arguments_with_a_non_json_number_go_back_to_the_model(
    constant: str,
) -> None:
    args, raw, error = decode_arguments("list_files", f'{{"path": ".", "depth": {constant}}}')
    assert args is None
    assert raw == f'{{"path": ".", "depth": {constant}}}'
    assert error is not None
    assert f"{constant} is not a JSON number" in error
    assert "Call the tool again" in error


def test_strict_json_writes_non_finite_numbers_as_null_and_the_rest_as_dumps() -> None:
    value = {"a": [math.nan, 1.5, {"b": math.inf}], "c": (-math.inf, "NaN"), "d": 2}
    for encode in (strict_dumps, _dumps_no_nul):
        out = encode(value)
        assert json.loads(out, parse_constant=_refuse) == {
            "a": [None, 1.5, {"b": None}],
            "c": [None, "NaN"],
            "d": 2,
        }
    plain = {"a": [1.5, "x", None, True], "é": {"n": 10**20}}
    assert strict_dumps(plain) == dumps(plain)


def _refuse(name: str) -> None:
    raise AssertionError(f"{name} written")


async def test_non_finite_arguments_never_stop_a_run(store: Store, tmp_path: Path) -> None:
    spec = contract(op_rule_items("a"), limits={"max_rounds": 4})
    actor = first_then(
        say(
            "looking",
            tool_call("list_files", path=".", depth=math.nan),
            tool_call("list_files", path=".", limit=[math.inf, -math.inf]),
        ),
        say("writing", write("a")),
    )
    tid, res = await run_task(store, spec, tmp_path, ScriptedModel(policy=actor))
    assert res.status == "satisfied", res
    ops = await store.get_ops(tid)
    listed = [o for o in ops if o.tool == "list_files"]
    assert len(listed) == 2
    for event in await store.read_events(tid):
        json.dumps(event.data)  # readable back, whatever the store wrote
    await assert_honest(store, tid, spec)
