"""A context budget that cannot hold the system prompt and tools says what takes the
room — the largest tools by name, with their estimated tokens — not only "raise the
budget", on every store."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.adversarial import contract, plain_items, say
from tests.support.loop import run_task
from tether import ToolRegistry, errors
from tether.models.scripted import ScriptedModel
from tether.store.base import Store
from tether.tools.registry import Tool


async def test_the_error_names_the_tool_that_fills_the_budget(store: Store, tmp_path: Path) -> None:
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
    model = ScriptedModel(policy=lambda request: say("reading the manual"))
    with pytest.raises(errors.UserError) as info:
        await run_task(store, spec, tmp_path, model, registry=ToolRegistry([huge]))
    text = str(info.value)
    assert "the context budget of 16000 tokens is too small" in text
    assert "largest: manual ~" in text and "allow fewer or smaller tools" in text
    assert not model.requests  # no request was sent that the provider would refuse
