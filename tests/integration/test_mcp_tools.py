"""MCP tool sources against a real MCP server process (`tests/mcp_server.py`).

The server is built with the official SDK and started by the tests, over stdio (one
process per source) and over streamable HTTP on an ephemeral 127.0.0.1 port. The tests
check the tool listing (effects, idempotency, schemas, cursor pages), the exposed names
(`<prefix>__<tool>`), calls and their results, how each failure is classified, restarts
after a lost connection, the `tools:` subset, startup failures as `UserError`s, and that
everything shuts down cleanly (warnings are errors here).
"""

from __future__ import annotations

import logging
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed (pip install -e '.[mcp]')")

from tether import errors
from tether.spec import McpServer
from tether.tools.mcp import (
    OP_ID_META_KEY,
    TIMEOUT_GRACE,
    McpSources,
    McpToolSource,
    effect_for,
    exposed_name,
    prefix_of,
)
from tether.tools.registry import Tool, ToolContext, ToolRegistry, render_result

SERVER_SCRIPT = Path(__file__).resolve().parents[1] / "mcp_server.py"
ALL_TOOLS = {
    "add",
    "delete_note",
    "put_note",
    "plain",
    "fail",
    "slow",
    "slow_read",
    "whoami",
    "op_key",
    "crash",
    "crash_once",
    "pid",
}


def stdio_server(name: str = "notes", **kw: Any) -> McpServer:
    """A spec entry that starts the test server over stdio (tools unprefixed unless a
    `prefix` is given)."""
    kw.setdefault("prefix", "")
    return McpServer(name=name, command=sys.executable, args=[str(SERVER_SCRIPT)], **kw)


def make_ctx(op_id: str = "op-1") -> ToolContext:
    return ToolContext(
        op_id=op_id,
        task_id="task-1",
        task_version=1,
        fencing_token=1,
        workspace=None,
        logger=logging.getLogger("test.mcp"),
    )


async def call(tool: Tool, args: dict[str, Any], op_id: str = "op-1") -> Any:
    """Call the way the runtime does: check the arguments, then run `fn`."""
    return await tool.fn(tool.check_args(args), make_ctx(op_id))


@pytest.fixture
async def notes() -> AsyncIterator[dict[str, Tool]]:
    """The test server's tools over stdio, listed in pages of 3."""
    server = stdio_server(env={"MCP_TEST_PAGE_SIZE": "3", "MCP_TEST_TAG": "from-spec"}, timeout=1.0)
    async with McpSources([server]) as sources:
        yield {t.name: t for t in sources.tools()}


# --- listing -------------------------------------------------------------------------------


async def test_lists_every_tool_across_cursor_pages(notes: dict[str, Tool]) -> None:
    # Pages of 3: the listing is only complete if next_cursor was followed.
    assert set(notes) == ALL_TOOLS


async def test_annotations_map_to_effects_and_idempotency(notes: dict[str, Tool]) -> None:
    got = {name: (t.effect, t.idempotent) for name, t in notes.items()}
    assert got["add"] == ("read", True)  # readOnlyHint
    assert got["delete_note"] == ("delete", False)  # destructiveHint
    assert got["put_note"] == ("write", True)  # idempotentHint
    assert got["plain"] == ("write", False)  # no annotations at all
    assert got["slow"] == ("write", False)
    assert notes["delete_note"].risky
    assert not notes["add"].risky and not notes["plain"].risky
    # A read may change by itself (asking again is waiting) unless its world is closed.
    assert notes["whoami"].volatile and notes["slow_read"].volatile
    assert not notes["add"].volatile  # openWorldHint: false
    assert not notes["plain"].volatile and not notes["delete_note"].volatile


async def test_tools_carry_schema_service_timeout_and_description(
    notes: dict[str, Tool],
) -> None:
    add = notes["add"]
    assert add.parameters["type"] == "object"
    assert set(add.parameters["properties"]) == {"a", "b"}
    assert add.parameters["properties"]["a"]["type"] == "integer"
    assert sorted(add.parameters["required"]) == ["a", "b"]
    assert add.description == "Add two integers."
    assert add.schema().name == "add"
    assert all(t.service == "notes" for t in notes.values())
    # The runtime's outer timeout leaves room for the MCP request's own timeout.
    assert add.timeout == pytest.approx(1.0 + TIMEOUT_GRACE)
    registry = ToolRegistry(notes.values())
    assert registry.names() == sorted(ALL_TOOLS)


def test_effect_mapping_without_a_server() -> None:
    from mcp.types import ToolAnnotations

    assert effect_for(None) == ("write", False)
    assert effect_for(ToolAnnotations()) == ("write", False)
    assert effect_for(ToolAnnotations(read_only_hint=True, idempotent_hint=False)) == (
        "read",
        True,
    )
    assert effect_for(ToolAnnotations(destructive_hint=True, idempotent_hint=True)) == (
        "delete",
        True,
    )
    assert effect_for(ToolAnnotations(destructive_hint=False)) == ("write", False)


# --- calls ---------------------------------------------------------------------------------


async def test_add_gives_five(notes: dict[str, Tool]) -> None:
    result = await call(notes["add"], {"a": 2, "b": 3})
    assert result == 5
    assert render_result(result) == "5"


async def test_structured_and_text_results(notes: dict[str, Tool]) -> None:
    assert await call(notes["put_note"], {"name": "n1", "text": "hello"}) == {
        "name": "n1",
        "size": 5,
    }
    assert await call(notes["delete_note"], {"name": "n1"}) == "deleted n1"
    assert await call(notes["plain"], {"x": "hi"}) == "plain:hi"


async def test_spec_env_reaches_the_server(notes: dict[str, Tool]) -> None:
    assert await call(notes["whoami"], {}) == "from-spec"


async def test_op_id_travels_in_request_meta(notes: dict[str, Tool]) -> None:
    assert OP_ID_META_KEY == "tether/op_id"
    assert await call(notes["op_key"], {}, op_id="task-1:r3:c0") == "task-1:r3:c0"


async def test_is_error_result_becomes_deterministic_tool_failed(notes: dict[str, Tool]) -> None:
    with pytest.raises(errors.ToolFailed) as info:
        await call(notes["fail"], {"msg": "the disk is full"})
    assert "the disk is full" in str(info.value)
    assert info.value.retryable is False


async def test_bad_arguments_fail_before_anything_is_sent(notes: dict[str, Tool]) -> None:
    add = notes["add"]
    with pytest.raises(errors.ToolFailed) as info:
        add.check_args({"a": "two"})
    text = str(info.value)
    assert text.startswith("bad arguments for add:")
    assert "'b' is a required property" in text
    assert "a: 'two' is not of type 'integer'" in text
    assert info.value.retryable is False
    huge = "x" * 100_000
    with pytest.raises(errors.ToolFailed) as info:
        add.check_args({"a": huge, "b": 1})
    assert len(str(info.value)) < 400
    assert add.check_args({"a": 1, "b": 2}) == {"a": 1, "b": 2}


async def test_concurrent_calls_share_one_session(notes: dict[str, Tool]) -> None:
    import asyncio

    results = await asyncio.gather(*(call(notes["add"], {"a": i, "b": i}) for i in range(20)))
    assert results == [2 * i for i in range(20)]


# --- timeouts and lost connections -----------------------------------------------------------


async def test_timeout_of_a_write_is_outcome_unknown(notes: dict[str, Tool]) -> None:
    with pytest.raises(errors.OutcomeUnknown) as info:
        await call(notes["slow"], {"seconds": 10})
    assert "no answer within 1.0s" in str(info.value)
    # The session survives a timed-out request.
    assert await call(notes["add"], {"a": 1, "b": 1}) == 2


async def test_timeout_of_a_read_is_retryable_tool_failed(notes: dict[str, Tool]) -> None:
    with pytest.raises(errors.ToolFailed) as info:
        await call(notes["slow_read"], {"seconds": 10})
    assert info.value.retryable is True
    assert await call(notes["slow_read"], {"seconds": 0.01}) == "slept"


async def test_server_dying_mid_call_is_restarted() -> None:
    # The default timeout: a restart must fit in it, and a loaded machine starts slowly.
    async with McpToolSource(stdio_server(tools=["pid", "crash", "add", "plain"])) as source:
        notes = {t.name: t for t in source.tools()}
        before = await call(notes["pid"], {})
        with pytest.raises(errors.OutcomeUnknown) as info:
            await call(notes["crash"], {})
        assert "connection was lost" in str(info.value)
        # What the server said before dying travels with the failure.
        assert "crash() was called" in str(info.value)
        # The next calls restart the server: a new process answers.
        assert await call(notes["add"], {"a": 1, "b": 1}) == 2
        assert await call(notes["plain"], {"x": "y"}) == "plain:y"
        assert await call(notes["pid"], {}) != before
        assert source.restarts == 1


async def test_read_dying_mid_call_is_retryable_and_the_retry_works(tmp_path: Path) -> None:
    marker = str(tmp_path / "crashed")
    async with McpToolSource(stdio_server(tools=["crash_once"])) as source:
        (tool,) = source.tools()
        with pytest.raises(errors.ToolFailed) as info:
            await call(tool, {"marker": marker})
        assert info.value.retryable is True and "connection was lost" in str(info.value)
        assert await call(tool, {"marker": marker}) == "survived"
        assert source.restarts == 1


async def test_server_killed_while_idle_is_restarted_before_sending() -> None:
    import asyncio
    import os
    import signal

    async with McpToolSource(stdio_server(tools=["pid", "plain"])) as source:
        tools = {t.name: t for t in source.tools()}
        first = await call(tools["pid"], {})
        os.kill(first, signal.SIGKILL)
        for _ in range(1000):  # until the client sees the pipe close (at most ~10 s)
            if not source.connected:
                break
            await asyncio.sleep(0.01)
        assert not source.connected
        # A write whose server is known dead is not in doubt: it is sent after a restart.
        assert await call(tools["plain"], {"x": "again"}) == "plain:again"
        assert await call(tools["pid"], {}) != first
        assert source.restarts == 1


async def test_server_that_never_comes_back_fails_transient_without_sending(
    tmp_path: Path,
) -> None:
    once = stdio_server(
        tools=["crash_once", "plain"],
        env={"MCP_TEST_START_ONCE": str(tmp_path / "started")},
        restart_attempts=2,
    )
    async with McpToolSource(once) as source:
        tools = {t.name: t for t in source.tools()}
        with pytest.raises(errors.ToolFailed):
            await call(tools["crash_once"], {"marker": str(tmp_path / "m")})
        # Even a write: nothing can have been sent, so it is retryable, not in doubt.
        with pytest.raises(errors.ToolFailed) as info:
            await call(tools["plain"], {"x": "y"})
        text = str(info.value)
        assert info.value.retryable is True and isinstance(info.value, errors.ServiceDown)
        assert "could not be restarted (2 tries" in text and "the call was not sent" in text
        assert "will not start again" in text
        assert source.restarts == 0


async def test_restart_that_hangs_is_bounded_and_fails_before_sending(tmp_path: Path) -> None:
    hangs = stdio_server(
        tools=["crash_once", "plain"],
        env={"MCP_TEST_START_ONCE": str(tmp_path / "started"), "MCP_TEST_HANG_AGAIN": "1"},
        timeout=1.0,
    )
    async with McpToolSource(hangs) as source:
        tools = {t.name: t for t in source.tools()}
        with pytest.raises(errors.ToolFailed):
            await call(tools["crash_once"], {"marker": str(tmp_path / "m")})
        with pytest.raises(errors.ToolFailed) as info:
            await call(tools["plain"], {"x": "y"})
        assert info.value.retryable is True
        assert "not back within 1.0s" in str(info.value) and "not sent" in str(info.value)


async def test_call_after_close_is_retryable_and_sends_nothing() -> None:
    async with McpSources([stdio_server(tools=["add"])]) as sources:
        (add,) = sources.tools()
    with pytest.raises(errors.ToolFailed) as info:
        await call(add, {"a": 1, "b": 2})
    assert info.value.retryable is True
    assert "not connected" in str(info.value)


# --- the tools subset ----------------------------------------------------------------------


async def test_tools_subset_keeps_only_the_named_tools() -> None:
    server = stdio_server(tools=["put_note", "add"])
    async with McpToolSource(server) as source:
        tools = source.tools()
        assert [t.name for t in tools] == ["put_note", "add"]
        assert await call(tools[1], {"a": 20, "b": 22}) == 42


async def test_tools_subset_naming_a_missing_tool_is_a_user_error() -> None:
    with pytest.raises(errors.UserError) as info:
        async with McpSources([stdio_server(tools=["add", "launch_rockets"])]):
            pass
    text = str(info.value)
    assert "'notes'" in text and "'launch_rockets'" in text
    assert "add" in text  # what it does offer


# --- several servers -----------------------------------------------------------------------


async def test_several_servers_and_duplicate_names() -> None:
    a = stdio_server("alpha", tools=["add", "whoami"], env={"MCP_TEST_TAG": "A"})
    b = stdio_server("beta", tools=["plain"])
    async with McpSources([a, b]) as sources:
        tools = {t.name: t for t in sources.tools()}
        assert set(tools) == {"add", "whoami", "plain"}
        assert tools["add"].service == "alpha" and tools["plain"].service == "beta"
        assert await call(tools["whoami"], {}) == "A"
        assert [s.server.name for s in sources.sources] == ["alpha", "beta"]
    async with McpSources([]) as none:
        assert none.tools() == []
    clash = stdio_server("gamma", tools=["add"])
    with pytest.raises(errors.SpecError) as info:
        async with McpSources([a, clash]):
            pass
    text = str(info.value)
    assert "'alpha'" in text and "'gamma'" in text and "'add'" in text and "prefix" in text
    assert info.value.exit_code == 2
    # Same prefix on purpose: a clash too.
    same = [stdio_server("a1", tools=["add"], prefix="p"), stdio_server("a2", prefix="p")]
    with pytest.raises(errors.SpecError) as info:
        async with McpSources(same):
            pass
    assert "'p__add'" in str(info.value)


# --- exposed names -------------------------------------------------------------------------


async def test_tools_are_prefixed_by_default() -> None:
    a = McpServer(name="alpha", command=sys.executable, args=[str(SERVER_SCRIPT)], tools=["add"])
    b = McpServer(
        name="beta.v2", command=sys.executable, args=[str(SERVER_SCRIPT)], tools=["add", "pid"]
    )
    c = McpServer(
        name="gamma", command=sys.executable, args=[str(SERVER_SCRIPT)], tools=["add"], prefix="g"
    )
    assert prefix_of(b) == "beta_v2" and exposed_name(c, "add") == "g__add"
    async with McpSources([a, b, c]) as sources:
        tools = {t.name: t for t in sources.tools()}
        assert set(tools) == {"alpha__add", "beta_v2__add", "beta_v2__pid", "g__add"}
        # Every name is one providers accept.
        assert all(re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", n) for n in tools)
        assert tools["beta_v2__add"].service == "beta.v2"
        assert tools["g__add"].schema().name == "g__add"
        # The server is asked for its own name.
        assert await call(tools["alpha__add"], {"a": 2, "b": 3}) == 5
        assert await call(tools["g__add"], {"a": 1, "b": 3}) == 4


def test_prefix_must_be_a_provider_safe_name() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        McpServer(name="x", command="c", prefix="a.b")
    assert McpServer(name="x", command="c", prefix="").prefix == ""


# --- startup failures ----------------------------------------------------------------------


async def test_missing_command_is_a_user_error_naming_the_server() -> None:
    server = McpServer(name="ghost", command="tether-no-such-mcp-server", args=["--x"])
    with pytest.raises(errors.UserError) as info:
        async with McpSources([stdio_server("fine"), server]):
            pass
    text = str(info.value)
    assert "'ghost'" in text
    assert "tether-no-such-mcp-server --x" in text
    assert "No such file or directory" in text
    assert "\n" not in text and "Traceback" not in text


async def test_server_exiting_at_start_reports_its_stderr() -> None:
    script = "import sys; sys.stderr.write('Traceback\\nValueError: bad config\\n'); sys.exit(3)"
    server = McpServer(name="dies", command=sys.executable, args=["-c", script], timeout=5)
    with pytest.raises(errors.UserError) as info:
        async with McpSources([server]):
            pass
    text = str(info.value)
    assert "'dies'" in text and "could not be started" in text
    assert "ValueError: bad config" in text
    assert "\n" not in text


async def test_unreachable_url_is_a_user_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    server = McpServer(name="remote", url=f"http://127.0.0.1:{port}/mcp", timeout=5)
    with pytest.raises(errors.UserError) as info:
        async with McpSources([server]):
            pass
    text = str(info.value)
    assert "'remote'" in text and f"127.0.0.1:{port}" in text and "could not be reached" in text


# --- streamable HTTP -----------------------------------------------------------------------


def _wait_for_http(port: int, timeout: float = 10.0) -> None:
    """Until the server answers HTTP at all (uvicorn starts after the port is bound)."""
    import http.client
    import time

    deadline = time.monotonic() + timeout
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        try:
            conn.request("GET", "/")
            conn.getresponse().read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
        finally:
            conn.close()


def _start_http(port: int = 0) -> tuple[subprocess.Popen[str], int]:
    """The test server over streamable HTTP (on `port`, or an ephemeral one)."""
    import os

    proc = subprocess.Popen(
        [sys.executable, str(SERVER_SCRIPT), "--http"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "MCP_TEST_PORT": str(port)},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("PORT "), line
        got = int(line.split()[1])
        _wait_for_http(got)
    except BaseException:
        _stop_http(proc)
        raise
    return proc, got


def _stop_http(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


@pytest.fixture
def http_url() -> Iterator[str]:
    """The test server over streamable HTTP on an ephemeral port."""
    proc, port = _start_http()
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        _stop_http(proc)


async def test_http_server_restarted_on_the_same_url_keeps_serving() -> None:
    proc, port = _start_http()
    try:
        server = McpServer(name="web", url=f"http://127.0.0.1:{port}/mcp", timeout=5.0)
        async with McpToolSource(server) as source:
            tools = {t.name: t for t in source.tools()}
            first = await call(tools["web__pid"], {})
            _stop_http(proc)
            proc, _ = _start_http(port)  # a new server process behind the same URL
            assert await call(tools["web__plain"], {"x": "y"}) == "plain:y"
            assert await call(tools["web__pid"], {}) != first
    finally:
        _stop_http(proc)


async def test_streamable_http_transport(http_url: str) -> None:
    server = McpServer(name="web", url=http_url, timeout=1.0, prefix="")
    async with McpSources([server]) as sources:
        tools = {t.name: t for t in sources.tools()}
        assert set(tools) == ALL_TOOLS
        assert tools["add"].effect == "read" and tools["delete_note"].effect == "delete"
        assert await call(tools["add"], {"a": 2, "b": 3}) == 5
        assert await call(tools["op_key"], {}, op_id="op-http") == "op-http"
        with pytest.raises(errors.ToolFailed) as info:
            await call(tools["fail"], {"msg": "over http"})
        assert "over http" in str(info.value) and not info.value.retryable
        with pytest.raises(errors.OutcomeUnknown):
            await call(tools["slow"], {"seconds": 10})
        assert await call(tools["add"], {"a": 1, "b": 1}) == 2


async def test_cancelled_start_leaves_no_process(tmp_path: Path) -> None:
    import asyncio
    import os

    pid_file = tmp_path / "pid"
    script = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"
    server = McpServer(name="hangs", command=sys.executable, args=["-c", script, str(pid_file)])
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(McpSources([server]).__aenter__(), 0.5)
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
