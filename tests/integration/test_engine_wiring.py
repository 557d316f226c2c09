"""What an `Engine` is given reaches the run: `services` go to every tool call's
`ToolContext`; a registry without `read_artifact` gets it, and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

import tether
from tether.models.base import ModelRequest, ModelResponse
from tether.store.memory import MemoryStore
from tether.tools.builtin.files import READ_ARTIFACT, TOOLS_ENV
from tether.tools.registry import ToolRegistry


async def test_services_reach_the_tools(tmp_path: Path) -> None:
    sink: list[str] = []
    seen: list[object] = []

    @tether.tool(effect="write", idempotent=True)
    def record(text: str, ctx: tether.ToolContext) -> str:
        """Records a line with the shared client."""
        seen.append(ctx.services.get("sink"))
        ctx.services["sink"].append(text)
        return "recorded"

    def actor(request: ModelRequest) -> ModelResponse:
        if any(m.role == "tool" for m in request.messages):
            return ModelResponse("done")
        return ModelResponse("recording", (tether.tool_call("record", text="hello"),))

    store = await MemoryStore.open()
    spec = tether.parse_spec(
        {
            "objective": "record",
            "items": [{"id": "r", "title": "r", "done_when": {"kind": "op", "tool": "record"}}],
            "tools": [{"name": "record", "approval": False}],
            "models": {"judge": "rules"},
        }
    )
    tid = (await tether.create_task(store, spec, workspace=tmp_path)).task_id
    registry = ToolRegistry([record])
    engine = tether.Engine(
        store,
        tether.ModelSet(tether.ScriptedModel(policy=actor)),
        registry=registry,
        services={"sink": sink},
    )
    result = await engine.run(tid)
    assert result.status == "satisfied"
    assert seen == [sink] and seen[0] is sink
    assert sink == ["hello"]


async def test_a_registry_without_read_artifact_gets_it_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A registry given whole is not filled from `TETHER_TOOLS`: a bad reference there
    # is not even imported (it used to be, to fetch `read_artifact` alone).
    monkeypatch.setenv(TOOLS_ENV, "tests.nowhere_to_be_found:TOOLS")
    store = await MemoryStore.open()
    registry = ToolRegistry([])
    engine = tether.Engine(
        store, tether.ModelSet(tether.ScriptedModel(["done"])), registry=registry
    )
    assert engine.registry is registry
    # the runtime's own read tools: evidence and (for a long checklist) the ledger's pages
    assert registry.names() == sorted([READ_ARTIFACT, "ledger_items"])
    tool = registry.get(READ_ARTIFACT)
    assert tool is not None and tool.effect == "read"
