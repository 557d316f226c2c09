"""A context budget no compaction can fit: the task waits for a person, told what takes
the room (the largest tools by name, with their estimated tokens) and the command that
raises the budget, and goes on after that edit — on every store. Before, a `UserError`
came out of `Engine.run` and left the task `running`, to fail the same way at every
claim."""

from __future__ import annotations

from pathlib import Path

from tests.support.adversarial import (
    act_requests,
    contract,
    op_rule_items,
    plain_items,
    say,
    write,
)
from tests.support.loop import run_task
from tether import ToolRegistry
from tether.edits import edit_task
from tether.models.base import ModelRequest, ModelResponse, Usage
from tether.models.scripted import ScriptedModel
from tether.store.base import Store
from tether.tools.registry import Tool


async def test_a_tool_that_fills_the_budget_makes_the_task_wait(
    store: Store, tmp_path: Path
) -> None:
    def manual(args: object, ctx: object) -> str:
        return "ok"

    huge = Tool(
        name="manual",
        description="How to use this tool. " * 20_000,
        parameters={"type": "object", "properties": {}},
        fn=manual,
        effect="read",
    )
    spec = contract(plain_items("a"), models={"judge": "rules"}, tools=["manual"])
    model = ScriptedModel(policy=lambda request: say("NEED_HELP: nothing to do"))
    tid, result = await run_task(store, spec, tmp_path, model, registry=ToolRegistry([huge]))
    assert result.status == "waiting" and not model.requests
    reason = (result.waiting or {})["reason"]
    assert "the context budget of 32000 tokens is too small" in reason
    assert "largest: manual ~" in reason and "Allow fewer or smaller tools" in reason
    assert f"tether edit {tid} --set context.input_budget_tokens=" in reason
    task = await store.get_task(tid)
    assert task.status == "waiting" and task.stop_reason is None
    # The edit the message names queues the task, and the next run gets to the model.
    await edit_task(store, tid, {"context": {"input_budget_tokens": 400_000}})
    _, again = await run_task(
        store, spec, tmp_path, model, registry=ToolRegistry([huge]), task_id=tid
    )
    assert model.requests and again.status == "waiting"
    assert "nothing to do" in (again.waiting or {})["reason"]  # the model's own request


async def test_a_provider_counting_far_above_the_estimate_makes_the_task_wait(
    store: Store, tmp_path: Path
) -> None:
    """A provider (or an adapter) that reports three times the estimated input tokens:
    the calibrated requests cannot fit a small budget; the task waits, told about the
    ratio, with nothing of its rounds lost."""
    spec = contract(
        op_rule_items("a", "b"),
        models={"judge": "rules"},
        context={"input_budget_tokens": 1500, "preview_chars": 200},
    )

    def inflated(request: ModelRequest) -> ModelResponse:
        return ModelResponse(
            "reading", (write("a", "x" * 400),), Usage(input_tokens=10_000), "m", 1.0
        )

    model = ScriptedModel(policy=inflated)
    tid, result = await run_task(store, spec, tmp_path, model)
    assert result.status == "waiting", result
    reason = (result.waiting or {})["reason"]
    assert "the provider counts about" in reason and "context.input_budget_tokens=" in reason
    task = await store.get_task(tid)
    assert task.status == "waiting"
    committed = await store.read_events(tid, types={"round.committed"})
    assert len(committed) == len(act_requests(model)) >= 1
