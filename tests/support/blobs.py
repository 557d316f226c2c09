"""Losing a stored artifact's content behind tether's back (a restore that missed
blobs, a hand edit): what recovery and `tether verify` must notice."""

from __future__ import annotations

import sqlite3

from tests.conftest import pg_connect


def delete_blob(db: str, artifact_id: str) -> None:
    """Delete an artifact's content from tether's store (`db`: a SQLite or PostgreSQL
    URL), behind its back."""
    if db.startswith("sqlite:///"):
        conn = sqlite3.connect(db.removeprefix("sqlite:///"))
        try:
            (blob,) = conn.execute(
                "SELECT blob_hash FROM artifacts WHERE artifact_id = ?", (artifact_id,)
            ).fetchone()
            assert conn.execute("DELETE FROM blobs WHERE hash = ?", (blob,)).rowcount == 1
            conn.commit()
        finally:
            conn.close()
        return
    with pg_connect(db) as conn:
        row = conn.execute(
            "SELECT blob_hash FROM artifacts WHERE artifact_id = %s", (artifact_id,)
        ).fetchone()
        assert conn.execute("DELETE FROM blobs WHERE hash = %s", (row["blob_hash"],)).rowcount == 1
