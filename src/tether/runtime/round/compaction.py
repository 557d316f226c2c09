"""Compaction: fold older rounds into a summary when the history outgrows the budget.

The compressor (a `compact` model call) is given the current ledger and told never to
turn pending work into done work. Whatever it writes, the ledger is not touched: the
summary enters the history as a user message that defers to the ledger, and the system
prompt is re-rendered with the current ledger at its tail (a new cache epoch). A summary
that claims completion the ledger does not record, in any wording, raises an audit
warning, and the runtime appends a note to it: the claim was not accepted, and here is
the ledger. If the compressor fails, a mechanical summary is used so the task never dies
of compaction.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal

from tether import errors, failpoints, ledger_view, tokens
from tether import events as ev
from tether.ledger import Ledger
from tether.models.base import Message, ModelRequest
from tether.runtime.round import history
from tether.runtime.round.context import SUMMARY_PREFIX, Context, Entry, render_system, transcript
from tether.runtime.run.ports import Commit
from tether.store.base import ArtifactRecord

if TYPE_CHECKING:
    from tether.runtime.run.ports import CompactHost

COMPACT_INSTRUCTIONS = """\
You compress the history of a long-running agent task so that it fits the context
window. Write a concise summary of what was tried, what was learned, and what the tool
results showed, keeping ids, paths and numbers that later work needs.

The GOAL LEDGER below is the audited truth about progress. Never describe an item as
done unless the ledger says it is done; pending work stays pending. Do not invent
results.
"""


# -- completion claims ----------------------------------------------------------------
#
# The compressor is told not to turn pending work into done work, but it is a model: it
# may still write "all items done" or "- [x] i3". `completion_claims` reads a summary
# the way a later model would and reports what it asserts beyond the ledger. It is a
# heuristic reader, tuned to flag claims in any ordinary wording and to stay quiet on
# honest progress reports ("i1 is done; i3 is still pending").

#: Statuses that close an item for the purpose of a "the task is finished" claim.
#: Compared as strings so statuses added later (e.g. "waived") need no import.
FINISHED_STATUSES: Final[frozenset[str]] = frozenset({"done", "waived", "skipped"})


@dataclass(frozen=True)
class ClaimFindings:
    """What a summary asserts beyond the ledger: items called done, a whole-task claim."""

    items: tuple[str, ...] = ()
    global_phrase: str | None = None

    def __bool__(self) -> bool:
        return bool(self.items) or self.global_phrase is not None

    def describe(self) -> str:
        """The claims in words, for the note the model reads next."""
        parts = []
        if self.global_phrase is not None:
            parts.append(f'that the whole task is finished ("{self.global_phrase}")')
        if self.items:
            verb = "is" if len(self.items) == 1 else "are"
            parts.append(f"that {', '.join(self.items)} {verb} done")
        return " and ".join(parts)


_WORD = r"[\w'-]+"
_B = r"(?<![\w/.\\-])"  # no word, path or dotted-name character before
_E = r"(?![\w/\\-]|\.\w)"  # ...nor after ("out/i1.txt" does not mention i1)
_CHECKED, _UNCHECKED = "☑", "☐"

# Per-item vocabulary. "both": the phrase may stand before or after the item ("done: i3",
# "i3 done"); "post": only after it ("i3 complete", but "complete i3" is an instruction);
# "pre": only before it (a checkbox).
_DONE_BOTH = (
    r"done|completed|finished|resolved|delivered|succeeded|handled|accomplished|achieved|"
    r"fulfilled|satisfied|closed|implemented|wrapped up|taken care of|checked off|"
    r"ticked off|marked (?:as )?(?:done|complete|completed|finished)"
)
_DONE_POST = r"complete|successful|successfully"
_OPEN_WORDS = (
    r"pending|open|remaining|remain|remains|outstanding|in[ _]progress|ongoing|todo|"
    r"to[ -]do|tbd|wip|not started|unstarted|started|starting|blocked|failed|failing|"
    r"fails|incomplete|unfinished|undone|left|next|waiting|awaiting|queued|planned|"
    r"skipped|waived|retry|retrying|needs|need|needed|requires|still|not|never|no|"
    r"partial|partially|attempted|tried|trying|working on|except|excluding|besides|"
    r"apart from|other than"
)


@functools.lru_cache(maxsize=64)
def _phrase_pattern(extra_done: str = "") -> re.Pattern[str]:
    """The per-item status vocabulary, with the task's own done-words (`extra_done`, an
    alternation such as "catalogued|fetched") among the done-words."""
    both = _DONE_BOTH + (f"|{extra_done}" if extra_done else "")
    return re.compile(
        rf"{_B}(?P<both>{both}){_E}|{_B}(?P<post>{_DONE_POST}){_E}|"
        rf"(?P<mark>[✅✔✓])|(?P<pre>{_CHECKED})|(?P<openmark>[{_UNCHECKED}⬜❌⏳])|"
        rf"{_B}(?P<open>{_OPEN_WORDS}){_E}"
    )


_PHRASE = _phrase_pattern()


def _wordset(words: str) -> frozenset[str]:
    return frozenset(words.split())


# Words that, shortly before a done-word, make it not a claim: negation, hedging,
# conditions, plans, and reported speech ("the actor claimed i3 was done").
_HEDGES = _wordset(
    "not no never cannot yet almost nearly mostly partially partly half barely hardly if "
    "once until unless whether before when will would should must could might can may "
    "need needs needed to get awaiting without nor neither ensure sure verify check "
    "confirm claimed claims claim said says reported thought believed assumed wrongly "
    "falsely supposedly allegedly pretended expected hope hoped plan planned nothing none "
    "zero 0"
)
_NEGATED_AFTER = re.compile(r"\s*(?:[:=?]\s*)?(?:false|no|not|never|0)(?![\w])")

# Whole-task vocabulary.
_DONE_G = (
    r"(?:done|complete|completed|finished|resolved|delivered|handled|accomplished|achieved|"
    r"succeeded|closed|fulfilled|met|satisfied|written|implemented|wrapped up|"
    r"taken care of|checked off|ticked off)"
)
_NOUNS = (
    r"(?:items?|tasks?|subtasks?|steps?|files?|todos?|to-dos?|milestones?|goals?|"
    r"objectives?|deliverables?|requirements?|entries|things|parts|pieces|work|jobs?|"
    r"checklist(?: items?)?|ledger items?|of them|of it)"
)
_COPULA = (
    r"(?:,? (?:have|has|had|are|were|is|was|got|now|all|been|also|already|fully|"
    r"successfully|completely|each|individually|finally|officially|therefore|thus))*"
)
_EXCEPT = (
    r"(?:except(?: for)?|but(?: not)?|apart from|other than|besides|save for|excluding|"
    r"aside from|with the exception of|minus)"
)


# (pattern, kind). "weak": counts only in a sentence that names no item, where it cannot
# be about one item ("i3 is fully completed" is a per-item claim). "verb": not when an
# item is its subject ("i1 completed all its steps"). "else": claims every item but the
# ones the line names ("i3 is open, everything else is done").
@functools.lru_cache(maxsize=64)
def _global_patterns(
    done_g: str = _DONE_G, nouns: str = _NOUNS, extra: str = "", subjects: str = ""
) -> tuple[tuple[re.Pattern[str], str], ...]:
    """The whole-task patterns, with a task's own done-words (`done_g`, `extra`: an
    alternation led by "|"), nouns for its items (`nouns`) and for the whole of its work
    (`subjects`: "catalogue" when the objective is to catalogue the shelves)."""
    extra_patterns: list[tuple[str, str]] = [
        # the whole catalogue is finished / the entire set is complete / the full list done
        (
            r"(?:^|[:,]\s*|\s[-–—]+\s*|\b(?:the|this|our|my)\s+)"
            rf"(?:whole|entire|full|complete|overall)\s+[a-z][\w-]*(?:'s)?{_COPULA} {done_g}\b",
            "strong",
        ),
        # cataloguing finished for every shelf / finished cataloguing all of them
        (
            rf"\b[a-z]+ing(?:{_COPULA})? {done_g} (?:for|on|of|across|in) (?:all|every|each)\b|"
            rf"\b(?:finished|completed|done(?: with)?) [a-z]+ing (?:all|every|each|everything)\b",
            "strong",
        ),
    ]
    if subjects:
        # the catalogue is done / Catalogue complete.
        extra_patterns.append(
            (
                r"(?:^|[:,]\s*|\s[-–—]+\s*|\b(?:the|this|our|my)\s+)"
                rf"(?:{subjects})(?:'s)?{_COPULA} {done_g}\b",
                "weak",
            )
        )
    return tuple(
        (re.compile(p), kind)
        for p, kind in (
            (
                r"\b(?:everything else|all (?:the )?(?:other|remaining) (?:items?|tasks?|steps?|"
                rf"work|files?)|the rest(?: of (?:the |them)?(?:items?|tasks?|work)?)?)(?:'s)?"
                rf"{_COPULA} {done_g}\b",
                "else",
            ),
            # all items are done / all 5 items have been completed / every step finished
            (
                r"\b(?:all|every|each)(?! (?:the )?(?:other|remaining)\b)"
                rf"(?: {_WORD}){{0,3}}? {nouns}"
                rf"(?: (?:in|on|of|from) (?:the |this |our |my )?{_WORD})?"
                rf"(?P<exc> {_EXCEPT} [^.;!?]{{1,80}}?)?{_COPULA} {done_g}\b",
                "strong",
            ),
            # everything is done / everything finished / all the work is complete
            (
                rf"\b(?:everything|all (?:the )?work)(?: (?:in|on|from) (?:the |this |our )?"
                rf"{_WORD})?(?:'s)?(?P<exc> {_EXCEPT} [^.;!?]{{1,80}}?)?{_COPULA} {done_g}\b",
                "strong",
            ),
            # (the) task is complete / objective achieved / mission accomplished / work is done
            (
                r"(?:^|[:,]\s*|\s[-–—]+\s*|\b(?:the|this|our|my)\s+)"
                r"(?:(?:whole|entire|overall|main)\s+)?(?:task|job|work|objective|goal|mission|"
                rf"project|assignment|checklist|ledger)(?:'s)?{_COPULA} (?:{done_g}|reached)\b",
                "strong",
            ),
            # finished all the items / completed everything / did them all
            (
                r"\b(?:finished|completed|done|did|resolved|delivered|handled|closed|"
                r"accomplished|achieved|fulfilled|wrapped up|ticked off|checked off|knocked out|"
                rf"took care of|taken care of{extra})(?: off| up)? "
                rf"(?:(?:all|every|each)\b(?:(?: {_WORD}){{0,3}}? {nouns}\b)?|everything\b|"
                r"(?:them|it|these|those) all\b)",
                "verb",
            ),
            # completed the task / achieved the objective
            (
                r"\b(?:completed|finished|accomplished|achieved|met|fulfilled|delivered|"
                r"satisfied|wrapped up|closed out) (?:the |our |my |this )?"
                r"(?:(?:whole|entire|overall|full) )?(?:task|objective|goal|job|mission|"
                r"assignment|project|checklist|ledger|acceptance criteria)\b",
                "strong",
            ),
            # nothing left to do / nothing remains / no items remaining / zero items left
            (
                r"\bnothing(?: (?:else|more|further|is|was))* (?:left|remains|remaining|"
                r"outstanding|pending|to do|to be done|to work on)\b|"
                r"\bno (?:more |further |other )?(?:remaining |pending |outstanding )?"
                r"(?:items?|work|tasks?|steps?|todos?)(?: (?:is|are))? (?:left|remain|remains|"
                r"remaining|outstanding|pending|to do)\b|"
                r"\bno (?:remaining|pending|outstanding|unfinished|incomplete) "
                r"(?:items?|work|tasks?|steps?|todos?)\b|"
                r"\b(?:zero|0) (?:items? )?(?:left|remaining|outstanding)\b",
                "strong",
            ),
            # we're done / I have finished (with nothing after it)
            (
                r"\b(?:we|i)(?:'re|'m|'ve| are| am| have| had)(?: (?:now|all|fully|completely|"
                r"successfully|finally|officially))* (?:done|finished|complete|completed)\b"
                r"(?=\s*(?:$|[.!,;:]|now\b|here\b|and\b|with (?:everything|it all|all\b|the "
                r"(?:whole |entire )?(?:task|job|work|checklist|project)\b)))",
                "strong",
            ),
            (r"\bdone and dusted\b|\bthat's a wrap\b", "strong"),
            (
                r"\b(?:all )?(?:the )?acceptance (?:criteria|checks?)(?: (?:are|were|have|has|"
                r"been|now|all|fully))* (?:met|satisfied|passed|pass|fulfilled|done|green)\b",
                "strong",
            ),
            (r"\ball (?:now )?(?:done|complete|completed|finished|wrapped up)\b", "weak"),
            (
                r"\b(?:fully|completely|entirely|totally) (?:done|complete|completed|finished)\b",
                "weak",
            ),
            (
                r"\b100 ?(?:%|percent|per cent)(?: {_WORD}){0,2}? (?:complete|completed|done|"
                r"finished)\b|\b(?:completion|progress)\s*[:=]?\s*(?:is |at |of )?100 ?"
                r"(?:%|percent)",
                "weak",
            ),
            (
                r"\b(?:overall |final |task |current )?status\s*[:=]?\s*(?:is\s+)?(?:done|"
                r"complete|completed|finished|success|successful|delivered|satisfied)\b",
                "weak",
            ),
            (
                r"\bready (?:for|to) (?:delivery|deliver|be delivered|ship|hand ?off|handoff|"
                r"submission)\b",
                "weak",
            ),
            *extra_patterns,
        )
    )


_GLOBAL: Final = _global_patterns()
_RATIO = (
    re.compile(
        r"\b(\d+)\s*(?:/|of|out of)\s*(\d+)(?: [\w'-]+){0,2}? (?:are |were |have been |is )?"
        r"(?:done|complete|completed|finished)\b"
    ),
    re.compile(
        r"\b(?:done|completed|complete|finished)\s*[:=]?\s*(\d+)\s*(?:/|of|out of)\s*(\d+)\b"
    ),
)
_BARE = frozenset(
    {"done", "complete", "completed", "finished", "all done", "task complete", "task done"}
)
_CONDITIONAL_START = re.compile(
    r"\s*(?:when|whenever|once|if|as soon as|until|unless|only when|only once)\b"
)
_GLOBAL_HEDGES = _HEDGES | {"far", "whenever", "wait", "waiting", "until"}
_GLOBAL_NOT_AFTER = re.compile(
    r"\s*(?:\?|(?:when|once|if|only|after|as soon as|until|unless|yet)\b)"
)
_OBJECT_AFTER = re.compile(r"\s*(?:to do |to be done )?(?:for|on|of|in|with|about|regarding|at)\b")

_BULLET = re.compile(r"^\s*(?:[-*+•·]|\d+[.)])\s+")
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\s*;\s*")
_SOFT = re.compile(r"\s*,\s*|\s+[-–—]+\s+|\s*\|\s*")
_HARD = re.compile(r"\s+(?:but|while|whereas|however|although|though|whilst)\s+")
_LABEL = re.compile(
    rf"(?:(?:not|still|yet|to|in|left|now|so|far|work|items?)\s+)*{_WORD}:(?=\s|$)"
    rf"|[{_CHECKED}{_UNCHECKED}]"
)
_JOINERS = _wordset("and or the of to with are is were was have has been & plus")
_LIST_JOINERS = _wordset("and or & plus")
_FILLER = _wordset("and or & plus also both as well items item the")


@dataclass(frozen=True)
class _Mention:
    start: int
    end: int
    item: str


@dataclass(frozen=True)
class _Phrase:
    start: int
    end: int
    done: bool
    where: Literal["both", "post", "pre"]


def _clean(line: str) -> tuple[str, bool, bool]:
    """`(text, is_heading, is_bullet)`: lower case, markdown and decoration removed."""
    text = line.replace("\ufe0f", "").replace("’", "'").replace("‘", "'").lower()
    bold_line = bool(re.fullmatch(r"\s*(?:[-*+]\s+)?\*\*[^*]+\*\*\s*:?\s*", text))
    text = re.sub(r"^\s*>+\s?", "", text)
    heading = bool(re.match(r"^\s*#+\s", text)) or bold_line
    text = re.sub(r"^\s*#+\s*", "", text)
    bullet = bool(_BULLET.match(text))
    text = _BULLET.sub("", text)
    text = re.sub(r"\[[x✓✔]\]", f" {_CHECKED} ", text)
    text = re.sub(r"\[[ ~!\-]?\]", f" {_UNCHECKED} ", text)
    bullet = bullet or text.lstrip().startswith((_CHECKED, _UNCHECKED))
    text = re.sub(r"\*+|__|`+|~~|(?<!\w)_|_(?!\w)", "", text)
    # "i3: pending -> done" reports a transition to done.
    text = re.sub(r"\b(?:pending|open|in[ _]progress|todo|blocked)\s*(?:->|=>|→)\s*", "", text)
    # An arrow between two names is a range ("cat-1 → cat-8"): kept as "→" for
    # `_expand_ranges`, which drops the ones left.
    text = re.sub(r"(?<=\w)\s*(?:->|=>)\s*(?=\w)", " → ", text)
    text = re.sub(r"->|=>|[()\[\]{}\"]", " ", text)
    return re.sub(r"\s+", " ", text).strip(), heading, bullet


def _logical_lines(summary: str) -> list[tuple[str, bool, bool]]:
    """Cleaned lines; a sentence that wraps ("i1, i2 and" / "i3 are done") is joined."""
    out: list[tuple[str, bool, bool]] = []
    for raw in summary.splitlines():
        text, heading, bullet = _clean(raw)
        prev = out[-1][0] if out else ""
        wraps = prev.endswith(",") or (prev[-1:].isalnum() and prev.rsplit(" ", 1)[-1] in _JOINERS)
        if text and wraps and not (heading or bullet or re.match(rf"{_WORD}:(?:\s|$)", text)):
            out[-1] = (f"{prev} {text}", out[-1][1], out[-1][2])
        else:
            out.append((text, heading, bullet))
    return out


@dataclass(frozen=True)
class _Names:
    """What a summary may name of one ledger: one regex for every item id and
    (distinctive) title and who each names; the items in order (for ranges); and the
    status vocabulary with the task's own words (its titles' verbs as done-words,
    "catalogued" for "catalogue shelf 3", and its nouns)."""

    pattern: re.Pattern[str] | None
    lookup: dict[str, str]
    order: tuple[str, ...] = ()
    #: Item by the number a summary may call it ("items 3-7", "shelves 1 to 8").
    numbered: dict[int, str] = field(default_factory=dict)
    #: Nouns a numbered range may use ("items", "shelves").
    range_nouns: str = r"items?|entries|steps?|parts?|tasks?"
    phrase: re.Pattern[str] = _PHRASE
    global_patterns: tuple[tuple[re.Pattern[str], str], ...] = _GLOBAL


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
_NOT_DONE_VERBS = _wordset("read run get set put do try check verify test start open see look")
_STOP = _wordset(
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


def _names(ledger: Ledger) -> _Names:
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
        return _Names(None, lookup)
    alts = sorted(lookup, key=len, reverse=True)  # the longest name wins at a position
    body = "|".join(r"\s+".join(re.escape(w) for w in name.split(" ")) for name in alts)
    verbs, nouns, subjects, range_nouns = _vocabulary(ledger.skeleton.objective, tuple(titles))
    return _Names(
        re.compile(f"{_B}(?:{body}){_E}"),
        lookup,
        tuple(ids),
        _numbered(ids, titles),
        r"items?|entries|steps?|parts?|tasks?" + (f"|{range_nouns}" if range_nouns else ""),
        _phrase_pattern(verbs),
        _global_patterns(
            f"(?:{_DONE_G[3:-1]}|{verbs})" if verbs else _DONE_G,
            f"(?:{_NOUNS[3:-1]}|{nouns})" if nouns else _NOUNS,
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


def _span(names: _Names, a: str, b: str) -> list[str]:
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


def _expand_ranges(text: str, names: _Names) -> str:
    """`text` with every range of items written out as the items it spans."""
    if names.pattern is None:
        return text
    # "cat-1..cat-8": the dots would hide the second id (a dotted name is no mention).
    text = re.sub(r"(?<=\w)(?:\.\.\.?|…)(?=\w)", " to ", text)
    text = _expand_numbered(text, names)
    mentions = _mentions(text, names)
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


def _expand_numbered(text: str, names: _Names) -> str:
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


def _mentions(text: str, names: _Names) -> list[_Mention]:
    if names.pattern is None:
        return []
    return [
        _Mention(m.start(), m.end(), names.lookup[" ".join(m.group(0).split())])
        for m in names.pattern.finditer(text)
    ]


def _words(text: str) -> list[str]:
    return re.findall(rf"[\w']+|[{_CHECKED}{_UNCHECKED}✅✔✓⬜❌⏳]", text)


def _phrases(
    text: str, mentions: list[_Mention], phrase: re.Pattern[str] = _PHRASE
) -> list[_Phrase]:
    out = []
    for m in phrase.finditer(text):
        if any(k.start < m.end() and m.start() < k.end for k in mentions):
            continue  # part of an item's title
        kind = m.lastgroup
        if kind in ("open", "openmark"):
            out.append(_Phrase(m.start(), m.end(), False, "both"))
            continue
        # The words before it, items and list joiners left out: a hedge before a list
        # ("once i4, i5 and i6 are done") covers the whole list.
        head = text[: m.start()]
        for k in reversed(mentions):
            if k.end <= m.start():
                head = head[: k.start] + " " + head[k.end :]
        before = [w for w in _words(head) if w not in _LIST_JOINERS][-3:]
        negated = any(w in _HEDGES or w.endswith("n't") for w in before) or bool(
            _NEGATED_AFTER.match(text, m.end())
        )
        where: Literal["both", "post", "pre"] = (
            "post" if kind == "post" else "pre" if kind == "pre" else "both"
        )
        out.append(_Phrase(m.start(), m.end(), not negated, where))
    return out


def _pieces(sentence: str, names: _Names) -> list[str]:
    """Split a sentence into clauses, each about its own items.

    Hard breaks: "but", "while"...; labels ("Remaining: i3") and checkboxes once an item
    was named before them. Soft breaks: commas, dashes, table bars. A piece that only
    lists items ("i1, i2 and i3 are done") joins its neighbour across a soft break.
    """
    # (soft break before it, text, lists items only)
    pieces: list[tuple[bool, str, bool]] = []
    for hard in _HARD.split(sentence):
        for part in _split_labels(hard, names):
            for k, soft in enumerate(_SOFT.split(part)):
                if soft.strip():
                    only = bool(_mentions(soft, names)) and all(
                        w in _FILLER for w in _words(_strip_mentions(soft, names))
                    )
                    pieces.append((k > 0, soft, only))
    # A bare list of items takes the clause after it ("i1, i2 and i3 are done"), else
    # the one before it ("done: i1, i2").
    backward: list[tuple[bool, str, bool]] = []
    for soft_before, text, only in reversed(pieces):
        if only and backward and backward[-1][0]:
            nxt = backward.pop()
            backward.append((soft_before, f"{text}, {nxt[1]}", nxt[2]))
        else:
            backward.append((soft_before, text, only))
    merged: list[tuple[bool, str, bool]] = []
    for soft_before, text, only in reversed(backward):
        if only and soft_before and merged:
            prev = merged.pop()
            merged.append((prev[0], f"{prev[1]}, {text}", prev[2]))
        else:
            merged.append((soft_before, text, only))
    return [t for _, t, _ in merged]


def _split_labels(text: str, names: _Names) -> list[str]:
    """Split before a label or checkbox that follows a named item ("Done: i1 Left: i2")."""
    cuts = [0]
    for m in _LABEL.finditer(text):
        start = m.start()
        before = text[cuts[-1] : start]
        # Not after a bare list of items: "i1 and i2 and i3: done" is one clause.
        listed = all(w in _FILLER for w in _words(_strip_mentions(before, names)))
        if start > cuts[-1] and text[start - 1] == " " and _mentions(before, names) and not listed:
            cuts.append(start)
    return [text[a:b] for a, b in itertools.pairwise([*cuts, len(text)])]


def _strip_mentions(text: str, names: _Names) -> str:
    for m in reversed(_mentions(text, names)):
        text = text[: m.start] + " " + text[m.end :]
    return text


def _status_of(text: str, names: _Names) -> bool | None:
    """A header's meaning for the list under it: True done, False open, None neither."""
    ps = _phrases(text, _mentions(text, names), names.phrase)
    if any(not p.done for p in ps):
        return False
    return True if ps else None


def _item_claims(pieces: list[str], names: _Names, header: bool | None, listed: bool) -> list[str]:
    """Items each piece calls done: the nearest status phrase decides, a phrase after the
    item winning a tie; with none, a listed item takes its section header's status."""
    claimed: list[str] = []
    for piece in pieces:
        mentions = _mentions(piece, names)
        if not mentions:
            continue
        phrases = _phrases(piece, mentions, names.phrase)
        for m in mentions:
            best: tuple[int, int, bool] | None = None  # (distance, phrase before?, done)
            for p in phrases:
                after = p.start >= m.end
                if (p.where == "post" and not after) or (p.where == "pre" and after):
                    continue
                gap = piece[m.end : p.start] if after else piece[p.end : m.start]
                key = (len(_words(gap)), 0 if after else 1, p.done)
                if best is None or key[:2] < best[:2]:
                    best = key
            done = best[2] if best is not None else bool(listed and header)
            if done and m.item not in claimed:
                claimed.append(m.item)
    return claimed


def _clause_before(sentence: str, pos: int) -> list[str]:
    """The last words of the clause that ends at `pos`."""
    head = re.split(r"[,;:]|\s[-–—]+\s", sentence[:pos])[-1]
    return _words(head)[-4:]


def _hedged(sentence: str, m: re.Match[str]) -> bool:
    if _GLOBAL_NOT_AFTER.match(sentence, m.end()):
        return True
    if m.start() > 0 and _CONDITIONAL_START.match(sentence):
        return True  # "when every shelf is catalogued, the task is done": a condition
    return any(
        w in _GLOBAL_HEDGES or w.endswith("n't") for w in _clause_before(sentence, m.start())
    )


def _global_claims(
    sentence: str, names: _Names, line_items: list[str], header: bool
) -> list[tuple[str, list[str] | None]]:
    """`(phrase, exceptions)` per whole-task claim in one sentence, in text order;
    `exceptions` is None for a plain claim, else the items the claim leaves out ("all
    done except i3")."""
    out: list[tuple[int, str, list[str] | None]] = []
    named = bool(_mentions(sentence, names))
    bare = " ".join(re.sub(r"[^\w' ]+", " ", sentence).split())
    if not named and not header and bare in _BARE:
        out.append((0, bare, None))
    for ratio in _RATIO:
        for m in ratio.finditer(sentence):
            if int(m.group(1)) == int(m.group(2)) > 0 and not named and not _hedged(sentence, m):
                out.append((m.start(), m.group(0).strip(), None))
    for pat, kind in names.global_patterns:
        for m in pat.finditer(sentence):
            found = _global_match(sentence, m, kind, names, line_items, named)
            if found is not None:
                out.append((m.start(), *found))
    return [(p, e) for _, p, e in sorted(out, key=lambda x: x[0])]


def _global_match(
    sentence: str,
    m: re.Match[str],
    kind: str,
    names: _Names,
    line_items: list[str],
    named: bool,
) -> tuple[str, list[str] | None] | None:
    """One match of a whole-task pattern: `(phrase, exceptions)`, or None when it is
    hedged, about one item, or too vague to judge."""
    if _hedged(sentence, m):
        return None
    phrase = m.group(0).strip(" :,-–—")
    exc_text = m.groupdict().get("exc") or ""
    core = sentence[m.start() : m.end()].replace(exc_text, " ")
    if _mentions(core, names):
        return None  # "all the work on i1 is done": about one item
    if kind == "verb" and _mentions(sentence[: m.start()], names):
        return None  # "i1 completed all its steps": the subject is an item
    rest = sentence[m.end() :]
    if not exc_text:
        exc = re.match(rf"\s*,?\s*{_EXCEPT}\b(.*)", rest)
        exc_text = exc.group(1) if exc else ""
    if exc_text:
        excepted = [x.item for x in _mentions(exc_text, names)]
        # "all done except the review" names nothing: too vague to judge.
        return (phrase, excepted) if excepted else None
    if _OBJECT_AFTER.match(rest) and _mentions(rest[:80], names):
        return None  # "nothing left to do for i1"
    if kind == "else":
        return phrase, line_items or None
    if kind == "weak" and named:
        return None
    return phrase, None


def completion_claims(summary: str, ledger: Ledger) -> ClaimFindings:
    """What `summary` asserts as finished beyond what `ledger` records. Pure.

    Two kinds of claim are found, in any case, punctuation or markdown (bold, headings,
    bullets, tables, checkboxes such as ``- [x] i3``), across lines:

    - per item: an item's id, or its title, tied to a done-word (done, complete(d),
      finished, resolved, delivered, succeeded, handled, a check mark...), either in the
      same clause ("i3 is done", "Completed: i2, i3", "| i3 | done |") or under a header
      ("Done:" over a bulleted list). A done-word that is negated or hedged ("i3 is not
      done", "i3 has yet to be finished", "once i3 is done"), or a clause that says the
      item is open ("i3 remains pending", "still to do: i3", "i2 not started") is not a
      claim. A path such as ``out/i3.txt`` does not name item i3.
    - whole task: "all done", "all 5 items are complete", "everything finished", "task
      complete", "objective achieved", "nothing left to do", "100% complete", "5/5
      done", "we're done", "finished all the items", "mission accomplished"... unless
      negated, conditional or reported ("not all items are done", "when everything is
      finished", "the actor claimed everything was done"). "Everything is done except
      i3" (or "i3 is open, everything else is done") claims each other item instead.

    Only claims the ledger contradicts are returned: items whose status is not
    ``done``, and a whole-task phrase only while some item is unfinished (its status is
    not in `FINISHED_STATUSES`). Questions are not claims.
    """
    names = _names(ledger)
    status = {d.id: str(s.status) for d, s in ledger.items()}
    unfinished = [i for i, st in status.items() if st not in FINISHED_STATUSES]
    claimed: list[str] = []
    phrase: str | None = None
    header: bool | None = None
    for text, heading, bullet in _logical_lines(summary):
        if not text:
            continue
        text = _expand_ranges(text, names).replace("→", " ")
        line_items = [m.item for m in _mentions(text, names)]
        is_header = (heading or text.endswith(":")) and not line_items
        for sentence in _SENTENCE.split(text):
            sentence = sentence.strip()
            if not sentence or sentence.endswith("?"):
                continue
            for found, excepted in _global_claims(sentence, names, line_items, is_header):
                if excepted is None:
                    phrase = phrase or found
                else:
                    claimed += [i for i in unfinished if i not in excepted]
            if not is_header:
                listed = bullet or all(
                    w in _FILLER for w in _words(_strip_mentions(sentence, names))
                )
                claimed += _item_claims(_pieces(sentence, names), names, header, listed)
        if is_header:
            header = _status_of(text, names)
    items = tuple(i for i in status if i in claimed and status[i] != "done")
    return ClaimFindings(items, phrase if unfinished else None)


SUMMARY_AUDIT_INSTRUCTIONS = """\
You check a summary of an agent's earlier work against the goal ledger, which is the
audited truth about progress. Find every item the summary presents as finished, in any
wording: one by one, as a range ("i1 to i5 were handled", "items 3-7 done"), or as the
whole task ("the whole catalogue is finished", "everything is done"). Report only what
the summary asserts as finished; plans, conditions, questions and honest statements
that work is still open are not claims.

Answer with one JSON object and nothing else:
{"claimed_done": ["<item id>", ...], "whole_task": true or false, "quote": "<the words>"}
"""


def may_claim(summary: str, ledger: Ledger) -> bool:
    """Whether `summary` uses any completion vocabulary (a done-word of the task, a
    check mark): the summaries worth a second reading when the rules found no claim."""
    names = _names(ledger)
    text = summary.lower()
    if any(m.lastgroup in ("both", "post", "mark", "pre") for m in names.phrase.finditer(text)):
        return True
    return any(pat.search(text) for pat, _ in names.global_patterns)


def summary_audit_request(summary: str, ledger: Ledger, task_id: str | None) -> ModelRequest:
    """The question to the judge model: which completion does this summary claim?"""
    payload = {
        "summary": summary,
        "ledger": [
            {"id": d.id, "title": d.title, "status": str(s.status)} for d, s in ledger.items()
        ],
    }
    return ModelRequest(
        purpose="judge",
        system=SUMMARY_AUDIT_INSTRUCTIONS,
        messages=(Message("user", json.dumps(payload, ensure_ascii=False, sort_keys=True)),),
        max_output_tokens=512,
        json_output=True,
        task_id=task_id,
        ledger=ledger.to_dict(),
    )


def parse_summary_audit(text: str, ledger: Ledger) -> ClaimFindings:
    """The judge's answer as findings the ledger contradicts; an answer that cannot be
    read finds nothing (the rules' reading stands)."""
    start, end = text.find("{"), text.rfind("}")
    try:
        raw = json.loads(text[start : end + 1]) if start != -1 and end > start else None
    except json.JSONDecodeError:
        return ClaimFindings()
    if not isinstance(raw, dict):
        return ClaimFindings()
    status = {d.id: str(s.status) for d, s in ledger.items()}
    named = raw.get("claimed_done")
    ids = [i for i in named if isinstance(i, str)] if isinstance(named, list) else []
    items = tuple(i for i in status if i in ids and status[i] != "done")
    unfinished = any(st not in FINISHED_STATUSES for st in status.values())
    phrase = None
    if raw.get("whole_task") is True and unfinished:
        quote = raw.get("quote")
        phrase = (
            " ".join(str(quote).split())[:120]
            if isinstance(quote, str) and quote
            else ("the whole task is finished")
        )
    return ClaimFindings(items, phrase)


async def _read_claims(
    run: CompactHost, summary: str, fallback: bool, events: list[ev.Event]
) -> tuple[ClaimFindings, str]:
    """What the summary claims beyond the ledger, and who found it ("rules", "judge").

    A mechanical summary is the runtime's own and claims nothing. The rules read the
    summary first; a judge model, when configured, may find a claim they missed."""
    if fallback:
        return ClaimFindings(), "rules"
    findings = completion_claims(summary, run.view.ledger)
    if findings:
        return findings, "rules"
    return await _second_reading(run, summary, events), "judge"


async def _second_reading(run: CompactHost, summary: str, events: list[ev.Event]) -> ClaimFindings:
    """Ask the judge model what `summary` claims, when one is configured and the summary
    speaks of completion: what it finds adds to the rules' reading, never removes."""
    judge = run.calls.models.judge
    if judge is None or not may_claim(summary, run.view.ledger):
        return ClaimFindings()
    request = summary_audit_request(summary, run.view.ledger, run.journal.task_id)
    try:
        response = await run.calls.call_model(judge, request)
    except errors.ModelError as exc:
        # The rules' reading is the floor. The failure is journaled, so that a replay
        # meets it at the same point (and goes on the same way).
        events.append(
            ev.ModelFailed(
                call_id=f"{run.journal.task_id}.judge.summary.failed",
                purpose="judge",
                model=judge.name,
                error=str(exc),
                transient=exc.transient,
                attempts=exc.attempts,
            )
        )
        return ClaimFindings()
    events.append(await run.calls.record_call("judge", judge, request, response, None))
    return parse_summary_audit(response.text, run.view.ledger)


def _rejection_note(findings: ClaimFindings, ledger: Ledger, *, short: bool = False) -> str:
    """The runtime's note after a summary whose completion claim was refused."""
    head = (
        f"\n\n----------\nNOTE FROM THE RUNTIME: the summary above claims "
        f"{findings.describe()}; that claim was not accepted."
    )
    if short:
        return head + " The goal ledger in the system prompt is the truth."
    return head + " The goal ledger is the truth:\n" + ledger_view.render(ledger, compact=True)


def _mechanical_summary(entries: list[Entry]) -> str:
    lines = ["(mechanical summary: the compressor was unavailable)"]
    for e in entries:
        for m in e.messages:
            if m.role == "assistant" and m.tool_calls:
                calls = ", ".join(f"{c.name}({c.raw_arguments[:80]})" for c in m.tool_calls)
                lines.append(f"round {e.round}: called {calls}")
            elif m.role == "tool" and m.content.startswith("ERROR"):
                lines.append(f"round {e.round}: {m.content[:120]}")
    return "\n".join(lines[-60:])


def latest_round_entries(entries: list[Entry]) -> int:
    """How many entries, from the end, make up the latest round: its `round` entry and
    all that follows it (its continuation, a turn's opening message, a user's words).
    0 when there is no round (the history holds only a summary and turn messages)."""
    for n in range(len(entries) - 1, -1, -1):
        if entries[n].kind == "round":
            return len(entries) - n
    return 0


def _trim_results(entry: Entry) -> None:
    """Cut the long tool results of one entry to their first 300 characters."""
    entry.messages = [
        Message(m.role, m.content[:300] + "\n[trimmed]", m.tool_calls, m.tool_call_id, m.name)
        if m.role == "tool" and len(m.content) > 300
        else m
        for m in entry.messages
    ]
    entry.tokens = sum(tokens.estimate_message(m) for m in entry.messages)


#: How much of a long message of the latest round the model still sees when nothing
#: else can give way (its text, and each long string argument of its calls).
_LAST_RESORT_CHARS = 2_000


def _cut(text: str) -> str:
    return text if len(text) <= _LAST_RESORT_CHARS else text[:_LAST_RESORT_CHARS] + "\n[trimmed]"


def _trim_messages(entry: Entry) -> None:
    """Cut every long part of one entry's messages: tool results as `_trim_results`
    does, and the model's own long text and long string arguments to
    `_LAST_RESORT_CHARS` (the call's record in the journal is untouched: only what
    the model sees again is shortened)."""
    _trim_results(entry)
    out = []
    for m in entry.messages:
        calls = tuple(
            dataclasses.replace(
                c,
                arguments={k: _cut(v) if isinstance(v, str) else v for k, v in c.arguments.items()},
                raw_arguments=_cut(c.raw_arguments),
            )
            if c.arguments is not None
            else dataclasses.replace(c, raw_arguments=_cut(c.raw_arguments))
            for c in m.tool_calls
        )
        out.append(Message(m.role, _cut(m.content), calls, m.tool_call_id, m.name))
    entry.messages = out
    entry.tokens = sum(tokens.estimate_message(m) for m in entry.messages)


def _fit(
    ctx: Context,
    budget: int,
    kept: str,
    note: str,
    findings: ClaimFindings,
    ledger: Ledger,
    older: list[Entry],
) -> None:
    """Make the compacted context fit `budget` if it can (the caller checks): the
    summary entry is `ctx.entries[0]`, with the runtime's `note` at its end; rounds
    folded into it are appended to `older`."""
    # Still too big: trim long tool outputs, then fold the oldest kept rounds into the
    # summary one by one, then shorten the summary; give up clearly only when the system
    # prompt and tools alone do not fit. The runtime's note always stays at the end.
    # The latest round is left for last: its results are trimmed only when nothing else
    # can give way, and it is never folded into the summary.
    pinned = min(latest_round_entries(ctx.entries), len(ctx.entries) - 1)
    if ctx.estimate() > budget:
        for e in ctx.entries[1 : len(ctx.entries) - pinned]:
            _trim_results(e)
    while ctx.estimate() > budget and len(ctx.entries) > 1 + pinned:
        dropped = ctx.entries.pop(1)
        older.append(dropped)
        folded = _mechanical_summary([dropped]).splitlines()[1:]
        kept += ("\n" + "\n".join(folded)) if folded else ""
        head = ctx.entries[0]
        head.messages = [Message("user", SUMMARY_PREFIX + kept + note)]
        head.tokens = tokens.estimate_message(head.messages[0])
    # Then the summary is shortened (its note kept whole); then, as a last resort, the
    # latest round's long results are trimmed and the summary (and its note) shortened
    # again.
    for last_resort in (False, True):
        if ctx.estimate() <= budget:
            break
        if last_resort:
            for e in ctx.entries[1:]:
                _trim_messages(e)
        head = ctx.entries[0]
        room = max(0, budget - (ctx.estimate() - head.tokens)) * 3
        if last_resort and note and room <= len(SUMMARY_PREFIX) + len(note) + 40:
            note = _rejection_note(findings, ledger, short=True)
        if last_resort and note and room <= len(SUMMARY_PREFIX) + len(note) + 40:
            note = ""
        if room > len(SUMMARY_PREFIX) + len(note) + 40:
            keep = room - 20 - len(SUMMARY_PREFIX) - len(note)
            head.messages = [Message("user", SUMMARY_PREFIX + kept[:keep] + "\n[cut]" + note)]
            head.tokens = tokens.estimate_message(head.messages[0])


async def compact_context(run: CompactHost, budget: int) -> None:
    """Compact `run.ctx` until the next request fits `budget` tokens."""
    ctx = run.ctx
    before = ctx.estimate()
    keep = int(budget * 0.35)
    older, recent = ctx.split(keep)
    # The latest round (its calls and results, its continuation and whatever came after
    # it) is always kept verbatim, even when it alone is over `keep`: the model must see
    # what it has just done. Only older history is summarised.
    n_latest = latest_round_entries(ctx.entries)
    start = len(ctx.entries) - (n_latest or 1)
    if len(older) > start or not older:
        # The most recent round alone is over `keep`, or everything fits in it while the
        # request does not: fold all that came before the latest round.
        older, recent = ctx.entries[:start], ctx.entries[start:]
    if not older:
        raise errors.UserError(
            f"the context budget of {budget} tokens is too small for this task's system "
            "prompt and tools; raise context.input_budget_tokens in the spec"
        )
    ledger_text = ledger_view.render(run.view.ledger, header="GOAL LEDGER")
    system = COMPACT_INSTRUCTIONS + "\n\n" + ledger_text
    fixed = tokens.estimate_text(system) + 200
    room_chars = max(2000, (budget - fixed) * 3)
    prior = "\n\n".join(m.content for e in older if e.kind == "summary" for m in e.messages)
    body = ""
    if prior:
        body += "Earlier summary:\n" + prior[-room_chars // 3 :] + "\n\n"
    body += "Transcript to compress:\n" + transcript(
        [e for e in older if e.kind != "summary"], room_chars - len(body)
    )
    request = ModelRequest(
        purpose="compact",
        system=system,
        messages=(Message("user", body),),
        max_output_tokens=max(256, budget // 8),
        task_id=run.journal.task_id,
    )
    failpoints.hit("during_compaction")
    model = run.calls.models.compact or run.calls.models.actor
    events: list[ev.Event] = []
    fallback = False
    try:
        response = await run.calls.call_model(model, request)
        summary = response.text.strip()
        events.append(await run.calls.record_call("compact", model, request, response, None))
    except errors.ModelError as exc:
        summary = _mechanical_summary(older)
        fallback = True
        events.append(
            ev.AuditWarning(code="compaction_fallback", message=f"compressor failed: {exc}")
        )
    if not summary:
        summary, fallback = _mechanical_summary(older), True
    max_chars = max(800, int(budget * 0.15) * 3)
    summary = summary[:max_chars]
    findings, by = await _read_claims(run, summary, fallback, events)
    claimed = list(findings.items)
    note = ""
    if findings:
        unfinished = [
            d.id for d, s in run.view.ledger.items() if str(s.status) not in FINISHED_STATUSES
        ]
        events.append(
            ev.AuditWarning(
                code="summary_claims_done",
                message=f"the compaction summary claims {findings.describe()}, which the "
                "ledger does not record; the claim was not accepted",
                details={
                    "items": claimed,
                    "global": findings.global_phrase,
                    "unfinished": unfinished,
                    "found_by": by,
                },
            )
        )
        # The next request must say that the claim was refused, next to the true ledger.
        note = _rejection_note(findings, run.view.ledger)
    kept = summary
    ctx.entries = [Entry("summary", [Message("user", SUMMARY_PREFIX + kept + note)]), *recent]
    # A compaction breaks the cached prefix anyway: start a new epoch with the current
    # ledger at the tail of the system prompt.
    ctx.system = render_system(run.view.spec, run.view.ledger)
    run.view.state.system_blob = run.journal.stage_blob(ctx.system.encode())
    run.view.state.system_version = run.view.task.version
    run.view.state.system_at = run.view.clock.now()
    _fit(ctx, budget, kept, note, findings, run.view.ledger, older)
    if ctx.estimate() > budget:
        raise errors.UserError(
            f"the context budget of {budget} tokens cannot hold this task's system prompt, "
            f"tools and a summary ({ctx.estimate()} tokens needed); raise "
            "context.input_budget_tokens in the spec"
        )
    snapshot = {
        "entries": [
            {"kind": e.kind, "round": e.round, "messages": [m.to_dict() for m in e.messages]}
            for e in ctx.entries
        ]
    }
    blob = run.journal.stage_blob(history.pack(snapshot))
    summary_blob = run.journal.stage_blob(summary.encode())
    run.view.state.ctx_blob = blob
    run.view.state.ctx_after_seq = run.view.state.last_seq
    run.view.state.compactions += 1
    upto = max((e.round or 0) for e in older) if older else 0
    events.append(
        ev.ContextCompacted(
            summary_blob=summary_blob,
            rounds_compacted=sum(1 for e in older if e.kind == "round"),
            upto_round=upto,
            tokens_before=before,
            tokens_after=ctx.estimate(),
            claimed_done=claimed,
            fallback=fallback,
        )
    )
    # The summary is an artifact too, so `search_artifacts` finds what it says after
    # later compactions have folded it away (its id is fixed by the compaction count,
    # so a compaction redone after a crash writes the same one).
    summary_art = ArtifactRecord(
        artifact_id=f"{run.journal.task_id}.summary{run.view.state.compactions}",
        task_id=run.journal.task_id,
        kind="summary",
        name=f"summary of rounds up to {upto}",
        blob_hash=summary_blob,
        size=len(summary),
        source="compaction",
        task_version=run.view.task.version,
    )
    await run.journal.write(Commit(events, artifacts=[summary_art]))
