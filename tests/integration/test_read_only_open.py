"""Read paths never write: `open_store(url, read_only=True)` migrates nothing and takes
no write lock, and an open whose schema is current takes none either."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import create_small_task, pg_connect
from tether import errors
from tether.store import open_store


async def test_sqlite_opens_while_another_process_holds_the_write_lock(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    url = f"sqlite:///{path}?busy_timeout=1"
    store = await open_store(url)
    try:
        await create_small_task(store, "t1")
    finally:
        await store.close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        for read_only in (True, False):
            store = await open_store(url, read_only=read_only)
            try:
                assert [t.task_id for t in await store.list_tasks()] == ["t1"]
            finally:
                await store.close()
        # A write still waits only the busy timeout, then names the cause.
        store = await open_store(url)
        try:
            with pytest.raises(errors.StoreBusy, match="another process holds the write lock"):
                await create_small_task(store, "t2")
        finally:
            await store.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()


async def test_sqlite_read_only_refuses_an_unmigrated_file_and_leaves_it(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    sqlite3.connect(path).close()  # an empty file: no tether tables yet
    with pytest.raises(errors.SchemaOutdated, match="only reads"):
        await open_store(f"sqlite:///{path}", read_only=True)
    assert path.stat().st_size == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db"]
    with pytest.raises(errors.StoreConfigError, match="no tether database"):
        await open_store(f"sqlite:///{tmp_path / 'missing.db'}", read_only=True)
    assert not (tmp_path / "missing.db").exists()


@pytest.mark.parametrize("value", ["0", "-1", "nan", "x", "1e9"])
async def test_sqlite_busy_timeout_must_be_a_sane_number(tmp_path: Path, value: str) -> None:
    with pytest.raises(errors.StoreConfigError, match="busy_timeout"):
        await open_store(f"sqlite:///{tmp_path / 't.db'}?busy_timeout={value}")
    assert not (tmp_path / "t.db").exists()


@pytest.mark.postgres
async def test_postgres_read_only_creates_and_migrates_nothing(
    pg_schema_url: Callable[[], str],
) -> None:
    url = pg_schema_url()
    schema = url.rsplit("schema=", 1)[1]
    with pytest.raises(errors.SchemaOutdated, match="only reads"):
        await open_store(url, read_only=True)
    with pg_connect(url) as conn:
        found = conn.execute(
            "SELECT count(*) AS n FROM information_schema.schemata WHERE schema_name = %s",
            (schema,),
        ).fetchone()
    assert found["n"] == 0
    store = await open_store(url)
    try:
        await create_small_task(store, "t1")
    finally:
        await store.close()
    store = await open_store(url, read_only=True)
    try:
        assert [t.task_id for t in await store.list_tasks()] == ["t1"]
    finally:
        await store.close()


@pytest.mark.postgres
async def test_postgres_sessions_get_lock_and_idle_timeouts(pg_url: str) -> None:
    store = await open_store(pg_url)
    try:
        rows = await store._run(_settings, store)  # type: ignore[attr-defined]
    finally:
        await store.close()
    assert rows == {"lock_timeout": "5s", "idle_in_transaction_session_timeout": "10s"}


def _settings(store: object) -> dict[str, str]:
    with store._translated() as conn:  # type: ignore[attr-defined]
        row = conn.execute(
            "SELECT current_setting('lock_timeout') AS a,"
            " current_setting('idle_in_transaction_session_timeout') AS b"
        ).fetchone()
    return {"lock_timeout": row["a"], "idle_in_transaction_session_timeout": row["b"]}
