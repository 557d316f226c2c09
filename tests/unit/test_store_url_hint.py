"""A database URL that is a bare file path (`--db tether.db`) is refused with the URL
that was likely meant; other unknown URLs say what is expected."""

from __future__ import annotations

from pathlib import Path

import pytest

from tether import errors, open_store


async def test_a_bare_database_file_gets_its_url_named(tmp_path: Path) -> None:
    with pytest.raises(errors.StoreConfigError) as info:
        await open_store(str(tmp_path / "tether.db"))
    assert f"(a file: sqlite:///{tmp_path / 'tether.db'})" in str(info.value)
    existing = tmp_path / "data"
    existing.write_text("")
    with pytest.raises(errors.StoreConfigError) as info:
        await open_store(str(existing))
    assert f"sqlite:///{existing}" in str(info.value)
    assert not (tmp_path / "tether.db").exists()  # refused: nothing was made


@pytest.mark.parametrize(
    "url", ["foo", "mysql://h/db", "a\nb.db", "a" * 5000, "~nobody_x/t.db", "a\x00b"]
)
async def test_other_unknown_urls_say_what_is_expected(url: str) -> None:
    with pytest.raises(errors.StoreConfigError) as info:
        await open_store(url)
    text = str(info.value)
    assert "expected sqlite:///path, postgresql://... or memory://" in text
    assert "(a file:" not in text


@pytest.mark.parametrize("scheme", ["sqlite", "SQLite", "sqlite3"])
async def test_a_sqlite_url_without_slashes_gets_the_file_named(
    tmp_path: Path, scheme: str
) -> None:
    """`sqlite:tether.db` means the file tether.db, not a file named 'sqlite:tether.db'."""
    with pytest.raises(errors.StoreConfigError) as info:
        await open_store(f"{scheme}:{tmp_path / 'tether.db'}")
    assert f"(a file: sqlite:///{tmp_path / 'tether.db'})" in str(info.value)
    assert not list(tmp_path.iterdir())  # refused: nothing was made


def test_sqlite_open_errors_say_what_to_do(tmp_path: Path) -> None:
    """A file SQLite cannot open (a folder one may not write to: WAL needs its -wal and
    -shm files beside the database) or a read-only one: the message names the folder
    and the way out, not SQLite's words alone."""
    import sqlite3

    from tether.store.sqlite import _translate

    db = str(tmp_path / "ro" / "tether.db")
    opened = _translate(sqlite3.OperationalError("unable to open database file"), db)
    assert isinstance(opened, errors.StoreConfigError)
    text = str(opened)
    assert db in text and str(tmp_path / "ro") in text and "tether.db-wal" in text
    assert "point --db at another file" in text
    readonly = str(_translate(sqlite3.OperationalError("attempt to write a readonly database"), db))
    assert "read-only" in readonly and "point --db at another file" in readonly
