"""MCP client configs against real server processes: `tether run --mcp-config FILE` with
the `mcpServers` map as Claude Desktop, Cursor and `.mcp.json` write it.

- a streamable HTTP (and an HTTP+SSE) server on 127.0.0.1 that answers 401 without its
  header: `headers` with `${VAR}` reach it, the task runs, and the secret is in neither
  the database nor the output; an unset variable is exit 2 naming server and variable;
- `tether run` starts a stdio server once: the sessions its check opened are the run's;
- the real third-party servers CI uses (`make mcp-servers`), wired in with `type`,
  `cwd`, `env` and `${VAR:-default}`.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.test_mcp_real_servers import installed, new_repo
from tests.integration.test_mcp_tools import _stop_http as stop_http
from tether import errors
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import tool_call
from tether.spec import McpServer
from tether.tools.mcp import McpSources
from tether.tools.mcp_connect import kept_open

ROOT = Path(__file__).resolve().parents[2]
SERVER = str(ROOT / "tests" / "mcp_server.py")
SECRET = "k3y-0f-the-test-server-4711"
HEADER = "X-Api-Key"


def serve(*flags: str, env: dict[str, str]) -> Iterator[int]:
    """The test server as its own process on 127.0.0.1 (its port), stopped after."""
    proc = subprocess.Popen(
        [sys.executable, SERVER, *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **env},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # it listens before it tells the port
        assert line.startswith("PORT "), line
        yield int(line.split()[1])
    finally:
        stop_http(proc)


@pytest.fixture
def guarded_port() -> Iterator[int]:
    """A streamable HTTP server that wants `X-Api-Key: SECRET`."""
    yield from serve("--http", env={"MCP_TEST_REQUIRE_HEADER": f"{HEADER}: {SECRET}"})


@pytest.fixture
def guarded_sse_port() -> Iterator[int]:
    yield from serve("--sse", env={"MCP_TEST_REQUIRE_HEADER": f"{HEADER}: {SECRET}"})


def status_of(port: int, path: str, headers: dict[str, str]) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        body = '{"jsonrpc": "2.0", "id": 1, "method": "ping"}'
        all_headers = {"content-type": "application/json", **headers}
        conn.request("POST", path, body=body, headers=all_headers)
        return conn.getresponse().status
    finally:
        conn.close()


def add_once(request: ModelRequest) -> ModelResponse:
    """The model of the CLI runs: one call of `api__add`, then done."""
    if any(m.role == "tool" for m in request.messages):
        return ModelResponse("added")
    return ModelResponse("adding", (tool_call("api__add", a=2, b=3),))


def contract(tmp_path: Path, tool: str = "api__add", **more: Any) -> Path:
    path = tmp_path / "spec.yaml"
    spec = {
        "objective": "add two numbers through an MCP server",
        "items": [{"id": "sum", "title": "add 2 and 3", "done_when": {"kind": "op", "tool": tool}}],
        "tools": [tool],
        "models": {"judge": "rules"},
        "limits": {"max_rounds": 4},
        **more,
    }
    path.write_text(yaml.safe_dump(spec))
    return path


def config(tmp_path: Path, servers: dict[str, Any]) -> Path:
    path = tmp_path / ".mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def tether(tmp_path: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TETHER_", "TEST_MCP"))}
    return subprocess.run(
        [sys.executable, "-m", "tether.cli", *args],
        cwd=tmp_path,
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=180,
    )


def run_args(tmp_path: Path, spec: Path, mcp: Path, model: str = "add_once") -> list[str]:
    db = f"sqlite:///{tmp_path / 'tether.db'}"
    scripted = f"scripted:tests.integration.test_mcp_config:{model}"
    return ["run", str(spec), "--mcp-config", str(mcp), "--model", scripted, "--db", db, "--json"]


def stored_bytes(tmp_path: Path) -> bytes:
    """Everything the database holds, its WAL included."""
    return b"".join(p.read_bytes() for p in tmp_path.glob("tether.db*"))


# --- a remote server that needs its header ----------------------------------------------


@pytest.mark.parametrize("kind", ["http", "sse"])
def test_headers_from_the_environment_reach_a_server_that_requires_them(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    port = request.getfixturevalue("guarded_port" if kind == "http" else "guarded_sse_port")
    path = "/mcp" if kind == "http" else "/sse"
    # The server refuses a request without its header (the test can fail).
    assert status_of(port, path, {}) == 401
    assert status_of(port, path, {HEADER: "wrong"}) == 401
    mcp = config(
        tmp_path,
        {
            "api": {
                "type": kind,
                "url": f"http://${{TEST_MCP_HOST:-127.0.0.1}}:{port}{path}",
                "headers": {HEADER: "${TEST_MCP_KEY}"},
            }
        },
    )
    res = tether(
        tmp_path, *run_args(tmp_path, contract(tmp_path), mcp), env={"TEST_MCP_KEY": SECRET}
    )
    assert res.returncode == 0, (res.stdout, res.stderr)
    doc = json.loads(res.stdout)
    assert doc["status"] == "satisfied", doc
    assert doc["launch"]["mcp_config"] == str(mcp) and doc["launch"]["mcp_servers"] == ["api"]
    # The task keeps the reference; the secret is never stored nor printed.
    stored = stored_bytes(tmp_path)
    assert b"${TEST_MCP_KEY}" in stored and SECRET.encode() not in stored
    assert SECRET not in res.stdout + res.stderr


def test_an_unset_header_variable_is_refused_before_anything_is_written(
    tmp_path: Path, guarded_port: int
) -> None:
    url = f"http://127.0.0.1:{guarded_port}/mcp"
    mcp = config(tmp_path, {"api": {"url": url, "headers": {HEADER: "${TEST_MCP_KEY}"}}})
    res = tether(tmp_path, *run_args(tmp_path, contract(tmp_path), mcp), env={})
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    said = " ".join(res.stderr.split())  # the message may be wrapped
    # The environment check names the variable and the server before anything starts.
    assert "TEST_MCP_KEY (for MCP server api) is not set" in said
    assert not stored_bytes(tmp_path)


def test_a_wrong_header_is_refused_at_the_check_without_showing_it(
    tmp_path: Path, guarded_port: int
) -> None:
    wrong = "not-the-key-but-still-secret-0815"
    url = f"http://127.0.0.1:{guarded_port}/mcp"
    mcp = config(tmp_path, {"api": {"url": url, "headers": {HEADER: "${TEST_MCP_KEY}"}}})
    res = tether(
        tmp_path, *run_args(tmp_path, contract(tmp_path), mcp), env={"TEST_MCP_KEY": wrong}
    )
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    assert "MCP server 'api'" in res.stderr and "could not be reached" in res.stderr
    assert wrong not in res.stdout + res.stderr
    assert not stored_bytes(tmp_path)


def test_an_unknown_field_in_the_config_names_field_and_server(tmp_path: Path) -> None:
    mcp = config(tmp_path, {"api": {"command": "x", "alwaysAllow": ["add"]}})
    res = tether(tmp_path, *run_args(tmp_path, contract(tmp_path), mcp), env={})
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    assert "server 'api': unknown field 'alwaysAllow'" in " ".join(res.stderr.split())


async def test_sources_reach_a_guarded_server_only_with_the_header(
    guarded_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"http://127.0.0.1:{guarded_port}/mcp"
    monkeypatch.setenv("TEST_MCP_KEY", SECRET)
    server = McpServer(name="api", type="http", url=url, headers={HEADER: "${TEST_MCP_KEY}"})
    async with McpSources([server]) as sources:
        assert "api__add" in {t.name for t in sources.tools()}
    with pytest.raises(errors.UserError, match="could not be reached"):
        async with McpSources([McpServer(name="api", url=url)]):
            pass


# --- started once -----------------------------------------------------------------------


def test_tether_run_starts_a_stdio_server_once(tmp_path: Path) -> None:
    """The run uses the session its check opened: one start, not two."""
    log = tmp_path / "starts.log"
    mcp = config(
        tmp_path,
        {
            "api": {
                "command": sys.executable,
                "args": [SERVER],
                "env": {"MCP_TEST_START_LOG": str(log)},
            }
        },
    )
    res = tether(tmp_path, *run_args(tmp_path, contract(tmp_path), mcp), env={})
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert json.loads(res.stdout)["status"] == "satisfied"
    assert len(log.read_text().splitlines()) == 1


def test_submit_queues_the_config_servers_as_written(tmp_path: Path) -> None:
    """`submit --mcp-config`: checked here (the server starts), stored with `${VAR}`."""
    mcp = config(
        tmp_path,
        {"api": {"command": sys.executable, "args": [SERVER], "env": {"TAG": "${TEST_MCP_TAG}"}}},
    )
    db = f"sqlite:///{tmp_path / 'tether.db'}"
    spec = contract(tmp_path)
    args = ["submit", str(spec), "--mcp-config", str(mcp), "--db", db, "--json"]
    res = tether(tmp_path, *args, env={"TEST_MCP_TAG": "tag-value-not-stored"})
    assert res.returncode == 0, (res.stdout, res.stderr)
    task_id = json.loads(res.stdout)["task_id"]
    shown = tether(tmp_path, "status", task_id, "--db", db, "--json", env={})
    assert json.loads(shown.stdout)["launch"]["mcp_config"] == str(mcp)
    stored = stored_bytes(tmp_path)
    assert b"${TEST_MCP_TAG}" in stored and b"tag-value-not-stored" not in stored
    # Without the variable the check refuses it, naming server and variable.
    res = tether(tmp_path, *args, env={})
    assert res.returncode == 2, (res.stdout, res.stderr)
    said = " ".join(res.stderr.split())
    assert "TEST_MCP_TAG (for MCP server api) is not set" in said


async def test_kept_open_sources_start_each_server_once(tmp_path: Path) -> None:
    log = tmp_path / "starts.log"
    server = McpServer(
        name="api", command=sys.executable, args=[SERVER], env={"MCP_TEST_START_LOG": str(log)}
    )
    again = McpServer.model_validate(server.model_dump())  # equal settings, another object
    async with kept_open():
        async with McpSources([server]) as first:
            pid = first.sources[0]
        async with McpSources([again]) as second:
            assert second.sources[0] is pid and second.sources[0].connected
            assert "api__add" in {t.name for t in second.tools()}
        assert pid.connected  # still open: kept_open closes it
    assert not pid.connected
    assert len(log.read_text().splitlines()) == 1
    async with McpSources([server]):  # outside kept_open: started, and stopped after
        pass
    assert len(log.read_text().splitlines()) == 2


# --- the real servers CI uses -----------------------------------------------------------


def real_tools(request: ModelRequest) -> ModelResponse:
    """Calls through each real server, one per round, then done."""
    done = sum(1 for m in request.messages if m.role == "tool")
    calls = [
        tool_call("time__get_current_time", timezone="UTC"),
        tool_call("git__git_status", repo_path=os.environ["TEST_MCP_REPO"]),
        tool_call("fs__list_directory", path=os.environ["TEST_MCP_WS"]),
    ]
    if done >= len(calls):
        return ModelResponse("done")
    return ModelResponse("next", (calls[done],))


def test_real_servers_from_a_dot_mcp_json(tmp_path: Path) -> None:
    fs = installed("npm/node_modules/.bin/mcp-server-filesystem")
    git = installed("py/bin/mcp-server-git")
    clock = installed("py/bin/mcp-server-time")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "hello.txt").write_text("hi\n")
    repo = new_repo(tmp_path / "repo")
    mcp = config(
        tmp_path,
        {
            "time": {"type": "stdio", "command": clock, "env": {"TZ": "${TEST_MCP_TZ:-UTC}"}},
            "git": {"command": git, "args": ["--repository", "${TEST_MCP_REPO}"], "cwd": str(repo)},
            "fs": {"command": fs, "args": ["${env:TEST_MCP_WS}"]},
        },
    )
    items = [
        {"id": t, "title": f"call {t}", "done_when": {"kind": "op", "tool": t}}
        for t in ("time__get_current_time", "git__git_status", "fs__list_directory")
    ]
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "objective": "work through real MCP servers from a .mcp.json",
                "items": items,
                "tools": [i["id"] for i in items],
                "models": {"judge": "rules"},
                "limits": {"max_rounds": 8},
            }
        )
    )
    env = {"TEST_MCP_REPO": str(repo), "TEST_MCP_WS": str(ws)}
    res = tether(tmp_path, *run_args(tmp_path, spec, mcp, "real_tools"), env=env)
    assert res.returncode == 0, (res.stdout, res.stderr)
    doc = json.loads(res.stdout)
    assert doc["status"] == "satisfied", doc
    assert doc["launch"]["mcp_servers"] == ["time", "git", "fs"]
