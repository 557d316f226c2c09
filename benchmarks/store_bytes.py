"""Where a round's bytes go: the peer benchmark's tether loop, sized table by table.

The workload is `benchmarks/peers`'s (one never-completing item, one `do_step` call per
round returning 1,024 characters of prose-like text, `judge: rules`), run for N rounds
on a fresh database; then, per table (its indexes and TOAST included), the bytes it
occupies, and for `events` the stored JSON per event type. SQLite: `dbstat` pages in use
(`pgsize - unused`); PostgreSQL: `pg_total_relation_size` after `VACUUM` (dead row
versions are not stored data: autovacuum reclaims them), and the task row's size.

    .venv/bin/python benchmarks/store_bytes.py --store sqlite --n 100,1000
    TETHER_TEST_PG_URL=postgresql://postgres@127.0.0.1:5432/test \\
        .venv/bin/python benchmarks/store_bytes.py --store postgres --n 100,1000

Bytes per round are printed as the total over N and, between two N, as the slope
(the growth from the smaller N to the larger one, per round added): the slope is what
a long task pays per round, without the task's setup.

On PostgreSQL, `tasks` depends on the machine's load: a task row's old versions are
pruned from its page only once no snapshot can see them, and on a busy machine a
commit may find the page full of versions a concurrent read still sees, and move the
row to a new page (fewer HOT updates, printed per table). Compare runs made side by
side (`--pg-url` to one database each: other databases' sessions do not hold back the
pruning), and read the other tables' slopes, which the load does not change.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))

from harness import tool_output
from tether_runner import spec_for

import tether
from tether.models.base import ModelRequest

PG_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"


def _policy() -> Any:
    step = 0

    def policy(request: ModelRequest) -> tether.ModelResponse:
        nonlocal step
        size = len(request.system) + sum(len(m.content) for m in request.messages)
        usage = tether.Usage(input_tokens=size // 4, output_tokens=20)
        if request.purpose == "act":
            step += 1
            call = tether.tool_call("do_step", step=step)
            return tether.ModelResponse(f"Step {step}.", (call,), usage, "peers", 0.0)
        return tether.ModelResponse(
            f"Steps 1 to {step} were done with do_step, one per round; keep going.",
            (),
            usage,
            "peers",
            0.0,
            "stop",
        )

    return policy


@tether.tool(effect="write")
def do_step(step: int) -> str:
    """Process one record (returns 1 KB)."""
    return tool_output(step)


async def _run(url: str, n: int) -> str:
    store = await tether.open_store(url)
    try:
        task = await tether.create_task(store, spec_for(n))
        model = tether.ScriptedModel(policy=_policy(), name="peers", keep_requests=1)
        engine = tether.Engine(
            store, tether.ModelSet(model), registry=tether.ToolRegistry([do_step])
        )
        await engine.run(task.task_id)
        return task.task_id
    finally:
        await store.close()


def _sqlite_sizes(path: Path) -> tuple[dict[str, int], dict[str, tuple[int, int]], int]:
    conn = sqlite3.connect(path)
    try:
        # dbstat names indexes by index name: fold each into its table.
        query = "SELECT name, tbl_name FROM sqlite_schema WHERE type IN ('table', 'index')"
        owner = dict(conn.execute(query))
        tables: dict[str, int] = {}
        for name, used in conn.execute(
            "SELECT name, SUM(pgsize - unused) FROM dbstat GROUP BY name"
        ):
            table = owner.get(name, name)
            tables[table] = tables.get(table, 0) + int(used)
        events = {
            t: (int(c), int(s))
            for t, c, s in conn.execute(
                "SELECT type, COUNT(*), SUM(length(data)) FROM events GROUP BY type"
            )
        }
        row = conn.execute("SELECT SUM(length(usage)) FROM tasks").fetchone()[0] or 0
        return tables, events, int(row)
    finally:
        conn.close()


def _pg_sizes(url: str, schema: str) -> tuple[dict[str, int], dict[str, tuple[int, int]], int]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)
            ).fetchall()
        ]
        for t in names:
            conn.execute(f'VACUUM "{schema}"."{t}"')
        tables = {
            r[0]: int(r[1])
            for r in conn.execute(
                "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = %s AND c.relkind = 'r'",
                (schema,),
            ).fetchall()
        }
        events = {
            r[0]: (int(r[1]), int(r[2]))
            for r in conn.execute(
                f'SELECT type, COUNT(*), SUM(pg_column_size(data)) FROM "{schema}".events'
                " GROUP BY type"
            ).fetchall()
        }
        row = conn.execute(f'SELECT SUM(pg_column_size(t.*)) FROM "{schema}".tasks t').fetchone()
        for r in conn.execute(
            "SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
            " WHERE schemaname = %s AND n_tup_upd > 0 ORDER BY relname",
            (schema,),
        ).fetchall():
            print(f"  {r[0]}: {r[1]} updates, {r[2]} HOT")
        return tables, events, int(row[0] or 0)


def measure(kind: str, n: int, pg: str) -> tuple[dict[str, int], dict[str, tuple[int, int]], int]:
    """Run N rounds on a fresh database; its sizes by table, by event type, task row."""
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "tether.db"
            asyncio.run(_run(f"sqlite:///{path}", n))
            return _sqlite_sizes(path)
    import psycopg

    schema = f"bytes_{uuid.uuid4().hex[:8]}"
    sep = "&" if "?" in pg else "?"
    try:
        asyncio.run(_run(f"{pg}{sep}schema={schema}", n))
        return _pg_sizes(pg, schema)
    finally:
        with psycopg.connect(pg, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def main() -> None:
    """Print the sizes of each N and the slope between the first two."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    ap.add_argument("--n", default="100,1000")
    ap.add_argument("--pg-url", default=os.environ.get("TETHER_TEST_PG_URL", PG_DEFAULT))
    args = ap.parse_args()
    ns = [int(x) for x in args.n.split(",")]
    got = {n: measure(args.store, n, args.pg_url) for n in ns}
    names = sorted({t for tables, _, _ in got.values() for t in tables})
    print(f"store={args.store}; bytes per round (total / N)")
    print(f"{'table':24}" + "".join(f"{f'N={n}':>12}" for n in ns) + "       slope")
    for t in [*names, "TOTAL"]:
        vals = [sum(got[n][0].values()) if t == "TOTAL" else got[n][0].get(t, 0) for n in ns]
        cells = "".join(f"{v / n:12.0f}" for v, n in zip(vals, ns, strict=True))
        slope = (vals[-1] - vals[0]) / (ns[-1] - ns[0]) if len(ns) > 1 else 0
        print(f"{t:24}{cells}{slope:12.0f}")
    print("events by type: count / N, stored bytes per round (JSON)")
    types = sorted({t for _, evs, _ in got.values() for t in evs})
    for t in types:
        cells = "".join(
            f"{got[n][1].get(t, (0, 0))[0] / n:6.2f} {got[n][1].get(t, (0, 0))[1] / n:7.0f}"
            for n in ns
        )
        print(f"  {t:30}{cells}")
    print("task row (usage / whole row) bytes: " + ", ".join(f"N={n}: {got[n][2]}" for n in ns))


if __name__ == "__main__":
    main()
