"""Named tokens files (`tether serve --tokens-file`, `TETHER_TOKENS`) and who a token is."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette", reason="the dashboard needs the web extra")

from tether import errors
from tether.web.security import Access, Caller, Refused, parse_tokens

A = "abcdefghij#klmnopq"  # a `#` inside a token is part of it
B = "0123456789abcdefgh"


def test_lines_comments_and_spaces() -> None:
    text = f"# the team\n\nalice:{A}   # on call\n  bob : {B}\n#carol:{B}x\n"
    assert parse_tokens(text, "f") == {"alice": A, "bob": B}
    assert parse_tokens(f"alice:{A}, bob:{B}", "TETHER_TOKENS", lines=False) == {
        "alice": A,
        "bob": B,
    }


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("alice:short", "at least 16"),
        (f"al ice:{A}", "name:token"),
        (f":{A}", "name:token"),
        (f"alice:{A} extra", "without spaces"),
    ],
)
def test_a_bad_entry_names_its_line_and_never_the_token(text: str, needle: str) -> None:
    with pytest.raises(errors.UserError, match=needle) as exc:
        parse_tokens(f"# first\n{text}\n", "tokens.txt")
    assert "tokens.txt, line 2" in str(exc.value)
    assert text.partition(":")[2] not in str(exc.value)  # the token is never shown


def test_who_holds_a_token() -> None:
    access = Access(None, named={"alice": A, "bob": B})
    assert access.who(A) == Caller("alice") and access.who(B) == Caller("bob")
    assert access.who(A[:-1]) is None and access.who("") is None and access.who(None) is None
    assert access.csrf_of(A) != access.csrf_of(B)
    shared = Access(B)
    assert shared.who(B) == Caller(None) and shared.csrf == shared.csrf_of(B)
    assert Caller(None).by() == "web" and Caller(None).by("carol") == "carol"
    assert Caller("alice").by() == "alice" and Caller("alice").by("alice") == "alice"
    with pytest.raises(Refused, match="signed in as 'alice'"):
        Caller("alice").by("bob")
