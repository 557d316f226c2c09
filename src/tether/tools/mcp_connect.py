"""How tether reaches an MCP server, and the servers a command keeps open for its run.

`transport(server, errlog)` is what the SDK's `Client` connects through: a stdio
process (`command`, `args`, `env`, `cwd`), streamable HTTP (`url`, `headers`) or the
older HTTP+SSE transport (`type: sse`), every `${VAR}` of the settings expanded first
(`mcp_config.expand`). Header values taken from variables are secrets: the redactor
masks them from then on, in what tether journals and prints.

`kept_open()`: within it, the MCP servers an `McpSources` starts stay open when it
closes, and a later `McpSources` of a server with the same settings, in the same
asyncio task or one it started, uses that open session instead of starting the server
again; all are closed when it ends. `tether run` checks a contract by starting its
servers before the task is written; in `kept_open()`, the run uses those sessions.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any, Final, Protocol, TextIO

from tether import errors, mcp_config, redact
from tether._extras import needs
from tether._validation import http_url_problem

with needs("mcp", "a contract with mcp_servers"):
    import httpx2
    from mcp.client.sse import sse_client
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client

#: The HTTP client's timeouts (seconds), as the SDK's own: a response stream may stay
#: open for long.
HTTP_TIMEOUT: Final = 30.0
HTTP_READ_TIMEOUT: Final = 300.0


class _Server(mcp_config.ServerConfig, Protocol):
    def model_dump_json(self) -> str: ...


def transport(server: mcp_config.ServerConfig, errlog: TextIO) -> Any:
    """The SDK transport for `server` (see the module docstring); a variable that is not
    set, or a URL that is not one once expanded, is a `UserError` naming the server."""
    x = mcp_config.expand(server)
    for secret in x.secrets:
        redact.remember(secret)
    if x.command is not None:
        params = StdioServerParameters(command=x.command, args=x.args, env=x.env or None, cwd=x.cwd)
        return stdio_client(params, errlog=errlog)
    url = x.url or ""
    problem = http_url_problem(url)
    if problem:
        # Shown as written: the expanded URL may hold a secret.
        raise errors.UserError(
            f"MCP server {server.name!r}: url {server.url!r} {problem}", server=server.name
        )
    if server.type == "sse":
        return sse_client(url, headers=x.headers or None, sse_read_timeout=HTTP_READ_TIMEOUT)
    return _streamable_http(url, x.headers)


@asynccontextmanager
async def _streamable_http(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    timeout = httpx2.Timeout(HTTP_TIMEOUT, read=HTTP_READ_TIMEOUT)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams


_KEPT: ContextVar[dict[str, Any] | None] = ContextVar("tether_mcp_kept", default=None)


def key(server: _Server) -> str:
    """What makes two servers the same one: all their settings, as written."""
    return server.model_dump_json()


def kept() -> dict[str, Any] | None:
    """The open sources of `kept_open()` by `key`, or None outside it."""
    return _KEPT.get()


@asynccontextmanager
async def kept_open() -> AsyncIterator[None]:
    """Keep the MCP servers started within open until the end (see the module)."""
    sources: dict[str, Any] = {}
    token = _KEPT.set(sources)
    try:
        yield
    finally:
        _KEPT.reset(token)
        await asyncio.gather(*(s.__aexit__(None, None, None) for s in sources.values()))


__all__ = ["HTTP_READ_TIMEOUT", "HTTP_TIMEOUT", "kept", "kept_open", "key", "transport"]
