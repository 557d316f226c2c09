"""A tool's side effect checks the fence, and tools get secrets only by grant.

- `ctx.ensure_owner()`: a run whose task was taken over while a tool call was in
  flight (the worker paused past its lease) raises `StaleLease` from the check; the
  built-in `write_file` calls it right before writing, so no file is written and no
  result of the stale run is journaled.
- `ctx.secret(NAME)`: a secret the contract grants the tool is read from the
  environment (whatever its variable's name) and masked in every event and op tether
  stores; asking for one not granted fails the call with a clear message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.support.loop import by_purpose, rules_judge, spec_of
from tether import errors
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.tasks import create_task
from tether.spec import parse_spec
from tether.store.base import Store
from tether.tools.builtin import files as builtins
from tether.tools.registry import ToolContext, ToolRegistry, ensure_lease, tool

SECRET = "tk-4f8a9c2e71d04b6b"


async def test_ensure_owner_refuses_after_a_takeover(store: Store, tmp_path: Path) -> None:
    task = await create_task(store, spec_of(1), workspace=tmp_path)
    lease = await store.claim("w1", 60, task_id=task.task_id)
    assert lease is not None
    ctx = ToolContext(
        op_id="op1",
        task_id=task.task_id,
        task_version=1,
        fencing_token=lease.token,
        workspace=tmp_path,
        logger=__import__("logging").getLogger("t"),
        owner_check=lambda: ensure_lease(store, task.task_id, lease.token),
    )
    await ctx.ensure_owner()  # still ours
    await store.claim("w2", 60, task_id=task.task_id, force=True)
    with pytest.raises(errors.StaleLease):
        await ctx.ensure_owner()
    with pytest.raises(errors.StaleLease):
        await builtins.write_file.fn({"path": "out/i1.txt", "content": "late"}, ctx)
    assert not (tmp_path / "out" / "i1.txt").exists()


async def test_write_file_after_a_takeover_writes_nothing(store: Store, tmp_path: Path) -> None:
    task = await create_task(store, spec_of(1), workspace=tmp_path)
    original = builtins.write_file

    async def paused_then_write(args: Mapping[str, Any], ctx: ToolContext) -> Any:
        # The worker was paused here past its lease: another one took the task over.
        await store.claim("other-worker", 60, task_id=ctx.task_id, force=True)
        return await original.fn(args, ctx)

    registry = ToolRegistry(builtins.FILE_TOOLS)
    registry.add(dataclasses.replace(original, fn=paused_then_write))

    def actor(request: ModelRequest) -> ModelResponse:
        return ModelResponse("write", (tool_call("write_file", path="out/i1.txt", content="x"),))

    models = ModelSet(
        actor=ScriptedModel(policy=by_purpose(act=actor)),
        judge=ScriptedModel(policy=rules_judge),
    )
    # The run stops as one that lost its lease (whether it says so or raises).
    with contextlib.suppress(errors.StaleLease):
        result = await Engine(store, models, registry=registry, lease_ttl=30).run(task.task_id)
        assert result.status == "running", result
    assert not (tmp_path / "out" / "i1.txt").exists()
    ops = await store.get_ops(task.task_id)
    assert [o.status for o in ops if o.tool == "write_file"] != ["succeeded"]
    assert not [e for e in await store.read_events(task.task_id) if e.type == "op.result"]


@tool(effect="read", name="use_token")
async def use_token(ctx: ToolContext, name: str) -> str:
    token = ctx.secret(name)
    if name == "TICKETS_AUTH":
        raise errors.ToolFailed(f"the service refused token {token}")
    return f"sent with {token}"


@tool(effect="read", name="echo_token")
async def echo_token(ctx: ToolContext) -> str:
    return f"token is {ctx.secret('TICKETS_AUTH')}"


async def test_secrets_are_granted_per_tool_and_never_stored(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A name the environment redactor would not guess holds a secret.
    monkeypatch.setenv("TICKETS_AUTH", SECRET)
    monkeypatch.setenv("OTHER_AUTH", "other-9b1e77c3d5a2")
    spec = parse_spec(
        {
            "objective": "use a token",
            "items": [{"id": "a", "title": "call the service"}],
            "tools": [
                {"name": "echo_token", "secrets": ["TICKETS_AUTH"]},
                {"name": "use_token", "secrets": ["TICKETS_AUTH"]},
            ],
            "limits": {"max_rounds": 3},
            "models": {"judge": "rules"},
        }
    )
    task = await create_task(store, spec, workspace=tmp_path)
    calls = iter(
        [
            (tool_call("echo_token"),),
            (
                tool_call("use_token", name="TICKETS_AUTH"),
                tool_call("use_token", name="OTHER_AUTH"),
            ),
        ]
    )

    def actor(request: ModelRequest) -> ModelResponse:
        return ModelResponse("calling", next(calls, ()))

    registry = ToolRegistry(builtins.FILE_TOOLS)
    registry.extend([echo_token, use_token])
    models = ModelSet(
        actor=ScriptedModel(policy=by_purpose(act=actor)),
        judge=ScriptedModel(policy=rules_judge),
    )
    await Engine(store, models, registry=registry, lease_ttl=30).run(task.task_id)
    ops = await store.get_ops(task.task_id)
    by_args = {(o.tool, json.dumps(dict(o.args), sort_keys=True)): o for o in ops}
    echoed = by_args[("echo_token", "{}")]
    assert echoed.status == "succeeded" and "token is ***" in json.dumps(echoed.result)
    other = by_args[("use_token", json.dumps({"name": "OTHER_AUTH"}))]
    assert other.status == "failed"
    assert "'OTHER_AUTH' is not granted to this tool" in json.dumps(other.error)
    refused = by_args[("use_token", json.dumps({"name": "TICKETS_AUTH"}))]
    assert "refused token ***" in json.dumps(refused.error)
    stored = json.dumps([e.to_dict() for e in await store.read_events(task.task_id)])
    stored += json.dumps([dataclasses.asdict(o) for o in ops], default=str)
    assert SECRET not in stored


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("Authorization: Bearer abc.def-123456", "Authorization: ***"),
        ('{"Authorization": "Basic dXNlcjpwYXNz"}', '{"Authorization": "***"}'),
        ("headers={'authorization': 'Bearer sk-1234567890'}", "headers={'authorization': '***'}"),
        ("401: bearer eyJhbGciOiJIUzI1NiJ9.x refused", "401: bearer *** refused"),
        ("the authorization was denied", "the authorization was denied"),
        ("Bearer of bad news", "Bearer of bad news"),
    ],
)
def test_authorization_headers_are_masked(text: str, masked: str) -> None:
    from tether.redact import redact

    assert redact(text) == masked
