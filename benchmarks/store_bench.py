"""Store benchmark: the cost of one round, and of getting a long task ready to run.

A simulated round is ONE `Store.commit` that appends three events (about 2 KB together:
`round.started`, `op.result`, `round.committed`) and updates the task projection and
the ledger. For SQLite (synchronous FULL and NORMAL) and PostgreSQL (when
`TETHER_TEST_PG_URL` or `--pg URL` is given) it reports:

- median and p99 ms per round in windows of rounds around 100, 1,000 and 10,000 of
  one task;
- bytes stored per round (database growth over the first 1,000 rounds and over the
  rest);
- the time to open a task with 100,000 events and be ready to run: `get_task` and
  `get_ledger` (projections, no replay), cold right after opening and warm;
- beside them the floor measured in the same run with the same settings: one bare
  `INSERT` of 2 KB + `COMMIT` through the raw driver (sqlite3 / psycopg), and the ratio;
- the cost of the reads a round makes with nothing to ask for (`get_ops` and
  `get_artifacts` with empty id sets: answered without a query or a thread).

SQLite NORMAL is opened by URL, `sqlite:///path?synchronous=normal`. PostgreSQL runs
with the server's `synchronous_commit` unless `--pg-sync-commit on|off` sets it for the
store's and the floor's sessions (off takes the disk flush out, leaving round trips and
work).

    python benchmarks/store_bench.py            # full run (10,000 rounds, 100,000 events)
    python benchmarks/store_bench.py --quick    # 1,000 rounds, 20,000 events
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from tether import events as ev
from tether import ledger as ledger_mod
from tether.store import LedgerWrite, Store, TaskPatch, open_store
from tether.store.postgres import PostgresStore

PAYLOAD = 2048
WINDOW = 100


# --- the simulated round ----------------------------------------------------------------


def make_ledger() -> ledger_mod.Ledger:
    items = [(f"i{n}", f"Checklist item number {n}", f"m{1 + n // 3}") for n in range(1, 7)]
    return ledger_mod.from_spec(
        "Produce a sourced report on the topic",
        items,
        acceptance=[("a1", "the report exists"), ("a2", "every claim has a source")],
        milestones=[("m1", "Gather"), ("m2", "Write"), ("m3", "Review")],
    )


def round_events(r: int) -> list[ev.Event]:
    # ~1.8 KB of incompressible text, so the three events weigh ~2 KB on any backend.
    summary = base64.b64encode(random.Random(r).randbytes(1380)).decode()
    return [
        ev.RoundStarted(round=r, turn=1 + r // 50, item="i1"),
        ev.OpResult(
            op_id=f"op-{r:08d}", tool="fetch", status="succeeded", summary=summary, attempt=1
        ),
        ev.RoundCommitted(round=r, turn=1 + r // 50, ops=1, text="continuing with item i1"),
    ]


def events_size(r: int) -> int:
    return sum(len(json.dumps(ev.encode(e)[2], separators=(",", ":"))) for e in round_events(r))


@dataclass
class Runner:
    """Drives rounds on one task and records per-round latencies."""

    store: Store
    task_id: str
    token: int
    ledger: ledger_mod.Ledger
    rounds: int = 0
    times: list[float] = field(default_factory=list)

    async def one_round(self) -> None:
        r = self.rounds + 1
        upd = ledger_mod.record_attempt(self.ledger, "i1", note=f"round {r}")
        t0 = time.perf_counter()
        await self.store.commit(
            self.task_id,
            self.token,
            round_events(r),
            task=TaskPatch(status="running", usage={"rounds": r, "tokens": 1234 * r}),
            ledger=LedgerWrite.of(upd.ledger, expected_version=self.ledger.version),
        )
        self.times.append(time.perf_counter() - t0)
        self.ledger = upd.ledger
        self.rounds = r


async def start_task(store: Store, task_id: str) -> Runner:
    led = make_ledger()
    await store.create_task(
        task_id=task_id,
        name="bench",
        spec={"objective": led.skeleton.objective},
        ledger=led,
        events=[ev.TaskCreated(name="bench", objective=led.skeleton.objective, items=6)],
    )
    lease = await store.claim("bench", 3600, task_id=task_id)
    assert lease is not None
    return Runner(store, task_id, lease.token, led)


def stats_ms(samples: list[float]) -> tuple[float, float]:
    """(median, p99) in ms."""
    s = sorted(samples)
    p99 = s[min(len(s) - 1, round(0.99 * (len(s) - 1)))]
    return statistics.median(s) * 1000, p99 * 1000


def window(times: list[float], at: int) -> list[float]:
    """The latencies of the WINDOW rounds ending at round `at` (1-based, inclusive)."""
    lo = max(0, at - WINDOW)
    return times[lo:at]


# --- backends -----------------------------------------------------------------------------


class Backend:
    name = ""

    async def open(self) -> Store:
        raise NotImplementedError

    def size(self) -> int:
        """Bytes the database holds now."""
        raise NotImplementedError

    def floor_session(self) -> tuple[Callable[[], None], Callable[[], None]]:
        """`(one, close)`: `one()` does a bare INSERT of 2 KB + COMMIT."""
        raise NotImplementedError

    def floor(self, n: int) -> list[float]:
        """Latencies of `n` bare INSERT 2 KB + COMMIT with the same settings."""
        one, close = self.floor_session()
        try:
            out = []
            for _ in range(n):
                t0 = time.perf_counter()
                one()
                out.append(time.perf_counter() - t0)
            return out
        finally:
            close()

    async def floor_threaded(self, n: int) -> list[float]:
        """The same, each one sent to a worker thread the way the store's calls are."""
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(max_workers=1) as pool:
            one, close = await loop.run_in_executor(pool, self.floor_session)
            try:
                out = []
                for _ in range(n):
                    t0 = time.perf_counter()
                    await loop.run_in_executor(pool, one)
                    out.append(time.perf_counter() - t0)
                return out
            finally:
                await loop.run_in_executor(pool, close)

    def close(self) -> None:
        pass


class SQLiteBackend(Backend):
    def __init__(self, folder: Path, synchronous: str) -> None:
        self.name = f"SQLite {synchronous}"
        self.sync = synchronous
        self.path = folder / f"bench-{synchronous.lower()}.db"

    async def open(self) -> Store:
        return await open_store(f"sqlite:///{self.path}?synchronous={self.sync.lower()}")

    def size(self) -> int:
        import sqlite3

        conn = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            free = conn.execute("PRAGMA freelist_count").fetchone()[0]
            page = conn.execute("PRAGMA page_size").fetchone()[0]
            return int((pages - free) * page)
        finally:
            conn.close()

    def floor_session(self) -> tuple[Callable[[], None], Callable[[], None]]:
        import sqlite3

        path = self.path.with_suffix(".floor.db")
        conn = sqlite3.connect(path, isolation_level=None, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self.sync}")
        conn.execute("CREATE TABLE IF NOT EXISTS floor (id INTEGER PRIMARY KEY, data BLOB)")

        def one() -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO floor (data) VALUES (?)", (os.urandom(PAYLOAD),))
            conn.execute("COMMIT")

        return one, conn.close


def _split(url: str) -> tuple[str, str | None]:
    parts = urlsplit(url)
    q = parse_qsl(parts.query, keep_blank_values=True)
    schema = next((v for k, v in q if k == "schema"), None)
    rest = urlencode([(k, v) for k, v in q if k != "schema"], quote_via=quote)
    return urlunsplit(parts._replace(query=rest)), schema


class PostgresBackend(Backend):
    def __init__(self, url: str, sync_commit: str | None = None) -> None:
        import psycopg

        self.name = "PostgreSQL"
        base, _ = _split(url)
        self.schema = f"bench_{uuid.uuid4().hex[:12]}"
        if sync_commit:
            # The store's and the floor's sessions alike (libpq `options`).
            q = [
                *parse_qsl(urlsplit(base).query),
                ("options", f"-c synchronous_commit={sync_commit}"),
            ]
            base = urlunsplit(urlsplit(base)._replace(query=urlencode(q, quote_via=quote)))
        self.base = base
        sep = "&" if urlsplit(base).query else "?"
        self.url = f"{base}{sep}schema={self.schema}"
        with psycopg.connect(base, autocommit=True) as conn:
            self.sync = conn.execute("SHOW synchronous_commit").fetchone()[0]
        self.name = f"PostgreSQL sync_commit={self.sync}"

    async def open(self) -> Store:
        return await PostgresStore.open(self.url)

    def _conn(self) -> Any:
        import psycopg

        conn = psycopg.connect(self.base, autocommit=True)
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
        conn.execute(f'SET search_path TO "{self.schema}"')
        return conn

    def size(self) -> int:
        with self._conn() as conn:
            conn.execute("VACUUM")  # what autovacuum would reclaim is not stored data
            row = conn.execute(
                "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = %s AND c.relkind = 'r'",
                (self.schema,),
            ).fetchone()
            return int(row[0])

    def floor_session(self) -> tuple[Callable[[], None], Callable[[], None]]:
        conn = self._conn()
        conn.execute("CREATE TABLE IF NOT EXISTS floor (id BIGSERIAL PRIMARY KEY, data BYTEA)")
        conn.autocommit = False

        def one() -> None:
            conn.execute("INSERT INTO floor (data) VALUES (%s)", (os.urandom(PAYLOAD),))
            conn.commit()

        def close() -> None:
            conn.autocommit = True
            conn.execute("DROP TABLE floor")
            conn.close()

        return one, close

    def close(self) -> None:
        import psycopg

        with psycopg.connect(self.base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


# --- one backend's run --------------------------------------------------------------------


@dataclass
class Result:
    name: str
    windows: dict[int, tuple[float, float]]
    floor: tuple[float, float]
    floor_hop: tuple[float, float]
    empty_reads_us: float
    bytes_first: float
    bytes_rest: float | None
    big_events: int
    open_ms: float
    ready_cold_ms: float
    ready_warm_ms: float
    replay_ms: float
    total_s: float


@contextlib.asynccontextmanager
async def opened(backend: Backend) -> AsyncIterator[Store]:
    store = await backend.open()
    try:
        yield store
    finally:
        await store.close()


async def fill_big_task(store: Store, task_id: str, n_events: int) -> None:
    """A task with `n_events` events, written in large commits (setup, not measured)."""
    runner = await start_task(store, task_id)
    per_commit = 300
    r = 0
    while r * 3 + 1 < n_events:
        batch: list[ev.Event] = []
        while len(batch) < per_commit and r * 3 + 1 < n_events:
            r += 1
            batch.extend(round_events(r))
        upd = ledger_mod.record_attempt(runner.ledger, "i1", note=f"round {r}")
        await store.commit(
            task_id,
            runner.token,
            batch,
            task=TaskPatch(status="running", usage={"rounds": r}),
            ledger=LedgerWrite.of(upd.ledger, expected_version=runner.ledger.version),
        )
        runner.ledger = upd.ledger


async def run_backend(
    backend: Backend, rounds: int, big_events: int, marks: list[int], log: Callable[[str], None]
) -> Result:
    started = time.perf_counter()
    floor_n = 300
    floor_times = backend.floor(floor_n)
    hop_times = await backend.floor_threaded(floor_n)
    async with opened(backend) as store:
        runner = await start_task(store, "bench")
        size0 = backend.size()
        size1k = None
        step = max(1, rounds // 10)
        while runner.rounds < rounds:
            await runner.one_round()
            if runner.rounds == min(1000, rounds):
                size1k = backend.size()
            if runner.rounds % step == 0:
                log(f"  {backend.name}: round {runner.rounds}/{rounds}")
        size_end = backend.size()
        empty = []
        for _ in range(1000):
            t = time.perf_counter()
            await store.get_ops("bench", op_ids=set())
            await store.get_artifacts("bench", artifact_ids=set())
            empty.append(time.perf_counter() - t)
        log(f"  {backend.name}: writing a task with {big_events:,} events")
        await fill_big_task(store, "big", big_events)
    floor_times += backend.floor(floor_n)
    hop_times += await backend.floor_threaded(floor_n)

    assert size1k is not None
    first = min(1000, rounds)
    bytes_first = (size1k - size0) / first
    bytes_rest = (size_end - size1k) / (rounds - first) if rounds > first else None

    # Ready to run: open, then the task and ledger projections; no event is read.
    t0 = time.perf_counter()
    store = await backend.open()
    t1 = time.perf_counter()
    try:
        task = await store.get_task("big")
        led = (await store.get_ledger("big")).to_ledger()
        t2 = time.perf_counter()
        assert task.last_seq >= big_events and led.version > 0
        warm = []
        for _ in range(30):
            t = time.perf_counter()
            await store.get_task("big")
            (await store.get_ledger("big")).to_ledger()
            warm.append(time.perf_counter() - t)
        t = time.perf_counter()
        events = await store.read_events("big")
        [e.typed() for e in events]
        replay = time.perf_counter() - t
        assert len(events) == task.last_seq
    finally:
        await store.close()

    return Result(
        name=backend.name,
        windows={m: stats_ms(window(runner.times, m)) for m in marks if m <= rounds},
        floor=stats_ms(floor_times),
        floor_hop=stats_ms(hop_times),
        empty_reads_us=statistics.median(empty) * 1e6,
        bytes_first=bytes_first,
        bytes_rest=bytes_rest,
        big_events=task.last_seq,
        open_ms=(t1 - t0) * 1000,
        ready_cold_ms=(t2 - t1) * 1000,
        ready_warm_ms=statistics.median(warm) * 1000,
        replay_ms=replay * 1000,
        total_s=time.perf_counter() - started,
    )


# --- output -------------------------------------------------------------------------------


def render(results: list[Result], marks: list[int], args: argparse.Namespace) -> None:
    """One column per backend, one row per measure."""
    big = results[0].big_events if results else 0
    rows: list[tuple[str, list[str]]] = []

    def ms(pair: tuple[float, float]) -> str:
        return f"{pair[0]:.3f} / {pair[1]:.3f}"

    nan = (float("nan"), float("nan"))
    for m in marks:
        rows.append((f"round {m:,}: median / p99 ms", [ms(r.windows.get(m, nan)) for r in results]))
    rows.append(
        ("floor, bare INSERT 2 KB + COMMIT: median / p99 ms", [ms(r.floor) for r in results])
    )
    rows.append(
        (
            "ratio round / floor (median) at " + " / ".join(f"{m:,}" for m in marks),
            [
                " / ".join(f"{r.windows.get(m, nan)[0] / r.floor[0]:.1f}x" for m in marks)
                for r in results
            ],
        )
    )
    rows.append(
        ("floor sent through a worker thread: median / p99 ms", [ms(r.floor_hop) for r in results])
    )
    rows.append(
        (
            "ratio round / thread-hop floor (median) at " + " / ".join(f"{m:,}" for m in marks),
            [
                " / ".join(f"{r.windows.get(m, nan)[0] / r.floor_hop[0]:.1f}x" for m in marks)
                for r in results
            ],
        )
    )
    rows.append(
        (
            "reads with empty id sets (get_ops + get_artifacts): median us",
            [f"{r.empty_reads_us:.1f}" for r in results],
        )
    )
    rows.append(
        (
            "bytes stored per round: first 1,000 / after",
            [
                f"{r.bytes_first:,.0f} / "
                + (f"{r.bytes_rest:,.0f}" if r.bytes_rest is not None else "-")
                for r in results
            ],
        )
    )
    rows.append(
        (
            f"ready to run, task of {big:,} events (get_task + get_ledger): cold / warm ms",
            [f"{r.ready_cold_ms:.2f} / {r.ready_warm_ms:.2f}" for r in results],
        )
    )
    rows.append(
        ("open the store (connect, schema check) ms", [f"{r.open_ms:.1f}" for r in results])
    )
    rows.append(
        (
            f"for contrast: read and decode all {big:,} events ms",
            [f"{r.replay_ms:,.0f}" for r in results],
        )
    )
    rows.append(("wall time of this backend's run s", [f"{r.total_s:.1f}" for r in results]))

    title = (
        f"tether store benchmark: 1 round = 1 commit of 3 events ({events_size(1):,} B of JSON)"
        f" + task and ledger projections; latency windows = the {WINDOW} rounds ending at"
        " each mark"
    )
    command = "python " + " ".join(["benchmarks/store_bench.py", *sys.argv[1:]])
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover - rich is a dependency
        args.plain = True
    if not args.plain:
        table = Table(title=title, caption=command, show_lines=False)
        table.add_column("measure")
        for r in results:
            table.add_column(r.name, justify="right")
        for label, cells in rows:
            table.add_row(label, *cells)
        Console(width=max(120, 60 + 24 * len(results))).print(table)
    else:
        print(title)
        print(command)
        print(" | ".join(["measure", *[r.name for r in results]]))
        for label, cells in rows:
            print(" | ".join([label, *cells]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1,000 rounds and 20,000 events")
    ap.add_argument("--rounds", type=int, help="rounds in one task (default 10,000)")
    ap.add_argument("--events", type=int, help="events of the ready-to-run task (100,000)")
    ap.add_argument("--pg", help="PostgreSQL URL (default: $TETHER_TEST_PG_URL)")
    ap.add_argument("--no-pg", action="store_true", help="skip PostgreSQL")
    ap.add_argument(
        "--pg-sync-commit",
        choices=["on", "off"],
        help="PostgreSQL synchronous_commit for the run's sessions (default: the server's)",
    )
    ap.add_argument("--only", choices=["full", "normal", "pg"], action="append")
    ap.add_argument("--plain", action="store_true", help="plain text table")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = ap.parse_args(argv)

    rounds = args.rounds or (1000 if args.quick else 10_000)
    big = args.events or (20_000 if args.quick else 100_000)
    marks = [m for m in (100, 1000, 10_000) if m <= rounds] or [rounds]
    pg_url = None if args.no_pg else (args.pg or os.environ.get("TETHER_TEST_PG_URL"))

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="tether-bench-") as tmp:
        backends: list[Backend] = []
        only = set(args.only or ["full", "normal", "pg"])
        if "full" in only:
            backends.append(SQLiteBackend(Path(tmp), "FULL"))
        if "normal" in only:
            backends.append(SQLiteBackend(Path(tmp), "NORMAL"))
        if "pg" in only and pg_url:
            backends.append(PostgresBackend(pg_url, args.pg_sync_commit))
        elif "pg" in only:
            log("PostgreSQL skipped: set TETHER_TEST_PG_URL or pass --pg URL")
        results = []
        for b in backends:
            log(f"{b.name}: {rounds:,} rounds, then a task of {big:,} events")
            try:
                results.append(asyncio.run(run_backend(b, rounds, big, marks, log)))
            finally:
                b.close()
    render(results, marks, args)
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
