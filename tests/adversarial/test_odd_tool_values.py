"""What a tool's own code hands back when it misbehaves — a value nested deeper than
the JSON encoder goes, a value that holds itself, an exception whose `__str__` raises
— is the tool's failure or an odd output, never the run's end, on every store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.adversarial import contract, nested, say
from tests.support.loop import run_task
from tether import ToolRegistry, tool
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.store.base import Store
from tether.text import exc_text
from tether.tools.registry import render_result


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no words")


def test_exc_text_says_what_it_can() -> None:
    assert exc_text(ValueError("bad \ud800")) == "bad \ufffd"
    assert exc_text(ValueError()) == "ValueError"
    assert exc_text(_Unprintable()) == "_Unprintable"


def test_render_result_shows_any_value() -> None:
    loop: list[Any] = []
    loop.append(loop)
    assert render_result(loop) == "[[...]]"
    deep = render_result(nested(100_000))
    assert deep.startswith("(a value nested too deeply to show: [[[")
    assert len(deep) < 1000


async def test_misbehaving_tool_values_never_stop_a_run(store: Store, tmp_path: Path) -> None:
    @tool(effect="read")
    def deep_value(n: int) -> Any:
        """A value nested 100,000 levels deep."""
        return nested(100_000)

    @tool(effect="read")
    def unprintable_failure(n: int) -> str:
        """Raises an exception whose text cannot be had."""
        raise _Unprintable

    spec = contract(
        [{"id": "a", "title": "look around"}],
        tools=["deep_value", "unprintable_failure"],
        models={"judge": "rules"},
        limits={"max_rounds": 3, "no_progress_rounds": 100, "max_attempts_per_item": 100},
    )
    rounds = 0

    def actor(request: ModelRequest) -> ModelResponse:
        nonlocal rounds
        rounds += 1
        return say(
            "trying",
            tool_call("deep_value", n=rounds),
            tool_call("unprintable_failure", n=rounds),
        )

    tid, res = await run_task(
        store,
        spec,
        tmp_path,
        ScriptedModel(policy=actor),
        registry=ToolRegistry([deep_value, unprintable_failure]),
    )
    assert rounds == 3
    assert res.status == "waiting", res
    ops = await store.get_ops(tid)
    deep = [o for o in ops if o.tool == "deep_value"]
    assert len(deep) == 3 and all(o.status == "succeeded" for o in deep)
    assert all("nested too deeply" in str((o.result or {}).get("content")) for o in deep)
    failed = [o for o in ops if o.tool == "unprintable_failure"]
    assert len(failed) == 3 and all(o.status == "failed" for o in failed)
    assert all("_Unprintable" in str(o.error) for o in failed)
