"""Soak: one long task, its process SIGKILLed at random moments, on SQLite and PostgreSQL.

The task has N items of K side-effecting calls each (N x K rounds, one ticket per
round) against the real HTTP ticket service of `tests/services/ticket_api.py`, run as
its own process on 127.0.0.1. The first half of the items files with `put_ticket`
(idempotent by op id), the second half with `log_ticket` (not idempotent, reconciled
by a look-up); see `tests/services/soak_tools.py`. A real `tether run` process drives
the task, and is SIGKILLed when the task reaches a randomly chosen round (plus a random
fraction of a second); `tether resume` picks it up each time, until the task ends.
Kills fall in the first 60% of the rounds, so the last stretch runs in one process
(its memory growth per 100 rounds is reported).

Checks (any failure is printed and the exit code is 1):

- exactly-once effects: the service's tickets are exactly the intended effects (one
  ticket per title `itI-cJ`, 0 duplicates, 0 missing), and each ticket was created by
  the op journaled for it (its `Idempotency-Key` or `X-Trace-Op` is the op's id);
- the log is gapless (seq 1..n), every op intended once and with exactly one final
  result;
- `tether rebuild` finds no difference between the log and the projections;
- the task is `satisfied`.

Figures: rounds/s early (rounds 5-15% of the run: 500-1,500 of 10,000) and late (the
last 10%), from the journal's `round.committed` times, not counting intervals that
span a kill; RSS of the live process when the task passes 10% and 100% of the rounds,
and the growth of the unkilled last process per 100 rounds; the database's bytes per
round in the first and second half (SQLite: page_count x page_size; PostgreSQL:
pg_total_relation_size of every table of the task's schema, the server's own
autovacuum settings); look-ups the service saw per recovery (per resumed process);
kill -> first new event (the time from SIGKILL to the first event the next process
journals; the next process is started right after the kill), and the CPU time that
process had used by then (what does not depend on the machine's load). The processes
run without `PYTHONDONTWRITEBYTECODE`, so their bytecode is cached as an installed
tether's is.

    .venv/bin/python benchmarks/soak.py                         # 20 x 25 rounds, 6 kills
    .venv/bin/python benchmarks/soak.py --full                  # 100 x 100, 18 kills
    .venv/bin/python benchmarks/soak.py --items 4 --calls 5 --kills 3 --store sqlite
    .venv/bin/python benchmarks/soak.py --seed 1234             # replays run 1234's plan

The seed fixes the kill plan (rounds and delays) and the PostgreSQL schema name; the
timing of a kill within a round is the machine's. PostgreSQL runs at `--pg-url` or
`$TETHER_TEST_PG_URL` and is skipped (said so) when neither is set. `--src DIR` runs
the tether of another source tree (`DIR/src` first on `PYTHONPATH`), for before/after
figures. `--json PATH` writes the result.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.services.soak_tools import (  # noqa: E402
    CALLS_ENV,
    ITEMS_ENV,
    MODEL,
    TOOLS_REF,
    item_id,
    title,
    tool_of,
)

SERVICE = ROOT / "tests" / "services" / "ticket_api.py"
POLL = 0.01


@dataclass
class Result:
    store: str
    seed: int
    items: int
    calls: int
    rounds: int = 0
    events: int = 0
    kills: int = 0
    processes: int = 0
    wall_s: float = 0.0
    status: str = ""
    violations: list[str] = field(default_factory=list)
    tickets: int = 0
    duplicates: int = 0
    missing: int = 0
    rate_early: float = 0.0
    rate_late: float = 0.0
    late_over_early: float = 0.0
    #: CPU milliseconds per round of the process that ran them, in the same windows
    #: (independent of how busy the machine is).
    cpu_ms_per_round_early: float = 0.0
    cpu_ms_per_round_late: float = 0.0
    rate_by_tenth: list[float] = field(default_factory=list)
    cpu_ms_by_tenth: list[float] = field(default_factory=list)
    rss_mb_at_10pct: float = 0.0
    rss_mb_at_end: float = 0.0
    last_process_rounds: int = 0
    last_process_mb_per_100_rounds: float = 0.0
    bytes_per_round_first_half: float = 0.0
    bytes_per_round_second_half: float = 0.0
    lookups_per_recovery: list[int] = field(default_factory=list)
    kill_to_event_s: list[float] = field(default_factory=list)
    kill_to_event_median_s: float = 0.0
    kill_to_event_max_s: float = 0.0
    #: CPU seconds the new process had used when its first event was seen: the part of
    #: kill -> first event that does not depend on how busy the machine is.
    cpu_to_event_s: list[float] = field(default_factory=list)
    cpu_to_event_median_s: float = 0.0
    #: PostgreSQL: the tables whose rows are rewritten each round (`tasks`, `ledgers`,
    #: `shared_state`): bytes with TOAST and indexes, updates and HOT updates.
    hot_rows: dict[str, dict[str, int]] = field(default_factory=dict)


# --- the services ------------------------------------------------------------------------


class TicketService:
    """`tests/services/ticket_api.py` as a child process on an ephemeral port."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVICE), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        self.port = int(json.loads(self.proc.stdout.readline())["port"])
        self.url = f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> Any:
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", path)
            return json.loads(conn.getresponse().read())
        finally:
            conn.close()

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class Journal:
    """Reads the task's events and the database size directly (no tether import)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.pg = not url.startswith("sqlite")
        self.conn: Any = None
        self.schema = ""

    def _connect(self) -> Any:
        if self.conn is not None:
            return self.conn
        if self.pg:
            import psycopg
            from tests.services.tools import rows_connect

            self.schema = dict(
                kv.split("=", 1) for kv in self.url.split("?", 1)[1].split("&") if "=" in kv
            ).get("schema", "public")
            self.conn = rows_connect(self.url)
            assert isinstance(self.conn, psycopg.Connection)
        else:
            path = self.url.removeprefix("sqlite:///")
            if not Path(path).exists():
                return None
            self.conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        return self.conn

    def _q(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        conn = self._connect()
        if conn is None:
            return []
        if self.pg:
            sql = sql.replace("?", "%s")
        try:
            return list(conn.execute(sql, args).fetchall())
        except Exception:  # the schema is not there yet
            if self.pg:
                return []
            raise

    def task_id(self) -> str | None:
        try:
            rows = self._q("SELECT task_id FROM tasks LIMIT 1")
        except sqlite3.OperationalError:
            return None
        return str(rows[0][0]) if rows else None

    def events_after(self, task: str, seq: int) -> list[tuple[int, str, float]]:
        rows = self._q(
            "SELECT seq, type, at FROM events WHERE task_id = ? AND seq > ? ORDER BY seq",
            (task, seq),
        )
        return [(int(s), str(t), float(a)) for s, t, a in rows]

    def size(self) -> int:
        if self.pg:
            rows = self._q(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = ? AND c.relkind = 'r'",
                (self.schema,),
            )
            return int(rows[0][0])
        pages, size = self._q("PRAGMA page_count"), self._q("PRAGMA page_size")
        return int(pages[0][0]) * int(size[0][0]) if pages and size else 0

    def hot_rows(self) -> dict[str, dict[str, int]]:
        if not self.pg:
            return {}
        rows = self._q(
            "SELECT relname, pg_total_relation_size(relid), n_tup_upd, n_tup_hot_upd"
            " FROM pg_stat_user_tables WHERE schemaname = ?"
            " AND relname IN ('tasks', 'ledgers', 'shared_state')",
            (self.schema,),
        )
        return {str(n): {"bytes": int(b), "updates": int(u), "hot": int(h)} for n, b, u, h in rows}

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


# --- the run -----------------------------------------------------------------------------


def spec(items: int, calls: int) -> dict[str, Any]:
    return {
        "name": "soak",
        "objective": "File every ticket of every item, one per round, each exactly once",
        "instructions": "File the focus item's next ticket with its tool; one per round.",
        "models": {"judge": "rules"},
        "items": [
            {
                "id": item_id(i),
                "title": f"file the {calls} tickets of item {i}",
                "done_when": {
                    "kind": "op",
                    "tool": tool_of(i, items),
                    "args": {"title": title(i, calls - 1)},
                },
            }
            for i in range(items)
        ],
        "tools": ["put_ticket", "log_ticket"],
        "limits": {
            "max_rounds": items * calls * 2 + 100,
            "no_progress_rounds": 10**6,
            "max_attempts_per_item": 10**6,
            "max_rounds_per_item": None,
        },
    }


class Soak:
    def __init__(self, args: argparse.Namespace, store: str, url: str, work: Path) -> None:
        self.a, self.store, self.url, self.work = args, store, url, work
        self.rng = random.Random(args.seed)
        self.res = Result(store, args.seed, args.items, args.calls)
        self.rounds_total = args.items * args.calls
        self.journal = Journal(url)
        self.api = TicketService()
        self.task: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.seq = 0
        self.rounds = 0
        #: (seq, type, at) of every event seen, in order.
        self.events: list[tuple[int, str, float]] = []
        self.kill_marks: list[float] = []  # kill times (time.time())
        self.size_marks: dict[str, int] = {}
        self.rss_marks: dict[str, float] = {}
        self.last_proc_rss: list[tuple[int, float]] = []
        #: (rounds done, process number, its CPU seconds) whenever rounds were seen.
        self.cpu_marks: list[tuple[int, int, float]] = []
        self.ws = work / "ws"
        self.ws.mkdir(parents=True)
        self.spec_path = work / "spec.yaml"
        self.spec_path.write_text(json.dumps(spec(args.items, args.calls)))

    def env(self) -> dict[str, str]:
        # As an installed tether runs: with its bytecode cached (an editable install
        # under PYTHONDONTWRITEBYTECODE would compile every module at every start).
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("TETHER_") and k != "PYTHONDONTWRITEBYTECODE"
        }
        path = [str(ROOT)]
        if self.a.src:
            path.insert(0, str(Path(self.a.src).resolve() / "src"))
        env.update(
            PYTHONPATH=os.pathsep.join(path),
            TETHER_TOOLS=TOOLS_REF,
            TICKETS_URL=self.api.url,
            **{ITEMS_ENV: str(self.a.items), CALLS_ENV: str(self.a.calls)},
        )
        return env

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "tether.cli", *args, "--db", self.url]
        return subprocess.run(
            cmd, cwd=self.ws, env=self.env(), capture_output=True, text=True, timeout=600
        )

    def start(self) -> subprocess.Popen[bytes]:
        if self.task is None:
            args = ["run", str(self.spec_path), "--model", MODEL, "--workspace", str(self.ws)]
        else:
            args = ["resume", self.task, "--model", MODEL]
        cmd = [sys.executable, "-m", "tether.cli", *args, "--db", self.url]
        self.res.processes += 1
        return subprocess.Popen(
            cmd, cwd=self.ws, env=self.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

    def poll(self) -> list[tuple[int, str, float]]:
        if self.task is None:
            self.task = self.journal.task_id()
            if self.task is None:
                return []
        new = self.journal.events_after(self.task, self.seq)
        for seq, typ, at in new:
            self.seq = seq
            self.events.append((seq, typ, at))
            if typ == "round.committed":
                self.rounds += 1
                self.on_round()
        if self.proc is not None and any(t == "round.committed" for _, t, _ in new):
            self.cpu_marks.append((self.rounds, self.res.processes, cpu_s(self.proc.pid)))
        return new

    def on_round(self) -> None:
        half, tenth = self.rounds_total // 2, max(1, self.rounds_total // 10)
        if self.rounds == half:
            self.size_marks["half"] = self.journal.size()
        if self.rounds == tenth and self.proc is not None:
            self.rss_marks["10pct"] = rss_mb(self.proc.pid)
        if self.rounds == self.rounds_total and self.proc is not None:
            self.rss_marks["end"] = rss_mb(self.proc.pid)

    def run(self) -> Result:
        t0 = time.perf_counter()
        total = self.rounds_total
        hi = max(3, int(total * 0.6))
        kills = sorted(self.rng.randrange(2, hi) for _ in range(self.a.kills))
        plan = [(r, self.rng.uniform(0, self.a.max_extra)) for r in kills]
        lookups_before = 0
        killed_at: float | None = None
        self.size_marks["start"] = 0
        while True:
            self.proc = self.start()
            proc_start_rounds = self.rounds
            waiting_first = killed_at is not None
            target = plan.pop(0) if plan else None
            hit_at: float | None = None
            self.last_proc_rss = []
            next_rss = time.monotonic()
            while self.proc.poll() is None:
                new = self.poll()
                now = time.monotonic()
                # Only an event stamped after the kill is the new process's: on
                # PostgreSQL a commit the killed process had sent may still land.
                fresh = [e for e in new if self.kill_marks and e[2] > self.kill_marks[-1]]
                if waiting_first and fresh and killed_at is not None:
                    self.res.kill_to_event_s.append(now - killed_at)
                    self.res.cpu_to_event_s.append(cpu_s(self.proc.pid))
                    waiting_first = False
                if now >= next_rss:
                    self.last_proc_rss.append(
                        (self.rounds - proc_start_rounds, rss_mb(self.proc.pid))
                    )
                    next_rss = now + 0.25
                if target is not None and hit_at is None and self.rounds >= target[0]:
                    hit_at = now + target[1]
                if hit_at is not None and now >= hit_at:
                    self.proc.send_signal(signal.SIGKILL)
                    self.proc.wait()
                    killed_at = time.monotonic()
                    self.poll()  # what the killed process committed before it died
                    self.kill_marks.append(time.time())
                    self.res.kills += 1
                    break
                time.sleep(POLL)
            else:
                _, err = self.proc.communicate()
                self.poll()
                if self.proc.returncode != 0:
                    self.res.violations.append(
                        f"process exited {self.proc.returncode}: {err.decode()[-2000:]}"
                    )
                    break
                killed_at = None
            if self.res.processes > 1:
                stats = self.api.get("/stats")
                self.res.lookups_per_recovery.append(int(stats["lookups"]) - lookups_before)
                lookups_before = int(stats["lookups"])
            if killed_at is None:
                # ended by itself: finished, or waiting (nothing here waits for a person)
                break
            if self.res.processes > self.a.kills + 20:
                self.res.violations.append("too many processes: the task does not finish")
                break
        self.res.wall_s = time.perf_counter() - t0
        self.size_marks["end"] = self.journal.size()
        self.res.hot_rows = self.journal.hot_rows()
        self.figures()
        self.check()
        return self.res

    # -- figures and checks -------------------------------------------------------------

    def figures(self) -> None:
        r = self.res
        r.rounds = self.rounds
        r.events = len(self.events)
        ends = [at for _, typ, at in self.events if typ == "round.committed"]
        kills = sorted(self.kill_marks)

        def rate(lo: int, hi: int) -> float:
            spent, n = 0.0, 0
            for k in range(max(lo, 1), min(hi, len(ends))):
                a, b = ends[k - 1], ends[k]
                if any(a <= t <= b for t in kills):
                    continue  # an interval with a kill and a restart in it
                spent += b - a
                n += 1
            return n / spent if spent > 0 else 0.0

        def cpu_ms(lo: int, hi: int) -> float:
            spent, done = 0.0, 0
            for (r0, p0, c0), (r1, p1, c1) in itertools.pairwise(self.cpu_marks):
                if p0 == p1 and lo <= r0 and r1 <= hi and c1 > 0:
                    spent, done = spent + c1 - c0, done + r1 - r0
            return round(spent / done * 1000, 1) if done else 0.0

        n = len(ends)
        r.cpu_ms_per_round_early = cpu_ms(int(n * 0.05), int(n * 0.15))
        r.cpu_ms_per_round_late = cpu_ms(int(n * 0.9), n)
        r.rate_early = round(rate(int(n * 0.05), int(n * 0.15)), 2)
        r.rate_late = round(rate(int(n * 0.9), n), 2)
        r.late_over_early = round(r.rate_late / r.rate_early, 2) if r.rate_early else 0.0
        # The whole curve, a tenth of the rounds at a time: growth shows as a slope,
        # a change of tool or a killed stretch as a step.
        tenths = [(n * t // 10, n * (t + 1) // 10) for t in range(10)]
        r.rate_by_tenth = [round(rate(lo, hi), 1) for lo, hi in tenths]
        r.cpu_ms_by_tenth = [cpu_ms(lo, hi) for lo, hi in tenths]
        r.rss_mb_at_10pct = round(self.rss_marks.get("10pct", 0.0), 1)
        r.rss_mb_at_end = round(self.rss_marks.get("end", 0.0), 1)
        samples = [(k, m) for k, m in self.last_proc_rss if m > 0]
        if len(samples) >= 4:
            warm = samples[len(samples) // 4 :]  # after warm-up
            (k0, m0), (k1, m1) = warm[0], warm[-1]
            r.last_process_rounds = samples[-1][0]
            if k1 > k0:
                r.last_process_mb_per_100_rounds = round((m1 - m0) / (k1 - k0) * 100, 3)
        half = self.rounds_total // 2
        if "half" in self.size_marks and half:
            r.bytes_per_round_first_half = round(
                (self.size_marks["half"] - self.size_marks["start"]) / half
            )
            r.bytes_per_round_second_half = round(
                (self.size_marks["end"] - self.size_marks["half"]) / (self.rounds_total - half)
            )
        if r.kill_to_event_s:
            r.kill_to_event_median_s = round(statistics.median(r.kill_to_event_s), 3)
            r.kill_to_event_max_s = round(max(r.kill_to_event_s), 3)
        r.kill_to_event_s = [round(x, 3) for x in r.kill_to_event_s]
        if r.cpu_to_event_s:
            r.cpu_to_event_median_s = round(statistics.median(r.cpu_to_event_s), 3)

    def check(self) -> None:
        r, v = self.res, self.res.violations
        if self.task is None:
            v.append("no task was created")
            return
        status = json.loads(self.cli("status", self.task, "--json").stdout)
        r.status = str(status["status"])
        if r.status != "satisfied":
            v.append(f"the task is {r.status}, not satisfied ({status.get('stop_reason')})")
        res = self.cli("events", self.task, "--json")
        events = json.loads(res.stdout)
        seqs = [e["seq"] for e in events]
        if seqs != list(range(1, len(seqs) + 1)):
            v.append("the log has gaps or repeats")
        intents = Counter(e["data"]["op_id"] for e in events if e["type"] == "op.intended")
        results: Counter[str] = Counter()
        final: dict[str, str] = {}
        for e in events:
            if e["type"] == "op.result" and e["data"]["status"] in ("succeeded", "failed"):
                results[e["data"]["op_id"]] += 1
                final[e["data"]["op_id"]] = e["data"]["status"]
        if any(n != 1 for n in intents.values()):
            v.append(f"ops intended more than once: {[o for o, n in intents.items() if n != 1]}")
        bad = [o for o in intents if results[o] != 1]
        if bad:
            v.append(f"ops without exactly one final result: {bad[:10]}")
        by_op = {
            e["data"]["op_id"]: e["data"]["args"].get("title")
            for e in events
            if e["type"] == "op.intended"
        }
        wanted = {title(i, j) for i in range(self.a.items) for j in range(self.a.calls)}
        tickets = self.api.get("/tickets")
        posts = self.api.get("/stats")["posts"]
        titles = Counter(t["title"] for t in tickets)
        r.tickets = len(tickets)
        r.duplicates = sum(n - 1 for n in titles.values() if n > 1)
        r.missing = len(wanted - set(titles))
        if r.duplicates or r.missing or set(titles) - wanted:
            v.append(
                f"effects: {r.tickets} tickets for {len(wanted)} intended, "
                f"{r.duplicates} duplicates, {r.missing} missing"
            )
        made = {p["ticket"]: p for p in posts if p["outcome"].startswith("created")}
        for t in tickets:
            post = made.get(t["id"])
            op = post and (post["key"] or post["trace"])
            if not op or by_op.get(op) != t["title"]:
                v.append(f"ticket {t['title']} was not made by the op journaled for it")
                break
        if sum(1 for o in final.values() if o == "succeeded") != len(wanted):
            v.append(f"{sum(1 for o in final.values() if o == 'succeeded')} ops succeeded")
        rebuilt = json.loads(self.cli("rebuild", self.task, "--json").stdout)
        if rebuilt.get("differences"):
            v.append(f"rebuild differs from the log: {rebuilt['differences']}")

    def close(self) -> None:
        self.journal.close()
        self.api.close()


def pg_url(base: str, schema: str) -> str:
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}schema={schema}&application_name=soak-{schema}"


def drop_schema(base: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = %s AND pid <> pg_backend_pid()",
            (f"soak-{schema}",),
        )
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def one(args: argparse.Namespace, store: str) -> Result:
    with tempfile.TemporaryDirectory(prefix="tether-soak-") as tmp:
        work = Path(tmp)
        schema = ""
        if store == "sqlite":
            url = f"sqlite:///{work / 'tether.db'}"
        else:
            schema = f"soak_{args.seed}_{os.getpid()}"
            url = pg_url(args.pg_url, schema)
        soak = Soak(args, store, url, work)
        try:
            return soak.run()
        finally:
            soak.close()
            if schema and not args.keep:
                drop_schema(args.pg_url, schema)


def show(r: Result) -> None:
    print(f"== {r.store}: seed={r.seed} items={r.items} calls={r.calls} rounds={r.rounds}")
    print(f"   status={r.status} events={r.events} kills={r.kills} processes={r.processes}"
          f" wall={r.wall_s:.1f}s")  # fmt: skip
    print(f"   effects: tickets={r.tickets} duplicates={r.duplicates} missing={r.missing}")
    print(f"   rounds/s early={r.rate_early} late={r.rate_late} (late/early {r.late_over_early});"
          f" CPU ms/round early={r.cpu_ms_per_round_early}"
          f" late={r.cpu_ms_per_round_late}")  # fmt: skip
    print(f"   by tenth of the rounds: rounds/s {r.rate_by_tenth};"
          f" CPU ms/round {r.cpu_ms_by_tenth}")  # fmt: skip
    print(f"   RSS MB at 10%={r.rss_mb_at_10pct} at end={r.rss_mb_at_end};"
          f" last process {r.last_process_rounds} rounds,"
          f" {r.last_process_mb_per_100_rounds} MB/100 rounds")  # fmt: skip
    print(f"   bytes/round first half={r.bytes_per_round_first_half}"
          f" second half={r.bytes_per_round_second_half}")  # fmt: skip
    for name, row in sorted(r.hot_rows.items()):
        print(f"   {name}: {row['bytes']} bytes, {row['updates']} updates, {row['hot']} HOT")
    print(f"   look-ups per recovery={r.lookups_per_recovery}")
    print(f"   kill -> first event median={r.kill_to_event_median_s}s"
          f" max={r.kill_to_event_max_s}s all={r.kill_to_event_s};"
          f" CPU of the new process by then: median {r.cpu_to_event_median_s}s")  # fmt: skip
    print("   violations: " + ("none" if not r.violations else "; ".join(r.violations)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--items", type=int, default=20)
    p.add_argument("--calls", type=int, default=25)
    p.add_argument("--kills", type=int, default=6)
    p.add_argument("--full", action="store_true", help="100 items x 100 calls, 18 kills")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--store", choices=["sqlite", "postgres", "both"], default="both")
    p.add_argument("--pg-url", default=os.environ.get("TETHER_TEST_PG_URL"))
    p.add_argument("--max-extra", type=float, default=0.05, help="seconds after the round")
    p.add_argument("--src", default=None, help="run the tether of another source tree")
    p.add_argument("--keep", action="store_true", help="keep the PostgreSQL schema")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.full:
        args.items, args.calls, args.kills = 100, 100, 18
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(10**6)
    print(f"seed={args.seed} (--seed {args.seed} replays this plan)", flush=True)
    stores = ["sqlite", "postgres"] if args.store == "both" else [args.store]
    results = []
    for store in stores:
        if store == "postgres" and not args.pg_url:
            print("== postgres: skipped (no --pg-url and no TETHER_TEST_PG_URL)")
            continue
        r = one(args, store)
        show(r)
        results.append(r)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 1 if any(r.violations for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
