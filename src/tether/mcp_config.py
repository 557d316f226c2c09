"""MCP client configs: the `mcpServers` map as Claude Desktop, Cursor and Claude Code's
`.mcp.json` write it, and the `${VAR}` references in a server's settings.

    {"mcpServers": {
       "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem"]},
       "api": {"type": "http", "url": "${API_URL:-https://api.example.com}/mcp",
               "headers": {"Authorization": "Bearer ${API_TOKEN}"}}}}

A contract holds such a map as `mcpServers:` (or `mcp_servers:` written as a map), and
`tether run --mcp-config FILE` reads one from a JSON file (other top-level keys of the
file, as Claude Desktop's has, are left alone). The map's keys are the servers' names;
an entry takes the clients' fields (`CLIENT_FIELDS`) and tether's own (`TETHER_FIELDS`):
any other is refused, naming the field and the server.

`type`: `stdio` (a `command`), `http` or `streamable-http` (a `url`, streamable HTTP),
`sse` (a `url`, the older HTTP+SSE transport); without it a `command` is stdio and a
`url` streamable HTTP.

`${VAR}`, `${VAR:-default}` (and Cursor's `${env:VAR}`) in `command`, `args`, `env`,
`cwd`, `url` and `headers` are taken from tether's environment when the server starts:
the task stores them as written, never their values. A variable that is not set (and
has no default) is a `UserError` naming the server and the variable. A header that
carries a credential (`Authorization`, `Cookie`, a name with KEY, TOKEN, SECRET, ...)
must come from a variable, so that the secret is never stored with the task.

Pure: neither the MCP SDK nor `tether.spec` (which reads its contracts with this).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from tether import errors
from tether._validation import http_url_problem

#: A server's fields as the MCP clients write them.
CLIENT_FIELDS: Final = ("type", "command", "args", "env", "cwd", "url", "headers")
#: tether's own fields of a server (see `spec.McpServer`).
TETHER_FIELDS: Final = ("tools", "timeout", "prefix", "restart_attempts")
#: The transports of `type`.
TYPES: Final = ("stdio", "http", "streamable-http", "sse")
#: The largest config file `load_file` reads.
MAX_FILE_BYTES: Final = 1 << 20

_REF = re.compile(r"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_CREDENTIAL = re.compile(
    r"(AUTHORIZATION|COOKIE|KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE
)


class ServerConfig(Protocol):
    """The settings of one server (`spec.McpServer`), as read here."""

    @property
    def name(self) -> str: ...
    @property
    def type(self) -> str | None: ...
    @property
    def command(self) -> str | None: ...
    @property
    def args(self) -> list[str]: ...
    @property
    def env(self) -> dict[str, str]: ...
    @property
    def cwd(self) -> str | None: ...
    @property
    def url(self) -> str | None: ...
    @property
    def headers(self) -> dict[str, str]: ...


def _kind(value: Any) -> str:
    return {"str": "a line of text", "list": "a list"}.get(type(value).__name__, "a value")


def servers_from_map(value: Any) -> Any:
    """The `mcp_servers` list of a `mcpServers` map (name: settings); a list as it is.
    Fields no client writes and tether does not know are refused (a `ValueError`, one
    line per problem), naming the field and the server."""
    if isinstance(value, Mapping):
        entries = []
        for name, entry in value.items():
            if not isinstance(entry, Mapping):
                raise ValueError(
                    f"server {name!r}: expected its settings (command:, url:, ...), "
                    f"got {_kind(entry)}"
                )
            if "name" in entry:
                raise ValueError(f"server {name!r}: unknown field 'name' (its key is its name)")
            entries.append({"name": name, **entry})
    elif isinstance(value, list):
        entries = value
    else:
        return value
    known = ("name", *CLIENT_FIELDS, *TETHER_FIELDS)
    problems = [
        f"server {entry.get('name', n)!r}: unknown field {key!r} (a server takes "
        f"{', '.join(CLIENT_FIELDS)}, and tether's {', '.join(TETHER_FIELDS)})"
        for n, entry in enumerate(entries)
        if isinstance(entry, Mapping)
        for key in entry
        if key not in known
    ]
    if problems:
        raise ValueError("\n".join(problems))
    return entries


def transport_problem(server: ServerConfig, *, stored: bool) -> str | None:
    """What is wrong with a server's transport settings (naming the server), or None.
    `stored`: a task's stored spec (the checks of what is written now are skipped)."""
    problem = _transport_problem(server, stored=stored)
    return None if problem is None else f"server {server.name!r}: {problem}"


def _transport_problem(server: ServerConfig, *, stored: bool) -> str | None:
    kind, url = server.type, server.url
    if (server.command is None) == (url is None):
        return "give exactly one of command (stdio) or url (streamable HTTP or SSE)"
    if kind == "stdio" and url is not None:
        return f"type {kind!r} takes a command, not a url"
    if kind not in (None, "stdio") and server.command is not None:
        return f"type {kind!r} takes a url, not a command"
    if server.headers and url is None:
        return "headers are for a server with a url (HTTP); a stdio server takes env"
    if server.cwd is not None and url is not None:
        return "cwd is for a server with a command (stdio)"
    if stored:
        return None
    problem = None if url is None or references(url) else http_url_problem(url)
    if problem:
        return f"url {problem}"
    for name, text in server.headers.items():
        if _CREDENTIAL.search(name) and not references(text):
            return (
                f"headers.{name} is written out: the contract is stored with the task, so "
                f'take the value from the environment (for example "Bearer ${{API_TOKEN}}")'
            )
    return None


def references(text: str) -> bool:
    """Does `text` refer to a variable (`${VAR}`)?"""
    return _REF.search(text) is not None


@dataclass(frozen=True)
class Expanded:
    """A server's settings with every `${VAR}` taken from the environment."""

    command: str | None
    args: list[str]
    env: dict[str, str]
    cwd: str | None
    url: str | None
    headers: dict[str, str]
    #: The values variables gave to headers: secrets, never to be shown.
    secrets: set[str] = field(default_factory=set)


def expand(server: ServerConfig, environ: Mapping[str, str] | None = None) -> Expanded:
    """`server`'s settings with `${VAR}` and `${VAR:-default}` (`${env:VAR}`) taken from
    `environ` (default: tether's environment). A variable that is unset (or empty) takes
    its default; one that is not set and has none is a `UserError` naming the server,
    the field and the variable (never a value)."""
    source = os.environ if environ is None else environ
    secrets: set[str] = set()

    def sub(text: str, where: str, found: set[str] | None = None) -> str:
        def value(m: re.Match[str]) -> str:
            var, default = m.group(1), m.group(2)
            got = source.get(var)
            if not got and default is not None:
                return default
            if got is None:
                raise errors.UserError(
                    f"MCP server {server.name!r}: {where} refers to ${{{var}}}, which is "
                    f"not set; set {var} in tether's environment (or write "
                    f"${{{var}:-default}})",
                    server=server.name,
                )
            if found is not None:
                found.add(got)
            return got

        return _REF.sub(value, text)

    return Expanded(
        command=None if server.command is None else sub(server.command, "command"),
        args=[sub(a, f"args.{n}") for n, a in enumerate(server.args)],
        env={k: sub(v, f"env.{k}") for k, v in server.env.items()},
        cwd=None if server.cwd is None else sub(server.cwd, "cwd"),
        url=None if server.url is None else sub(server.url, "url"),
        headers={k: sub(v, f"headers.{k}", secrets) for k, v in server.headers.items()},
        secrets=secrets,
    )


def load_file(path: str | Path) -> list[Any]:
    """The servers of an MCP client config file (JSON with an `mcpServers` map), as
    `mcp_servers` entries; a file that cannot be read, or has no such map, or a server
    with a field nobody writes, is a `SpecError` naming the file."""
    source = str(path)
    try:
        with Path(path).open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise errors.SpecError(
            f"cannot read the MCP config ({exc.strerror})", source=source
        ) from None
    if len(raw) > MAX_FILE_BYTES:
        raise errors.SpecError("the MCP config is larger than 1 MiB", source=source)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise errors.SpecError(f"the MCP config is not JSON ({exc})", source=source) from None
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise errors.SpecError(
            'expected an MCP client config: a JSON object with an "mcpServers" map of '
            "server names to their settings (as Claude Desktop, Cursor and .mcp.json write)",
            source=source,
        )
    try:
        return list(servers_from_map(servers))
    except ValueError as exc:
        raise errors.SpecError(
            "the MCP config is not valid", source=source, problems=str(exc).splitlines()
        ) from None


__all__ = [
    "CLIENT_FIELDS",
    "TETHER_FIELDS",
    "TYPES",
    "Expanded",
    "ServerConfig",
    "expand",
    "load_file",
    "references",
    "servers_from_map",
    "transport_problem",
]
