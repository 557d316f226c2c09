"""A fault-injecting TCP proxy on 127.0.0.1, for the chaos tests.

`FaultProxy(upstream_port)` listens on an ephemeral port and forwards bytes both ways
to the upstream, unchanged: it never parses the protocol. It runs an asyncio loop in a
thread of the test process, so a test steers it with plain method calls and reads what
happened from `exchanges`, while tether runs as a real subprocess talking to it.

**Exchanges.** An HTTP/1.1 client (no pipelining) sends a request, then reads a
response, then perhaps reuses the connection for the next request. The proxy cuts the
byte stream into exchanges at those turns: client bytes arriving on a new connection,
or after upstream bytes went back, start a new exchange. Faults apply per exchange in
arrival order across all connections, so they hit "the second request" whether the
client reused a pooled connection or opened a new one.

**Faults** (`Fault`), picked for each new exchange from the plan (`plan(f1, f2, ...)`,
consumed in order) or else from the default (`default`, or `during(fault)` for a window
of time):

- `PASS`: forward both ways.
- `reset_before()`: RST the client (SO_LINGER 0) on the request's first bytes; the
  upstream never sees it.
- `reset_after_request()`: forward the request, wait for the upstream's first response
  bytes (it has executed the request), then RST the client and drop the response.
- `close_after_request()`: the same, with a clean close (FIN) instead of a reset.
- `reset_mid_response(after=N)`: forward the first N response bytes, then RST.
- `stall_request(seconds)`: hold the request for `seconds` (None: for good), then go on.
- `stall_response(seconds)`: forward the request (the upstream executes it) and hold
  the response for `seconds` (None: for good), then go on.
- `trickle(chunk, interval)`: deliver the response `chunk` bytes at a time, `interval`
  seconds apart.
- `slow_close(hold)`: deliver the response, then keep the client's socket open for
  `hold` seconds after the upstream closed (None: until the client closes it).

Written by hand because it must be byte-level (no HTTP mock library fakes a reset
mid-response or a peer that never closes) and small enough to read in one sitting.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from tests.support.procs import wait_for

FaultKind = Literal[
    "pass",
    "reset_before",
    "reset_after_request",
    "close_after_request",
    "reset_mid_response",
    "stall_request",
    "stall_response",
    "trickle",
    "slow_close",
]


@dataclass(frozen=True)
class Fault:
    """What the proxy does to one exchange (see the module docstring)."""

    kind: FaultKind = "pass"
    #: Stall length (None: until the connection or the proxy closes); slow close's hold.
    seconds: float | None = None
    #: Response bytes forwarded before a mid-response reset; trickle's chunk size.
    size: int = 1
    #: Trickle's pause between chunks.
    interval: float = 0.0

    @classmethod
    def reset_before(cls) -> Fault:
        """RST before the request is forwarded."""
        return cls("reset_before")

    @classmethod
    def reset_after_request(cls) -> Fault:
        """Forward the request, RST once the upstream answers (response lost)."""
        return cls("reset_after_request")

    @classmethod
    def close_after_request(cls) -> Fault:
        """Forward the request, close (FIN) once the upstream answers (response lost)."""
        return cls("close_after_request")

    @classmethod
    def reset_mid_response(cls, after: int) -> Fault:
        """Forward `after` bytes of the response, then RST."""
        return cls("reset_mid_response", size=after)

    @classmethod
    def stall_request(cls, seconds: float | None = None) -> Fault:
        """Hold the request for `seconds` (None: for good)."""
        return cls("stall_request", seconds=seconds)

    @classmethod
    def stall_response(cls, seconds: float | None = None) -> Fault:
        """Hold the response for `seconds` (None: for good)."""
        return cls("stall_response", seconds=seconds)

    @classmethod
    def trickle(cls, chunk: int, interval: float) -> Fault:
        """Deliver the response `chunk` bytes every `interval` seconds."""
        return cls("trickle", size=chunk, interval=interval)

    @classmethod
    def slow_close(cls, hold: float | None = None) -> Fault:
        """Deliver the response, then hold the socket open for `hold` seconds."""
        return cls("slow_close", seconds=hold)


PASS = Fault()


@dataclass
class Exchange:
    """What happened to one request/response turn, as the proxy saw it."""

    n: int
    """1-based, in arrival order over all connections."""
    conn: int
    """The connection it came on (1-based, in accept order)."""
    fault: Fault
    request_bytes: int = 0
    """Request bytes forwarded to the upstream."""
    response_bytes: int = 0
    """Response bytes forwarded to the client."""
    upstream_answered: bool = False
    """The upstream sent response bytes (it executed the request)."""
    outcome: str = "open"
    """`open`, `forwarded`, or what the fault did: `reset`, `closed`, `stalled`, ..."""
    at: float = field(default_factory=time.time)


class _Conn:
    """One client connection and its (lazily opened) upstream connection."""

    def __init__(
        self, proxy: FaultProxy, n: int, cr: asyncio.StreamReader, cw: asyncio.StreamWriter
    ) -> None:
        self.proxy = proxy
        self.n = n
        self.cr, self.cw = cr, cw
        self.ur: asyncio.StreamReader | None = None
        self.uw: asyncio.StreamWriter | None = None
        self.current: Exchange | None = None
        self.responding = False  # the current exchange's response has begun
        self.done = asyncio.Event()
        self.pump_up: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ endings

    def reset(self) -> None:
        """RST the client: SO_LINGER 0, then close (the kernel sends RST, not FIN)."""
        sock = self.cw.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.cw.transport.abort()
        self.finish()

    def close(self) -> None:
        """Close the client cleanly (FIN)."""
        self.cw.close()
        self.finish()

    def finish(self) -> None:
        """Close the upstream side and mark the connection done."""
        if self.uw is not None:
            self.uw.transport.abort()
        if not self.cw.is_closing():
            self.cw.close()
        self.done.set()

    async def hold(self, seconds: float | None) -> None:
        """Wait `seconds` (None: for good), or until the connection is done."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.done.wait(), seconds)

    # ------------------------------------------------------------ the pumps

    async def run(self) -> None:
        """Pump client bytes to the upstream until either side ends."""
        try:
            while not self.done.is_set():
                data = await self.cr.read(65536)
                if not data:
                    break
                if self.current is None or self.responding:
                    held = await self.begin_exchange()
                    if held is None:
                        return
                    data += held
                if not await self.forward_request(data):
                    return
            # The client closed (or reset): nothing more will be asked.
            if self.current is not None and self.current.outcome == "open":
                self.current.outcome = "client closed"
        except (ConnectionError, OSError):
            if self.current is not None and self.current.outcome == "open":
                self.current.outcome = "client reset"
        finally:
            self.finish()
            if self.pump_up is not None:
                self.pump_up.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self.pump_up

    async def begin_exchange(self) -> bytes | None:
        """Start an exchange on the client's new request: more request bytes read
        meanwhile (a stall), or None when its fault ended the connection."""
        ex = self.proxy._next_exchange(self.n)
        self.current = ex
        self.responding = False
        if ex.fault.kind == "reset_before":
            ex.outcome = "reset"
            self.reset()
            return None
        if ex.fault.kind == "stall_request":
            ex.outcome = "stalled"
            held = await self.hold_request(ex.fault.seconds)
            if self.done.is_set():
                return None
            ex.outcome = "open"
            return held
        return b""

    async def hold_request(self, seconds: float | None) -> bytes:
        """Forward nothing for `seconds` (None: for good), but keep reading the client,
        so that a client that gives up ends the connection: what it sent meanwhile."""
        held = bytearray()

        async def watch() -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await self.cr.read(65536):
                    held.extend(data)
            self.finish()  # the client is gone

        watcher = asyncio.ensure_future(watch())
        try:
            await self.hold(seconds)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        return bytes(held)

    async def forward_request(self, data: bytes) -> bool:
        """Send request bytes upstream (connecting first); False if that failed."""
        assert self.current is not None
        if self.uw is None:
            try:
                self.ur, self.uw = await asyncio.open_connection(
                    "127.0.0.1", self.proxy.upstream_port
                )
            except OSError:
                self.current.outcome = "upstream refused"
                self.reset()
                return False
            self.pump_up = asyncio.ensure_future(self.pump_response())
        self.uw.write(data)
        await self.uw.drain()
        self.current.request_bytes += len(data)
        return True

    async def pump_response(self) -> None:
        """Pump upstream bytes to the client, applying the exchange's fault."""
        assert self.ur is not None
        try:
            while True:
                data = await self.ur.read(65536)
                if not data:
                    break
                if not await self.forward_response(data):
                    return
        except (ConnectionError, OSError):
            pass
        # The upstream closed its side.
        ex = self.current
        if ex is not None and ex.fault.kind == "slow_close" and ex.outcome != "reset":
            ex.outcome = "held open"
            await self.hold(ex.fault.seconds)
        self.close()

    async def forward_response(self, data: bytes) -> bool:
        """Deliver response bytes to the client per the fault; False when it ended."""
        ex = self.current
        assert ex is not None
        first = not self.responding
        self.responding = True
        ex.upstream_answered = True
        kind = ex.fault.kind
        if kind == "reset_after_request":
            ex.outcome = "reset"
            self.reset()
            return False
        if kind == "close_after_request":
            ex.outcome = "closed"
            self.close()
            return False
        if kind == "stall_response" and first:
            ex.outcome = "stalled"
            await self.hold(ex.fault.seconds)
            if self.done.is_set():
                return False
        if kind == "reset_mid_response":
            room = ex.fault.size - ex.response_bytes
            if room < len(data):
                await self.deliver(data[: max(0, room)])
                ex.outcome = "reset"
                self.reset()
                return False
        if kind == "trickle":
            # Not "open" meanwhile: a client that read the last chunk and closed did
            # not cut the trickle short.
            ex.outcome = "trickling"
            step = max(1, ex.fault.size)
            for i in range(0, len(data), step):
                if i:
                    await asyncio.sleep(ex.fault.interval)
                await self.deliver(data[i : i + step])
        if ex.outcome in ("open", "stalled", "trickling"):
            ex.outcome = "forwarded"
        if kind != "trickle":
            # Counted before the write: the client may read it before drain() returns.
            await self.deliver(data)
        return True

    async def deliver(self, data: bytes) -> None:
        """Count and write to the client."""
        if not data:
            return
        assert self.current is not None
        self.current.response_bytes += len(data)
        self.cw.write(data)
        await self.cw.drain()


class FaultProxy:
    """The proxy (see the module docstring). Use as a context manager, or `close()`."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.default: Fault = PASS
        self.exchanges: list[Exchange] = []
        self.connections = 0
        self._plan: deque[Fault] = deque()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stopped: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0
        self._thread = threading.Thread(target=self._main, name="fault-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(30) or not self.port:
            raise RuntimeError("the fault proxy did not start")

    @property
    def url(self) -> str:
        """`http://127.0.0.1:PORT`."""
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------ steering

    def plan(self, *faults: Fault) -> None:
        """Faults for the next exchanges, in order (after them: the default)."""
        with self._lock:
            self._plan.extend(faults)

    @contextlib.contextmanager
    def during(self, fault: Fault) -> Iterator[None]:
        """Apply `fault` to every new exchange inside the `with` block."""
        before = self.default
        self.default = fault
        try:
            yield
        finally:
            self.default = before

    def snapshot(self) -> list[Exchange]:
        """The exchanges so far (copies)."""
        with self._lock:
            return [Exchange(**vars(e)) for e in self.exchanges]

    def wait_exchanges(self, n: int, timeout: float = 60.0) -> list[Exchange]:
        """Wait until `n` exchanges began; the exchanges so far."""
        wait_for(lambda: len(self.exchanges) >= n, f"{n} exchanges through the proxy", timeout)
        return self.snapshot()

    def _next_exchange(self, conn: int) -> Exchange:
        with self._lock:
            fault = self._plan.popleft() if self._plan else self.default
            ex = Exchange(n=len(self.exchanges) + 1, conn=conn, fault=fault)
            self.exchanges.append(ex)
            return ex

    # ------------------------------------------------------------ the loop

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stopped = asyncio.Event()
        server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stopped.wait()
            server.close()
            for task in list(self._tasks):
                task.cancel()
            for task in list(self._tasks):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await server.wait_closed()

    async def _accept(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = _Conn(self, self.connections, cr, cw)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await conn.run()
        finally:
            conn.finish()
            self._tasks.discard(task)

    def close(self) -> None:
        """Stop listening, end every connection, join the thread."""
        if self._thread.is_alive() and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(timeout=30)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
