"""The claim reader's name index finds exactly what the alternation regex it replaced found.

The reference is the regex the reader used before (`NAME_START`, the names longest first
with `\\s+` between their words, `NAME_END`), kept here; hypothesis draws names and texts
from a small alphabet of letters, digits, separators and path characters, so names
overlap, share words and prefixes, and stand next to every kind of boundary.
"""

from __future__ import annotations

import re

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tether import ledger as L
from tether.runtime.round.claims import completion_claims
from tether.runtime.round.claims.name_index import NameIndex
from tether.runtime.round.claims.names import item_names, mentions_in
from tether.runtime.round.claims.words import NAME_END, NAME_START


def _reference(names: list[str], text: str) -> list[tuple[int, int, str]]:
    body = "|".join(r"\s+".join(re.escape(w) for w in name.split(" ")) for name in names)
    pattern = re.compile(f"{NAME_START}(?:{body}){NAME_END}")
    return [(m.start(), m.end(), " ".join(m.group(0).split())) for m in pattern.finditer(text)]


_WORD = st.text(alphabet="abi1-2._/:é\\", min_size=1, max_size=4)
_NAME = st.lists(_WORD, min_size=1, max_size=3).map(" ".join)
_GAP = st.sampled_from(
    [" ", "  ", "\n", "\t ", "\u00a0", "\u2003", ", ", ". ", ":", "(", ")", "/", "-", ".", ""]
)


@st.composite
def _case(draw: st.DrawFn) -> tuple[list[str], str]:
    names = draw(st.lists(_NAME, min_size=1, max_size=6, unique=True))
    pieces = draw(st.lists(st.one_of(st.sampled_from(names), _WORD, _GAP), min_size=0, max_size=14))
    ordered = sorted(names, key=len, reverse=True)
    return ordered, "".join(pieces)


@settings(max_examples=1500, deadline=None)
@given(_case())
@example((["i1", "i1 done"], "i1  done."))
@example((["shelf-1", "shelf-10"], "shelf-10, shelf-1.txt shelf-1."))
@example((["a b", "a"], "a\tb a-b a"))
def test_the_index_finds_what_the_regex_found(case: tuple[list[str], str]) -> None:
    names, text = case
    assert list(NameIndex(names).finditer(text)) == _reference(names, text)


def test_a_large_checklist_reuses_its_names() -> None:
    """2,000 items whose titles share their first words: the names are built once per
    skeleton, and a second read of a summary finds the same items by id and by title."""
    items = [(f"shelf-{k}", f"Catalogue shelf {k} of the east wing", None) for k in range(2000)]
    led = L.from_spec("Catalogue every shelf of the archive", items)
    summary = "Catalogued shelf-1 and shelf-2; shelf-3 is pending.\n" * 5
    first = completion_claims(summary, led)
    assert item_names(led) is item_names(led)
    again = completion_claims(summary, led)
    assert again == first
    assert first.items == ("shelf-1", "shelf-2")
    names = item_names(led)
    found = [m.item for m in mentions_in("catalogue shelf 7 of the east wing, shelf-9", names)]
    assert found == ["shelf-7", "shelf-9"]
