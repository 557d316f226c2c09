"""Shared fixtures for every test tier.

- `clock`: a `FakeClock` the stores below are opened with.
- `pg_url`: a PostgreSQL URL (from `TETHER_TEST_PG_URL`) pointing at a fresh schema of
  its own (`?schema=NAME`), dropped afterwards. Skips with a reason when the variable is
  unset; when it is set the PostgreSQL tests always run.
- `backend` / `store`: parametrized over `memory`, `sqlite` (a file in `tmp_path`) and
  `postgres`. `backend` describes where the data live (URL, file path) and can open
  more handles on the same database; `store` is one open handle.
- `make_ledger`, `make_task`: a small ledger and a queued task with it.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest
from hypothesis import settings

from tether import events as ev
from tether import ledger as ledger_mod
from tether.clock import Clock, FakeClock
from tether.store import Store, TaskRecord

# Property tests assert behaviour, not speed: hypothesis's per-example deadline (200 ms)
# fails them on a loaded CI machine, so it is off for every test (a test may still set
# its own).
settings.register_profile("tether", deadline=None)
settings.load_profile("tether")

PG_ENV = "TETHER_TEST_PG_URL"
PG_SKIP_REASON = f"{PG_ENV} is not set: PostgreSQL tests need a server (e.g. {PG_ENV}=postgresql://postgres@127.0.0.1:5432/test)"
BACKENDS = ("memory", "sqlite", "postgres")
SQL_BACKENDS = ("sqlite", "postgres")


# --- PostgreSQL ---------------------------------------------------------------------------


def pg_base_url() -> str | None:
    """The server URL tests may use, or None."""
    return os.environ.get(PG_ENV) or None


def with_schema(url: str, schema: str, **params: str) -> str:
    """`url` with tether's `schema=` parameter (and any other libpq `params`) set."""
    parts = urlsplit(url)
    drop = {"schema", *params}
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in drop]
    query.extend(params.items())
    query.append(("schema", schema))
    return urlunsplit(parts._replace(query=urlencode(query)))


def pg_connect(url: str) -> Any:
    """A plain autocommit psycopg connection (tether's `schema=` becomes the search_path)."""
    import psycopg
    from psycopg.rows import dict_row

    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = next((v for k, v in query if k == "schema"), None)
    rest = urlencode([(k, v) for k, v in query if k != "schema"])
    conn = psycopg.connect(
        urlunsplit(parts._replace(query=rest)), autocommit=True, row_factory=dict_row
    )
    if schema:
        conn.execute(f'SET search_path TO "{schema}"')
    return conn


def _drop_schema(base: str, schema: str) -> None:
    with pg_connect(base) as conn:
        # Backends of killed or stopped test processes may linger a moment.
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE pid <> pg_backend_pid() AND application_name = %s",
            (f"tt-{schema}",),
        )
        conn.execute("SET lock_timeout = '20s'")
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def pg_schema_url() -> Iterator[Callable[[], str]]:
    """`pg_schema_url()`: a URL to a new, unique schema; all are dropped afterwards.

    The URL also sets `application_name`, so that connections left behind by killed
    child processes can be found and ended before the drop.
    """
    base = pg_base_url()
    if base is None:
        pytest.skip(PG_SKIP_REASON)
    made: list[str] = []

    def make() -> str:
        schema = f"tt_{uuid.uuid4().hex[:16]}"
        made.append(schema)
        return with_schema(base, schema, application_name=f"tt-{schema}")

    try:
        yield make
    finally:
        for schema in made:
            _drop_schema(base, schema)


@pytest.fixture
def pg_url(pg_schema_url: Callable[[], str]) -> str:
    """A PostgreSQL URL with a schema of this test's own, dropped afterwards."""
    return pg_schema_url()


# --- backends -----------------------------------------------------------------------------


@dataclass
class Backend:
    """Where a test's database lives, and how to open more handles on it."""

    kind: str
    url: str
    path: Path | None = None
    clock: Clock = field(default_factory=FakeClock)
    _memory: Any = None

    @property
    def durable(self) -> bool:
        """True for SQLite and PostgreSQL (data survive a process)."""
        return self.kind != "memory"

    async def open(self, clock: Clock | None = None, **kwargs: Any) -> Store:
        """A new handle on the same database (the same object for `memory`)."""
        clk = clock or self.clock
        if self.kind == "memory":
            from tether.store.memory import MemoryStore

            if self._memory is None:
                self._memory = MemoryStore(clk)
            return self._memory  # type: ignore[no-any-return]
        if self.kind == "sqlite":
            from tether.store.sqlite import SQLiteStore

            assert self.path is not None
            return await SQLiteStore.open(self.path, clock=clk, **kwargs)
        from tether.store.postgres import PostgresStore

        return await PostgresStore.open(self.url, clock=clk, **kwargs)

    def raw(self) -> Any:
        """A plain DB-API connection on the same database (SQLite/PostgreSQL only)."""
        if self.kind == "sqlite":
            assert self.path is not None
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=30)
            conn.row_factory = sqlite3.Row
            return conn
        if self.kind == "postgres":
            return pg_connect(self.url)
        raise RuntimeError("the memory store has no raw connection")


def make_backend(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, clock: Clock
) -> Backend:
    """A `Backend` of `kind` for this test (skips postgres without a server)."""
    if kind == "memory":
        return Backend("memory", "memory://", clock=clock)
    if kind == "sqlite":
        path = tmp_path / "tether.db"
        return Backend("sqlite", f"sqlite:///{path}", path=path, clock=clock)
    if kind == "postgres":
        url = request.getfixturevalue("pg_url")
        return Backend("postgres", url, clock=clock)
    raise ValueError(kind)


def _backend_params(kinds: tuple[str, ...]) -> list[Any]:
    return [
        pytest.param(k, id=k, marks=[pytest.mark.postgres] if k == "postgres" else [])
        for k in kinds
    ]


@pytest.fixture
def clock() -> FakeClock:
    """The fake clock `store` is opened with."""
    return FakeClock()


@pytest.fixture(params=_backend_params(BACKENDS))
def backend(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> Backend:
    """Every backend: memory, sqlite, postgres."""
    return make_backend(request.param, tmp_path, request, clock)


@pytest.fixture(params=_backend_params(SQL_BACKENDS))
def sql_backend(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> Backend:
    """The durable backends only: sqlite, postgres."""
    return make_backend(request.param, tmp_path, request, clock)


@pytest.fixture
def backend_factory(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> Callable[[str], Backend]:
    """`backend_factory(kind)`: one more, empty database of `kind` for this test."""
    count = 0

    def make(kind: str) -> Backend:
        nonlocal count
        count += 1
        if kind == "sqlite":
            path = tmp_path / f"extra-{count}.db"
            return Backend("sqlite", f"sqlite:///{path}", path=path, clock=clock)
        if kind == "postgres":
            url = request.getfixturevalue("pg_schema_url")()
            return Backend("postgres", url, clock=clock)
        return make_backend(kind, tmp_path, request, clock)

    return make


@pytest.fixture(params=_backend_params(SQL_BACKENDS))
def cli_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A `--db` for the `tether` command: a SQLite file, or a fresh PostgreSQL schema."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path / 'tether.db'}"


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[Store]:
    """An open store on `backend`, closed afterwards."""
    s = await backend.open()
    try:
        yield s
    finally:
        await s.close()


# --- small ledgers and tasks --------------------------------------------------------------


def small_ledger(n_items: int = 3, objective: str = "Write the report") -> ledger_mod.Ledger:
    """A fresh ledger with `n_items` items over two milestones."""
    items = [(f"i{n}", f"Item {n}", "m1" if n < 2 else "m2") for n in range(1, n_items + 1)]
    return ledger_mod.from_spec(
        objective,
        items,
        acceptance=[("a1", "the report exists")],
        milestones=[("m1", "Gather"), ("m2", "Write")],
    )


@pytest.fixture
def make_ledger() -> Callable[..., ledger_mod.Ledger]:
    """`make_ledger(n_items=3)`: a fresh small ledger."""
    return small_ledger


MakeTask = Callable[..., Awaitable[TaskRecord]]


async def create_small_task(store: Store, task_id: str | None = None, **kwargs: Any) -> TaskRecord:
    """Create a queued task with a small ledger and its `task.created` event."""
    tid = task_id or f"t-{uuid.uuid4().hex[:10]}"
    led = kwargs.pop("ledger", None) or small_ledger()
    return await store.create_task(
        task_id=tid,
        name=kwargs.pop("name", "demo"),
        spec=kwargs.pop("spec", {"objective": led.skeleton.objective}),
        ledger=led,
        workspace=kwargs.pop("workspace", None),
        events=kwargs.pop(
            "events",
            [ev.TaskCreated(name="demo", objective=led.skeleton.objective, items=len(led.states))],
        ),
    )


@pytest.fixture
def add_task() -> Callable[..., Awaitable[TaskRecord]]:
    """`await add_task(store, task_id=None, **create_task_kwargs)` on any store."""
    return create_small_task


@pytest.fixture
def make_task(store: Store) -> MakeTask:
    """`await make_task(task_id=None, **create_task_kwargs)` on `store`."""

    async def make(task_id: str | None = None, **kwargs: Any) -> TaskRecord:
        return await create_small_task(store, task_id, **kwargs)

    return make


# --- CPU stress ---------------------------------------------------------------------------

STRESS_ENV = "TETHER_TEST_STRESS"


@pytest.fixture(scope="session", autouse=True)
def cpu_stress() -> Iterator[int]:
    """With `TETHER_TEST_STRESS=N`, N busy processes per CPU spin for the whole session
    (CI's stress pass: a timing-dependent test must wait on conditions, not on luck)."""
    import subprocess
    import sys

    try:
        per_cpu = int(os.environ.get(STRESS_ENV, "0") or 0)
    except ValueError:
        per_cpu = 0
    procs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(per_cpu * (os.cpu_count() or 1))
    ]
    try:
        yield len(procs)
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database URL for the CLI: a new SQLite file, or a new PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tether.db'}"
    make: Callable[[], str] = request.getfixturevalue("pg_schema_url")
    return make()
