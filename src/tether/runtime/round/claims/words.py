"""The wording a summary's completion claims come in: done-words and open-words per item,
whole-task phrases, hedges, and the splits of a summary into sentences and clauses.

Regexes and word sets only, for `claims` (the claim reader) and `claims.names` (the
task's own items and vocabulary). Case-insensitive matching is done by lower-casing the
text first. The two large ones (`phrase_pattern`, `global_claim_patterns`, ~8 ms to
compile) are compiled when a summary is first read, not when a run starts.
"""

from __future__ import annotations

import functools
import re

_WORD = r"[\w'-]+"
NAME_START = r"(?<![\w/.\\-])"  # no word, path or dotted-name character before
NAME_END = r"(?![\w/\\-]|\.\w)"  # ...nor after ("out/i1.txt" does not mention i1)
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
def phrase_pattern(extra_done: str = "") -> re.Pattern[str]:
    """The per-item status vocabulary, with the task's own done-words (`extra_done`, an
    alternation such as "catalogued|fetched") among the done-words."""
    both = _DONE_BOTH + (f"|{extra_done}" if extra_done else "")
    return re.compile(
        rf"{NAME_START}(?P<both>{both}){NAME_END}|{NAME_START}(?P<post>{_DONE_POST}){NAME_END}|"
        rf"(?P<mark>[✅✔✓])|(?P<pre>{_CHECKED})|(?P<openmark>[{_UNCHECKED}⬜❌⏳])|"
        rf"{NAME_START}(?P<open>{_OPEN_WORDS}){NAME_END}"
    )


def wordset(words: str) -> frozenset[str]:
    return frozenset(words.split())


# Words that, shortly before a done-word, make it not a claim: negation, hedging,
# conditions, plans, and reported speech ("the actor claimed i3 was done").
HEDGES = wordset(
    "not no never cannot yet almost nearly mostly partially partly half barely hardly if "
    "once until unless whether before when will would should must could might can may "
    "need needs needed to get awaiting without nor neither ensure sure verify check "
    "confirm claimed claims claim said says reported thought believed assumed wrongly "
    "falsely supposedly allegedly pretended expected hope hoped plan planned nothing none "
    "zero 0"
)
NEGATED_AFTER = re.compile(r"\s*(?:[:=?]\s*)?(?:false|no|not|never|0)(?![\w])")

# Whole-task vocabulary.
DONE_G = (
    r"(?:done|complete|completed|finished|resolved|delivered|handled|accomplished|achieved|"
    r"succeeded|closed|fulfilled|met|satisfied|written|implemented|wrapped up|"
    r"taken care of|checked off|ticked off)"
)
NOUNS = (
    r"(?:items?|tasks?|subtasks?|steps?|files?|todos?|to-dos?|milestones?|goals?|"
    r"objectives?|deliverables?|requirements?|entries|things|parts|pieces|work|jobs?|"
    r"checklist(?: items?)?|ledger items?|of them|of it)"
)
_COPULA = (
    r"(?:,? (?:have|has|had|are|were|is|was|got|now|all|been|also|already|fully|"
    r"successfully|completely|each|individually|finally|officially|therefore|thus))*"
)
EXCEPT = (
    r"(?:except(?: for)?|but(?: not)?|apart from|other than|besides|save for|excluding|"
    r"aside from|with the exception of|minus)"
)


# (pattern, kind). "weak": counts only in a sentence that names no item, where it cannot
# be about one item ("i3 is fully completed" is a per-item claim). "verb": not when an
# item is its subject ("i1 completed all its steps"). "else": claims every item but the
# ones the line names ("i3 is open, everything else is done").
@functools.lru_cache(maxsize=64)
def global_claim_patterns(
    done_g: str = DONE_G, nouns: str = NOUNS, extra: str = "", subjects: str = ""
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
                rf"(?P<exc> {EXCEPT} [^.;!?]{{1,80}}?)?{_COPULA} {done_g}\b",
                "strong",
            ),
            # everything is done / everything finished / all the work is complete
            (
                rf"\b(?:everything|all (?:the )?work)(?: (?:in|on|from) (?:the |this |our )?"
                rf"{_WORD})?(?:'s)?(?P<exc> {EXCEPT} [^.;!?]{{1,80}}?)?{_COPULA} {done_g}\b",
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


RATIO = (
    re.compile(
        r"\b(\d+)\s*(?:/|of|out of)\s*(\d+)(?: [\w'-]+){0,2}? (?:are |were |have been |is )?"
        r"(?:done|complete|completed|finished)\b"
    ),
    re.compile(
        r"\b(?:done|completed|complete|finished)\s*[:=]?\s*(\d+)\s*(?:/|of|out of)\s*(\d+)\b"
    ),
)
BARE = frozenset(
    {"done", "complete", "completed", "finished", "all done", "task complete", "task done"}
)
CONDITIONAL_START = re.compile(
    r"\s*(?:when|whenever|once|if|as soon as|until|unless|only when|only once)\b"
)
GLOBAL_HEDGES = HEDGES | {"far", "whenever", "wait", "waiting", "until"}
GLOBAL_NOT_AFTER = re.compile(
    r"\s*(?:\?|(?:when|once|if|only|after|as soon as|until|unless|yet)\b)"
)
OBJECT_AFTER = re.compile(r"\s*(?:to do |to be done )?(?:for|on|of|in|with|about|regarding|at)\b")

_BULLET = re.compile(r"^\s*(?:[-*+•·]|\d+[.)])\s+")
SENTENCE = re.compile(r"(?<=[.!?])\s+|\s*;\s*")
SOFT = re.compile(r"\s*,\s*|\s+[-–—]+\s+|\s*\|\s*")
HARD = re.compile(r"\s+(?:but|while|whereas|however|although|though|whilst)\s+")
LABEL = re.compile(
    rf"(?:(?:not|still|yet|to|in|left|now|so|far|work|items?)\s+)*{_WORD}:(?=\s|$)"
    rf"|[{_CHECKED}{_UNCHECKED}]"
)
_JOINERS = wordset("and or the of to with are is were was have has been & plus")
LIST_JOINERS = wordset("and or & plus")
FILLER = wordset("and or & plus also both as well items item the")


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
    # `expand_ranges`, which drops the ones left.
    text = re.sub(r"(?<=\w)\s*(?:->|=>)\s*(?=\w)", " → ", text)
    text = re.sub(r"->|=>|[()\[\]{}\"]", " ", text)
    return re.sub(r"\s+", " ", text).strip(), heading, bullet


def logical_lines(summary: str) -> list[tuple[str, bool, bool]]:
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


def words_of(text: str) -> list[str]:
    return re.findall(rf"[\w']+|[{_CHECKED}{_UNCHECKED}✅✔✓⬜❌⏳]", text)
