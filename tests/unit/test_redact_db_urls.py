"""A database URL shows its role name and masks only a password that is there; other
URLs keep masking their whole userinfo (a user alone may be a token)."""

from __future__ import annotations

import pytest

from tether.redact import Redactor, redact


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


@pytest.mark.parametrize(
    "text",
    [
        "PROXY-AUTHORIZATION: Basic dXNlcjpwYXNzd29yZA==",
        "Authorization: token abcdefgh12345678",
        "sent with BEARER abcdefgh12345678",
        "Bearer abcdefgh12345678",
        "HTTPS://TOKENVALUE@example.org/r",
    ],
)
def test_a_document_holding_a_credential_in_any_case_is_not_clean(text: str) -> None:
    # `clean` lets a document skip the walk: it must never pass one `redact` would mask.
    assert redact(text, ()) != text
    assert not Redactor(()).clean(text)
    assert Redactor(()).data({"error": text}) == {"error": redact(text, ())}


def test_a_document_with_nothing_to_mask_is_clean() -> None:
    r = Redactor(("s3cr3t-value",))
    assert r.clean('{"content": "step 3 done. plain words"}')
    assert not r.clean('{"content": "the key is s3cr3t-value"}')
