"""Tools benchmark: what the op journal costs per side-effecting call, and retries.

Every round, a zero-latency scripted model makes ONE call to `create_ticket`, a `write`
tool that POSTs to the ticket API of `tests/services/ticket_api.py` (a real HTTP service
started as a subprocess on 127.0.0.1, ~0 latency) with `ctx.op_id` as its
`Idempotency-Key`, over one keep-alive `http.client` connection. Judging is by rules
only (`models.judge: rules`); the task's item never completes, so the loop goes on for
`--rounds` rounds in one `Engine.run`.

**Part A: harness overhead per op.** The *op window* runs from the start of the round's
act phase (`OpRunner.act`) to the end of its write-back (`TaskRun.commit_round`: the
round commit that records the op's result, with the verdict when judging is by rules).
Overhead = window - time inside the tool function (the HTTP round trip, timed inside the
tool). Each store call in the window is timed by a thin wrapper on the store instance,
so the overhead is split into: the op-journal read (`get_ops`), the intent commit, the
`dispatched` commit (only a non-idempotent tool without `reconcile` writes one), the
service guard's three `update_shared` transactions (admit, release, record), the
messages blob, the round commit, and the rest (Python). Four variants, each on a fresh
database:

- idempotent tool with `reconcile` (intent + result commits), no service guard;
- the same with the shared service guard (breaker and concurrency slot in the store);
- non-idempotent tool without `reconcile` (adds the `dispatched` commit), no guard;
- the same with the shared guard.

"No guard" passes `Engine(guard=<a guard that admits everything and stores nothing>)`;
"shared guard" is the engine's default `ServiceGuard` built from the contract.

Beside them, the floor measured in the same run with the same settings: TWO bare
`INSERT` + `COMMIT` transactions with payloads the size of the intent commit and of the
round commit (events, op record and task usage as JSON; learnt from a 20-round warm-up
run), inline and with each commit sent through a worker thread the way the store sends
its calls. The floor is sampled once per round, interleaved with the ops (from the
scripted model's act call, outside the op window), so both see the same disk and the
same machine load. The target (issue 4) is overhead <= 1.5x that floor. SQLite runs
with WAL and `synchronous=FULL` (the default); PostgreSQL too when
`TETHER_TEST_PG_URL` (or `--pg`) is set. The service's handler runs with TCP_NODELAY
(it writes headers and body in two sends, which would otherwise cost a ~40 ms delayed
ACK per call).

**Part B: retries.** The same idempotent tool against the service failing a fraction
`p` = 0.3 of POSTs with 503 (transient; a seeded generator in arrival order, so
failures are independent), `RetryPolicy(max_attempts=5, base_delay=2 ms)`. The shared
breaker would open at 30% failures with the default thresholds (>= 30% of >= 10 calls),
so Part B runs with the no-op guard and the retry statistics are clean. Reported:
attempts per op from tether's op records and from the service's own request log,
against the policy's expectation for independent failures with `k` attempts:
P(success within k) = 1 - p^k, E[attempts | success] = sum_j j p^(j-1) (1-p) / (1 -
p^k), attempts per successful op = (1 - p^k) / ((1 - p)(1 - p^k)) = 1 / (1 - p), and
the share of ops that failed after k attempts against p^k; also at the 503 share the
seeded service actually produced. For contrast (not with `--quick`), 100 more rounds run
WITH the default shared breaker, which opens and then fails calls fast for its 60 s
cooldown.

    .venv/bin/python benchmarks/tools_bench.py            # 500 rounds per variant
    .venv/bin/python benchmarks/tools_bench.py --quick    # 100 rounds, a smoke test
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from rich.console import Console
from rich.table import Table

from tether import events as ev
from tether.clock import SystemClock
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime import engine as engine_mod
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.ops import runner as ops_mod
from tether.runtime.tasks import create_task
from tether.spec import parse_spec
from tether.store.base import Store
from tether.tools.breaker import Admission, Transition
from tether.tools.registry import Reconciliation, Tool, ToolContext, ToolRegistry, tool
from tether.tools.retry import RetryPolicy

ROOT = Path(__file__).resolve().parent.parent
SERVICE = ROOT / "tests" / "services" / "ticket_api.py"
TARGET = 1.5
FAIL_P = 0.3
K = 5
SEED = 7


# --- the ticket service --------------------------------------------------------------


class HTTPStatusError(Exception):
    """A non-2xx answer; `status_code` drives tether's default classification (503:
    transient)."""

    def __init__(self, status: int, headers: Any, body: str) -> None:
        super().__init__(f"{status} {body[:200]}")
        self.status_code = status
        self.response = type("R", (), {"status_code": status, "headers": headers})()


# The service writes a response's headers and body in two `send`s; with Nagle's
# algorithm on, the body then waits for the client's delayed ACK (~40 ms on Linux). The
# benchmark wants a ~0-latency service, so its handler sets TCP_NODELAY
# (`StreamRequestHandler.disable_nagle_algorithm`); nothing else changes.
_LAUNCH = """
import importlib.util, sys
path = sys.argv[1]
sys.argv = sys.argv[1:]
spec = importlib.util.spec_from_file_location("ticket_api", path)
mod = importlib.util.module_from_spec(spec)
sys.modules["ticket_api"] = mod
spec.loader.exec_module(mod)
mod.Handler.disable_nagle_algorithm = True
mod.main()
"""


class Service:
    """The ticket API as a subprocess, and one keep-alive connection to it."""

    def __init__(self, fail_rate: float = 0.0, seed: int = 1) -> None:
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-c", _LAUNCH, str(SERVICE)),
                *("--port", "0", "--seed", str(seed), "--fail-rate", str(fail_rate)),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the ticket service did not start (exit {self.proc.wait()})")
        self.port = int(json.loads(line)["port"])
        self.conn: http.client.HTTPConnection | None = None

    def request(
        self, method: str, path: str, body: Any = None, headers: Mapping[str, str] | None = None
    ) -> tuple[int, Any, Any]:
        data = json.dumps(body).encode() if body is not None else None
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        for again in (True, False):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            try:
                self.conn.request(method, path, body=data, headers=hdrs)
                resp = self.conn.getresponse()
                raw = resp.read()
                return resp.status, resp.headers, json.loads(raw) if raw else None
            except (http.client.HTTPException, ConnectionError):
                self.conn.close()
                self.conn = None
                if not again:
                    raise
        raise AssertionError("unreachable")

    def stats(self) -> dict[str, Any]:
        return dict(self.request("GET", "/stats")[2])

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# --- measurement -----------------------------------------------------------------------


def _size(obj: Any) -> int:
    return len(json.dumps(obj, separators=(",", ":"), default=str))


def commit_bytes(events: Any, kwargs: Mapping[str, Any]) -> int:
    """The JSON a commit writes: events, op records and the task's usage."""
    n = sum(_size(ev.encode(e)[2]) for e in events)
    for op in kwargs.get("ops") or ():
        n += _size(op.args) + _size(op.result) + _size(op.error) + 200
    task = kwargs.get("task")
    if task is not None and task.usage is not None:
        n += _size(task.usage)
    return n


@dataclass
class OpSample:
    """One op window."""

    round: int
    start: float
    end: float = 0.0
    tool_s: float = 0.0
    sleep_s: float = 0.0
    parts: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    writes: Counter[str] = field(default_factory=Counter)  # write transactions by kind
    bytes: dict[str, int] = field(default_factory=dict)

    @property
    def overhead(self) -> float:
        return self.end - self.start - self.tool_s - self.sleep_s


class Probe:
    """Collects op windows; the store wrapper and the patched methods report here."""

    def __init__(self) -> None:
        self.samples: list[OpSample] = []
        self.current: OpSample | None = None
        self.writes_all: Counter[str] = Counter()  # every write transaction of the run

    def begin(self, round_no: int) -> None:
        self.current = OpSample(round_no, time.perf_counter())

    def end(self) -> None:
        if self.current is not None:
            self.current.end = time.perf_counter()
            self.samples.append(self.current)
            self.current = None

    def add(self, kind: str, seconds: float, write: bool, nbytes: int | None = None) -> None:
        if write:
            self.writes_all[kind] += 1
        cur = self.current
        if cur is None:
            return
        cur.parts[kind] += seconds
        if write:
            cur.writes[kind] += 1
        if nbytes is not None:
            cur.bytes[kind] = cur.bytes.get(kind, 0) + nbytes


PROBE = Probe()

_READS = ("get_ops", "get_approvals", "get_task", "get_blob", "get_shared", "get_artifacts")


def _commit_kind(events: Any) -> str:
    types = {type(e) for e in events}
    if ev.RoundCommitted in types:
        return "round commit"
    if ev.OpIntended in types:
        return "intent commit"
    if ev.OpDispatched in types:
        return "dispatched commit"
    if ev.OpRetryScheduled in types:
        return "retry commit"
    return "other commit"


def _guard_kind(fn: Any) -> str:
    q = getattr(fn, "__qualname__", "")
    for name in ("admit", "finish", "release", "record"):
        if f".{name}." in q:
            return f"guard {name}"
    return "shared update"


def instrument(store: Store) -> None:
    """Time the store calls made inside op windows (instance attributes: the class and
    other stores are untouched)."""

    def wrap(name: str, kind: Callable[..., str], write: bool, sized: bool = False) -> None:
        inner = getattr(store, name)

        async def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await inner(*args, **kwargs)
            finally:
                nbytes = commit_bytes(args[2], kwargs) if sized else None
                PROBE.add(kind(*args, **kwargs), time.perf_counter() - t0, write, nbytes)

        setattr(store, name, timed)

    wrap("commit", lambda _t, _tok, events, **_k: _commit_kind(events), True, sized=True)
    wrap("update_shared", lambda _key, fn: _guard_kind(fn), True)
    wrap("get_shared", lambda *_a, **_k: "guard admit (read only)", False)
    wrap("put_blob", lambda *_a, **_k: "messages blob", True)
    for name in _READS:
        wrap(name, lambda *_a, _n=name, **_k: f"read ({_n})", False)


@contextlib.contextmanager
def op_windows() -> Iterator[None]:
    """Open a window at `OpRunner.act`, close it when the round's results are committed
    (`commit_round`, with the verdict when judging is by rules)."""
    act0 = ops_mod.OpRunner.act
    wb0 = engine_mod.TaskRun.commit_round

    async def act(self: Any, round_no: int, response: ModelResponse, **kw: Any) -> Any:
        PROBE.begin(round_no)
        return await act0(self, round_no, response, **kw)

    async def write_back(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await wb0(self, *args, **kwargs)
        finally:
            PROBE.end()

    ops_mod.OpRunner.act = act  # type: ignore[method-assign]
    engine_mod.TaskRun.commit_round = write_back  # type: ignore[method-assign]
    try:
        yield
    finally:
        ops_mod.OpRunner.act = act0  # type: ignore[method-assign]
        engine_mod.TaskRun.commit_round = wb0  # type: ignore[method-assign]


class TimedClock(SystemClock):
    """The system clock; backoff sleeps are subtracted from the op window."""

    async def sleep(self, seconds: float) -> None:
        t0 = time.perf_counter()
        await super().sleep(seconds)
        if PROBE.current is not None:
            PROBE.current.sleep_s += time.perf_counter() - t0


class NoGuard:
    """A service guard (`tether.tools.breaker.Guard`) that admits everything and stores
    nothing."""

    async def admit(self, service: str, holder: str) -> Admission:
        return Admission(True, None, "no guard")

    async def release(self, service: str, holder: str) -> None:
        return None

    async def record(self, service: str, ok: bool, holder: str) -> list[Transition]:
        return []

    async def finish(self, service: str, ok: bool, holder: str) -> list[Transition]:
        return []


# --- the task ------------------------------------------------------------------------


def bench_spec(rounds: int) -> dict[str, Any]:
    return {
        "name": "tools-bench",
        "objective": "File one ticket per round in the ticket tracker",
        "instructions": "Call create_ticket once per round with a new title.",
        "items": [{"id": "tickets", "title": "File the tickets"}],
        "tools": ["create_ticket"],
        "models": {"judge": "rules"},
        "limits": {
            "max_rounds": rounds + 10,
            "no_progress_rounds": 10**9,
            "max_attempts_per_item": 10**9,
            "max_rounds_per_item": None,
        },
    }


def make_tool(service: Service, *, idempotent: bool, reconcile: bool, retry: RetryPolicy) -> Tool:
    async def create_ticket(title: str, ctx: ToolContext) -> dict[str, Any]:
        """File a ticket with this title in the ticket tracker."""
        t0 = time.perf_counter()
        try:
            status, hdrs, doc = service.request(
                "POST",
                "/tickets",
                {"title": title},
                {"Idempotency-Key": ctx.op_id, "X-Attempt": str(ctx.attempt)},
            )
        finally:
            if PROBE.current is not None:
                PROBE.current.tool_s += time.perf_counter() - t0
        if status not in (200, 201):
            raise HTTPStatusError(status, hdrs, json.dumps(doc))
        return dict(doc)

    async def find_ticket(op: Any, ctx: ToolContext) -> Reconciliation:
        status, _, doc = service.request("GET", f"/tickets?key={op.op_id}")
        if status == 200:
            return Reconciliation("done", doc)
        return Reconciliation("not_done") if status == 404 else Reconciliation("unknown")

    def has_id(result: Any) -> bool | str:
        ok = isinstance(result, dict) and isinstance(result.get("id"), int)
        return ok or "no ticket id"

    made: Tool = tool(
        create_ticket,
        effect="write",
        idempotent=idempotent,
        service="tickets",
        retry=retry,
        reconcile=find_ticket if reconcile else None,
        validate=has_id,
    )
    return made


def make_model(floor: Floor | None = None) -> ScriptedModel:
    async def policy(request: ModelRequest) -> ModelResponse:
        if request.purpose == "act":
            if floor is not None:
                await floor.sample()
            n = sum(1 for m in request.messages if m.role == "assistant") + 1
            return ModelResponse(
                "Filing the next ticket.", (tool_call("create_ticket", title=f"ticket {n}"),)
            )
        if request.purpose == "compact":
            return ModelResponse("Tickets were filed one per round with create_ticket.")
        return ModelResponse('{"changes": [], "decision": "continue", "reason": "bench"}')

    return ScriptedModel(policy=policy, name="scripted-bench", keep_requests=2)


# --- backends and floors --------------------------------------------------------------------


def _split(url: str) -> tuple[str, str | None]:
    parts = urlsplit(url)
    q = parse_qsl(parts.query, keep_blank_values=True)
    schema = next((v for k, v in q if k == "schema"), None)
    rest = urlencode([(k, v) for k, v in q if k != "schema"])
    return urlunsplit(parts._replace(query=rest)), schema


class Backend:
    name = ""

    async def open(self, tag: str) -> Store:
        raise NotImplementedError

    def floor_session(
        self, sizes: tuple[int, int]
    ) -> tuple[Callable[[], None], Callable[[], None]]:
        """`(two, close)`: `two()` runs two bare INSERT + COMMIT of these sizes."""
        raise NotImplementedError

    async def hop(self, pool: ThreadPoolExecutor, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(pool, fn)

    def floor_parts(
        self, sizes: tuple[int, int]
    ) -> tuple[Callable[[], None], Callable[[], None], Callable[[], None]]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class Floor:
    """Pairs of bare commits, sampled once per round (from inside the scripted model's
    act call, outside the op window), so the floor sees the same disk and the same load
    as the ops it is compared with: one pair inline, one pair with each commit sent to a
    worker thread the way the store sends its calls."""

    def __init__(self, backend: Backend, sizes: tuple[int, int]) -> None:
        self.backend = backend
        self.sizes = sizes
        self.inline: list[float] = []
        self.hopped: list[float] = []
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="floor")
        self._two: Callable[[], None] | None = None
        self._parts: tuple[Callable[[], None], ...] = ()

    async def __aenter__(self) -> Floor:
        self._two, self._close = self.backend.floor_session(self.sizes)
        self._parts = await self.backend.hop(
            self.pool, lambda: self.backend.floor_parts(self.sizes)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._close()
        await self.backend.hop(self.pool, self._parts[2])
        self.pool.shutdown(wait=True)

    async def sample(self) -> None:
        assert self._two is not None
        t0 = time.perf_counter()
        self._two()
        self.inline.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await self.backend.hop(self.pool, self._parts[0])
        await self.backend.hop(self.pool, self._parts[1])
        self.hopped.append(time.perf_counter() - t0)


class SQLiteBackend(Backend):
    name = "SQLite FULL"

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    async def open(self, tag: str) -> Store:
        from tether.store.sqlite import SQLiteStore

        return await SQLiteStore.open(self.folder / f"{tag}.db", synchronous="FULL")

    def _session(self, sizes: tuple[int, int]) -> tuple[Callable[[int], None], Callable[[], None]]:
        import sqlite3

        conn = sqlite3.connect(self.folder / "floor.db", isolation_level=None, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE IF NOT EXISTS floor (id INTEGER PRIMARY KEY, data TEXT)")

        def one(size: int) -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO floor (data) VALUES (?)", (os.urandom(size // 2).hex(),))
            conn.execute("COMMIT")

        return one, conn.close

    def floor_session(
        self, sizes: tuple[int, int]
    ) -> tuple[Callable[[], None], Callable[[], None]]:
        one, close = self._session(sizes)

        def two() -> None:
            one(sizes[0])
            one(sizes[1])

        return two, close

    def floor_parts(
        self, sizes: tuple[int, int]
    ) -> tuple[Callable[[], None], Callable[[], None], Callable[[], None]]:
        one, close = self._session(sizes)
        return (lambda: one(sizes[0])), (lambda: one(sizes[1])), close


class PostgresBackend(Backend):
    def __init__(self, url: str) -> None:
        import psycopg

        self.base, _ = _split(url)
        self.schemas: list[str] = []
        with psycopg.connect(self.base, autocommit=True) as conn:
            sync = (conn.execute("SHOW synchronous_commit").fetchone() or ("?",))[0]
        self.name = f"PostgreSQL sync_commit={sync}"
        self.floor_schema = f"tools_bench_floor_{uuid.uuid4().hex[:8]}"

    async def open(self, tag: str) -> Store:
        from tether.store.postgres import PostgresStore

        schema = f"tools_bench_{tag}_{uuid.uuid4().hex[:8]}"
        self.schemas.append(schema)
        sep = "&" if urlsplit(self.base).query else "?"
        return await PostgresStore.open(f"{self.base}{sep}schema={schema}")

    async def hop(self, pool: ThreadPoolExecutor, fn: Callable[[], Any]) -> Any:
        return await asyncio.to_thread(fn)  # as PostgresStore._run does

    def _session(self) -> tuple[Callable[[int], None], Callable[[], None]]:
        import psycopg

        conn = psycopg.connect(self.base, autocommit=True)
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.floor_schema}"')
        conn.execute(f'SET search_path TO "{self.floor_schema}"')
        conn.execute("CREATE TABLE IF NOT EXISTS floor (id BIGSERIAL PRIMARY KEY, data TEXT)")

        def one(size: int) -> None:
            with conn.transaction():
                conn.execute("INSERT INTO floor (data) VALUES (%s)", (os.urandom(size // 2).hex(),))

        return one, conn.close

    def floor_session(
        self, sizes: tuple[int, int]
    ) -> tuple[Callable[[], None], Callable[[], None]]:
        one, close = self._session()

        def two() -> None:
            one(sizes[0])
            one(sizes[1])

        return two, close

    def floor_parts(
        self, sizes: tuple[int, int]
    ) -> tuple[Callable[[], None], Callable[[], None], Callable[[], None]]:
        one, close = self._session()
        return (lambda: one(sizes[0])), (lambda: one(sizes[1])), close

    def close(self) -> None:
        import psycopg

        with psycopg.connect(self.base, autocommit=True) as conn:
            for s in [*self.schemas, self.floor_schema]:
                conn.execute(f'DROP SCHEMA IF EXISTS "{s}" CASCADE')


# --- one run -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    key: str
    label: str
    idempotent: bool
    reconcile: bool
    guard: bool


VARIANTS = (
    Variant("idem", "idempotent + reconcile,\nno guard", True, True, False),
    Variant("idem_guard", "idempotent + reconcile,\nshared guard", True, True, True),
    Variant("blind", "non-idempotent,\nno reconcile, no guard", False, False, False),
    Variant("blind_guard", "non-idempotent,\nno reconcile, shared guard", False, False, True),
)


@dataclass
class Run:
    variant: Variant
    samples: list[OpSample]
    wall_s: float
    status: str
    rounds: int
    ops: list[Any]
    stats: dict[str, Any]
    writes_all: Counter[str] = field(default_factory=Counter)
    floor: list[float] = field(default_factory=list)
    floor_hop: list[float] = field(default_factory=list)
    sizes: tuple[int, int] = (0, 0)
    backend: str = ""
    breaker_openings: int = 0
    guard_doc: tuple[int, int] = (0, 0)  # calls in the breaker's window, bytes of JSON
    seed: int = 0


@contextlib.asynccontextmanager
async def opened(backend: Backend, tag: str) -> AsyncIterator[Store]:
    store = await backend.open(tag)
    try:
        yield store
    finally:
        await store.close()


async def run_variant(
    backend: Backend,
    variant: Variant,
    rounds: int,
    *,
    fail_rate: float = 0.0,
    retry: RetryPolicy | None = None,
    seed: int = 1,
    floor: Floor | None = None,
    allow_park: bool = False,
) -> Run:
    service = Service(fail_rate=fail_rate, seed=seed)
    try:
        async with opened(backend, variant.key) as store:
            instrument(store)
            registry = ToolRegistry(
                [
                    make_tool(
                        service,
                        idempotent=variant.idempotent,
                        reconcile=variant.reconcile,
                        retry=retry or RetryPolicy(),
                    )
                ]
            )
            model = make_model(floor)
            task = await create_task(store, parse_spec(bench_spec(rounds), source="tools_bench"))
            engine = Engine(
                store,
                ModelSet(actor=model, judge=None, compact=model),
                registry=registry,
                clock=TimedClock(),
                worker_id="tools-bench",
                lease_ttl=3600.0,
                max_rounds_this_run=rounds,
                guard=None if variant.guard else NoGuard(),
            )
            PROBE.samples = []
            PROBE.writes_all = Counter()
            t0 = time.perf_counter()
            with op_windows():
                result = await engine.run(task.task_id)
            wall = time.perf_counter() - t0
            samples, writes_all = PROBE.samples, PROBE.writes_all
            PROBE.samples = []
            parked = allow_park and result.status == "waiting"
            if not parked and (result.rounds != rounds or len(samples) != rounds):
                final = await store.get_task(task.task_id)
                raise RuntimeError(
                    f"{variant.key}: {result.rounds} rounds of {rounds} ({len(samples)} op "
                    f"windows): {result} waiting={final.waiting}"
                )
            ops = [o for o in await store.get_ops(task.task_id) if o.tool == "create_ticket"]
            changes = await store.read_events(task.task_id, types={ev.BreakerChanged.TYPE})
            openings = sum(1 for c in changes if c.data.get("dst") == "open")
            doc = await store.get_shared("service:tickets") or {}
            guard_doc = (len(doc.get("calls") or ()), _size(doc) if doc else 0)
        stats = service.stats()
    finally:
        service.close()
    return Run(
        variant,
        samples,
        wall,
        result.status,
        result.rounds,
        ops,
        stats,
        writes_all,
        backend=backend.name,
        breaker_openings=openings,
        guard_doc=guard_doc,
        seed=seed,
    )


# --- statistics ----------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def med_p99(values: list[float]) -> tuple[float, float]:
    return (statistics.median(values) * 1000, pct(values, 0.99) * 1000) if values else (0.0, 0.0)


def oracle(seed: int, p: float, k: int, n: int) -> tuple[Counter[int], int, list[bool]]:
    """A perfect client against the service's seeded failure sequence: the service
    draws `random.Random(seed).random() < p` for each POST in arrival order
    (`tests/services/ticket_api.py`), and the ops run one after another, so the attempts
    of every op follow from the sequence. Returns (successes by attempt, ops failed
    after k attempts, the 503 flags of the POSTs)."""
    import random

    rng = random.Random(seed)
    dist: Counter[int] = Counter()
    failed = 0
    flags: list[bool] = []
    for _ in range(n):
        for a in range(1, k + 1):
            flags.append(rng.random() < p)
            if not flags[-1]:
                dist[a] += 1
                break
        else:
            failed += 1
    return dist, failed, flags


def expectation(p: float, k: int) -> dict[str, Any]:
    """The policy's expectation for independent failures with probability p."""
    success = 1 - p**k
    given = sum(j * p ** (j - 1) * (1 - p) for j in range(1, k + 1)) / success
    per_op = (1 - p**k) / (1 - p)  # E[attempts] over all ops
    return {
        "success": success,
        "attempts_given_success": given,
        "attempts_per_op": per_op,
        "attempts_per_success": per_op / success,
        "fail_share": p**k,
        "p": p,
        "dist": [p ** (j - 1) * (1 - p) for j in range(1, k + 1)],
    }


# --- output ---------------------------------------------------------------------------------


def _ms(pair: tuple[float, float]) -> str:
    return f"{pair[0]:.3f} / {pair[1]:.3f}"


PARTS = (
    ("read (get_ops)", "op journal read (get_ops)"),
    ("intent commit", "intent commit"),
    ("dispatched commit", "dispatched commit"),
    ("guard admit", "guard: admit (update_shared)"),
    ("guard admit (read only)", "guard: admit, breaker closed (get_shared)"),
    ("guard finish", "guard: release + record (update_shared)"),
    ("guard release", "guard: release (update_shared)"),
    ("guard record", "guard: record (update_shared)"),
    ("messages blob", "messages blob (put_blob; now inside the round commit)"),
    ("round commit", "round commit (result + op.committed)"),
)


def part_a_table(backend: str, runs: list[Run], command: str) -> Table:
    table = Table(
        title=f"Part A, {backend}: harness overhead per op (op window - time in the tool)\n"
        f"$ {command}",
        title_justify="left",
    )
    table.add_column("measure")
    for r in runs:
        table.add_column(r.variant.label, justify="right")

    def row(label: str, f: Callable[[Run], str]) -> None:
        table.add_row(label, *(f(r) for r in runs))

    row("rounds (1 create_ticket op each) / wall s", lambda r: f"{r.rounds} / {r.wall_s:.1f}")
    row(
        "overhead per op: median / p99 ms",
        lambda r: _ms(med_p99([s.overhead for s in r.samples])),
    )
    row(
        "floor, 2 bare INSERT+COMMIT inline: median / p99 ms",
        lambda r: _ms(med_p99(r.floor)),
    )

    def ov(r: Run) -> float:
        return statistics.median([s.overhead for s in r.samples])

    def writes(r: Run) -> float:
        return statistics.median([sum(s.writes.values()) for s in r.samples])

    row(
        f"ratio overhead / floor, median (target <= {TARGET}x)",
        lambda r: f"{ov(r) / statistics.median(r.floor):.2f}x",
    )
    row(
        "floor, 2 commits via a worker thread: median / p99 ms",
        lambda r: _ms(med_p99(r.floor_hop)),
    )
    row(
        "ratio overhead / thread-hop floor, median",
        lambda r: f"{ov(r) / statistics.median(r.floor_hop):.2f}x",
    )
    row(
        "ratio overhead / (write transactions in the window x one thread-hop commit)",
        lambda r: f"{ov(r) / (writes(r) / 2 * statistics.median(r.floor_hop)):.2f}x",
    )
    row(
        "floor payloads (intent / round commit JSON) B",
        lambda r: f"{r.sizes[0]:,} / {r.sizes[1]:,}",
    )
    row(
        "write transactions in the op window / in the whole round",
        lambda r: (
            f"{statistics.median([sum(s.writes.values()) for s in r.samples]):.0f} / "
            f"{sum(r.writes_all.values()) / r.rounds:.1f}"
        ),
    )
    table.add_section()

    def part(k: str) -> Callable[[Run], str]:
        def cell(r: Run) -> str:
            if not any(k in s.parts for s in r.samples):
                return "-"
            return f"{statistics.median([s.parts.get(k, 0.0) for s in r.samples]) * 1000:.3f}"

        return cell

    for kind, label in PARTS:
        row(f"  {label}: median ms", part(kind))

    def guard_ms(samples: list[OpSample]) -> float:
        return (
            statistics.median(
                sum(v for k, v in s.parts.items() if k.startswith("guard")) for s in samples
            )
            * 1000
        )

    row(
        "  guard, 3 transactions together: median ms, first / last 10% of rounds",
        lambda r: (
            f"{guard_ms(r.samples[: max(1, r.rounds // 10)]):.3f} / "
            f"{guard_ms(r.samples[-max(1, r.rounds // 10) :]):.3f}"
            if r.variant.guard
            else "-"
        ),
    )

    def rest(s: OpSample) -> float:
        return s.overhead - sum(s.parts.values())

    row(
        "  the rest (Python, event loop): median ms",
        lambda r: f"{statistics.median([rest(s) for s in r.samples]) * 1000:.3f}",
    )
    row(
        "  in the tool (HTTP round trip, keep-alive): median ms",
        lambda r: f"{statistics.median([s.tool_s for s in r.samples]) * 1000:.3f}",
    )
    table.add_section()
    row(
        "guard document at the end: calls in the breaker window / JSON bytes",
        lambda r: f"{r.guard_doc[0]} / {r.guard_doc[1]:,}" if r.variant.guard else "-",
    )
    row(
        "tickets created by the service / POSTs it saw",
        lambda r: f"{r.stats['created']} / {len(r.stats['posts'])}",
    )
    return table


def part_b_table(run: Run, command: str, p: float, k: int, extra: Run | None) -> Table:
    ops = run.ops
    n = len(ops)
    succeeded = [o for o in ops if o.status == "succeeded"]
    failed = [o for o in ops if o.status == "failed"]
    attempts = [int(o.attempts) for o in ops]
    posts = run.stats["posts"]
    by_key = Counter(str(post["key"]) for post in posts)
    svc_attempts = [by_key.get(o.op_id, 0) for o in ops]
    unavailable = sum(1 for post in posts if post["outcome"] == "unavailable")
    p_hat = unavailable / max(1, len(posts))
    s_att = [int(o.attempts) for o in succeeded]
    exps = (expectation(p, k), expectation(p_hat, k))

    table = Table(
        title=f"Part B, {run.backend}: the service answers {p:.0%} of POSTs with 503 (seeded, "
        f"independent); RetryPolicy(max_attempts={k}, base_delay=2 ms, full jitter); the "
        "shared breaker is DISABLED (no-op guard) so the retry statistics are clean\n"
        f"$ {command}",
        title_justify="left",
    )
    table.add_column("measure")
    table.add_column("observed", justify="right")
    table.add_column(f"policy expectation\n(p = {p}, k = {k})", justify="right")
    table.add_column(f"expectation at the observed\n503 share p = {p_hat:.3f}", justify="right")

    def both(f: Callable[[dict[str, Any]], str]) -> tuple[str, str]:
        return f(exps[0]), f(exps[1])

    def fail_cell(e: dict[str, Any]) -> str:
        sd = math.sqrt(n * e["fail_share"] * (1 - e["fail_share"]))
        return f"{e['fail_share']:.4f} ({n * e['fail_share']:.1f} +- {sd:.1f})"

    rows: list[tuple[str, str, str, str]] = [
        ("ops (rounds), one create_ticket call each", f"{n}", "", ""),
        (
            "POSTs the service saw / answered 503",
            f"{len(posts)} / {unavailable} ({p_hat:.1%})",
            f"{p:.0%}",
            "",
        ),
        (
            "attempts per op: tether op records / service log",
            f"{statistics.mean(attempts):.3f} / {statistics.mean(svc_attempts):.3f}",
            *both(lambda e: f"{e['attempts_per_op']:.3f}"),
        ),
        (
            "attempts per successful op (all attempts / successes) = 1/(1-p)",
            f"{sum(attempts) / max(1, len(succeeded)):.3f}",
            *both(lambda e: f"{e['attempts_per_success']:.3f}"),
        ),
        (
            "E\\[attempts | success] (mean over succeeded ops)",
            f"{statistics.mean(s_att):.3f}" if s_att else "n/a",
            *both(lambda e: f"{e['attempts_given_success']:.3f}"),
        ),
        (
            f"P(success within {k} attempts) = 1 - p^{k}",
            f"{len(succeeded) / max(1, n):.4f}",
            *both(lambda e: f"{e['success']:.4f}"),
        ),
        (
            f"share of ops failed after {k} attempts = p^{k} (count +- sd)",
            f"{len(failed) / max(1, n):.4f} ({len(failed)})",
            *both(fail_cell),
        ),
    ]

    def at(j: int) -> Callable[[dict[str, Any]], str]:
        return lambda e: f"{n * e['dist'][j - 1]:.1f}"

    for j in range(1, k + 1):
        got = sum(1 for o in succeeded if o.attempts == j)
        rows.append((f"  ops that succeeded at attempt {j}", f"{got}", *both(at(j))))
    rows.append(
        (
            "tickets created by the service (effects) / ops succeeded",
            f"{run.stats['created']} / {len(succeeded)}",
            "equal",
            "",
        )
    )
    backoff = [sm.sleep_s for sm in run.samples]
    rows.append(
        (
            "backoff slept per op: mean ms",
            f"{statistics.mean(backoff) * 1000:.2f}",
            *both(
                lambda e: (
                    f"{sum(e['p'] ** j * 0.002 * 2 ** (j - 1) / 2 for j in range(1, k)) * 1000:.2f}"
                )
            ),
        )
    )
    rows.append(
        (
            "retry commits per op (op.retry_scheduled): mean",
            f"{statistics.mean([sm.writes.get('retry commit', 0) for sm in run.samples]):.3f}",
            *both(lambda e: f"{e['attempts_per_op'] - 1:.3f}"),
        )
    )
    rows.append(
        (
            "overhead per op excl. tool and backoff: median / p99 ms",
            _ms(med_p99([sm.overhead for sm in run.samples])),
            "",
            "",
        )
    )
    # The last column: a perfect client against this run's seeded 503 sequence.
    o_dist, o_failed, flags = oracle(run.seed, p, k, n)
    o_ok = n - o_failed
    same = flags == [post["outcome"] == "unavailable" for post in posts]
    o_given = sum(a * c for a, c in o_dist.items()) / max(1, o_ok)
    ocells = [
        "",
        f"{len(flags)} / {sum(flags)}" + ("" if same else " (differs from the log!)"),
        f"{len(flags) / n:.3f}",
        f"{len(flags) / max(1, o_ok):.3f}",
        f"{o_given:.3f}",
        f"{o_ok / n:.4f}",
        f"{o_failed / n:.4f} ({o_failed})",
        *(f"{o_dist[j]}" for j in range(1, k + 1)),
        "",
        "",
        f"{(len(flags) - n) / n:.3f}",
        "",
    ]
    table.add_column(
        f"a perfect client on this run's\nseeded 503 sequence (seed {run.seed})", justify="right"
    )
    for r, o in zip(rows, ocells, strict=True):
        table.add_row(*r, o)
    if extra is not None:
        table.add_section()
        ex_ops = extra.ops
        refused = sum(
            1
            for o in ex_ops
            if o.status == "failed" and "breaker" in str((o.error or {}).get("message"))
        )
        ok = sum(1 for o in ex_ops if o.status == "succeeded")
        opened = extra.breaker_openings
        table.add_row(
            "for contrast, up to 100 rounds WITH the shared breaker (default "
            f"thresholds): {len(ex_ops)} ops ran before the task was parked until the "
            "breaker's next chance; ops succeeded / held back by the open breaker / openings",
            f"{ok} / {refused} / {opened}",
            "opens at >= 30% of >= 10 calls,",
            "then cools down 60 s",
            "",
        )
    return table


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def command_line(argv: list[str]) -> str:
    exe, script = sys.executable, os.path.abspath(__file__)
    shown = []
    for path in (exe, script):
        rel = os.path.relpath(path)
        shown.append(path if rel.startswith("..") else rel)
    return " ".join(shlex.quote(x) for x in [*shown, *argv])


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def part_a(backend: Backend, rounds: int) -> list[Run]:
    runs = []
    for v in VARIANTS:
        log(f"  {backend.name}: {v.label.replace(chr(10), ' ')}: {rounds} rounds")
        # A few rounds to learn the payload sizes of the floor, and to warm up.
        warm = await run_variant(backend, v, min(20, rounds))
        sizes = (
            int(statistics.median(s.bytes.get("intent commit", 0) for s in warm.samples)),
            int(statistics.median(s.bytes.get("round commit", 0) for s in warm.samples)),
        )
        async with Floor(backend, sizes) as floor:
            run = await run_variant(backend, replace_key(v, "main"), rounds, floor=floor)
        run.variant = v
        run.floor, run.floor_hop, run.sizes = floor.inline, floor.hopped, sizes
        runs.append(run)
    return runs


def replace_key(v: Variant, suffix: str) -> Variant:
    return Variant(f"{v.key}_{suffix}", v.label, v.idempotent, v.reconcile, v.guard)


async def part_b(backend: Backend, rounds: int, contrast: int) -> tuple[Run, Run | None]:
    retry = RetryPolicy(max_attempts=K, base_delay=0.002, max_delay=0.05)
    v = Variant("retries", "retries", True, True, False)
    log(f"  {backend.name}: {rounds} rounds against {FAIL_P:.0%} 503s, no breaker")
    run = await run_variant(backend, v, rounds, fail_rate=FAIL_P, retry=retry, seed=SEED)
    extra = None
    if contrast:
        log(f"  {backend.name}: {contrast} rounds with the default shared breaker")
        vb = Variant("retries_breaker", "breaker", True, True, True)
        extra = await run_variant(
            backend, vb, contrast, fail_rate=FAIL_P, retry=retry, seed=SEED, allow_park=True
        )
    return run, extra


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100 rounds per variant")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per variant (500)")
    ap.add_argument("--pg", help="PostgreSQL URL (default: $TETHER_TEST_PG_URL)")
    ap.add_argument("--no-pg", action="store_true", help="skip PostgreSQL")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(args_list)
    rounds = args.rounds or (100 if args.quick else 500)
    pg_url = None if args.no_pg else (args.pg or os.environ.get("TETHER_TEST_PG_URL"))
    command = command_line(args_list)
    if pg_url and not args.pg:
        command = f"TETHER_TEST_PG_URL={shlex.quote(_redact(pg_url))} {command}"
    console = Console(width=None if sys.stdout.isatty() else 170)
    console.print(f"$ {command}")
    console.print(
        f"{rounds} rounds per variant, one create_ticket op per round against the local "
        f"ticket API (keep-alive http.client); zero-latency scripted model, judge: rules; "
        "the floor is sampled once per round, interleaved with the ops",
        highlight=False,
    )
    t_all = time.perf_counter()
    out: dict[str, Any] = {"command": command, "rounds": rounds}
    with tempfile.TemporaryDirectory(prefix="tether-tools-bench-") as tmp:
        backends: list[Backend] = [SQLiteBackend(Path(tmp))]
        if pg_url:
            backends.append(PostgresBackend(pg_url))
        else:
            log("PostgreSQL skipped: set TETHER_TEST_PG_URL or pass --pg URL")
        tables = []
        for b in backends:
            try:
                runs = asyncio.run(part_a(b, rounds))
                tables.append(part_a_table(b.name, runs, command))
                out[b.name] = [summary(r) for r in runs]
                if isinstance(b, SQLiteBackend):
                    run_b, extra = asyncio.run(
                        part_b(b, rounds, contrast=0 if args.quick else min(100, rounds))
                    )
                    tables.append(part_b_table(run_b, command, FAIL_P, K, extra))
                    out["part_b"] = summary(run_b)
            finally:
                b.close()
    for t in tables:
        console.print(t)
    console.print(f"total wall time {time.perf_counter() - t_all:.0f} s", highlight=False)
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


def summary(r: Run) -> dict[str, Any]:
    ov = [s.overhead for s in r.samples]
    return {
        "variant": r.variant.key,
        "rounds": r.rounds,
        "overhead_ms": med_p99(ov),
        "floor_ms": med_p99(r.floor),
        "floor_hop_ms": med_p99(r.floor_hop),
        "parts_median_ms": {
            k: statistics.median([s.parts.get(k, 0.0) for s in r.samples]) * 1000 for k, _ in PARTS
        },
        "attempts": [int(o.attempts) for o in r.ops],
        "statuses": dict(Counter(o.status for o in r.ops)),
        "created": r.stats["created"],
    }


if __name__ == "__main__":
    sys.exit(main())
