"""A tool that does not declare its effect is treated as having effects, on every way a
tool is registered: `@tether.tool` (bare or with options), `tether.Tool(...)`, a
`TETHER_TOOLS` module and an MCP server's tool without annotations. Such a tool is
journaled before it is sent, is under the contract's approval policy like a `write`,
and is not sent again blindly after an unknown outcome (only when `idempotent=True`)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import tether
from tether import approvals, errors
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.tasks import create_task
from tether.spec import McpServer, parse_spec
from tether.store.memory import MemoryStore
from tether.tools.builtin.files import TOOLS_ENV, default_registry
from tether.tools.mcp import McpSources
from tether.tools.registry import Tool, ToolContext, ToolRegistry

MCP_SERVER = str(Path(__file__).resolve().parents[1] / "mcp_server.py")


class Mailer:
    """The outside world: counts the mails it really sent; it can lose the answer to
    the first one (the mail went out, the connection dropped)."""

    def __init__(self, *, lose_first_answer: bool = False) -> None:
        self.sent: list[str] = []
        self.lose_first_answer = lose_first_answer

    def send(self, to: str) -> str:
        self.sent.append(to)
        if self.lose_first_answer and len(self.sent) == 1:
            raise ConnectionResetError("connection reset by peer")
        return f"sent to {to}"


TOOLS_MODULE = '''
import tether

MAILER = None  # the test sets it after import


@tether.tool
def send_mail(to: str) -> str:
    """Send a mail."""
    return MAILER.send(to)
'''


def by_decorator(mailer: Mailer, **options: Any) -> Tool:
    if not options:

        @tether.tool
        def send_mail(to: str) -> str:
            """Send a mail."""
            return mailer.send(to)

        return send_mail

    @tether.tool(**options)
    def send_mail_with_options(to: str) -> str:
        """Send a mail."""
        return mailer.send(to)

    return send_mail_with_options


def by_dataclass(mailer: Mailer, **options: Any) -> Tool:
    async def run(args: Mapping[str, Any], ctx: ToolContext) -> str:
        return mailer.send(str(args["to"]))

    return tether.Tool(
        name="send_mail",
        description="Send a mail.",
        parameters={"type": "object", "properties": {"to": {"type": "string"}}},
        fn=run,
        **options,
    )


PYTHON_PATHS = ["decorator", "decorator_with_options", "tool_call", "Tool", "TETHER_TOOLS"]


def python_registry(
    path: str, mailer: Mailer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **options: Any
) -> ToolRegistry:
    """The built-in registry with `send_mail` registered the way `path` names."""
    registry = default_registry(lambda: None)  # type: ignore[arg-type,return-value]
    if path == "decorator":
        registry.add(by_decorator(mailer, **options))
    elif path == "decorator_with_options":
        registry.add(by_decorator(mailer, name="send_mail", service="mail", **options))
    elif path == "tool_call":

        def send_mail(to: str) -> str:
            """Send a mail."""
            return mailer.send(to)

        registry.add(tether.tool(send_mail, **options))
    elif path == "Tool":
        registry.add(by_dataclass(mailer, **options))
    else:
        assert path == "TETHER_TOOLS" and not options
        module = f"tether_defaults_{uuid.uuid4().hex}"
        (tmp_path / f"{module}.py").write_text(TOOLS_MODULE)
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv(TOOLS_ENV, f"{module}:send_mail")
        registry = default_registry(lambda: None)  # type: ignore[arg-type,return-value]
        sys.modules[module].MAILER = mailer  # type: ignore[attr-defined]
    return registry


@asynccontextmanager
async def mcp_tools() -> AsyncIterator[dict[str, Tool]]:
    """The tools of the test MCP server (`plain` has no annotations, `add` is read-only)."""
    server = McpServer(name="notes", command=sys.executable, args=[MCP_SERVER])
    async with McpSources([server]) as sources:
        yield {t.name: t for t in sources.tools()}


# --- every registration path agrees ---------------------------------------------------


@pytest.mark.parametrize("path", [*PYTHON_PATHS, "mcp"])
async def test_an_undeclared_effect_is_a_write_on_every_registration_path(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if path == "mcp":
        async with mcp_tools() as tools:
            undeclared = tools["notes__plain"]
            read = tools["notes__add"]
    else:
        undeclared = python_registry(path, Mailer(), tmp_path, monkeypatch).get("send_mail")
        read = None
        if path != "TETHER_TOOLS":
            declared = python_registry(path, Mailer(), tmp_path, monkeypatch, effect="read")
            read = declared.get("send_mail")
    assert undeclared is not None
    assert (undeclared.effect, undeclared.idempotent) == ("write", False)
    if read is not None:  # a declared read stays a read, and a read is idempotent
        assert (read.effect, read.idempotent) == ("read", True)


def test_the_built_in_read_tools_stay_reads() -> None:
    registry = default_registry(lambda: None)  # type: ignore[arg-type,return-value]
    reads = {n for n in registry.names() if registry.get(n).effect == "read"}  # type: ignore[union-attr]
    assert reads == {
        "ledger_items",
        "list_files",
        "read_artifact",
        "read_file",
        "read_source",
        "search_artifacts",
    }


def test_a_tool_with_an_unknown_effect_is_refused() -> None:
    with pytest.raises(errors.UserError) as info:
        by_dataclass(Mailer(), effect="mail")
    assert "send_mail" in str(info.value) and "'mail'" in str(info.value)


# --- what the runtime does with it ----------------------------------------------------


def mail_spec(tool_entry: Any, servers: list[dict[str, Any]] | None = None) -> Any:
    data: dict[str, Any] = {
        "objective": "tell the team",
        "items": [{"id": "i1", "title": "mail the team"}],
        "tools": [tool_entry],
        "models": {"judge": "rules"},
        "limits": {"no_progress_rounds": 20, "max_rounds": 6},
    }
    if servers:
        data["mcp_servers"] = servers
    return parse_spec(data)


def mails_once(tool: str, **args: Any) -> Callable[[ModelRequest], ModelResponse]:
    def policy(request: ModelRequest) -> ModelResponse:
        if not any(m.role == "tool" for m in request.messages):
            return ModelResponse("mailing", (tool_call(tool, **args),))
        return ModelResponse("NEED_HELP: finished what I can")

    return policy


async def engine_for(spec: Any, policy: Any, registry: ToolRegistry | None, tmp_path: Path) -> Any:
    store = await MemoryStore.open()
    task = await create_task(store, spec, workspace=tmp_path)
    engine = Engine(store, ModelSet(ScriptedModel(policy=policy)), registry=registry)
    return store, task.task_id, engine


@pytest.mark.parametrize("path", [*PYTHON_PATHS, "mcp"])
async def test_an_undeclared_tool_is_journaled_before_it_is_sent(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mailer = Mailer()
    if path == "mcp":
        name, args = "notes__plain", {"x": "team"}
        server = {"name": "notes", "command": sys.executable, "args": [MCP_SERVER]}
        spec, registry = mail_spec(name, [server]), None
    else:
        name, args = "send_mail", {"to": "team"}
        spec = mail_spec(name)
        registry = python_registry(path, mailer, tmp_path, monkeypatch)
    store, tid, engine = await engine_for(spec, mails_once(name, **args), registry, tmp_path)
    await engine.run(tid)
    events = [e for e in await store.read_events(tid) if e.data.get("tool") == name]
    assert [e.type for e in events] == ["op.intended", "op.result"]
    assert events[0].data["effect"] == "write" and events[0].seq < events[1].seq
    (op,) = [o for o in await store.get_ops(tid) if o.tool == name]
    assert op.effect == "write" and op.status == "succeeded"
    assert mailer.sent == ([] if path == "mcp" else ["team"])


@pytest.mark.parametrize("path", [*PYTHON_PATHS, "mcp"])
async def test_an_undeclared_tool_is_under_the_approval_policy_like_a_write(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mailer = Mailer()
    if path == "mcp":
        name, args = "notes__plain", {"x": "team"}
        server = {"name": "notes", "command": sys.executable, "args": [MCP_SERVER]}
        spec, registry = mail_spec({"name": name, "approval": True}, [server]), None
    else:
        name, args = "send_mail", {"to": "team"}
        spec = mail_spec({"name": name, "approval": True})
        registry = python_registry(path, mailer, tmp_path, monkeypatch)
    store, tid, engine = await engine_for(spec, mails_once(name, **args), registry, tmp_path)
    result = await engine.run(tid)
    assert result.status == "waiting" and mailer.sent == []
    (req,) = await approvals.pending(store, tid)
    assert req.request["kind"] == "op" and name in req.request["what"]
    (op,) = [o for o in await store.get_ops(tid) if o.tool == name]
    assert op.effect == "write" and op.status == "awaiting_approval"


@pytest.mark.parametrize("path", PYTHON_PATHS)
async def test_an_undeclared_tool_is_not_sent_again_after_an_unknown_outcome(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mailer = Mailer(lose_first_answer=True)
    registry = python_registry(path, mailer, tmp_path, monkeypatch)
    policy = mails_once("send_mail", to="team")
    store, tid, engine = await engine_for(mail_spec("send_mail"), policy, registry, tmp_path)
    result = await engine.run(tid)
    # The mail went out once; whether it did is unknown, so a human decides.
    assert result.status == "waiting" and mailer.sent == ["team"]
    (req,) = await approvals.pending(store, tid)
    assert req.request["kind"] == "op_in_doubt"
    assert (await engine.run(tid)).status == "waiting" and mailer.sent == ["team"]


@pytest.mark.parametrize("path", ["decorator_with_options", "tool_call", "Tool"])
async def test_an_undeclared_idempotent_tool_is_sent_again_with_the_same_key(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mailer = Mailer(lose_first_answer=True)
    registry = python_registry(path, mailer, tmp_path, monkeypatch, idempotent=True)
    policy = mails_once("send_mail", to="team")
    store, tid, engine = await engine_for(mail_spec("send_mail"), policy, registry, tmp_path)
    await engine.run(tid)
    assert mailer.sent == ["team", "team"]
    assert await approvals.pending(store, tid) == []
    (op,) = [o for o in await store.get_ops(tid) if o.tool == "send_mail"]
    assert op.effect == "write" and op.status == "succeeded" and op.attempts == 2
