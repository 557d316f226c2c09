"""MCP client configs (`tether.mcp_config`): the `mcpServers` map as Claude Desktop, Cursor
and `.mcp.json` write it, in a contract and in an `--mcp-config` file, and `${VAR}` in a
server's settings, taken from the environment when it starts (never stored)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tether import errors, mcp_config
from tether.runtime.launch import record, with_mcp_config
from tether.spec import McpServer, parse_spec

BASE: dict[str, Any] = {"objective": "o", "items": [{"id": "a", "title": "t"}]}

#: As the three clients write them: Claude Desktop (command, args, env), Cursor (url,
#: headers with `${env:VAR}`), Claude Code's .mcp.json (type, `${VAR:-default}`).
CLIENTS: dict[str, Any] = {
    "mcpServers": {
        "files": {"command": "npx", "args": ["-y", "server-filesystem", "."], "env": {}},
        "docs": {"url": "https://mcp.example.com/mcp", "headers": {"API_KEY": "${env:K}"}},
        "api": {
            "type": "http",
            "url": "${API_URL:-https://api.example.com}/mcp",
            "headers": {"Authorization": "Bearer ${API_TOKEN}"},
        },
        "old": {"type": "sse", "url": "https://old.example.com/sse"},
        "local": {"type": "stdio", "command": "python", "args": ["s.py"], "cwd": "/srv"},
        "stream": {"type": "streamable-http", "url": "http://127.0.0.1:9/mcp"},
    }
}


def problems(data: dict[str, Any]) -> str:
    with pytest.raises(errors.SpecError) as info:
        parse_spec({**BASE, **data})
    assert info.value.exit_code == 2
    return str(info.value)


def test_a_contract_takes_the_clients_mcp_servers_map() -> None:
    spec = parse_spec({**BASE, **CLIENTS})
    by_name = {s.name: s for s in spec.mcp_servers}
    assert list(by_name) == ["files", "docs", "api", "old", "local", "stream"]
    assert by_name["api"].type == "http" and by_name["old"].type == "sse"
    assert by_name["local"].cwd == "/srv" and by_name["files"].args[-1] == "."
    # Stored as written: the references, never their values.
    stored = spec.model_dump(mode="json")["mcp_servers"]
    assert stored[2]["headers"] == {"Authorization": "Bearer ${API_TOKEN}"}
    again = parse_spec(spec.model_dump(mode="json"), stored=True)
    assert again.mcp_servers == spec.mcp_servers
    # `mcp_servers:` may be the map too.
    as_map = parse_spec({**BASE, "mcp_servers": CLIENTS["mcpServers"]})
    assert as_map.mcp_servers == spec.mcp_servers


@pytest.mark.parametrize(
    ("servers", "said"),
    [
        ({"n": {"command": "x", "autoApprove": []}}, "server 'n': unknown field 'autoApprove'"),
        ({"n": {"command": "x", "name": "m"}}, "server 'n': unknown field 'name'"),
        ({"n": "npx server"}, "server 'n': expected its settings"),
        ({"n": {"type": "sse", "command": "x"}}, "server 'n': type 'sse' takes a url"),
        ({"n": {"type": "stdio", "url": "http://h/mcp"}}, "type 'stdio' takes a command"),
        ({"n": {"command": "x", "headers": {"A": "b"}}}, "headers are for a server with a url"),
        ({"n": {"url": "http://h/mcp", "cwd": "/"}}, "cwd is for a server with a command"),
        ({"n": {"url": "ftp://h/mcp"}}, "server 'n': url must be an http(s):// URL"),
        ({"n": {"url": "http://h", "type": "ws"}}, "'stdio', 'http', 'streamable-http' or 'sse'"),
        ({"n": {"args": ["a"]}}, "give exactly one of command (stdio) or url"),
        (
            {"n": {"url": "http://h/mcp", "headers": {"Authorization": "Bearer abc123456"}}},
            "headers.Authorization is written out",
        ),
        ({"n": {"url": "http://h/mcp", "headers": {"X-Api-Key": "k"}}}, "written out"),
    ],
)
def test_a_bad_server_is_refused_naming_it(servers: dict[str, Any], said: str) -> None:
    text = problems({"mcpServers": servers})
    assert said in text
    assert "abc123456" not in text  # a credential written out is not repeated


def test_the_list_form_names_the_server_of_an_unknown_field_too() -> None:
    text = problems({"mcp_servers": [{"name": "notes", "command": "x", "disabled": True}]})
    assert "server 'notes': unknown field 'disabled'" in text


def test_a_stored_spec_keeps_reading_what_is_now_refused() -> None:
    """The credential check is for what is written now (a task stored before stays)."""
    data = {**BASE, "mcp_servers": [{"name": "n", "url": "http://h", "headers": {"KEY": "v"}}]}
    assert parse_spec(data, stored=True).mcp_servers[0].headers == {"KEY": "v"}


def server(**fields: Any) -> McpServer:
    return McpServer.model_validate({"name": "tickets", "command": "x", **fields})


def test_references_are_filled_from_the_environment() -> None:
    env = {"TICKETS_TOKEN": "s3cr3t-value", "EMPTY": "", "HOME": "/home/me"}
    s = server(
        command="${HOME}/bin/srv",
        args=["--token=${env:TICKETS_TOKEN}", "$HOME", "${MODE:-fast}", "${EMPTY:-dflt}"],
        env={"TOKEN": "${TICKETS_TOKEN}", "E": "${EMPTY}"},
        cwd="${HOME}/work",
    )
    x = mcp_config.expand(s, env)
    assert x.command == "/home/me/bin/srv" and x.cwd == "/home/me/work"
    # Only ${NAME} is a reference; an unset or empty one takes its default.
    assert x.args == ["--token=s3cr3t-value", "$HOME", "fast", "dflt"]
    assert x.env == {"TOKEN": "s3cr3t-value", "E": ""}
    assert x.secrets == set()
    h = McpServer(
        name="api", url="${BASE:-http://127.0.0.1:1}/mcp", headers={"A": "Bearer ${TICKETS_TOKEN}"}
    )
    hx = mcp_config.expand(h, env)
    assert hx.url == "http://127.0.0.1:1/mcp" and hx.headers == {"A": "Bearer s3cr3t-value"}
    assert hx.secrets == {"s3cr3t-value"}


def test_an_unset_reference_names_the_server_field_and_variable() -> None:
    s = McpServer(name="api", url="http://h/mcp", headers={"Authorization": "Bearer ${NOPE}"})
    with pytest.raises(errors.UserError) as info:
        mcp_config.expand(s, {"OTHER": "x"})
    assert info.value.exit_code == 2
    assert "MCP server 'api': headers.Authorization refers to ${NOPE}, which is not set" in str(
        info.value
    )


def write(tmp_path: Path, data: Any, name: str = "mcp.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_an_mcp_config_file_joins_the_contracts_servers(tmp_path: Path) -> None:
    contract = parse_spec({**BASE, "mcp_servers": [{"name": "mine", "command": "x"}]})
    # Claude Desktop's file holds more than the servers: the rest is not tether's.
    path = write(tmp_path, {**CLIENTS, "globalShortcut": "Ctrl+Space"})
    spec = with_mcp_config(contract, path)
    assert [s.name for s in spec.mcp_servers] == [
        "mine",
        *CLIENTS["mcpServers"],
    ]
    launch = record(spec, workspace="/w", env={}, mcp_config=path)
    assert launch["mcp_servers"][-1] == "stream" and launch["mcp_config"] == str(path)
    assert "mcp_config" not in record(contract, workspace="/w", env={})


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("{not json", "the MCP config is not JSON"),
        ({"servers": {}}, 'an "mcpServers" map'),
        ([1, 2], 'an "mcpServers" map'),
        ({"mcpServers": {"x": {"command": "c", "envFile": ".env"}}}, "unknown field 'envFile'"),
        ({"mcpServers": {"x": {"command": "c", "timeout": -1}}}, "mcpServers.x: timeout:"),
        ({"mcpServers": {"mine": {"command": "c"}}}, "the contract names a server 'mine' too"),
    ],
)
def test_a_bad_mcp_config_file_is_refused_naming_it(
    tmp_path: Path, content: Any, said: str
) -> None:
    contract = parse_spec({**BASE, "mcp_servers": [{"name": "mine", "command": "x"}]})
    path = write(tmp_path, content)
    with pytest.raises(errors.SpecError) as info:
        with_mcp_config(contract, path)
    assert str(info.value).startswith(f"{path}: ")
    assert said in str(info.value)


def test_a_missing_mcp_config_file_is_refused(tmp_path: Path) -> None:
    contract = parse_spec(BASE)
    with pytest.raises(errors.SpecError, match="cannot read the MCP config"):
        with_mcp_config(contract, tmp_path / "nope.json")
