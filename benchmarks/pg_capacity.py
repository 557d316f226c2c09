"""PostgreSQL capacity probe: what one tether round costs the database, what a claim
costs, and where one PostgreSQL server saturates under that load.

Runs against a database of its own (`tether_capacity_<pid>`, created on the server of
`--pg` and dropped at the end), so that the server's statistics count this load only.

1. **Per round**: `--tasks` tasks x `--rounds` rounds run by `Worker(concurrency=...)`
   in this process with a zero-latency fake model and a no-op tool (effect `write`,
   idempotent: two commits per round, as in `scale_bench.py`). Counted: statements sent
   (a counter on psycopg's `execute`, pipelined ones included), transactions
   (`pg_stat_database.xact_commit`), rows inserted and updated per table
   (`pg_stat_user_tables`), bytes the tables and indexes grew, and the CPU time of the
   server processes serving this database (`/proc/<pid>/stat` of the backends listed in
   `pg_stat_activity`, sampled until the run ends; WAL writer, checkpointer and
   background writer are not counted). WAL bytes are the server's whole WAL
   (`pg_current_wal_lsn`) over the run: other databases' writes are in it too, so it is
   an upper bound on a shared server.
2. **Claim**: the time of `store.claim` (one transaction: the oldest claimable row
   `FOR UPDATE SKIP LOCKED`, then the lease written) with 50 and with `--deep` tasks
   queued.
3. **Saturation**: `pgbench` replays a round's writes as measured in 1 — the same rows
   per table, of the same average width, in two transactions of one statement each per
   round, the task row locked first (as tether's commit does) — at 1, 2, 4, ... clients
   (`--clients`), `--seconds` each, and reports rounds/s and latency per client count.
   This is the server's ceiling for tether's write pattern without tether's Python in
   front of it; on a shared 2-core machine it is the machine's, not a server's.

    .venv/bin/python benchmarks/pg_capacity.py --pg postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from tether.models.base import ModelRequest, ModelResponse, Usage
from tether.models.scripted import tool_call
from tether.runtime.engine import ModelSet
from tether.runtime.tasks import create_task
from tether.runtime.worker import Worker
from tether.spec import TaskSpec, parse_spec
from tether.store import open_store
from tether.tools.registry import ToolRegistry, tool

TABLES = ("tasks", "events", "ledgers", "ops", "blobs", "artifacts", "artifact_text")


def with_db(url: str, db: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}", query=""))


def spec(rounds: int) -> Any:
    return parse_spec(
        {
            "name": "capacity",
            "objective": f"do {rounds} pieces of work, one per round",
            "items": [
                {"id": f"w{k}", "title": f"do piece {k}",
                 "done_when": {"kind": "op", "tool": "work", "args": {"item": f"w{k}"}}}
                for k in range(1, rounds + 1)
            ],
            "tools": ["work"],
            "models": {"judge": "rules"},
            "limits": {"max_rounds": rounds + 5},
        }
    )  # fmt: skip


class Fake:
    name = "fake"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        await asyncio.sleep(0)
        nxt = (request.ledger or {}).get("next")
        if not nxt:
            return ModelResponse("All done.", usage=Usage(100, 5))
        return ModelResponse(f"doing {nxt}", (tool_call("work", item=nxt),), usage=Usage(100, 10))

    async def aclose(self) -> None:
        return None


def models_for(_: TaskSpec) -> ModelSet:
    return ModelSet(actor=Fake())


async def work(item: str) -> str:
    """Do one piece of work."""
    return f"done {item}"


class Statements:
    """Counts what psycopg sends: `execute` on connections and cursors."""

    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()
        self.on = False

    def install(self) -> None:
        counter = self
        for cls in (psycopg.Connection, psycopg.Cursor):
            real = cls.execute

            def execute(self: Any, *a: Any, _real: Any = real, **k: Any) -> Any:
                if counter.on:
                    with counter.lock:
                        counter.n += 1
                return _real(self, *a, **k)

            cls.execute = execute  # type: ignore[method-assign]
        real_many = psycopg.Cursor.executemany

        def executemany(self: Any, query: Any, params: Any, *a: Any, **k: Any) -> Any:
            rows = list(params)
            if counter.on:
                with counter.lock:
                    counter.n += len(rows)
            return real_many(self, query, rows, *a, **k)

        psycopg.Cursor.executemany = executemany  # type: ignore[method-assign]


def db_stats(admin: str, db: str) -> dict[str, Any]:
    with psycopg.connect(with_db(admin, db), autocommit=True) as c:
        row = c.execute(
            "SELECT xact_commit, tup_inserted, tup_updated, tup_deleted"
            " FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        tables = {
            r[0]: (r[1], r[2], r[3])
            for r in c.execute(
                "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
            ).fetchall()
        }
        sizes = {
            r[0]: int(r[1])
            for r in c.execute(
                "SELECT relname, pg_total_relation_size(relid) FROM pg_stat_user_tables"
            ).fetchall()
        }
        wal = c.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None and wal is not None
    return {
        "xact": int(row[0]),
        "ins": int(row[1]),
        "upd": int(row[2]),
        "tables": tables,
        "sizes": sizes,
        "wal": int(wal[0]),
    }


def settled_stats(admin: str, db: str) -> dict[str, Any]:
    """The statistics once the server has flushed them (two reads agree)."""
    last = db_stats(admin, db)
    for _ in range(20):
        time.sleep(0.5)
        now = db_stats(admin, db)
        if (now["xact"], now["ins"], now["upd"]) == (last["xact"], last["ins"], last["upd"]):
            return now
        last = now
    return last


def backend_cpu(admin: str, db: str, seen: dict[int, float]) -> None:
    """Record the CPU seconds of the backends serving `db` (kept per pid, latest)."""
    tick = os.sysconf("SC_CLK_TCK")
    with psycopg.connect(with_db(admin, "postgres"), autocommit=True) as c:
        pids = [
            r[0]
            for r in c.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (db,),
            ).fetchall()
        ]
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        seen[pid] = (int(fields[11]) + int(fields[12])) / tick


async def round_cost(args: argparse.Namespace, admin: str, db: str) -> dict[str, Any]:
    url = with_db(admin, db)
    store = await open_store(url)
    try:
        for _ in range(args.tasks):
            await create_task(store, spec(args.rounds))
    finally:
        await store.close()
    before = settled_stats(admin, db)
    counter = Statements()
    counter.install()
    store = await open_store(url)
    cpu: dict[int, float] = {}
    cpu_before: dict[int, float] = {}
    backend_cpu(admin, db, cpu_before)
    worker = Worker(
        store,
        models_for,
        registry=ToolRegistry([tool(work, effect="write", idempotent=True)]),
        concurrency=args.concurrency,
        once=True,
        poll_interval=0.05,
        watch_every=None,
    )
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            await asyncio.to_thread(backend_cpu, admin, db, cpu)
            await asyncio.sleep(0.2)

    sampler = asyncio.create_task(sample())
    counter.on = True
    t0 = time.perf_counter()
    stats = await worker.run()
    wall = time.perf_counter() - t0
    counter.on = False
    await asyncio.to_thread(backend_cpu, admin, db, cpu)
    stop.set()
    await sampler
    await store.close()
    after = settled_stats(admin, db)
    rounds = args.tasks * args.rounds
    per_table = {}
    for t in TABLES:
        b = before["tables"].get(t, (0, 0, 0))
        a = after["tables"].get(t, (0, 0, 0))
        grow = after["sizes"].get(t, 0) - before["sizes"].get(t, 0)
        per_table[t] = {
            "inserted": (a[0] - b[0]) / rounds,
            "updated": (a[1] - b[1]) / rounds,
            "hot_updated": (a[2] - b[2]) / rounds,
            "bytes": grow / rounds,
        }
    pg_cpu = sum(v - cpu_before.get(pid, 0.0) for pid, v in cpu.items())
    return {
        "tasks": args.tasks,
        "rounds_per_task": args.rounds,
        "concurrency": args.concurrency,
        "ran": stats.ran,
        "wall_s": wall,
        "rounds_per_s_one_process": rounds / wall,
        "statements_per_round": counter.n / rounds,
        "transactions_per_round": (after["xact"] - before["xact"]) / rounds,
        "rows_inserted_per_round": (after["ins"] - before["ins"]) / rounds,
        "rows_updated_per_round": (after["upd"] - before["upd"]) / rounds,
        "bytes_per_round": sum(
            after["sizes"].get(t, 0) - before["sizes"].get(t, 0) for t in after["sizes"]
        )
        / rounds,
        "wal_bytes_per_round_upper_bound": (after["wal"] - before["wal"]) / rounds,
        "pg_backend_cpu_ms_per_round": pg_cpu * 1000 / rounds,
        "per_table": per_table,
    }


async def claim_cost(admin: str, db: str, deep: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for depth in (50, deep):
        name = f"claims{depth}"
        url = with_db(admin, db) + f"?schema={name}"
        store = await open_store(url)
        try:
            one = spec(1)
            for _ in range(depth):
                await create_task(store, one)
            times = []
            for n in range(min(40, depth)):
                t0 = time.perf_counter()
                lease = await store.claim(f"probe:{n}", 60)
                times.append((time.perf_counter() - t0) * 1000)
                assert lease is not None
            times.sort()
            out[str(depth)] = {"median_ms": times[len(times) // 2], "max_ms": times[-1]}
        finally:
            await store.close()
    return out


#: One round's writes (see the module docstring); pgbench statements may span lines.
PGBENCH = """\\set t random(1, {tasks})
BEGIN;
SELECT last_seq FROM cap_tasks WHERE task_id = :t FOR UPDATE;
WITH e AS (INSERT INTO cap_events (task_id, seq, data)
  SELECT :t, g, repeat('e', {ev_w}) FROM generate_series(1, {ev1}) g)
UPDATE cap_tasks SET last_seq = last_seq + {ev1}, version = version + 1 WHERE task_id = :t;
COMMIT;
BEGIN;
SELECT last_seq FROM cap_tasks WHERE task_id = :t FOR UPDATE;
WITH e AS (INSERT INTO cap_events (task_id, seq, data)
  SELECT :t, g, repeat('e', {ev_w}) FROM generate_series(1, {ev2}) g),
l AS (UPDATE cap_ledgers SET state = repeat('l', {led_w}), version = version + 1
  WHERE task_id = :t),
o AS (INSERT INTO cap_ops (task_id, data)
  SELECT :t, repeat('o', {op_w}) FROM generate_series(1, {ops}))
UPDATE cap_tasks SET last_seq = last_seq + {ev2}, version = version + 1 WHERE task_id = :t;
COMMIT;
"""

SETUP = """
DROP TABLE IF EXISTS cap_tasks, cap_events, cap_ledgers, cap_ops;
CREATE TABLE cap_tasks (task_id int PRIMARY KEY, last_seq bigint NOT NULL DEFAULT 0,
  version int NOT NULL DEFAULT 0, pad text);
CREATE TABLE cap_events (id bigserial PRIMARY KEY, task_id int, seq bigint, data text);
CREATE INDEX ON cap_events (task_id, seq);
CREATE TABLE cap_ledgers (task_id int PRIMARY KEY, state text, version int DEFAULT 0);
CREATE TABLE cap_ops (id bigserial PRIMARY KEY, task_id int, data text);
CREATE INDEX ON cap_ops (task_id);
INSERT INTO cap_tasks (task_id, pad) SELECT g, repeat('t', 600) FROM generate_series(1, {tasks}) g;
INSERT INTO cap_ledgers (task_id, state) SELECT g, repeat('l', {led_w})
  FROM generate_series(1, {tasks}) g;
"""


def saturate(args: argparse.Namespace, admin: str, db: str, cost: dict[str, Any]) -> list[Any]:
    pgbench = shutil.which("pgbench")
    if pgbench is None:
        return []
    ev = cost["per_table"]["events"]
    events = max(2, round(ev["inserted"]))
    ev_w = max(50, int(ev["bytes"] / max(1.0, ev["inserted"])) - 60)
    led = cost["per_table"]["ledgers"]
    led_w = max(200, int(led["bytes"] / max(1.0, led["updated"]))) if led["updated"] else 1500
    ops = cost["per_table"]["ops"]
    n_ops = max(1, round(ops["inserted"])) if ops["inserted"] >= 0.5 else 1
    op_w = max(100, int(ops["bytes"] / max(1.0, ops["inserted"])) - 60) if ops["inserted"] else 300
    params = {
        "tasks": 10_000,
        "ev_w": ev_w,
        "ev1": max(1, events // 2),
        "ev2": max(1, events - events // 2),
        "led_w": min(led_w, 8000),
        "ops": n_ops,
        "op_w": op_w,
    }
    url = with_db(admin, db)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(SETUP.format(**params))
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "round.sql"
        script.write_text(PGBENCH.format(**params))
        parts = urlsplit(admin)
        for clients in args.clients:
            cmd = [pgbench, "-n", "-f", str(script), "-c", str(clients),
                   "-j", str(min(clients, 2)), "-T", str(args.seconds), "-M", "prepared",
                   "-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 5432),
                   "-U", parts.username or "postgres", db]  # fmt: skip
            load = os.getloadavg()[0]
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            tps = re.search(r"tps = ([\d.]+)", res.stdout)
            lat = re.search(r"latency average = ([\d.]+) ms", res.stdout)
            out.append(
                {
                    "clients": clients,
                    "rounds_per_s": float(tps.group(1)) if tps else None,
                    "latency_ms": float(lat.group(1)) if lat else None,
                    "load": load,
                    "error": None if res.returncode == 0 else res.stderr[-300:],
                }
            )
            print(f"  pgbench {clients:3d} clients: {out[-1]}", flush=True)
    return [params, out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pg", default=os.environ.get("TETHER_TEST_PG_URL"), required=False)
    ap.add_argument("--tasks", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--deep", type=int, default=2000, help="queue depth of the claim probe")
    ap.add_argument("--clients", default="1,2,4,8,16,32,64")
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not args.pg:
        sys.exit("give --pg URL (or TETHER_TEST_PG_URL)")
    args.clients = [int(c) for c in args.clients.split(",")]
    command = "benchmarks/pg_capacity.py " + shlex.join(sys.argv[1:])
    print(f"tether PostgreSQL capacity probe: {command}; load {os.getloadavg()[0]:.1f}")
    db = f"tether_capacity_{os.getpid()}"
    admin = args.pg
    with psycopg.connect(with_db(admin, "postgres"), autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{db}"')
    try:
        cost = asyncio.run(round_cost(args, admin, db))
        print(json.dumps({k: v for k, v in cost.items() if k != "per_table"}, indent=1))
        print(json.dumps(cost["per_table"], indent=1))
        claims = asyncio.run(claim_cost(admin, db, args.deep))
        print("claim:", json.dumps(claims))
        sat = saturate(args, admin, db, cost)
    finally:
        with psycopg.connect(with_db(admin, "postgres"), autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "command": command,
                    "round": cost,
                    "claim": claims,
                    "pgbench_params": sat[0] if sat else None,
                    "saturation": sat[1] if sat else [],
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
