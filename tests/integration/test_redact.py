"""Secrets never reach the journal or the terminal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tether
from tether import errors
from tether.models.base import ModelRequest, ModelResponse
from tether.redact import MASK, redact, redact_data
from tether.store.memory import MemoryStore
from tether.tools.builtin.files import default_registry

KEY = "sk-test-4f9a8b7c6d5e"


def test_redact_masks_known_secrets_and_url_userinfo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("SHORT_TOKEN", "abc")  # too short to mask everywhere
    monkeypatch.setenv("HOME_DIR_NAME", "not-a-secret-name")
    assert redact(f"401: invalid key {KEY} (abc)") == f"401: invalid key {MASK} (abc)"
    assert redact("see http://user:pw@host:8000/v1 now") == f"see http://{MASK}@host:8000/v1 now"
    assert redact("https://token@api.example.com") == f"https://{MASK}@api.example.com"
    assert redact("not-a-secret-name stays") == "not-a-secret-name stays"
    assert redact_data({"a": [KEY, 1, {"b": KEY}]}) == {"a": [MASK, 1, {"b": MASK}]}


async def test_errors_echoing_a_key_are_stored_masked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TICKETS_API_KEY", KEY)

    @tether.tool(effect="write", idempotent=True)
    def file_ticket(title: str, ctx: tether.ToolContext) -> str:
        """Fails like a service that echoes the credentials it got."""
        raise errors.ToolFailed(f"403 Forbidden: key {KEY} has no access to http://u:{KEY}@t/x")

    class Named:
        name = f"openai-compatible:http://bob:{KEY}@10.0.0.1/v1#m"
        calls = 0

        async def complete(self, request: ModelRequest) -> ModelResponse:
            self.calls += 1
            if self.calls == 1:
                return ModelResponse("filing", (tether.tool_call("file_ticket", title="x"),))
            raise errors.ModelError(f"401 Unauthorized (key {KEY})", transient=False)

    store = await MemoryStore.open()
    spec = tether.parse_spec(
        {"objective": "o", "items": [{"id": "a", "title": "a"}], "tools": ["file_ticket"]}
    )
    tid = (await tether.create_task(store, spec, workspace=tmp_path)).task_id
    registry = default_registry(lambda: store)
    registry.add(file_ticket)
    result = await tether.Engine(store, tether.ModelSet(Named()), registry=registry).run(tid)
    assert result.status == "waiting"
    everything = json.dumps([e.data for e in await store.read_events(tid)])
    everything += json.dumps([o.error for o in await store.get_ops(tid)])
    everything += json.dumps((await store.get_task(tid)).waiting)
    assert KEY not in everything
    assert MASK in everything


async def test_a_secret_in_a_rounds_tool_result_is_stored_masked(
    store: tether.Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tool that succeeds with the key (and a URL's password) in its output: the op's
    stored result and its `op.result` event hold the mask, on every store (the journal
    looks at a result's strings before it builds a masked copy)."""
    monkeypatch.setenv("TICKETS_API_KEY", KEY)

    @tether.tool(effect="read")
    def show_config(name: str, ctx: tether.ToolContext) -> str:
        """Echoes its configuration, credentials and all."""
        return f"config {name}: key={KEY} db=postgresql://app:{KEY}x@db/main"

    model = tether.ScriptedModel(
        [
            tether.ModelResponse("looking", (tether.tool_call("show_config", name="a"),)),
            tether.ModelResponse("done", ()),
        ]
    )
    spec = tether.parse_spec(
        {
            "objective": "o",
            "items": [{"id": "a", "title": "a"}],
            "tools": ["show_config"],
            "limits": {"max_rounds": 2},
        }
    )
    tid = (await tether.create_task(store, spec, workspace=tmp_path)).task_id
    registry = default_registry(lambda: store)
    registry.add(show_config)
    await tether.Engine(store, tether.ModelSet(model), registry=registry).run(tid)
    ops = await store.get_ops(tid, tools=["show_config"])
    assert [o.status for o in ops] == ["succeeded"]
    stored = json.dumps([o.result for o in ops])
    stored += json.dumps([e.data for e in await store.read_events(tid, types=["op.result"])])
    assert KEY not in stored
    assert f"config a: key={MASK} db=postgresql://app:{MASK}@db/main" in stored
