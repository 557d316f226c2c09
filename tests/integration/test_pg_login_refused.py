"""A PostgreSQL URL the server refuses (no such database or role) is the user's mistake:
a clear error and exit 2, not "infrastructure unavailable" (exit 4), which tells an
operator to wait for a server that is already there."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.conftest import PG_SKIP_REASON, pg_base_url
from tests.support.cli import tether
from tether import errors
from tether.store.postgres import PostgresStore

pytestmark = pytest.mark.postgres


def _url(*, database: str | None = None, user: str | None = None) -> str:
    base = pg_base_url()
    if base is None:
        pytest.skip(PG_SKIP_REASON)
    parts = urlsplit(base)
    netloc = parts.netloc
    if user is not None:
        netloc = f"{user}@{netloc.rpartition('@')[2]}"
    path = f"/{database}" if database is not None else parts.path
    return urlunsplit(parts._replace(netloc=netloc, path=path))


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"database": "tether_no_such_db"}, 'database "tether_no_such_db" does not exist'),
        ({"user": "tether_no_such_role"}, 'role "tether_no_such_role" does not exist'),
    ],
    ids=["database", "role"],
)
async def test_a_refused_login_is_a_configuration_error(kwargs: dict[str, str], words: str) -> None:
    with pytest.raises(errors.StoreConfigError, match=words):
        await PostgresStore.open(_url(**kwargs))


def test_the_cli_says_so_with_exit_2(tmp_path: Path) -> None:
    proc = tether("list", "--db", _url(database="tether_no_such_db"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "does not exist" in proc.stderr and "Traceback" not in proc.stderr


async def test_a_server_that_is_away_is_still_unavailable() -> None:
    base = pg_base_url()
    if base is None:
        pytest.skip(PG_SKIP_REASON)
    parts = urlsplit(base)
    host = parts.netloc.rpartition("@")[2].rpartition(":")[0] or "127.0.0.1"
    away = urlunsplit(parts._replace(netloc=f"{host}:1"))  # nothing listens on port 1
    with pytest.raises(errors.StoreUnavailable) as raised:
        await PostgresStore.open(away, connect_timeout=2)
    assert not isinstance(raised.value, errors.UserError)
