"""Finding a ledger's item names in a summary without one regex of all of them.

A summary may name an item by its id or its (distinctive) title. The names were one
alternation regex (`(?<![\\w/.\\\\-])(?:name|name|...)(?![\\w/\\\\-]|\\.\\w)`), whose
compile time and matching time both grow with the number of items: at 2,000 items the
first summary read held the event loop for ~0.7 s and every later one for ~50 ms, and
every run of every worker paid that at its first compaction. This index finds the same
matches with dictionary lookups in a tree of the names' words: a name can only start
where the regex could have tried one (no word, path or dotted-name character before
it); a word that more words follow is a whole run of non-space characters; a last word
is a prefix of one that ends where a name may end. `tests/unit/test_claim_name_index.py`
holds the regex as the reference and compares the two.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

#: Where a name may start: a non-space character with no word, path or dotted-name
#: character before it (NAME_START).
_STARTS = re.compile(r"(?<![\w/.\\-])\S")
_TOKEN_END = re.compile(r"\s|$")


def _word_char(ch: str) -> bool:
    """`\\w` for one character (Python's `re` takes the same definition)."""
    return ch.isalnum() or ch == "_"


def _may_end(text: str, pos: int) -> bool:
    """NAME_END: no word or path character right after `pos`, nor a dot and a word
    character ("out/i1.txt" does not mention i1)."""
    if pos >= len(text):
        return True
    ch = text[pos]
    if _word_char(ch) or ch in "/\\-":
        return False
    return not (ch == "." and pos + 1 < len(text) and _word_char(text[pos + 1]))


class _Node:
    """Names by their words: `ends` holds the names whose last word comes here (by that
    word: its rank and the name), `next` the longer names by their next word."""

    __slots__ = ("ends", "next")

    def __init__(self) -> None:
        self.ends: dict[str, tuple[int, str]] = {}
        self.next: dict[str, _Node] = {}


class NameIndex:
    """Every name of a ledger (lower case, words split by single spaces), found in a
    lower-cased text as the alternation regex found them: scanning left to right, at
    each position the first name in `names`' order that matches there (the caller puts
    the longest first), words separated by any run of white space, a name's last word
    followed by no word or path character, and the search going on after the match."""

    def __init__(self, names: Iterable[str]) -> None:
        self._root = _Node()
        #: The first characters of the names: a position whose character is none of
        #: them starts no name (most words of a summary are ruled out so).
        self._firsts: set[str] = set()
        for rank, name in enumerate(names):
            self._firsts.add(name[:1])
            *head, last = name.split(" ")
            node = self._root
            for word in head:
                node = node.next.setdefault(word, _Node())
            node.ends.setdefault(last, (rank, name))  # the first rank wins, as in the regex

    def __bool__(self) -> bool:
        return bool(self._root.ends or self._root.next)

    def finditer(self, text: str) -> Iterator[tuple[int, int, str]]:
        """`(start, end, name)` of every mention in `text`, left to right."""
        done = 0
        firsts = self._firsts
        for start in _STARTS.finditer(text):
            pos = start.start()
            if pos < done or text[pos] not in firsts:
                continue
            found = self._match_at(text, pos)
            if found is not None:
                yield pos, found[0], found[1]
                done = found[0]

    def _match_at(self, text: str, pos: int) -> tuple[int, str] | None:
        """The end and name of the first-ranked name that matches at `pos`."""
        best: tuple[int, int, str] | None = None  # (rank, end, name)
        node = self._root
        at = pos
        while True:
            stop = _TOKEN_END.search(text, at).start()  # type: ignore[union-attr]
            if node.ends:
                # The last word: any prefix of this run of non-space characters that
                # a name could end at.
                for k in range(at + 1, stop + 1):
                    if k < stop and not _may_end(text, k):
                        continue
                    hit = node.ends.get(text[at:k])
                    if hit is not None and (best is None or hit[0] < best[0]):
                        best = (hit[0], k, hit[1])
            # A word that more words follow is the whole run, then white space.
            child = node.next.get(text[at:stop]) if node.next else None
            if child is None or stop >= len(text):
                break
            at = stop
            while at < len(text) and text[at].isspace():
                at += 1
            if at >= len(text):
                break
            node = child
        return None if best is None else (best[1], best[2])
