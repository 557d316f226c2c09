"""MCP tool sources: the tools of MCP servers, as tether `Tool`s.

A contract may name MCP servers (`spec.McpServer`: a stdio `command`, a streamable HTTP
or SSE `url`; `tether.mcp_config` reads clients' configs, `mcp_connect` the transports).
`McpSources` opens all of them through the official `mcp` SDK (2.x), lists their tools
(following `next_cursor` pages) and gives them to the registry:

```python
async with McpSources(spec.mcp_servers) as sources:
    registry.extend(sources.tools())
    ...  # run the task; every MCP tool call goes through the open sessions
```

Tool annotations map to effects: `readOnlyHint` → `read`, `destructiveHint` → `delete`,
anything else (unannotated tools included) → `write`, as for a Python `@tool` that
declares no effect. Read tools are idempotent, others only with `idempotentHint`; they
are volatile (`Tool.volatile`) unless `openWorldHint` is false. The service (for
breakers and concurrency limits) is the server's name.

Names: a server's tools are exposed as `<prefix>__<tool>` (`McpServer.prefix`, by
default the server's name with characters providers refuse turned into `_`; `prefix: ""`
exposes the tools' own names). Providers allow only `[a-zA-Z0-9_-]` in tool names, so
the separator is a double underscore, not a dot; a contract may write either
`notes__add` or `notes.add` in its `tools:`. Two servers exposing one name is a
`errors.SpecError` naming both (and so is an MCP tool named like a built-in or
registered tool: see `TaskRun.add_tools`).

Supervision: a lost connection (the stdio process exited, the HTTP session is gone) is
the server's failure, not the call's. The next call restarts the process or reopens the
session, with backoff, up to `McpServer.restart_attempts` tries; a call that finds the
server down and cannot bring it back was never sent, and fails as retryable
(`transient`): the op runner retries it under the tool's retry policy, and the service's
shared breaker counts it and, when the server stays down, holds the task's calls back
and parks it. It raises `errors.ServiceDown`: when its retries run out the op runner
holds it back like a call an open breaker stopped, never counted against the item (no
attempt, no repeated failure), and the task waits for the server.

The server's stderr goes to a file of its own (it would garble tether's terminal); the
last `STDERR_LINES` lines of it travel in the message of a failure the server caused (a
connection lost mid-call, a restart that failed, a start that failed), and so reach the
op's result, an approval request about a call in doubt and the reason a waiting task
gives in `tether status`.

Failures are classified for the runtime:

- a result with `is_error=True`, or an error response from the server, raises a
  deterministic `errors.ToolFailed` carrying the server's text;
- a timeout or a connection lost during the call means the call may have run:
  `errors.OutcomeUnknown` for tools with effects (so a non-idempotent call in doubt goes
  to a human), a retryable `errors.ToolFailed` for read tools;
- a connection found dead before sending, which could not be restored, is an
  `errors.ServiceDown` (retryable) whatever the effect: nothing was sent.

The op id travels in the request's `_meta` (`OP_ID_META_KEY`): a server can deduplicate.

Each server's session lives in a task of its own, so a source may be opened and closed
from different asyncio tasks and called from any task of the same event loop. Starting
is bounded by the SDK's timeouts (about 10 s of discovery plus `timeout` per request);
cancelling a start stops the server process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shlex
import tempfile
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Final, TextIO, cast

from pydantic import ValidationError

from tether import errors
from tether._extras import needs
from tether._version import installed_version
from tether.spec import McpServer
from tether.tools import mcp_connect
from tether.tools.mcp_values import compile_schema, shown_description, text_of, value_of
from tether.tools.registry import Effect, Tool, ToolContext, bad_arguments

# Without the `mcp` extra a contract with `mcp_servers` stops here, in one line.
with needs("mcp", "a contract with mcp_servers"):
    import mcp_types
    from mcp.client import Client
    from mcp.client._input_required import InputRequiredRoundsExceededError
    from mcp.shared.exceptions import MCPError


logger = logging.getLogger(__name__)

OP_ID_META_KEY: Final = "tether/op_id"
"""The `_meta` key of a `tools/call` request that carries tether's op id."""

TIMEOUT_GRACE: Final = 1.0
"""Seconds the runtime's own timeout of an MCP tool exceeds the server's `timeout`, so
the MCP request times out first and is classified by the tool's effect."""

_MAX_PAGES: Final = 1000

NAME_SEPARATOR: Final = "__"
"""Between a server's prefix and its tool's name in the name the model sees."""

RESTART_BACKOFF: Final = (0.2, 2.0)
"""Seconds before the second try at restarting a server, and the cap of the doubling."""

STDERR_LINES: Final = 5
"""How many of the last lines of a server's stderr a failure's message carries."""

#: The SDK's error for a request in a session the HTTP server no longer knows (404).
_SESSION_GONE: Final = "Session terminated"

_NOT_A_NAME_CHAR = re.compile(r"[^A-Za-z0-9_-]")


def prefix_of(server: McpServer) -> str:
    """The prefix of a server's exposed tool names ('' for none)."""
    if server.prefix is not None:
        return server.prefix
    return _NOT_A_NAME_CHAR.sub("_", server.name)


def exposed_name(server: McpServer, tool: str) -> str:
    """The name the model (and the contract) uses for a server's tool."""
    prefix = prefix_of(server)
    return f"{prefix}{NAME_SEPARATOR}{tool}" if prefix else tool


def effect_for(annotations: mcp_types.ToolAnnotations | None) -> tuple[Effect, bool]:
    """The `(effect, idempotent)` of an MCP tool with these annotations.

    `readOnlyHint` → `read` (always idempotent); `destructiveHint` → `delete`; anything
    else, and no annotations at all, → `write`. Tools with effects are idempotent only
    with `idempotentHint`.
    """
    if annotations is None:
        return "write", False
    read, gone = annotations.read_only_hint, annotations.destructive_hint
    effect: Effect = "read" if read else "delete" if gone else "write"
    return effect, effect == "read" or annotations.idempotent_hint is True


def _closed(annotations: mcp_types.ToolAnnotations | None) -> bool:
    """Whether a tool says its world is closed (`openWorldHint: false`)."""
    return annotations is not None and annotations.open_world_hint is False


@dataclass(frozen=True)
class McpTool(Tool):
    """A `Tool` served by an MCP server; arguments are checked against its JSON schema."""

    server: str = ""
    remote_name: str = ""
    output_schema: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    validator: Any = field(default=None, compare=False, repr=False)

    def check_args(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Validate arguments against the tool's input schema before anything is sent.

        A mismatch is a clear deterministic `ToolFailed`; a tool whose schema cannot be
        compiled is checked by the server alone.
        """
        data = dict(args)
        if self.validator is None:
            return data
        found = sorted(self.validator.iter_errors(data), key=lambda e: [str(p) for p in e.path])
        if not found:
            return data
        problems = []
        for err in found[:5]:
            where = ".".join(str(p) for p in err.absolute_path) or "(arguments)"
            problems.append(f"{where}: {_clip(str(err.message), 160)}")
        raise bad_arguments(self.name, problems)


class McpToolSource:
    """One MCP server, connected: its tools as tether `Tool`s (an async context manager).

    Entering starts the server (stdio) or connects to it (streamable HTTP) and lists its
    tools; a server that cannot be started or reached raises `errors.UserError` naming it.
    While open, a lost connection is restored by the next call (see the module's
    "Supervision"); `restarts` counts how often. Exiting closes the session and stops
    the server process.
    """

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self.restarts = 0
        self._client: Client | None = None
        self._stderr: IO[str] | None = None
        self._last_stderr = ""
        self._tools: list[Tool] = []
        self._runner: asyncio.Task[None] | None = None
        self._closing: asyncio.Event | None = None
        self._state = "new"  # new | open | closed
        self._lost_client: Client | None = None
        self._lock: asyncio.Lock | None = None

    @property
    def target(self) -> str:
        """The command line or URL of the server, for messages."""
        if self.server.command is not None:
            return shlex.join([self.server.command, *self.server.args])
        return str(self.server.url)

    @property
    def connected(self) -> bool:
        """Is the session open and alive (as far as the client can tell)?"""
        return self._alive() is not None

    async def __aenter__(self) -> McpToolSource:
        if self._state != "new":
            raise RuntimeError("McpToolSource is already open")
        await self._start(first=True)
        self._state = "open"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._state = "closed"
        if self._closing is not None:
            self._closing.set()
        await self._stop()

    async def _start(self, *, first: bool) -> None:
        """Start a session (in a task of its own) and wait until it is ready."""
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        closing = self._closing = asyncio.Event()
        # The SDK's anyio task groups must be entered and left by one task; a task of
        # our own holds the session, so callers may open and close us from any task.
        runner = self._runner = asyncio.create_task(
            self._hold(ready, closing, first=first), name=f"tether-mcp-{self.server.name}"
        )
        try:
            await asyncio.shield(ready)
        except BaseException:
            # Cancelled while starting: abandon the start (the SDK still stops the process).
            closing.set()
            if not ready.done():
                runner.cancel()
            await self._stop()
            if ready.done() and not ready.cancelled():
                ready.exception()  # retrieved: the failure raised here is the one that counts
            raise

    async def _stop(self) -> None:
        runner, self._runner = self._runner, None
        self._client = None
        if runner is None:
            return
        try:
            # Shielded: a cancelled caller still leaves no server process behind.
            await asyncio.shield(runner)
        except asyncio.CancelledError:
            if not runner.cancelled():
                raise  # the caller was cancelled, not the runner

    async def _hold(
        self, ready: asyncio.Future[None], closing: asyncio.Event, *, first: bool
    ) -> None:
        """The session's lifetime: connect, list, announce, wait for `closing`, close."""
        try:
            with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as file:
                errlog = cast(TextIO, file)
                # The server's stderr goes to a file: quiet, and the reason it died.
                self._stderr = errlog
                try:
                    async with self._connect(errlog) as client:
                        try:
                            listed = await self._list_all(client)
                            tools = self._select(listed) if first else []
                        except Exception as exc:
                            ready.set_exception(self._start_failed(exc))
                            return
                        if first:
                            self._tools = tools
                        self._client = client
                        ready.set_result(None)
                        await closing.wait()
                        self._client = None
                except Exception as exc:
                    if not ready.done():
                        ready.set_exception(self._start_failed(exc))
                    else:
                        logger.warning(
                            "MCP server %r did not close cleanly: %s",
                            self.server.name,
                            _first_line(exc),
                        )
                finally:
                    self._client = None
                    if self._stderr is errlog:
                        # Kept: a call that finds this session dead tells why it died.
                        self._last_stderr = self._stderr_tail()
                        self._stderr = None
        except asyncio.CancelledError:
            if not ready.done():
                ready.cancel()
            raise

    def _connect(self, errlog: TextIO) -> Client:
        return Client(
            mcp_connect.transport(self.server, errlog),
            read_timeout_seconds=self.server.timeout,
            client_info=mcp_types.Implementation(name="tether", version=installed_version()),
            cache=None,
        )

    def tools(self) -> list[Tool]:
        """The server's tools (only those named in `server.tools`, when given)."""
        return list(self._tools)

    # --- supervision ------------------------------------------------------------------

    def _alive(self) -> Client | None:
        """The client, if its session still stands."""
        client = self._client
        runner = self._runner
        if client is None or runner is None or runner.done() or client is self._lost_client:
            return None
        return None if _session_closed(client) else client

    async def _connected(self) -> Client:
        """The live client; a dead session is restored first (restart with backoff).

        Raises a retryable `ToolFailed` when the source is closed or the server stays
        down: nothing was sent.
        """
        client = self._alive() if self._state == "open" else None
        if client is not None:
            return client
        if self._state != "open":
            raise errors.ServiceDown(f"MCP server {self.server.name!r} is not connected")
        if self._lock is None:
            self._lock = asyncio.Lock()
        try:
            # Bounded below the runtime's own timeout of the call (`TIMEOUT_GRACE` more):
            # a restart that takes too long is a failure before sending, never in doubt.
            async with asyncio.timeout(self.server.timeout), self._lock:
                # Another call may have restored it while this one waited.
                client = self._alive()
                if client is not None:
                    return client
                return await self._restart()
        except TimeoutError as exc:
            raise errors.ServiceDown(
                f"MCP server {self.server.name!r} is down and was not back within "
                f"{self.server.timeout}s{self._stderr_note()}; the call was not sent"
            ) from exc

    async def _restart(self) -> Client:
        name = self.server.name
        tries = self.server.restart_attempts
        why = "the connection was lost"
        first_delay, cap = RESTART_BACKOFF
        for n in range(tries):
            if n:
                await asyncio.sleep(min(cap, first_delay * 2 ** (n - 1)))
            if self._state != "open":
                break
            if self._closing is not None:
                self._closing.set()
            await self._stop()
            try:
                await self._start(first=False)
            except errors.UserError as exc:
                why = str(exc)
                logger.warning(
                    "MCP server %r: restart %d of %d failed: %s", name, n + 1, tries, why
                )
                continue
            if self._state != "open":  # closed while restarting: leave nothing behind
                if self._closing is not None:
                    self._closing.set()
                await self._stop()
                break
            client = self._alive()
            if client is not None:
                self.restarts += 1
                self._lost_client = None
                logger.warning("MCP server %r (%s) was restarted", name, self.target)
                return client
        if self._state != "open":
            raise errors.ServiceDown(f"MCP server {name!r} is not connected")
        raise errors.ServiceDown(
            f"MCP server {name!r} is down and could not be restarted "
            f"({tries} {'try' if tries == 1 else 'tries'}; {_clip(why, 800)}); "
            "the call was not sent"
        )

    def _mark_lost(self, client: Client) -> None:
        """The session of `client` broke during a call: the next call restarts it."""
        self._lost_client = client

    # --- calls ------------------------------------------------------------------------

    async def call(self, tool: Tool, args: Mapping[str, Any], op_id: str | None = None) -> Any:
        """Call `tool` on the server; the result as `Tool.fn` returns it.

        Text content is joined; structured content, when present, is returned instead
        (the SDK's `{"result": x}` wrapper of non-object results unwrapped).
        """
        client = await self._connected()
        remote = tool.remote_name if isinstance(tool, McpTool) and tool.remote_name else tool.name
        meta = cast(mcp_types.RequestParamsMeta, {OP_ID_META_KEY: op_id}) if op_id else None
        try:
            result = await client.call_tool(
                remote, dict(args), read_timeout_seconds=self.server.timeout, meta=meta
            )
        except MCPError as exc:
            if exc.code == mcp_types.REQUEST_TIMEOUT:
                raise self._lost(tool, f"no answer within {self.server.timeout}s") from exc
            if exc.code == mcp_types.CONNECTION_CLOSED:
                self._mark_lost(client)
                raise self._lost(tool, "the connection was lost") from exc
            if exc.code == mcp_types.INVALID_REQUEST and exc.message == _SESSION_GONE:
                # The server no longer knows the session (it restarted): it refused the
                # request unread, so nothing ran. Reopen the session at the next try.
                self._mark_lost(client)
                raise errors.ToolFailed(
                    f"{tool.name}: MCP server {self.server.name!r}: the session is gone "
                    "(the server restarted?); the call was not run",
                    retryable=True,
                ) from exc
            raise errors.ToolFailed(f"{tool.name}: {exc.message}") from exc
        except InputRequiredRoundsExceededError as exc:
            raise errors.ToolFailed(
                f"{tool.name}: the tool asks for input that tether cannot give"
            ) from exc
        except ValidationError as exc:
            if tool.effect == "read":
                raise errors.ToolFailed(f"{tool.name}: the server sent a malformed result") from exc
            raise errors.OutcomeUnknown(
                f"{tool.name}: the server sent a malformed result; the call may have taken effect"
            ) from exc
        except Exception as exc:
            self._mark_lost(client)
            raise self._lost(tool, _first_line(exc)) from exc
        if result.is_error:
            raise errors.ToolFailed(text_of(result.content) or f"{tool.name} failed")
        return value_of(result, _output_schema(tool))

    # --- internals --------------------------------------------------------------------

    async def _list_all(self, client: Client) -> list[mcp_types.Tool]:
        out: list[mcp_types.Tool] = []
        cursor: str | None = None
        seen: set[str] = set()
        for _ in range(_MAX_PAGES):
            page = await client.list_tools(cursor=cursor)
            out.extend(page.tools)
            cursor = page.next_cursor
            if not cursor or cursor in seen:
                break
            seen.add(cursor)
        return out

    def _select(self, listed: list[mcp_types.Tool]) -> list[Tool]:
        by_name = {t.name: t for t in listed}
        wanted = self.server.tools
        if wanted is not None:
            missing = [n for n in wanted if n not in by_name]
            if missing:
                raise errors.UserError(
                    f"MCP server {self.server.name!r} ({self.target}) has no tool "
                    + ", ".join(repr(n) for n in missing)
                    + "; it offers: "
                    + (", ".join(sorted(by_name)) or "no tools")
                )
            chosen = [by_name[n] for n in dict.fromkeys(wanted)]
        else:
            chosen = list(by_name.values())
        return [self._make_tool(t) for t in chosen]

    def _make_tool(self, remote: mcp_types.Tool) -> Tool:
        effect, idempotent = effect_for(remote.annotations)
        source = self

        async def run(args: Mapping[str, Any], ctx: ToolContext) -> Any:
            return await source.call(tool, args, ctx.op_id)

        schema = dict(remote.input_schema)
        description = (
            remote.description or remote.title or (remote.annotations and remote.annotations.title)
        )
        name = exposed_name(self.server, remote.name)
        tool = McpTool(
            name=name,
            description=shown_description(name, (description or remote.name).strip()),
            parameters=schema,
            fn=run,
            effect=effect,
            idempotent=idempotent,
            volatile=None if effect == "read" and not _closed(remote.annotations) else False,
            service=self.server.name,
            timeout=self.server.timeout + TIMEOUT_GRACE,
            server=self.server.name,
            remote_name=remote.name,
            output_schema=remote.output_schema,
            validator=compile_schema(schema),
        )
        return tool

    def _lost(self, tool: Tool, why: str) -> errors.ToolSignal:
        where = f"MCP server {self.server.name!r}"
        why += self._stderr_note()
        if tool.effect == "read":
            return errors.ToolFailed(f"{tool.name}: {where}: {why}", retryable=True)
        return errors.OutcomeUnknown(
            f"{tool.name}: {where}: {why}; the call may or may not have taken effect"
        )

    def _start_failed(self, exc: BaseException) -> errors.UserError:
        if isinstance(exc, errors.UserError):
            return exc
        reason = _first_line(exc)
        tail = self._stderr_tail()
        if tail and tail not in reason:
            reason += f" (server stderr: {tail})"
        verb = "could not be started" if self.server.command is not None else "could not be reached"
        return errors.UserError(
            f"MCP server {self.server.name!r} ({self.target}) {verb}: {reason}",
            server=self.server.name,
        )

    def _stderr_tail(self) -> str:
        """The last lines of the server process's stderr (the current one's, else the
        last one's), on one line."""
        f = self._stderr
        if f is None or f.closed:
            return self._last_stderr
        try:
            # pread: the server shares this file's offset, and may still be writing.
            fd = f.fileno()
            size = os.fstat(fd).st_size
            data = os.pread(fd, 8192, max(0, size - 8192)).decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""
        lines = [ln.strip() for ln in data.splitlines() if ln.strip()]
        return _clip(" | ".join(_clip(ln, 200) for ln in lines[-STDERR_LINES:]), 600)

    def _stderr_note(self) -> str:
        tail = self._stderr_tail()
        return f" (server stderr: {tail})" if tail else ""


def _output_schema(tool: Tool) -> Mapping[str, Any] | None:
    return tool.output_schema if isinstance(tool, McpTool) else None


class McpSources:
    """All MCP servers of a spec, opened together (an async context manager).

    `tools()` gives every server's tools. Entering starts the servers concurrently; if
    one cannot start, the others are closed again and the `errors.UserError` of the first
    failing server (in spec order) is raised. Two servers exposing the same tool name
    is an `errors.SpecError` naming both. In `mcp_connect.kept_open()`, servers already
    open are used as they are, and those it starts stay open when it closes.
    """

    def __init__(self, servers: Sequence[McpServer]) -> None:
        self.servers = list(servers)
        self._sources: list[McpToolSource] = []
        self._owned: list[McpToolSource] = []

    async def __aenter__(self) -> McpSources:
        kept = mcp_connect.kept()
        shared = kept or {}
        sources = [shared.get(mcp_connect.key(s)) or McpToolSource(s) for s in self.servers]
        fresh = [s for s in sources if s._state == "new"]
        try:
            results = await asyncio.gather(
                *(source.__aenter__() for source in fresh), return_exceptions=True
            )
            for result in results:
                if isinstance(result, BaseException):
                    raise result
            owner: dict[str, str] = {}
            for source in sources:
                for t in source.tools():
                    if t.name in owner:
                        raise errors.SpecError(
                            f"MCP servers {owner[t.name]!r} and {source.server.name!r} both "
                            f"expose a tool named {t.name!r}; give them different `prefix`es "
                            "or keep one with `tools:` on either",
                            source="mcp_servers",
                        )
                    owner[t.name] = source.server.name
        except BaseException:
            await _close_all(fresh)
            raise
        if kept is not None:  # `kept_open()`: they outlive this, for the next one
            kept.update((mcp_connect.key(s.server), s) for s in fresh)
        self._sources, self._owned = sources, [] if kept is not None else sources
        return self

    async def __aexit__(self, *exc: object) -> None:
        owned, self._sources, self._owned = self._owned, [], []
        await _close_all(owned)

    @property
    def sources(self) -> list[McpToolSource]:
        """The open sources, in spec order."""
        return list(self._sources)

    def tools(self) -> list[Tool]:
        """Every open server's tools, in spec order."""
        return [t for s in self._sources for t in s.tools()]


def contract_names(
    tools: Sequence[Tool], registered: Collection[str], builtins: Collection[str] = ()
) -> list[str]:
    """Every name a contract may use, given the tools of open MCP sources and the names
    of the `registered` tools: those names, each MCP tool's exposed name and, for a
    prefixed one, `<prefix>.<tool>`. An MCP tool named like a registered tool (a
    built-in when in `builtins`) is an `errors.SpecError` naming both, as at the start
    of a run: `tether run` checks a contract with this before anything is written."""
    names = list(registered)
    taken = set(names)
    for t in tools:
        if t.name in taken:
            server = t.server if isinstance(t, McpTool) else "?"
            kind = "built-in" if t.name in builtins else "registered"
            raise errors.SpecError(
                f"the tool {t.name!r} of MCP server {server!r} clashes with the {kind} tool "
                f"{t.name!r}; give the server a prefix (do not set `prefix: ''`), or leave "
                "the tool out with the server's `tools:`",
                source="mcp_servers",
            )
        names.append(t.name)
        remote = t.remote_name if isinstance(t, McpTool) else ""
        tail = f"{NAME_SEPARATOR}{remote}"
        if remote and t.name.endswith(tail) and len(t.name) > len(tail):
            names.append(f"{t.name[: -len(tail)]}.{remote}")
    return names


# --- helpers ---------------------------------------------------------------------------


async def _close_all(sources: Sequence[McpToolSource]) -> None:
    """Close sources concurrently (closing one that never opened does nothing)."""
    await asyncio.gather(*(source.__aexit__(None, None, None) for source in sources))


def _session_closed(client: Client) -> bool:
    """Has the client's session seen its transport close (the process exited, the HTTP
    stream ended)? Read from the SDK's dispatcher; False when it cannot tell."""
    session = getattr(client, "_session", None)
    dispatcher = getattr(session, "_dispatcher", None)
    return bool(getattr(dispatcher, "_closed", False))


def _first_line(exc: BaseException) -> str:
    leaf = exc
    while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
        leaf = leaf.exceptions[0]
    lines = [ln.strip() for ln in str(leaf).splitlines() if ln.strip()]
    first = lines[0] if lines else ""
    name = type(leaf).__name__
    return _clip(f"{name}: {first}" if first else name, 300)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = [
    "NAME_SEPARATOR",
    "OP_ID_META_KEY",
    "TIMEOUT_GRACE",
    "McpSources",
    "McpTool",
    "McpToolSource",
    "contract_names",
    "effect_for",
    "exposed_name",
    "prefix_of",
]
