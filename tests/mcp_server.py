"""A real MCP server for tether's tests, built with the official SDK (`MCPServer`).

Run it over stdio (the default) or over streamable HTTP on an ephemeral port::

    python tests/mcp_server.py            # stdio
    python tests/mcp_server.py --http     # prints "PORT <n>" on stdout, serves /mcp
    python tests/mcp_server.py --sse      # the same, over HTTP+SSE at /sse

(`MCP_TEST_PORT=n` picks the HTTP port instead; with `MCP_TEST_REQUIRE_HEADER="Name:
value"` a request without that header is answered 401.)

Tools (their annotations drive tether's effect mapping):

- `add(a, b)`: read-only.
- `delete_note(name)`: destructive.
- `put_note(name, text)`: idempotent (not read-only, not destructive); structured result.
- `plain(x)`: no annotations at all.
- `fail(msg)`: always fails, so the client sees `is_error=True` with `msg` in the text.
- `slow(seconds)`: unannotated, sleeps; `slow_read(seconds)`: read-only, sleeps.
- `whoami()`: read-only; the value of `MCP_TEST_TAG` in the server's environment.
- `op_key()`: read-only; the `tether/op_id` the client sent in the request's `_meta`.
- `crash()`: unannotated; kills the server process in the middle of the call (after a
  line on stderr).
- `crash_once(marker)`: read-only; kills the server mid-call unless the file `marker`
  exists (it creates it first), so a restarted server answers "survived".
- `pid()`: read-only; the server's process id.

`MCP_TEST_SHADOW=1` adds a tool named `read_file`, like tether's built-in.

`MCP_TEST_LONG_DESCRIPTION=n` adds a read-only tool `verbose(x)` whose description is
about `n` characters long.

`MCP_TEST_START_ONCE=path` makes the server start only once: a later start finds the
file and exits at once, as a server that never comes back (with `MCP_TEST_HANG_AGAIN=1`
it hangs instead, never answering; with `MCP_TEST_DOWN_STARTS=n` only the next `n`
starts fail, and it comes back after them).

`MCP_TEST_START_LOG=path` appends a line (the process id) to `path` at each start.

`MCP_TEST_PAGE_SIZE=n` in the environment makes `tools/list` answer in pages of `n`
tools linked by `next_cursor`, so clients must follow the cursor to see every tool.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from typing import Any

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ListToolsResult, PaginatedRequestParams, ToolAnnotations

_NOTES: dict[str, str] = {}


class PagedServer(MCPServer):
    """An `MCPServer` that pages its tool listing when `MCP_TEST_PAGE_SIZE` is set."""

    async def _handle_list_tools(
        self, ctx: Any, params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        tools = await self.list_tools()
        size = int(os.environ.get("MCP_TEST_PAGE_SIZE", "0") or 0)
        if size <= 0:
            return ListToolsResult(tools=tools)
        start = int(params.cursor) if params is not None and params.cursor else 0
        end = start + size
        return ListToolsResult(
            tools=tools[start:end], next_cursor=str(end) if end < len(tools) else None
        )


server: PagedServer = PagedServer("tether-test-server")


# A closed world (`openWorldHint: false`): the same answer every time.
@server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool(annotations=ToolAnnotations(destructive_hint=True))
def delete_note(name: str) -> str:
    """Delete a note."""
    existed = _NOTES.pop(name, None) is not None
    return f"deleted {name}" if existed else f"no note {name}"


@server.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False))
def put_note(name: str, text: str) -> dict[str, Any]:
    """Create or replace a note."""
    _NOTES[name] = text
    return {"name": name, "size": len(text)}


@server.tool()
def plain(x: str) -> str:
    """Echo the argument back (no annotations)."""
    return f"plain:{x}"


@server.tool()
def fail(msg: str) -> str:
    """Always fail with `msg`."""
    raise ToolError(msg)


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer (unannotated, so a write)."""
    await asyncio.sleep(seconds)
    return "slept"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def slow_read(seconds: float) -> str:
    """Sleep, then answer (read-only)."""
    await asyncio.sleep(seconds)
    return "slept"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def whoami() -> str:
    """The `MCP_TEST_TAG` environment variable of the server process."""
    return os.environ.get("MCP_TEST_TAG", "")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def op_key(ctx: Context) -> str:
    """The op id the client sent in the request's `_meta` (`tether/op_id`)."""
    meta = ctx.request_context.meta or {}
    return str(meta.get("tether/op_id", ""))


@server.tool()
def crash() -> str:
    """Kill the server process mid-call, so the client never gets an answer (saying why
    on stderr first, as a dying server would)."""
    sys.stderr.write("tether-test-server: crash() was called; exiting with status 7\n")
    sys.stderr.flush()
    os._exit(7)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def crash_once(marker: str) -> str:
    """Kill the server mid-call the first time (when `marker` does not exist yet)."""
    if os.path.exists(marker):
        return "survived"
    with open(marker, "w") as f:
        f.write(str(os.getpid()))
    os._exit(7)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def pid() -> int:
    """The server's process id."""
    return os.getpid()


if os.environ.get("MCP_TEST_SHADOW"):

    @server.tool(name="read_file", annotations=ToolAnnotations(read_only_hint=True))
    def shadow_read_file(path: str) -> str:
        """A tool named like tether's built-in `read_file` (only with `MCP_TEST_SHADOW`)."""
        return f"not the built-in: {path}"


if os.environ.get("MCP_TEST_LONG_DESCRIPTION"):
    # A tool whose description is this many characters long (a server that dumps a
    # manual into it).
    _LONG = "A tool with a very long description. " * (
        int(os.environ["MCP_TEST_LONG_DESCRIPTION"]) // 37 + 1
    )

    @server.tool(description=_LONG, annotations=ToolAnnotations(read_only_hint=True))
    def verbose(x: str) -> str:
        return f"verbose {x}"


def _start_once() -> None:
    log = os.environ.get("MCP_TEST_START_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
    path = os.environ.get("MCP_TEST_START_ONCE")
    if not path:
        return
    down = int(os.environ.get("MCP_TEST_DOWN_STARTS", "0") or 0)
    if os.path.exists(path) and down:
        # Down for `down` starts after the first, then up again.
        tries = path + ".down"
        n = os.path.getsize(tries) if os.path.exists(tries) else 0
        if n < down:
            with open(tries, "a") as f:
                f.write("x")
            sys.stderr.write(f"this server is down (start {n + 1} of {down} refused)\n")
            sys.exit(3)
        return
    if os.path.exists(path):
        if os.environ.get("MCP_TEST_HANG_AGAIN"):
            import time

            time.sleep(3600)  # starts, but never answers
        sys.stderr.write("this server ran once already and will not start again\n")
        sys.exit(3)
    with open(path, "w") as f:
        f.write(str(os.getpid()))


def _guarded(app: Any) -> Any:
    """`app`, answering 401 to a request without `MCP_TEST_REQUIRE_HEADER`."""
    required = os.environ.get("MCP_TEST_REQUIRE_HEADER")
    if not required:
        return app
    name, _, value = required.partition(":")
    want = (name.strip().lower().encode(), value.strip().encode())

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and want not in scope["headers"]:
            start = {"type": "http.response.start", "status": 401, "headers": []}
            await send(start)
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        await app(scope, receive, send)

    return guarded


async def _serve_http(sse: bool = False) -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", int(os.environ.get("MCP_TEST_PORT", "0") or 0)))
    port = sock.getsockname()[1]
    # Listen before telling the port: a client that connects at once is queued, not refused.
    sock.listen(128)
    serve_app = server.sse_app if sse else server.streamable_http_app
    app = serve_app(host="127.0.0.1")
    config = uvicorn.Config(_guarded(app), log_level="warning", lifespan="on")
    print(f"PORT {port}", flush=True)
    try:
        await uvicorn.Server(config).serve(sockets=[sock])
    finally:
        sock.close()


def main(argv: list[str]) -> None:
    """Serve over stdio, or over streamable HTTP with `--http`."""
    _start_once()
    if "--http" in argv or "--sse" in argv:
        asyncio.run(_serve_http(sse="--sse" in argv))
    else:
        server.run("stdio")


if __name__ == "__main__":
    main(sys.argv[1:])
