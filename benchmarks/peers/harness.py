"""What every peer runner shares: the workload, the per-step probe, floors and sizes.

The workload is the same for tether, LangGraph and DBOS: a zero-latency fake model
answers one tool call per step (`do_step(step=k)`), and the tool appends the line
`k key` to an effect log (a plain file, written with `os.write` on an `O_APPEND`
descriptor, so a SIGKILL right after it loses nothing) and returns 1,024 characters.
A step whose number appears twice in the log is a repeated side effect.

A step's interval runs from the start of its model call to the start of the next
step's model call (the last step: to the return of the loop); its overhead is the
interval minus the time inside the model function and inside the tool function. What
remains is what the system itself does per step: persisting, loading, bookkeeping.
"""

from __future__ import annotations

import contextlib
import os
import random
import resource
import signal
import sqlite3
import statistics
import sys
import threading
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

OUTPUT_CHARS = 1024
FLOOR_PAYLOAD = 2048
PG_ENV = "TETHER_TEST_PG_URL"
PG_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"


def _vocabulary(size: int = 1000) -> tuple[str, ...]:
    # Pseudo-words from a fixed seed: 1 KB of them compresses (zlib) to ~60% alone and
    # to ~36% over many outputs, about like prose, so PostgreSQL's TOAST compression
    # does not make a repeated filler look free.
    rng = random.Random(1)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return tuple(
        "".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(size)
    )


_WORDS = _vocabulary()


# --- the workload -----------------------------------------------------------------------


def tool_output(step: int) -> str:
    """Exactly OUTPUT_CHARS characters of text for a step, different for every step."""
    rng = random.Random(step)
    words = [f"step {step} done."]
    size = len(words[0])
    while size < OUTPUT_CHARS:
        w = rng.choice(_WORDS)
        words.append(w)
        size += len(w) + 1
    return " ".join(words)[:OUTPUT_CHARS]


class EffectLog:
    """The tool's side effect: one line `step key` appended per call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def append(self, step: int, key: str = "-") -> None:
        """Append one line; an O_APPEND write survives the process being killed."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(self._fd, f"{step} {key}\n".encode())

    def lines(self) -> list[tuple[int, str]]:
        """Every (step, key) written so far, in order."""
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            step, _, key = line.partition(" ")
            out.append((int(step), key))
        return out

    def has_key(self, key: str) -> bool:
        """True when an effect with this key was written (a reconcile looks here)."""
        return any(k == key for _, k in self.lines())

    def last_step(self) -> int:
        """The highest step written, 0 when none."""
        return max((s for s, _ in self.lines()), default=0)

    def counts(self) -> Counter[int]:
        """How many times each step's effect happened."""
        return Counter(s for s, _ in self.lines())

    def close(self) -> None:
        """Close the descriptor (the file stays)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def crash_now() -> None:
    """Die the hard way, as a power cut or the OOM killer would: no cleanup at all."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


# --- the probe ----------------------------------------------------------------------------


class Probe:
    """Per-step timings of one run, in preallocated arrays (no growth while timing)."""

    def __init__(self, n: int) -> None:
        self.n = n
        size = n + 2
        self.start = array("d", [0.0]) * size  # perf_counter at the start of step k's model call
        self.model_s = array("d", [0.0]) * size
        self.tool_s = array("d", [0.0]) * size
        # CPU seconds at the start of step k: of the thread that opens the steps (the
        # event loop's, for tether) and of the whole process; and CPU spent inside the
        # model and tool functions, taken out as their time is.
        self.cpu_loop = array("d", [0.0]) * size
        self.cpu_proc = array("d", [0.0]) * size
        self.cpu_in_loop = array("d", [0.0]) * size
        self.cpu_in_proc = array("d", [0.0]) * size
        self.loop_ident: int | None = None
        self._tool_cpu = threading.local()
        self.steps = 0
        self.end = 0.0
        self.end_cpu = (0.0, 0.0)
        self.first_call: float | None = None  # first model/tool/reconcile call (perf_counter)
        self.first_call_wall: float | None = None  # the same, wall clock (across processes)

    def _slot(self) -> int:
        return min(self.steps, self.n + 1)

    def touch(self) -> None:
        """Note the first piece of real work done by this process (resume latency)."""
        if self.first_call is None:
            self.first_call = time.perf_counter()
            self.first_call_wall = time.time()

    def model_start(self) -> float:
        """Open the next step's interval; returns t0 for `model_done`."""
        t0 = time.perf_counter()
        self.touch()
        self.steps += 1
        slot = self._slot()
        self.start[slot] = t0
        if self.loop_ident is None:
            self.loop_ident = threading.get_ident()
        self.cpu_loop[slot] = time.thread_time()
        self.cpu_proc[slot] = time.process_time()
        self._tool_cpu.model = self.cpu_loop[slot]
        return t0

    def model_cpu_start(self) -> None:
        """Note the thread's CPU at the start of a model call that opens no step."""
        self._tool_cpu.model = time.thread_time()

    def _inside(self, since: float) -> None:
        # CPU of a model or tool function: off the process's figure, and off the loop
        # thread's when it ran there (a tool run in a worker thread is not loop CPU).
        used = time.thread_time() - since
        slot = self._slot()
        self.cpu_in_proc[slot] += used
        if threading.get_ident() == self.loop_ident:
            self.cpu_in_loop[slot] += used

    def extra_model(self, t0: float) -> None:
        """A model call that is not a step's decision (tether's compaction): model time."""
        self.model_s[self._slot()] += time.perf_counter() - t0
        self._inside(getattr(self._tool_cpu, "model", time.thread_time()))

    def model_done(self, t0: float) -> None:
        """Close the time inside the model function."""
        self.model_s[self._slot()] += time.perf_counter() - t0
        self._inside(getattr(self._tool_cpu, "model", time.thread_time()))

    def tool_start(self) -> float:
        """Open the time inside the tool function; returns t0 for `tool_done`."""
        self.touch()
        self._tool_cpu.tool = time.thread_time()
        return time.perf_counter()

    def tool_done(self, t0: float) -> None:
        """Close the time inside the tool function (it runs inside the open step)."""
        self.tool_s[self._slot()] += time.perf_counter() - t0
        self._inside(getattr(self._tool_cpu, "tool", time.thread_time()))

    def finish(self) -> None:
        """The loop returned: closes the last step's interval."""
        self.end = time.perf_counter()
        self.end_cpu = (time.thread_time(), time.process_time())

    def cpu_ms(self, step: int) -> tuple[float, float]:
        """(loop-thread CPU, process CPU) of a step outside the model and tool, in ms."""
        if step < self.steps:
            loop_end, proc_end = self.cpu_loop[step + 1], self.cpu_proc[step + 1]
        else:
            loop_end, proc_end = self.end_cpu
        loop = loop_end - self.cpu_loop[step] - self.cpu_in_loop[step]
        proc = proc_end - self.cpu_proc[step] - self.cpu_in_proc[step]
        return loop * 1000.0, proc * 1000.0

    def overhead_ms(self, step: int) -> float:
        """Interval minus model and tool time, in ms."""
        nxt = self.start[step + 1] if step < self.steps else self.end
        return (nxt - self.start[step] - self.model_s[step] - self.tool_s[step]) * 1000.0

    def overheads(self) -> list[float]:
        """Overhead of every step, in ms (index 0 is step 1)."""
        return [self.overhead_ms(k) for k in range(1, min(self.steps, self.n) + 1)]


def windows(n: int) -> dict[str, tuple[int, int]]:
    """The timing windows (1-based, inclusive): ~100, ~1000 and the end of the run.

    A window ends one step before its mark when the mark is the last step, because the
    last interval also holds the end of the run (closing, releasing a lease).
    """
    out: dict[str, tuple[int, int]] = {}
    marks = {"100": 100, "1000": 1000, "end": n}
    for name, mark in marks.items():
        hi = min(mark, n - 1)
        if hi < 2 or (name != "end" and mark > n):
            continue
        width = max(2, min(100, hi // 2))
        out[name] = (hi - width + 1, hi)
    if "100" not in out and "end" in out:  # a smoke-sized run: its only window
        out["100"] = out["end"]
    return out


def pct(values: list[float], q: float) -> float:
    """The q-quantile by nearest rank (q=0.99: p99)."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def med_p99(values: list[float]) -> tuple[float, float]:
    """(median, p99); NaN for no values."""
    if not values:
        return float("nan"), float("nan")
    return statistics.median(values), pct(values, 0.99)


def peak_rss() -> int:
    """Peak resident set size of this process so far, in bytes.

    Linux's VmHWM belongs to this program's address space; ru_maxrss would not do in a
    child, as Linux carries it over from the parent across fork and exec.
    """
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(ru if sys.platform == "darwin" else ru * 1024)


# --- PostgreSQL ---------------------------------------------------------------------------


def pg_base_url() -> str:
    """The server URL: $TETHER_TEST_PG_URL or the local default."""
    return os.environ.get(PG_ENV) or PG_DEFAULT


def pg_params(url: str, **params: str) -> str:
    """`url` with libpq query parameters set (replacing any of the same name)."""
    parts = urlsplit(url)
    q = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in params]
    q.extend(params.items())
    # %20, not '+': libpq does not decode '+' as a space (options=-c search_path=...).
    return urlunsplit(parts._replace(query=urlencode(q, quote_via=quote)))


def pg_connect(url: str, schema: str | None = None) -> Any:
    """A plain autocommit psycopg connection, its search_path on `schema` if given."""
    import psycopg

    conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
    if schema:
        conn.execute(f'SET search_path TO "{schema}"')
    return conn


def pg_problem(url: str) -> str | None:
    """None when the server answers, else why not (to print as a skip reason)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install -e '.[peers]')"
    try:
        with pg_connect(pg_params(url, connect_timeout="3")) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return f"no PostgreSQL at {redact(url)}: {type(exc).__name__}: {exc}".strip()
    return None


def pg_version(url: str) -> str:
    """The server's version string, short."""
    with pg_connect(url) as conn:
        return str(conn.execute("SHOW server_version").fetchone()[0])


def app_name(schema: str) -> str:
    """The application_name a run's connections carry, so leftovers can be ended."""
    return f"peers-{schema}"[:60]


def create_schema(url: str, schema: str) -> None:
    """A fresh, empty schema for one block."""
    with pg_connect(url) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')


def drop_schema(url: str, schema: str) -> None:
    """Drop a block's schema; end connections a killed child may have left behind."""
    with pg_connect(url) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE pid <> pg_backend_pid() AND application_name = %s",
            (app_name(schema),),
        )
        conn.execute("SET lock_timeout = '30s'")
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def redact(url: str) -> str:
    """The URL without its password, for printing."""
    parts = urlsplit(url)
    if parts.password:
        return urlunsplit(parts._replace(netloc=parts.netloc.replace(parts.password, "***")))
    return url


# --- where a system keeps its data: size and floor ----------------------------------------


@dataclass
class Storage:
    """A system's database, as the harness measures it (size) and imitates it (floor).

    SQLite: `path`, the journal mode and synchronous setting the system runs with.
    PostgreSQL: the server `url` and the `schema` holding the system's tables.
    """

    kind: str  # "sqlite" or "postgres"
    path: Path | None = None
    journal: str = "wal"
    synchronous: str = "FULL"
    url: str | None = None
    schema: str | None = None
    notes: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """One line for the table: what the floor imitates."""
        if self.kind == "sqlite":
            return f"SQLite journal={self.journal} synchronous={self.synchronous}"
        return "PostgreSQL"

    def size(self) -> int:
        """Bytes the system's data occupy now."""
        if self.kind == "sqlite":
            assert self.path is not None
            if not self.path.exists():
                return 0
            # A reader sees the WAL's committed frames, so no checkpoint is needed.
            conn = sqlite3.connect(self.path, timeout=30)
            try:
                pages = conn.execute("PRAGMA page_count").fetchone()[0]
                free = conn.execute("PRAGMA freelist_count").fetchone()[0]
                page = conn.execute("PRAGMA page_size").fetchone()[0]
                return int((pages - free) * page)
            finally:
                conn.close()
        assert self.url is not None and self.schema is not None
        with pg_connect(self.url) as conn:
            tables = [
                r[0]
                for r in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = %s", (self.schema,)
                ).fetchall()
            ]
            for t in tables:  # dead row versions are not stored data; autovacuum reclaims them
                conn.execute(f'VACUUM "{self.schema}"."{t}"')
            row = conn.execute(
                "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = %s AND c.relkind IN ('r', 'm')",
                (self.schema,),
            ).fetchone()
            return int(row[0])

    def floor(self, n: int) -> list[float]:
        """Latencies (s) of `n` bare INSERT of 2 KB + COMMIT with the same settings."""
        if n <= 0:
            return []
        if self.kind == "sqlite":
            return self._sqlite_floor(n)
        return self._pg_floor(n)

    def _sqlite_floor(self, n: int) -> list[float]:
        assert self.path is not None
        path = self.path.with_name(self.path.name + ".floor")
        conn = sqlite3.connect(path, isolation_level=None, timeout=30)
        try:
            conn.execute(f"PRAGMA journal_mode={self.journal}")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute("CREATE TABLE IF NOT EXISTS floor (id INTEGER PRIMARY KEY, data BLOB)")
            out = []
            for _ in range(n):
                data = os.urandom(FLOOR_PAYLOAD)
                t0 = time.perf_counter()
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("INSERT INTO floor (data) VALUES (?)", (data,))
                conn.execute("COMMIT")
                out.append(time.perf_counter() - t0)
            return out
        finally:
            conn.close()
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(str(path) + suffix).unlink(missing_ok=True)

    def _pg_floor(self, n: int) -> list[float]:
        assert self.url is not None and self.schema is not None
        conn = pg_connect(pg_params(self.url, application_name=app_name(self.schema)))
        try:
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
            conn.execute(
                f'CREATE TABLE IF NOT EXISTS "{self.schema}".peers_floor'
                " (id BIGSERIAL PRIMARY KEY, data BYTEA)"
            )
            conn.autocommit = False
            out = []
            for _ in range(n):
                data = os.urandom(FLOOR_PAYLOAD)
                t0 = time.perf_counter()
                conn.execute(f'INSERT INTO "{self.schema}".peers_floor (data) VALUES (%s)', (data,))
                conn.commit()
                out.append(time.perf_counter() - t0)
            conn.autocommit = True
            conn.execute(f'DROP TABLE "{self.schema}".peers_floor')
            return out
        finally:
            conn.close()


# --- one block's setup --------------------------------------------------------------------


@dataclass
class Setup:
    """What one child process is asked to do (a block, a crash run or a resume)."""

    system: str
    config: str
    n: int
    workdir: Path
    pg_url: str | None = None
    schema: str | None = None
    crash_at: int | None = None  # SIGKILL right after this step's side effect
    resume: bool = False  # continue the run a killed process left behind
    effects: EffectLog = field(init=False)
    resume_called_at: float | None = None  # perf_counter when the resume began

    def __post_init__(self) -> None:
        self.effects = EffectLog(self.workdir / "effects.log")

    def pg_app_url(self) -> str:
        """The server URL with this block's application_name (to find leftovers)."""
        assert self.pg_url is not None and self.schema is not None
        return pg_params(self.pg_url, application_name=app_name(self.schema))

    def after_effect(self, step: int) -> None:
        """Called by every tool right after its side effect: the crash point."""
        if self.crash_at is not None and step == self.crash_at:
            crash_now()
