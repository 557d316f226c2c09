"""Completion claims: what a compaction summary asserts as finished beyond the ledger.

The compressor is told not to turn pending work into done work, but it is a model: it
may still write "all items done" or "- [x] i3". `completion_claims` reads a summary the
way a later model would and reports what it asserts beyond the ledger. It is a heuristic
reader, tuned to flag claims in any ordinary wording and to stay quiet on honest
progress reports ("i1 is done; i3 is still pending"). When a judge model is configured,
`summary_audit_request` and `parse_summary_audit` give it a second reading.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from typing import Final, Literal

from tether.ledger import Ledger
from tether.models.base import ModelRequest
from tether.runtime.round.claims.names import (
    Mention,
    Names,
    expand_ranges,
    item_names,
    mentions_in,
)
from tether.runtime.round.claims.words import (
    BARE,
    CONDITIONAL_START,
    EXCEPT,
    FILLER,
    GLOBAL_HEDGES,
    GLOBAL_NOT_AFTER,
    HARD,
    HEDGES,
    LABEL,
    LIST_JOINERS,
    NEGATED_AFTER,
    OBJECT_AFTER,
    RATIO,
    SENTENCE,
    SOFT,
    logical_lines,
    words_of,
)

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


@dataclass(frozen=True)
class _Phrase:
    start: int
    end: int
    done: bool
    where: Literal["both", "post", "pre"]


def _phrases(text: str, mentions: list[Mention], phrase: re.Pattern[str]) -> list[_Phrase]:
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
        before = [w for w in words_of(head) if w not in LIST_JOINERS][-3:]
        negated = any(w in HEDGES or w.endswith("n't") for w in before) or bool(
            NEGATED_AFTER.match(text, m.end())
        )
        where: Literal["both", "post", "pre"] = (
            "post" if kind == "post" else "pre" if kind == "pre" else "both"
        )
        out.append(_Phrase(m.start(), m.end(), not negated, where))
    return out


def _pieces(sentence: str, names: Names) -> list[str]:
    """Split a sentence into clauses, each about its own items.

    Hard breaks: "but", "while"...; labels ("Remaining: i3") and checkboxes once an item
    was named before them. Soft breaks: commas, dashes, table bars. A piece that only
    lists items ("i1, i2 and i3 are done") joins its neighbour across a soft break.
    """
    # (soft break before it, text, lists items only)
    pieces: list[tuple[bool, str, bool]] = []
    for hard in HARD.split(sentence):
        for part in _split_labels(hard, names):
            for k, soft in enumerate(SOFT.split(part)):
                if soft.strip():
                    only = bool(mentions_in(soft, names)) and all(
                        w in FILLER for w in words_of(_strip_mentions(soft, names))
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


def _split_labels(text: str, names: Names) -> list[str]:
    """Split before a label or checkbox that follows a named item ("Done: i1 Left: i2")."""
    cuts = [0]
    for m in LABEL.finditer(text):
        start = m.start()
        before = text[cuts[-1] : start]
        # Not after a bare list of items: "i1 and i2 and i3: done" is one clause.
        listed = all(w in FILLER for w in words_of(_strip_mentions(before, names)))
        if (
            start > cuts[-1]
            and text[start - 1] == " "
            and mentions_in(before, names)
            and not listed
        ):
            cuts.append(start)
    return [text[a:b] for a, b in itertools.pairwise([*cuts, len(text)])]


def _strip_mentions(text: str, names: Names) -> str:
    for m in reversed(mentions_in(text, names)):
        text = text[: m.start] + " " + text[m.end :]
    return text


def _status_of(text: str, names: Names) -> bool | None:
    """A header's meaning for the list under it: True done, False open, None neither."""
    ps = _phrases(text, mentions_in(text, names), names.phrase)
    if any(not p.done for p in ps):
        return False
    return True if ps else None


def _item_claims(pieces: list[str], names: Names, header: bool | None, listed: bool) -> list[str]:
    """Items each piece calls done: the nearest status phrase decides, a phrase after the
    item winning a tie; with none, a listed item takes its section header's status."""
    claimed: list[str] = []
    for piece in pieces:
        mentions = mentions_in(piece, names)
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
                key = (len(words_of(gap)), 0 if after else 1, p.done)
                if best is None or key[:2] < best[:2]:
                    best = key
            done = best[2] if best is not None else bool(listed and header)
            if done and m.item not in claimed:
                claimed.append(m.item)
    return claimed


def _clause_before(sentence: str, pos: int) -> list[str]:
    """The last words of the clause that ends at `pos`."""
    head = re.split(r"[,;:]|\s[-–—]+\s", sentence[:pos])[-1]
    return words_of(head)[-4:]


def _hedged(sentence: str, m: re.Match[str]) -> bool:
    if GLOBAL_NOT_AFTER.match(sentence, m.end()):
        return True
    if m.start() > 0 and CONDITIONAL_START.match(sentence):
        return True  # "when every shelf is catalogued, the task is done": a condition
    return any(w in GLOBAL_HEDGES or w.endswith("n't") for w in _clause_before(sentence, m.start()))


def _global_claims(
    sentence: str, names: Names, line_items: list[str], header: bool
) -> list[tuple[str, list[str] | None]]:
    """`(phrase, exceptions)` per whole-task claim in one sentence, in text order;
    `exceptions` is None for a plain claim, else the items the claim leaves out ("all
    done except i3")."""
    out: list[tuple[int, str, list[str] | None]] = []
    named = bool(mentions_in(sentence, names))
    bare = " ".join(re.sub(r"[^\w' ]+", " ", sentence).split())
    if not named and not header and bare in BARE:
        out.append((0, bare, None))
    for ratio in RATIO:
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
    names: Names,
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
    if mentions_in(core, names):
        return None  # "all the work on i1 is done": about one item
    if kind == "verb" and mentions_in(sentence[: m.start()], names):
        return None  # "i1 completed all its steps": the subject is an item
    rest = sentence[m.end() :]
    if not exc_text:
        exc = re.match(rf"\s*,?\s*{EXCEPT}\b(.*)", rest)
        exc_text = exc.group(1) if exc else ""
    if exc_text:
        excepted = [x.item for x in mentions_in(exc_text, names)]
        # "all done except the review" names nothing: too vague to judge.
        return (phrase, excepted) if excepted else None
    if OBJECT_AFTER.match(rest) and mentions_in(rest[:80], names):
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
    names = item_names(ledger)
    status = {d.id: str(s.status) for d, s in ledger.items()}
    unfinished = [i for i, st in status.items() if st not in FINISHED_STATUSES]
    claimed: list[str] = []
    phrase: str | None = None
    header: bool | None = None
    for text, heading, bullet in logical_lines(summary):
        if not text:
            continue
        text = expand_ranges(text, names).replace("→", " ")
        line_items = [m.item for m in mentions_in(text, names)]
        is_header = (heading or text.endswith(":")) and not line_items
        for sentence in SENTENCE.split(text):
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
                    w in FILLER for w in words_of(_strip_mentions(sentence, names))
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
    names = item_names(ledger)
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
    from tether.runtime.judge.llm import json_request  # only when a summary is audited

    return json_request(
        "judge",
        SUMMARY_AUDIT_INSTRUCTIONS,
        payload,
        max_output_tokens=512,
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
