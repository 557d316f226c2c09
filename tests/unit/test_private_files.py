"""`Workspace(root, private=...)` keeps the store's own database out of every file tool,
by any name (`database_files` gives the file and its SQLite companions)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tether import errors
from tether.tools.files import Workspace, database_files


def test_database_files_names_the_file_and_its_companions(tmp_path: Path) -> None:
    real = tmp_path / "data" / "t.db"
    real.parent.mkdir()
    real.write_bytes(b"")
    (tmp_path / "alias.db").symlink_to(real)
    got = database_files(str(tmp_path / "alias.db"))
    for suffix in ("", "-wal", "-shm", "-journal"):
        assert Path(f"{real}{suffix}") in got
        if suffix:  # SQLite may name a companion after either name
            assert Path(f"{tmp_path / 'alias.db'}{suffix}") in got
    assert database_files(None) == database_files(":memory:") == frozenset()


def test_private_files_are_refused_by_every_name(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    db.write_bytes(b"SQLite format 3\x00")
    os.link(db, tmp_path / "copy.db")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "ln").symlink_to(db)
    ws = Workspace(tmp_path, database_files(str(db)))
    for name in ("state.db", "sub/../state.db", "copy.db", "sub/ln", str(db), "state.db-wal"):
        with pytest.raises(errors.ToolFailed, match="tether's own database"):
            ws.read_file(name)
        with pytest.raises(errors.ToolFailed, match="tether's own database"):
            ws.write_file(name, "x")
    assert ws.existing_file("state.db") is None
    assert ws.list_files(".").splitlines() == ["sub/"]
    assert db.read_bytes() == b"SQLite format 3\x00"
    # Without the list (no SQLite store, or one kept elsewhere) the file is a file.
    assert "SQLite" in Workspace(tmp_path).read_file("state.db")
