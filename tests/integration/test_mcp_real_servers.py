"""tether against real third-party MCP servers: `@modelcontextprotocol/server-filesystem`
(npm), `mcp-server-git` and `mcp-server-time` (PyPI), as a user would wire them in.

`make mcp-servers` installs them, pinned (tests/mcp_servers/), under `.mcp-servers/`
(or where `TETHER_MCP_SERVERS` says); CI does so before the tests. Without them these
tests skip, saying how to install them, except in CI, where a missing server fails.

- names: every tool is exposed as `<server>__<tool>` beside tether's built-ins, and a
  server whose tool would take a built-in's name stops the task at start (exit 2);
- a real write through server-filesystem: its `destructiveHint` makes the call wait for
  a human, and once approved the file is on disk and read back through the server;
- a server killed in the middle of a call is restarted, the call retried, and the task
  finishes with its item done;
- a non-idempotent call (`git_commit`) in flight when its server dies waits for a human;
- a server that cannot come back parks the task, not its item, and says why (its stderr).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.loop import events_of
from tether import approvals, errors
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.tasks import create_task, status_dict
from tether.spec import parse_spec
from tether.store.memory import MemoryStore

ROOT = Path(__file__).resolve().parents[2]
HOME = Path(os.environ.get("TETHER_MCP_SERVERS") or ROOT / ".mcp-servers")
DEADLINE = 60.0


def installed(relative: str) -> str:
    """The path of an installed server's command; skip (fail in CI) when it is missing."""
    path = HOME / relative
    if path.exists():
        return str(path)
    if os.environ.get("CI") or os.environ.get("TETHER_MCP_SERVERS"):
        pytest.fail(f"the third-party MCP server {path} is missing; `make mcp-servers` installs it")
    pytest.skip(f"third-party MCP servers are not installed ({path}); run `make mcp-servers`")


@pytest.fixture
def fs_server() -> str:
    return installed("npm/node_modules/.bin/mcp-server-filesystem")


@pytest.fixture
def git_server() -> str:
    return installed("py/bin/mcp-server-git")


@pytest.fixture
def time_server() -> str:
    return installed("py/bin/mcp-server-time")


def spec(
    items: list[dict[str, Any]], tools: list[Any], servers: list[dict[str, Any]], **more: Any
) -> Any:
    return parse_spec(
        {
            "objective": "work through real MCP servers",
            "items": items,
            "tools": tools,
            "models": {"judge": "rules"},
            "limits": {"no_progress_rounds": 20, "max_rounds": 8},
            "mcp_servers": servers,
            **more,
        }
    )


def results_of(request: ModelRequest) -> list[str]:
    return [str(m.content) for m in request.messages if m.role == "tool"]


# --- server processes -------------------------------------------------------------------


def children(marker: str) -> list[int]:
    """Live child processes of this one whose command line contains `marker`."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # Another process's name or arguments need not be UTF-8 (hostile-input tests
            # run the CLI with raw bytes): read them leniently.
            stat = (entry / "stat").read_bytes().decode(errors="replace")
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == me and fields[0] != "Z" and marker in cmdline:
            found.append(int(entry.name))
    return found


def holds_open(pid: int, path: Path) -> bool:
    """Does process `pid` have `path` open?"""
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(fd) == str(path):
                return True
        except OSError:
            continue
    return False


async def until(what: str, check: Callable[[], Any]) -> Any:
    """Poll `check` until it gives something true (the deadline fails the test)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


# --- names ------------------------------------------------------------------------------


async def test_real_servers_tools_are_prefixed_beside_the_builtins(
    tmp_path: Path, fs_server: str, git_server: str, time_server: str
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    repo = new_repo(tmp_path / "repo")
    servers = [
        {"name": "fs", "command": fs_server, "args": [str(ws)]},
        {"name": "git", "command": git_server, "args": ["--repository", str(repo)]},
        {"name": "time", "command": time_server},
    ]
    items = [
        {
            "id": "clock",
            "title": "tell the time in UTC",
            "done_when": {"kind": "op", "tool": "time.get_current_time"},
        }
    ]
    allow = ["time.get_current_time", "git__git_status", "fs__read_text_file", "read_file"]

    def policy(request: ModelRequest) -> ModelResponse:
        return ModelResponse("time?", (tool_call("time__get_current_time", timezone="UTC"),))

    store = await MemoryStore.open()
    task = await create_task(store, spec(items, allow, servers), workspace=ws)
    model = ScriptedModel(policy=policy)
    result = await Engine(store, ModelSet(model)).run(task.task_id)
    assert result.status == "satisfied", result
    (op,) = await events_of(store, task.task_id, "op.result")
    assert op["tool"] == "time__get_current_time" and op["status"] == "succeeded"
    assert "UTC" in op["summary"]
    act = next(r for r in model.requests if r.purpose == "act")
    names = {t.name for t in act.tools}
    # The allowlisted ones, each under its server's prefix; the built-in keeps its name.
    assert names >= {"time__get_current_time", "git__git_status", "fs__read_text_file"}
    assert "read_file" in names and "fs__read_file" not in names  # not on the allowlist
    assert not names & {"get_current_time", "git_status", "read_text_file"}


async def test_rereading_through_a_closed_world_server_is_no_progress(
    tmp_path: Path, fs_server: str
) -> None:
    """Real servers say which reads change by themselves: server-filesystem's reads are
    `openWorldHint: false`, so asking again and hearing the same is a loop (blocked after
    `no_progress_rounds` at the default limits), not waiting."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("the same every time\n")
    servers = [{"name": "fs", "command": fs_server, "args": [str(ws)]}]
    items = [{"id": "read", "title": "read the notes", "done_when": {"kind": "file", "path": "x"}}]
    contract = {
        "objective": "read the notes",
        "items": items,
        "tools": ["fs__read_text_file"],
        "mcp_servers": servers,
    }

    def policy(request: ModelRequest) -> ModelResponse:
        return ModelResponse(
            "reading again", (tool_call("fs__read_text_file", path=str(ws / "notes.txt")),)
        )

    store = await MemoryStore.open()
    task = await create_task(store, parse_spec(contract), workspace=ws)
    result = await Engine(store, ModelSet(ScriptedModel(policy=policy))).run(task.task_id)
    assert result.status == "waiting"
    item = (await store.get_ledger(task.task_id)).to_ledger().item("read")
    limit = parse_spec(contract).limits.no_progress_rounds
    assert item.status == "blocked" and item.note.startswith(f"no progress in {limit} rounds")
    assert len(await events_of(store, task.task_id, "round.committed")) == 1 + limit


def clashing_spec(ws: Path, fs_server: str) -> dict[str, Any]:
    return {
        "objective": "read a file",
        "items": [{"id": "i1", "title": "read it"}],
        "tools": ["read_file"],
        "models": {"judge": "rules"},
        "mcp_servers": [{"name": "fs", "command": fs_server, "args": [str(ws)], "prefix": ""}],
    }


async def test_real_server_tool_named_like_a_builtin_is_refused(
    tmp_path: Path, fs_server: str
) -> None:
    """server-filesystem without a prefix offers `read_file` and `write_file`, as tether's
    built-ins are named: refused at start, naming both, never silently shadowed."""
    store = await MemoryStore.open()
    task = await create_task(store, parse_spec(clashing_spec(tmp_path, fs_server)))
    with pytest.raises(errors.SpecError) as info:
        await Engine(store, ModelSet(ScriptedModel(policy=lambda r: ModelResponse("?")))).run(
            task.task_id
        )
    text = str(info.value)
    assert "'read_file'" in text and "MCP server 'fs'" in text and "built-in" in text
    assert info.value.exit_code == 2
    assert not await events_of(store, task.task_id, "op.result")


def typo_spec(ws: Path, fs_server: str) -> dict[str, Any]:
    data = clashing_spec(ws, fs_server)
    del data["mcp_servers"][0]["prefix"]
    data["tools"] = ["fs.read_text_file", "fs.write_fil"]
    return data


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (clashing_spec, ["'read_file'", "MCP server 'fs'", "built-in"]),
        (typo_spec, ["not registered: fs.write_fil", "fs__write_file"]),
    ],
    ids=["clash", "typo"],
)
def test_cli_run_refuses_a_bad_mcp_contract_before_writing(
    tmp_path: Path, fs_server: str, make: Callable[[Path, str], Any], said: list[str]
) -> None:
    """`tether run` starts the servers to check the contract: a clash or a tool no
    server offers is a one-paragraph error, exit 2, and no task (nor database) is made."""
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(make(tmp_path, fs_server)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env["PYTHONPATH"] = str(ROOT)
    model = "scripted:tests.integration.test_mcp_real_servers:idle"
    db = f"sqlite:///{tmp_path / 'tether.db'}"
    res = subprocess.run(
        [sys.executable, "-m", "tether.cli", "run", str(path), "--model", model, "--db", db],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    for text in said:
        assert text in res.stderr
    assert not (tmp_path / "tether.db").exists()  # refused before anything was written


def idle(request: ModelRequest) -> ModelResponse:
    """A model for the CLI test: it never gets to act."""
    return ModelResponse("NEED_HELP: nothing to do")


# --- a real write, with approval --------------------------------------------------------


async def test_real_write_through_server_filesystem_waits_for_approval(
    tmp_path: Path, fs_server: str
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    target = ws / "notes" / "hello.txt"
    items = [
        {
            "id": "note",
            "title": "write the note and read it back",
            "done_when": {"kind": "op", "tool": "fs.read_text_file"},
        }
    ]

    def policy(request: ModelRequest) -> ModelResponse:
        n = len(results_of(request))
        if n == 0:
            return ModelResponse(
                "mkdir", (tool_call("fs__create_directory", path=str(ws / "notes")),)
            )
        if n == 1:
            call = tool_call("fs__write_file", path=str(target), content="hello from tether\n")
            return ModelResponse("write", (call,))
        return ModelResponse("read back", (tool_call("fs__read_text_file", path=str(target)),))

    servers = [{"name": "fs", "command": fs_server, "args": [str(ws)]}]
    allow = ["fs.create_directory", "fs.write_file", "fs.read_text_file"]
    store = await MemoryStore.open()
    task = await create_task(store, spec(items, allow, servers), workspace=ws)
    engine = Engine(store, ModelSet(ScriptedModel(policy=policy)))
    first = await engine.run(task.task_id)
    # `write_file` is destructive (it may replace a file): it waits for a human, unsent.
    assert first.status == "waiting", first
    assert not target.exists()
    (req,) = await approvals.pending(store, task.task_id)
    assert req.request["tool"] == "fs__write_file" and "fs__write_file" in req.request["what"]
    await approvals.decide(store, task.task_id, req.request_id, "approve")
    result = await engine.run(task.task_id)
    assert result.status == "satisfied", result
    assert target.read_text() == "hello from tether\n"  # written by the server itself
    ops = await events_of(store, task.task_id, "op.result")
    assert [(o["tool"], o["status"]) for o in ops] == [
        ("fs__create_directory", "succeeded"),
        ("fs__write_file", "succeeded"),
        ("fs__read_text_file", "succeeded"),
    ]
    assert "hello from tether" in ops[-1]["summary"]


# --- supervision ------------------------------------------------------------------------


async def test_server_filesystem_killed_mid_call_is_restarted_and_the_task_finishes(
    tmp_path: Path, fs_server: str
) -> None:
    """The server blocks reading a FIFO; it is killed while the call is in flight. The
    read is retried on a restarted server, which gets the data; the item is done."""
    ws = tmp_path / "ws"
    ws.mkdir()
    fifo = ws / "pipe"
    os.mkfifo(fifo)
    items = [
        {
            "id": "pipe",
            "title": "read the pipe",
            "done_when": {"kind": "op", "tool": "fs__read_text_file"},
        }
    ]

    def policy(request: ModelRequest) -> ModelResponse:
        return ModelResponse("read", (tool_call("fs__read_text_file", path=str(fifo)),))

    def writer() -> int | None:
        """A write end of the pipe, once a reader is there (one blocked opening it counts)."""
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: nobody reads yet
            return None

    async def kill_then_feed() -> list[int]:
        fd = await until("the server to open the pipe", writer)
        try:
            # With a writer there, the server's open returns and it waits for data.
            first = await until(
                "the server to hold the pipe",
                lambda: [p for p in children(fs_server) if holds_open(p, fifo)],
            )
            os.kill(first[0], signal.SIGKILL)
            second = await until(
                "a restarted server to open the pipe",
                lambda: [p for p in children(fs_server) if p != first[0] and holds_open(p, fifo)],
            )
            os.write(fd, b"through the pipe\n")
        finally:
            os.close(fd)  # end of file: the reader's read ends
        return [first[0], second[0]]

    servers = [{"name": "fs", "command": fs_server, "args": [str(ws)], "timeout": 60}]
    store = await MemoryStore.open()
    task = await create_task(store, spec(items, ["fs__read_text_file"], servers), workspace=ws)
    feeder = asyncio.create_task(kill_then_feed())
    try:
        result = await Engine(store, ModelSet(ScriptedModel(policy=policy))).run(task.task_id)
        pids = await asyncio.wait_for(feeder, DEADLINE)
    finally:
        feeder.cancel()
    assert pids[0] != pids[1]
    assert result.status == "satisfied", result
    retries = await events_of(store, task.task_id, "op.retry_scheduled")
    assert len(retries) == 1 and "connection was lost" in retries[0]["error"]
    (op,) = await events_of(store, task.task_id, "op.result")
    assert op["status"] == "succeeded" and "through the pipe" in op["summary"]
    item = (await store.get_ledger(task.task_id)).to_ledger().item("pipe")
    assert item.status == "done" and item.attempts == 0


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


def new_repo(path: Path) -> Path:
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    git(path, "config", "user.email", "tests@tether.invalid")
    git(path, "config", "user.name", "tether tests")
    (path / "a.txt").write_text("a\n")
    git(path, "add", "a.txt")
    return path


async def test_git_commit_in_flight_when_the_server_dies_waits_for_a_human(
    tmp_path: Path, git_server: str
) -> None:
    """`git_commit` is neither read-only nor idempotent: lost in flight (a pre-commit
    hook holds it while the server is killed), it is never re-sent by guesswork."""
    repo = new_repo(tmp_path / "repo")
    started, release = tmp_path / "hook-started", tmp_path / "hook-release"
    hook = repo / ".git" / "hooks" / "pre-commit"
    hook.write_text(
        f"#!/bin/sh\ntouch '{started}'\nwhile [ ! -e '{release}' ]; do sleep 0.05; done\nexit 1\n"
    )
    hook.chmod(0o755)
    items = [{"id": "commit", "title": "commit a.txt"}]

    def policy(request: ModelRequest) -> ModelResponse:
        return ModelResponse(
            "commit", (tool_call("git__git_commit", repo_path=str(repo), message="a"),)
        )

    async def kill_in_flight() -> None:
        await until("the commit hook to start", started.exists)
        for pid in children(git_server):
            os.kill(pid, signal.SIGKILL)

    servers = [{"name": "git", "command": git_server, "args": ["--repository", str(repo)]}]
    store = await MemoryStore.open()
    task = await create_task(store, spec(items, ["git.git_commit"], servers), workspace=tmp_path)
    killer = asyncio.create_task(kill_in_flight())
    try:
        result = await Engine(store, ModelSet(ScriptedModel(policy=policy))).run(task.task_id)
        await asyncio.wait_for(killer, DEADLINE)
    finally:
        killer.cancel()
        release.touch()  # the orphaned hook exits
    assert result.status == "waiting", result
    (req,) = await approvals.pending(store, task.task_id)
    assert req.request_id.endswith(".in_doubt") and "git__git_commit" in req.request["what"]
    assert result.waiting is not None and result.waiting["request_id"] == req.request_id
    dispatched = await events_of(store, task.task_id, "op.dispatched")
    assert len(dispatched) == 1  # sent once, never again by itself
    assert git(repo, "log", "--oneline", "--all") == ""  # and nothing was committed


async def test_git_server_that_cannot_come_back_parks_the_task_not_its_item(
    tmp_path: Path, git_server: str
) -> None:
    """The repository goes away and the server is killed: every restart exits at once
    ("... is not a valid Git repository"). The task parks, the item is not charged, and
    the status says what the server said."""
    repo = new_repo(tmp_path / "repo")
    items = [
        {
            "id": "status",
            "title": "see the status",
            "done_when": {"kind": "op", "tool": "git__git_log"},
        }
    ]

    def policy(request: ModelRequest) -> ModelResponse:
        if not results_of(request):
            return ModelResponse("status", (tool_call("git__git_status", repo_path=str(repo)),))
        return ModelResponse("log", (tool_call("git__git_log", repo_path=str(repo)),))

    def break_it() -> None:
        # Between the rounds: the repository is gone, then its server.
        shutil.rmtree(repo / ".git")
        for pid in children(git_server):
            os.kill(pid, signal.SIGKILL)

    def acting(request: ModelRequest) -> ModelResponse:
        if len(results_of(request)) == 1 and (repo / ".git").exists():
            break_it()
        return policy(request)

    servers = [
        {
            "name": "git",
            "command": git_server,
            "args": ["--repository", str(repo)],
            "restart_attempts": 1,
        }
    ]
    allow = ["git__git_status", "git__git_log"]
    store = await MemoryStore.open()
    task = await create_task(store, spec(items, allow, servers), workspace=tmp_path)
    result = await Engine(store, ModelSet(ScriptedModel(policy=acting))).run(task.task_id)
    assert result.status == "waiting", result
    doc = await status_dict(store, task.task_id)
    reason = doc["waiting"]["reason"]
    assert doc["waiting"]["kind"] == "external" and "git__git_log" in reason
    assert "could not be restarted" in reason and "not a valid Git repository" in reason
    (item,) = doc["ledger"]["items"]
    assert item["status"] in ("pending", "in_progress") and item["attempts"] == 0
    ops = await events_of(store, task.task_id, "op.result")
    assert [(o["tool"], o["status"]) for o in ops] == [
        ("git__git_status", "succeeded"),
        ("git__git_log", "failed"),
    ]
    assert json.dumps(ops[1]).count("not a valid Git repository") >= 1


# --- the README's example -----------------------------------------------------------------


def readme_mcp_spec() -> dict[str, Any]:
    """The YAML contract of the README's "MCP servers" section."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## MCP servers") :]
    block = section[section.index("```yaml\n") + 8 :]
    return dict(yaml.safe_load(block[: block.index("```")]))


async def test_readme_mcp_example_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fs_server: str, time_server: str
) -> None:
    """The README's contract as written, its commands found where `make mcp-servers` put
    them (as on a PATH): the date comes from the time server, the write waits for a
    human, and once approved the note is on disk."""
    data = readme_mcp_spec()
    installed_as = {"mcp-server-filesystem": fs_server, "mcp-server-time": time_server}
    for server in data["mcp_servers"]:
        server["command"] = installed_as[server["command"]]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes").mkdir()
    note = tmp_path / "notes" / "today.md"

    def policy(request: ModelRequest) -> ModelResponse:
        seen = results_of(request)
        if not seen:
            return ModelResponse("date?", (tool_call("time__get_current_time", timezone="UTC"),))
        today = json.loads(seen[0])["datetime"][:10]
        return ModelResponse("write", (tool_call("fs__write_file", path=str(note), content=today),))

    store = await MemoryStore.open()
    task = await create_task(store, parse_spec(data), workspace=tmp_path)
    engine = Engine(store, ModelSet(ScriptedModel(policy=policy)))
    assert (await engine.run(task.task_id)).status == "waiting"
    (req,) = await approvals.pending(store, task.task_id)
    assert req.request["tool"] == "fs__write_file"
    await approvals.decide(store, task.task_id, req.request_id, "approve")
    result = await engine.run(task.task_id)
    assert result.status == "satisfied", result
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", note.read_text())
