"""`tether migrate`, `--no-migrate` and the compatibility policy, on SQLite and PostgreSQL.

An old-schema scenario is simulated by the version constants: the database is migrated
by this tether, then the code is made to say it knows one schema less (N-1). Whether that
older worker runs beside the newer database is what the policy recorded with each
migration says: refused with a clear message when migration N is not additive, running
its task (and migrating nothing) when it is.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from typer.testing import CliRunner, Result

from tests.support.cli import cli_env, describe, tether_many, write_spec
from tether.cli import app
from tether.store import SCHEMA_VERSION, schema_policy

if TYPE_CHECKING:
    from conftest import Backend

N = SCHEMA_VERSION
MODEL = "scripted:tests.e2e.policies:done_policy"


def cli(*args: str | Path, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args], env=env, catch_exceptions=False)


def versions(backend: Backend) -> list[tuple[int, int | None]]:
    conn = backend.raw()
    try:
        rows = conn.execute(
            "SELECT version, compatible_from FROM tether_schema ORDER BY version"
        ).fetchall()
        return [(int(r["version"]), r["compatible_from"]) for r in rows]
    finally:
        conn.close()


def migrate_to(backend: Backend, version: int) -> None:
    """Bring the database to `version` (this tether's migrations up to it)."""

    async def main() -> None:
        store = await backend.open(migrate_to=version)
        await store.close()

    asyncio.run(main())


def submit(backend: Backend, tmp_path: Path) -> str:
    spec = write_spec(tmp_path / "spec.yaml", 1)
    (tmp_path / "ws").mkdir()
    done = cli("submit", spec, "--workspace", tmp_path / "ws", "--db", backend.url, "--json")
    assert done.exit_code == 0, done.output
    return str(json.loads(done.stdout)["task_id"])


def status(backend: Backend, task_id: str) -> str:
    shown = cli("status", task_id, "--db", backend.url, "--json")
    assert shown.exit_code == 0, shown.output
    return str(json.loads(shown.stdout)["status"])


def test_every_migration_declares_its_oldest_compatible_code() -> None:
    assert sorted(schema_policy.COMPATIBLE_FROM) == list(range(1, N + 1))
    for version, oldest in schema_policy.COMPATIBLE_FROM.items():
        assert 1 <= oldest <= version
    for own in schema_policy.COMPATIBLE_FROM_BY_DIALECT.values():
        for version, oldest in own.items():
            assert version in schema_policy.COMPATIBLE_FROM and 1 <= oldest <= version


def test_each_dialect_records_what_its_own_migrations_declare(sql_backend: Backend) -> None:
    migrate_to(sql_backend, N)
    dialect = "postgres" if sql_backend.kind == "postgres" else "sqlite"
    assert versions(sql_backend) == [
        (v, schema_policy.compatible_from(v, dialect)) for v in range(1, N + 1)
    ]
    # Schema 9 reshapes SQLite's events and changes nothing on PostgreSQL: a rolling
    # upgrade of PostgreSQL workers from schema 8 goes on, SQLite's 8 is refused.
    assert dict(versions(sql_backend))[9] == (8 if dialect == "postgres" else 9)
    # Schema 10 stores PostgreSQL's events compacted (SQLite's were already): code of
    # 9 would read them short on PostgreSQL, and goes on beside it on SQLite.
    assert dict(versions(sql_backend))[10] == (10 if dialect == "postgres" else 9)
    # Schema 11 writes PostgreSQL's events a row per commit (`events` a view older code
    # cannot write) and changes nothing on SQLite: code of 9 goes on there.
    assert dict(versions(sql_backend))[11] == (11 if dialect == "postgres" else 9)


def test_migrate_check_no_migrate_and_apply(sql_backend: Backend) -> None:
    migrate_to(sql_backend, N - 1)
    db = ("--db", sql_backend.url)

    check = cli("migrate", "--check", *db)
    assert check.exit_code == 1, check.output
    assert f"schema {N - 1}: 1 migration(s) pending" in check.stdout
    as_json = cli("migrate", "--check", "--json", *db)
    assert as_json.exit_code == 1, as_json.output
    assert json.loads(as_json.stdout) == {
        "state": "pending",
        "found": N - 1,
        "code": N,
        "pending": 1,
        "reached": N - 1,
    }

    for refused in (
        cli("worker", "--once", "--no-migrate", *db),
        cli("worker", "--once", *db, env={"TETHER_NO_MIGRATE": "1"}),
        cli("serve", "--no-migrate", "--port", "0", *db),
    ):
        assert refused.exit_code == 2, refused.output
        assert f"is at schema {N - 1}" in refused.stderr
        assert "run `tether migrate`" in refused.stderr and "Traceback" not in refused.output
    assert [v for v, _ in versions(sql_backend)] == list(range(1, N))

    applied = cli("migrate", *db)
    assert applied.exit_code == 0, applied.output
    assert applied.stdout.strip() == f"migrated from schema {N - 1} to {N}"
    dialect = "postgres" if sql_backend.kind == "postgres" else "sqlite"
    assert versions(sql_backend)[-1] == (N, schema_policy.compatible_from(N, dialect))
    again = cli("migrate", "--check", *db)
    assert (again.exit_code, again.stdout.strip()) == (
        0,
        f"schema {N}: current; nothing to migrate",
    )
    current = cli("migrate", "--json", *db)
    assert current.exit_code == 0, current.output
    assert json.loads(current.stdout) == {
        "state": "current",
        "found": N,
        "code": N,
        "pending": 0,
        "reached": N,
    }
    ran = cli("worker", "--once", "--no-migrate", *db)
    assert ran.exit_code == 0, ran.output


def test_migrate_check_creates_no_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    check = cli("migrate", "--check", "--db", url)
    assert check.exit_code == 1 and f"{N} migration(s) pending" in check.stdout
    assert list(tmp_path.iterdir()) == []
    applied = cli("migrate", "--json", "--db", url)
    assert applied.exit_code == 0, applied.output
    assert json.loads(applied.stdout) == {
        "state": "migrated",
        "found": 0,
        "code": N,
        "pending": 0,
        "reached": N,
    }
    (tmp_path / "new.db").unlink()
    for extra in tmp_path.iterdir():
        extra.unlink()
    assert cli("worker", "--once", "--no-migrate", "--db", url).exit_code == 2
    assert list(tmp_path.iterdir()) == []


def test_an_older_worker_is_refused_by_a_migration_it_cannot_run_on(
    sql_backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Migration N declares no older code compatible (on every dialect, for this test).
    monkeypatch.setattr(schema_policy, "COMPATIBLE_FROM_BY_DIALECT", {})
    task_id = submit(sql_backend, tmp_path)
    before = versions(sql_backend)
    assert before[-1] == (N, N)

    monkeypatch.setattr("tether.store.base.SCHEMA_VERSION", N - 1)  # the code of N-1
    for refused in (
        cli("worker", "--once", "--model", MODEL, "--db", sql_backend.url),
        cli("migrate", "--check", "--db", sql_backend.url),
        cli("status", task_id, "--db", sql_backend.url),
    ):
        assert refused.exit_code == 2, refused.output
        text = " ".join(refused.stderr.split())
        assert f"schema is version {N}" in text and f"up to version {N - 1}" in text
        assert "old worker beside a newer database" in text and "upgrade tether" in text
    assert versions(sql_backend) == before
    monkeypatch.undo()
    assert status(sql_backend, task_id) == "queued"


def test_an_older_worker_runs_beside_an_additive_migration(
    sql_backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Migration N, had it been additive, would declare code of N-1 compatible.
    additive = {**schema_policy.COMPATIBLE_FROM, N: N - 1}
    monkeypatch.setattr(schema_policy, "COMPATIBLE_FROM", additive)
    monkeypatch.setattr(schema_policy, "COMPATIBLE_FROM_BY_DIALECT", {})  # on every dialect
    task_id = submit(sql_backend, tmp_path)
    before = versions(sql_backend)
    assert before[-1] == (N, N - 1)

    monkeypatch.setattr("tether.store.base.SCHEMA_VERSION", N - 1)  # the code of N-1
    check = cli("migrate", "--check", "--db", sql_backend.url)
    assert check.exit_code == 0, check.output
    assert "newer than this tether's" in check.stdout and "compatible" in check.stdout
    ran = cli("worker", "--once", "--no-migrate", "--model", MODEL, "--db", sql_backend.url)
    assert ran.exit_code == 0, ran.output
    assert status(sql_backend, task_id) == "satisfied"
    assert versions(sql_backend) == before  # nothing migrated down, nothing refused

    # One migration above it that is not additive, and the older worker is refused.
    conn = sql_backend.raw()
    try:
        conn.execute(
            "INSERT INTO tether_schema (version, name, applied_at, compatible_from)"
            f" VALUES ({N + 1}, 'future', 0, {N + 1})"
        )
        if sql_backend.kind == "postgres":
            conn.commit()
    finally:
        conn.close()
    refused = cli("worker", "--once", "--db", sql_backend.url)
    assert refused.exit_code == 2 and f"schema {N + 1} or later" in " ".join(
        refused.stderr.split()
    ), refused.output


def test_a_database_from_before_the_policy_gets_its_column(sql_backend: Backend) -> None:
    migrate_to(sql_backend, N - 1)
    conn = sql_backend.raw()
    try:
        conn.execute("ALTER TABLE tether_schema DROP COLUMN compatible_from")
        if sql_backend.kind == "postgres":
            conn.commit()
    finally:
        conn.close()
    migrate_to(sql_backend, N)
    dialect = "postgres" if sql_backend.kind == "postgres" else "sqlite"
    last = (N, schema_policy.compatible_from(N, dialect))
    assert versions(sql_backend) == [*((v, None) for v in range(1, N)), last]


def test_two_processes_migrating_at_once_apply_each_migration_once(
    sql_backend: Backend, tmp_path: Path
) -> None:
    calls = [(("migrate", "--db", sql_backend.url), tmp_path)] * 3
    procs = tether_many(calls, env=cli_env())
    for proc in procs:
        assert proc.returncode == 0, describe(proc)
    outs = sorted(p.stdout.strip() for p in procs)
    assert outs.count(f"migrated from schema 0 to {N}") >= 1, outs
    assert [v for v, _ in versions(sql_backend)] == list(range(1, N + 1))
