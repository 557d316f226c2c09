"""A database URL shows its role name and masks only a password that is there; other
URLs keep masking their whole userinfo (a user alone may be a token)."""

from __future__ import annotations

import pytest

from tether.redact import redact


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://postgres@127.0.0.1:5432/test", "postgresql://postgres@127.0.0.1:5432/test"),
        ("postgresql://app:s3cr3t-pw@db:5432/x", "postgresql://app:***@db:5432/x"),
        ("postgres://:s3cr3t-pw@db/x", "postgres://:***@db/x"),
        ("https://ghp_TOKENVALUE@example.org/r", "https://***@example.org/r"),
        ("http://user:key-value@127.0.0.1/x", "http://***@127.0.0.1/x"),
        ("http://:key-value@127.0.0.1/x", "http://***@127.0.0.1/x"),
    ],
)
def test_userinfo_masking(url: str, shown: str) -> None:
    assert redact(f"cannot reach {url} now", ()) == f"cannot reach {shown} now"
