"""What a summary may call a ledger's items: their ids and titles, their numbers ("items
3-7"), ranges of them ("cat-1 to cat-8", "doc-04 onwards"), and the task's own
done-words and nouns taken from its titles and objective.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from tether._by_object import keep
from tether.ledger import Ledger
from tether.runtime.round.claims.name_index import NameIndex
from tether.runtime.round.claims.words import (
    DONE_G,
    NOUNS,
    global_claim_patterns,
    phrase_pattern,
    wordset,
)


@dataclass(frozen=True)
class Names:
    """What a summary may name of one ledger: an index of every item id and
    (distinctive) title and who each names; the items in order (for ranges); and the
    status vocabulary with the task's own words (its titles' verbs as done-words,
    "catalogued" for "catalogue shelf 3", and its nouns)."""

    index: NameIndex | None
    lookup: dict[str, str]
    order: tuple[str, ...] = ()
    #: Item by the number a summary may call it ("items 3-7", "shelves 1 to 8").
    numbered: dict[int, str] = field(default_factory=dict)
    #: Nouns a numbered range may use ("items", "shelves").
    range_nouns: str = r"items?|entries|steps?|parts?|tasks?"
    phrase: re.Pattern[str] = field(default_factory=phrase_pattern)
    global_patterns: tuple[tuple[re.Pattern[str], str], ...] = field(
        default_factory=global_claim_patterns
    )


#: Participles of the verbs a title may start with, where adding "ed" does not make one.
_IRREGULAR = {
    "write": "written|wrote",
    "build": "built",
    "make": "made",
    "send": "sent",
    "draw": "drawn|drew",
    "find": "found",
    "take": "taken|took",
    "give": "given|gave",
    "buy": "bought",
    "sell": "sold",
    "pay": "paid",
    "teach": "taught",
    "bring": "brought",
    "catch": "caught",
    "seek": "sought",
    "hold": "held",
    "tell": "told",
    "ship": "shipped",
    "plan": "planned",
    "map": "mapped",
    "tag": "tagged",
    "scan": "scanned",
    "log": "logged",
}
#: Verbs whose participle says nothing about an item being finished ("read big.txt").
_NOT_DONE_VERBS = wordset("read run get set put do try check verify test start open see look")
_STOP = wordset(
    "the and for with from into that this each every all its their about over under per "
    "via out new one two any some of to in on at by an a or as is are be it them than"
)
_NUMBER_WORDS = {
    w: n
    for n, w in enumerate(
        ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
    )
}


def _participles(verb: str) -> list[str]:
    if verb in _IRREGULAR:
        return _IRREGULAR[verb].split("|")
    if verb.endswith("e"):
        return [verb + "d"]
    if verb.endswith("y") and verb[-2:-1] not in ("a", "e", "i", "o", "u"):
        return [verb[:-1] + "ied"]
    return [verb + "ed"]


def _plural(noun: str) -> str:
    if noun.endswith("f"):
        return noun[:-1] + "ves"
    if noun.endswith("y") and noun[-2:-1] not in ("a", "e", "i", "o", "u"):
        return noun[:-1] + "ies"
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    return noun + "s"


def _alt(words: set[str]) -> str:
    return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))


def _trailing_number(text: str) -> int | None:
    found = re.search(r"(\d+)\s*$", text)
    return int(found.group(1)) if found else None


def _numbered(ids: list[str], titles: list[str]) -> dict[int, str]:
    """Item by number: the number its id ends with, else its title's, else its place."""
    for source in (ids, titles):
        nums = [_trailing_number(t) for t in source]
        if all(n is not None for n in nums) and len(set(nums)) == len(nums):
            return {n: i for n, i in zip(nums, ids, strict=True) if n is not None}
    return {k: i for k, i in enumerate(ids, start=1)}


@functools.lru_cache(maxsize=64)
def _vocabulary(objective: str, titles: tuple[str, ...]) -> tuple[str, str, str, str]:
    """`(done-words, item nouns, whole-task nouns, range nouns)` of a task, each an
    alternation ("" when it has none) from its titles and objective."""
    verbs: set[str] = set()
    nouns: set[str] = set()
    for title in titles:
        words = re.findall(r"[a-z]+(?:-[a-z]+)*", title.lower())
        raw = title.lower().split()
        first = words[0] if raw and words and raw[0] == words[0] else ""
        if len(first) >= 3 and first not in _STOP and first not in _NOT_DONE_VERBS:
            verbs.update(_participles(first))
        for w in raw[1:]:
            if re.fullmatch(r"[a-z]{3,}", w) and w not in _STOP:
                nouns.update((w, _plural(w)))
    nouns -= verbs
    subjects = {
        w
        for w in re.findall(r"[a-z]+", objective.lower())
        if len(w) >= 4 and w not in _STOP and not w.endswith("ly")
    }
    subjects -= verbs
    return _alt(verbs), _alt(nouns), _alt(subjects), _alt(nouns)


#: Names by live skeleton (by id: a run's ledgers share theirs until its goal changes),
#: so a summary read does not rebuild them.
_BY_SKELETON: dict[int, Names] = {}


def item_names(ledger: Ledger) -> Names:
    """What a summary may call the items of `ledger` (built once per skeleton)."""
    hit = _BY_SKELETON.get(id(ledger.skeleton))
    if hit is not None:
        return hit
    return keep(_BY_SKELETON, ledger.skeleton, _build_names(ledger))


def _build_names(ledger: Ledger) -> Names:
    lookup: dict[str, str] = {}
    ids: list[str] = []
    titles: list[str] = []
    for d, _ in ledger.items():
        ids.append(d.id)
        titles.append(d.title)
        if key := " ".join(d.id.lower().split()):
            lookup.setdefault(key, d.id)
        title = " ".join(d.title.lower().split())
        if len(title.split()) >= 2 or len(title) >= 12:
            lookup.setdefault(title, d.id)
    if not lookup:
        return Names(None, lookup)
    verbs, nouns, subjects, range_nouns = _vocabulary(ledger.skeleton.objective, tuple(titles))
    return Names(
        NameIndex(sorted(lookup, key=len, reverse=True)),  # the longest name wins at a position
        lookup,
        tuple(ids),
        _numbered(ids, titles),
        r"items?|entries|steps?|parts?|tasks?" + (f"|{range_nouns}" if range_nouns else ""),
        phrase_pattern(verbs),
        global_claim_patterns(
            f"(?:{DONE_G[3:-1]}|{verbs})" if verbs else DONE_G,
            f"(?:{NOUNS[3:-1]}|{nouns})" if nouns else NOUNS,
            f"|{verbs}" if verbs else "",
            subjects,
        ),
    )


# -- ranges: "cat-1 to cat-8", "items 3-7", "doc-04 onwards", "everything up to i5" --------

_RANGE_SEP = re.compile(
    r"\s*(?:-|–|—|→|\.\.\.?|…|to|through|thru|till|until|up to|upto|up through)\s*"
    r"(?:and including\s*)?"
)
_ONWARDS = re.compile(
    r"\s+(?:onwards?|and (?:up|beyond|later|after|onwards?|everything after(?: it)?|all "
    r"(?:later|following|subsequent)(?: ones| items)?)|(?:through|to|till|until) the (?:end|last"
    r"(?: one| item)?))\b"
)
_UP_TO = re.compile(
    r"\b(?:everything|all(?: the)?(?: items?)?|items?)\s+(?:up to|through|until|till|upto)"
    r"(?: and including)?\s+$"
)
_FROM = re.compile(r"\bfrom\s+$")


def _spell(ids: list[str]) -> str:
    """Items as a list the claim reader takes as one group ("i1 and i2 and i3")."""
    # Joined by "and" alone, not commas: one clause, so a hedge before the range
    # ("once cat-4 to cat-8 are done") still covers all of it.
    return " and ".join(i.lower() for i in ids)


def _span(names: Names, a: str, b: str) -> list[str]:
    """The items from `a` to `b`: by the number their ids end with when they share a
    prefix ("doc-04" to "doc-12"), else in ledger order."""
    pa, pb = re.match(r"(.*?)(\d+)$", a), re.match(r"(.*?)(\d+)$", b)
    if pa and pb and pa.group(1) == pb.group(1):
        lo, hi = sorted((int(pa.group(2)), int(pb.group(2))))
        found = [
            i
            for i in names.order
            if (m := re.match(r"(.*?)(\d+)$", i))
            and m.group(1) == pa.group(1)
            and lo <= int(m.group(2)) <= hi
        ]
        if found:
            return found
    ia, ib = names.order.index(a), names.order.index(b)
    return list(names.order[min(ia, ib) : max(ia, ib) + 1])


def expand_ranges(text: str, names: Names) -> str:
    """`text` with every range of items written out as the items it spans."""
    if names.index is None:
        return text
    # "cat-1..cat-8": the dots would hide the second id (a dotted name is no mention).
    text = re.sub(r"(?<=\w)(?:\.\.\.?|…)(?=\w)", " to ", text)
    text = _expand_numbered(text, names)
    mentions = mentions_in(text, names)
    out: list[str] = []
    pos = 0
    k = 0
    while k < len(mentions):
        m = mentions[k]
        nxt = mentions[k + 1] if k + 1 < len(mentions) else None
        if nxt is not None and _RANGE_SEP.fullmatch(text[m.end : nxt.start]):
            start = m.start
            if _FROM.search(text[pos:start]):
                start = pos + _FROM.search(text[pos:start]).start()  # type: ignore[union-attr]
            out += [text[pos:start], _spell(_span(names, m.item, nxt.item))]
            pos, k = nxt.end, k + 2
            continue
        after = _ONWARDS.match(text, m.end)
        before = _UP_TO.search(text[pos : m.start])
        if after is not None:
            idx = names.order.index(m.item)
            out += [text[pos : m.start], _spell(list(names.order[idx:]))]
            pos = after.end()
        elif before is not None:
            idx = names.order.index(m.item)
            out += [text[pos : pos + before.start()], _spell(list(names.order[: idx + 1]))]
            pos = m.end
        k += 1
    out.append(text[pos:])
    return "".join(out)


def _number(word: str) -> int | None:
    return int(word) if word.isdigit() else _NUMBER_WORDS.get(word)


@functools.lru_cache(maxsize=64)
def _numbered_patterns(range_nouns: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """A range by number ("items 3-7") and a count from the start ("the first three
    items"), for the nouns a task's items go by."""
    num = r"#?(\d+)"
    return (
        re.compile(rf"\b(?:{range_nouns})\s+{num}{_RANGE_SEP.pattern}{num}\b"),
        re.compile(rf"\b(?:the )?first (\d+|{'|'.join(_NUMBER_WORDS)}) (?:{range_nouns})\b"),
    )


def _expand_numbered(text: str, names: Names) -> str:
    """Ranges by number ("items 3-7", "shelves 1 to 8") and counts from the start ("the
    first three items") written out as the items they name."""
    if not names.numbered:
        return text
    ranged, first = _numbered_patterns(names.range_nouns)

    def numbered(m: re.Match[str]) -> str:
        lo, hi = sorted((int(m.group(1)), int(m.group(2))))
        ids = [names.numbered[n] for n in sorted(names.numbered) if lo <= n <= hi]
        return _spell(ids) if ids else m.group(0)

    def leading(m: re.Match[str]) -> str:
        n = _number(m.group(1)) or 0
        return _spell(list(names.order[:n])) if 0 < n <= len(names.order) else m.group(0)

    return first.sub(leading, ranged.sub(numbered, text))


@dataclass(frozen=True)
class Mention:
    start: int
    end: int
    item: str


def mentions_in(text: str, names: Names) -> list[Mention]:
    if names.index is None:
        return []
    return [Mention(a, b, names.lookup[name]) for a, b, name in names.index.finditer(text)]
