"""Progress measured from what a round did, not from what a judge attached to it.

A round *moves* its focus item when it did something new for it:

- a successful call never seen before for the item: the tool, its arguments and a hash
  of its result, so re-reading a file that changed, or re-running the tests after an
  edit, is new information, and the same call with the same result is not;
- a failure not seen before for the item: a call failing for the first time with a
  message the item never met (its own arguments taken out: a WAF naming another rule),
  or the same wall met by another call (a guessed path is not there, the tests fail
  this way; `FRESH_FAILURES` of those per item, in rounds that repeat nothing they did
  before), one that failed before and now fails
  differently ("3 failed" then "2 failed" is convergence), or one failing the same way
  after the item's world changed (a successful call of a tool that is not `read`-only
  with something new: another edit, then the same test failing the same way, is another
  attempt at the bug, not the same call repeated; the same edit again changes nothing);
- a `done_when` rule check whose unmet state changed: the rule's file changed, its
  command says something else, more artifacts count toward its `min_count`.

Words alone move nothing. A round without failures that asks again what can change by
itself (a `volatile` read: a build's status, a queue; or such a read's "not now",
`errors.RetryLater`, once its retries ran out) and hears the same answer is *waiting*:
it moves nothing but clears the item's count of rounds without progress; the item's
rounds cap (`limits.max_rounds_per_item`) ends a wait that never ends. Re-reading what
only the task changes (its workspace files) and hearing the same is no progress, until
the item started work of its own (`started`: a build, a script, a shell, which may go on
writing the workspace): then a workspace read heard or failing as before is waiting too.

What a round did is kept as short fingerprints per item
(`RunState.seen`, stored with every commit), so the same judgement is made after a crash,
on resume and in a replay; each round only adds its own fingerprints to its item's set.

Failures are compared by what they say with the volatile parts taken out (`normalise`):
timestamps, durations, addresses, temporary paths, request and op ids, retry counts.
Counts that carry meaning (how many tests failed, a line number) are kept.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Final, Protocol

from tether.models.base import direct_init
from tether.volatile_text import normalise

#: Fingerprints kept per item: far more than an item's rounds produce (`max_rounds_per_item`
#: rounds of a few calls), a bound on what the run state carries.
MAX_SEEN: Final = 1_000


def digest(*parts: str) -> str:
    """A short, stable fingerprint of some parts (16 hex characters)."""
    # Each part, then the separator: one string encoded and hashed at once (the same
    # bytes as a part at a time; the separator is ASCII, so `replace` acts alike).
    data = "\x1f".join(parts) + "\x1f" if parts else ""
    return hashlib.sha256(data.encode("utf-8", errors="replace")).hexdigest()[:16]


def result_hash(content: str, artifact_hash: str | None = None) -> str:
    """What a successful call returned: the stored output's hash when a long output went
    to an artifact, else the normalised text."""
    if artifact_hash:
        return digest("blob", artifact_hash)
    return digest("text", normalise(content))


def failure_hash(
    error_class: str | None,
    error: str | None,
    args: Mapping[str, Any] | None = None,
    name: str = "",
) -> str:
    """What a failure said: its class and its normalised message, with the call's own
    words taken out where the message repeats them (its text arguments and their keys,
    `args`; the tool's `name`; a malformed call's raw text, passed as an argument):
    "no such file: a.txt" and "no such file: b.txt" say the same of the world, as do "no
    tool named helper_1" and "... helper_2"; "blocked by rule 942100" and "blocked by
    rule 941100" do not (`moves`: a new wall is news)."""
    text = error or ""
    if text and (args or name):
        words = _texts(args) if args else set()
        if len(name) >= 3:
            words.add(name)
        for value in sorted(words, key=len, reverse=True):
            text = text.replace(value, "<arg>")
    return digest(error_class or "", normalise(text))


def call_words(arguments: Mapping[str, Any] | None, raw: str) -> Mapping[str, Any]:
    """What `failure_hash` takes out of a call's failure: its arguments, or the raw text
    of arguments that were no JSON object."""
    return arguments if arguments is not None else {"raw": raw}


def _texts(value: Any, out: set[str] | None = None) -> set[str]:
    """The strings of three characters or more in arguments, keys too (nested ones)."""
    out = set() if out is None else out
    if isinstance(value, str):
        if len(value) >= 3:
            out.add(value)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            if isinstance(k, str) and len(k) >= 3:
                out.add(k)
            _texts(v, out)
    elif isinstance(value, list | tuple):
        for v in value:
            _texts(v, out)
    return out


def failure_key(
    focus: str | None,
    tool: str,
    args_hash: str,
    error_class: str | None,
    error: str | None,
    changed: int = 0,
) -> str:
    """The key of a repeated failure: the item, the call (tool and arguments), the
    failure (class and normalised message) and the item's changes before it (`changes`).
    The same call failing the same way again, with nothing changed in between, is the
    same key; failing differently, or after a change, is another."""
    key = f"{focus}|{tool}|{args_hash[-16:]}|{error_class}|{failure_hash(error_class, error)}"
    return f"{key}|{changed}" if changed else key


def _tag(count: int) -> tuple[str, ...]:
    """What a fingerprint adds for a count it is keyed by (nothing for 0: the
    fingerprints of an item without changes, or before any compaction, stay as they
    were)."""
    return (str(count),) if count else ()


class CallFact(Protocol):
    """What progress looks at in one call of a round."""

    @property
    def tool(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def args_hash(self) -> str: ...

    @property
    def result_hash(self) -> str: ...

    @property
    def effect(self) -> str: ...

    @property
    def volatile(self) -> bool: ...

    @property
    def shifting(self) -> bool: ...

    @property
    def error_class(self) -> str | None: ...


#: tether's own tools (`tether.tools.builtin`): a change by any other tool with an effect
#: (a build, a script, a shell, an MCP server's tool) is the task's own work, which may go
#: on writing the workspace after the call returned (`started`).
TETHER_TOOLS: Final = frozenset(
    {
        "list_files",
        "read_file",
        "write_file",
        "append_file",
        "read_artifact",
        "ledger_items",
        "read_source",
        "search_artifacts",
        "record_claim",
        "record_evidence",
        "write_report",
        "write_report_section",
    }
)
#: tether's reads of the workspace: what they show changes by the task's own work only.
WORKSPACE_READS: Final = frozenset({"read_file", "list_files"})
#: tether's reads of the task's own bookkeeping (its checklist): consulted between steps,
#: the same answer again repeats nothing the round did for its item.
BOOKKEEPING: Final = frozenset({"ledger_items"})
#: The mark of an item whose rounds started work of the task's own (`started`).
_STARTED: Final = "&"


def own_work(tool: str, effect: str, status: str) -> bool:
    """Whether a call started work of the task's own that may change the workspace by
    itself: a succeeded call with an effect of a tool that is not tether's."""
    return status == "succeeded" and effect != "read" and tool not in TETHER_TOOLS


def started(seen: Collection[str]) -> bool:
    """Whether an item's rounds started work of the task's own (`own_work`): from then on
    a read of the workspace may hear something new, or find a file missing, without the
    item doing anything (a background build writing its log, a job's output file not
    there yet), so asking again is waiting, as with a `volatile` read."""
    return _STARTED in seen


#: The first character of a change mark (`moves`): never a hex digit, so the marks of an
#: item's changes are told from its other fingerprints, and counted (`changes`).
_CHANGE: Final = "~"
#: Calls failing for the first time that count as news for an item (a few guessed paths,
#: a check narrowed down); past them a new failing call is no progress: padding.
FRESH_FAILURES: Final = 4
#: The first character of the mark of a first-time failure that counted as news.
_FRESH: Final = "!"


def changes(seen: Collection[str]) -> int:
    """How many different changes an item's rounds made (its change marks in `seen`):
    the failures of a call are compared within the same count only."""
    hit = _CHANGES.get(id(seen))
    if hit is not None and hit[0] is seen and hit[1] == len(seen):
        return hit[2]  # the count `remember` kept for the list it made (most rounds)
    return _count_changes(seen)


def _count_changes(marks: Iterable[str], first: str = _CHANGE) -> int:
    """How many of `marks` start with `first` (change marks by default)."""
    n = 0
    for m in marks:
        if m[:1] == first:
            n += 1
    return n


@direct_init
@dataclass(frozen=True)
class Moves:
    """What a round did for its item: `new` are the fingerprints that move it (empty: no
    progress), `marks` everything to remember, `repeated` whether a failure of the round
    had been seen before for the item (an attempt), `waiting` whether the round, doing
    nothing new, only asked again what can change by itself (`CallFact.volatile`), and
    `ruled` whether the item's rule check saw a state it had not seen before (measured
    progress toward the rule: a sync's count of files rising)."""

    new: tuple[str, ...]
    marks: tuple[str, ...]
    repeated: bool
    waiting: bool = False
    ruled: bool = False
    #: The round, doing nothing new and failing nothing, met a volatile tool's "not now"
    #: it had not heard from that call before (a sweep over several jobs through an
    #: outage): no progress, and not counted against the item; the rounds cap bounds it.
    held: bool = False

    @property
    def moved(self) -> bool:
        """True when the round did something new for its item."""
        return bool(self.new)


def moves(
    calls: Iterable[CallFact],
    rule_state: str | None,
    seen: Collection[str],
    changed: int = 0,
    compactions: int = 0,
) -> Moves:
    """Compare a round's calls (and its item's rule check, when it has one and it is not
    met) with what the item has seen; `changed` is the item's count of changes before
    the round (`changes`), `compactions` the task's count of context compactions. Pure.

    A successful call of a tool that is not `read`-only leaves a change mark (`_CHANGE`
    and its fingerprint) instead of its fingerprint. What was read, and how calls
    failed, is keyed by the compactions too: the summary took it from the model, so
    reading it or trying it again after a compaction is new to the model; a change
    stays a change.

    A round without failures, one of its calls a `volatile` read asked again with the
    same answer, is `waiting` when it has nothing new."""
    new: list[str] = []
    marks: list[str] = []
    repeated = False
    memory = _tag(compactions)
    polled = False  # a volatile read answered as before
    failed = False
    stale = False  # a call made before with the same outcome
    fresh: list[str] = []  # calls failing for the first time, as others did before
    walls: list[str] = []  # calls failing for the first time, as nothing did before
    working = _STARTED in seen  # the task's own work may be writing the workspace
    held = False  # a volatile tool's "not now" heard for the first time
    for c in calls:
        kind = _volatile(c, working, seen, marks, memory)
        if kind == "polled":
            polled = True  # a "not now" heard before: waiting
            continue
        if kind == "held":
            held = True
            continue
        volatile = kind == "volatile"
        if c.status == "succeeded" or volatile:
            if c.effect != "read":
                fp = _CHANGE + digest("ok", c.tool, c.args_hash, c.result_hash)[1:]
                if c.status == "succeeded" and fp not in seen and fp not in marks:
                    changed += 1  # the item's world changed (not by this change again)
                if not working and own_work(c.tool, c.effect, c.status):
                    working = True
                    marks.append(_STARTED)
            else:
                fp = digest("ok", c.tool, c.args_hash, c.result_hash, *memory)
            marks.append(fp)
            if fp not in seen:
                new.append(fp)
            elif volatile:
                polled = True  # asked again, the same answer (a volatile write too)
            elif c.tool not in BOOKKEEPING:
                stale = True  # (the checklist consulted again is no repeat of the work)
            continue
        failed = True
        if c.status != "deferred":  # a call an open breaker held back did nothing
            kind, fail = _failure(c, seen, marks, changed, memory)
            if kind == "repeated":
                repeated = True
            elif kind == "changed":
                new.append(fail)
            else:
                (fresh if kind == "fresh" else walls).append(fail)
    ruled = rule_state is not None and _rule_moved(rule_state, seen, marks, new)
    if (fresh or walls) and not (stale or repeated):
        # A call failing for the first time tells something (a guessed path is not
        # there, the tests fail this way), unless the round also repeats what it did
        # before: padding with ever-new failing calls is no progress. A wall the item
        # never met is news each time; the same wall met by another call, a few times
        # per item.
        new += walls
        room = FRESH_FAILURES - _count_changes(seen, _FRESH)
        counted = [_FRESH + f[1:] for f in fresh[: max(0, room)]]
        new += counted
        marks += counted
    quiet = not failed and not new
    return Moves(
        tuple(dict.fromkeys(new)),
        tuple(dict.fromkeys(marks)),
        repeated,
        polled and quiet,
        ruled,
        held and quiet,
    )


def _rule_moved(rule_state: str, seen: Collection[str], marks: list[str], new: list[str]) -> bool:
    """Whether the item's unmet rule check says something new (added to `new`), after
    a check already made for the item; its marks added to `marks`."""
    checked = digest("rule")
    state = digest("rule", rule_state)
    marks += [checked, state]
    if checked in seen and state not in seen:
        new.append(state)
        return True
    return False


def _volatile(
    c: CallFact, working: bool, seen: Collection[str], marks: list[str], memory: tuple[str, ...]
) -> str:
    """How `moves` takes a call whose answer may change by itself (a `volatile` tool, or
    a workspace read or a read of a volatile tool that failed (`CallFact.shifting`) once
    the item's own work may be writing the workspace or running a job): "volatile"
    (an answer, maybe asked again) or "plain" (not such a call). Such a read that failed
    (its retries ran out: "not now", the log not there yet) is "polled" when the item
    heard this answer to this call before (it is waiting); heard for the first time, a
    volatile tool's "not now" is "held" (a sweep over several jobs through an outage),
    and another failure (a workspace read's, a volatile read's "job 7 not ready") "plain":
    a failure (a wall, or one of the item's
    fresh ones), so ever-new guessed paths are not news without end. Its mark is added
    to `marks`."""
    volatile = c.volatile or (working and (c.shifting or c.tool in WORKSPACE_READS))
    # A failure that is a "not now" (`CallFact.volatile`) is one of a write too: a
    # service that said when to come back (a 503 with `Retry-After` in maintenance).
    if not volatile or c.status == "succeeded" or (c.effect != "read" and not c.volatile):
        return "volatile" if volatile else "plain"
    fp = digest("ok", c.tool, c.args_hash, c.result_hash, *memory)
    heard = fp in seen or fp in marks
    marks.append(fp)
    if heard:
        return "polled"
    return "held" if c.volatile else "plain"


def _failure(
    c: CallFact, seen: Collection[str], marks: list[str], changed: int, memory: tuple[str, ...]
) -> tuple[str, str]:
    """What a failing call is for its item (`moves`), with its fingerprint; its marks are
    added to `marks`. "repeated": it failed this way before (since the same changes);
    "changed": the same call failing differently; "wall": a new call meeting a wall the
    item never met (its message, the call's own arguments taken out, not seen before: a
    WAF naming another rule); "fresh": a new call meeting a known wall, one of the
    item's `FRESH_FAILURES`."""
    # A call to a tool the task does not have names no tool: ever-new names are one.
    tool = "" if c.error_class == "not_permitted" else c.tool
    call = digest("call", tool, c.args_hash, *memory)
    # A failure is keyed by the changes made before it (none: as it always was).
    fail = digest("fail", tool, c.args_hash, c.result_hash, *_tag(changed), *memory)
    marks += [call, fail]
    if fail in seen:
        return "repeated", fail
    if call in seen:
        return "changed", fail
    wall = digest("wall", tool, c.result_hash, *memory)
    known = wall in seen or wall in marks
    marks.append(wall)
    return ("fresh" if known else "wall"), fail


#: The set of each list `remember` returned lately, by the list's id: an item's marks
#: are looked up (`moves`) and added to (`remember`) every round, and a set of a
#: thousand of them built afresh twice a round cost more than the rest of the audit.
#: An entry holds its list (the id cannot be reused while it lives) and serves only
#: while the list has the length it had: a list `remember` returned is replaced, never
#: changed in place (`RunState.marks_write` relies on it too). Lists without duplicates
#: only (the set's size is the list's length).
_SETS: dict[int, tuple[Collection[str], set[str]]] = {}
#: Lists whose set is kept (a few runs judged in turn in one process).
_SETS_MAX: Final = 32


#: The count of change marks (`changes`) of each list `remember` returned lately, by the
#: list's id, as (list, its length, count): an item's marks reach a thousand, and a
#: scan of them every round cost more than the rest of its audit.
_CHANGES: dict[int, tuple[Collection[str], int, int]] = {}


def seen_set(seen: Collection[str]) -> AbstractSet[str]:
    """`set(seen)`, from the sets `remember` kept for the lists it returned (read-only:
    the set is the cache's)."""
    hit = _SETS.get(id(seen))
    if hit is not None and hit[0] is seen and len(hit[1]) == len(seen):
        return hit[1]
    return set(seen)


def remember(seen: Sequence[str], marks: Iterable[str]) -> list[str]:
    """An item's fingerprints with a round's marks added (oldest dropped past `MAX_SEEN`).
    Always a new list (`RunState.marks_write` tells a changed list by its identity)."""
    # Taken out of the cache, whether it serves or not: the set is changed below and
    # then belongs to the new list.
    counted = changes(seen)
    hit = _SETS.pop(id(seen), None)
    if hit is not None and hit[0] is seen and len(hit[1]) == len(seen):
        have = hit[1]
    else:
        have = set(seen)
        if len(have) != len(seen):  # duplicates (not written by `remember`): no cache
            return _remember_plain(seen, marks)
    added: list[str] = []
    for m in marks:
        if m not in have:
            have.add(m)
            added.append(m)
    over = len(seen) + len(added) - MAX_SEEN
    if over > len(seen):  # more new marks than are kept: the first of them go too
        have.difference_update(seen)
        have.difference_update(added[: over - len(seen)])
        out = added[over - len(seen) :]
        counted = _count_changes(out)
    else:
        # One list made (the kept part of `seen`, then the new marks at its end).
        kept = seen[over:] if over > 0 else seen
        out = kept if type(kept) is list and kept is not seen else list(kept)
        if over > 0:
            have.difference_update(seen[:over])
            counted -= _count_changes(seen[:over])
        out += added
        counted += _count_changes(added)
    if len(_SETS) >= _SETS_MAX:
        del _SETS[next(iter(_SETS))]
    _SETS[id(out)] = (out, have)
    if len(_CHANGES) >= _SETS_MAX:
        del _CHANGES[next(iter(_CHANGES))]
    _CHANGES[id(out)] = (out, len(out), counted)
    return out


def _remember_plain(seen: Sequence[str], marks: Iterable[str]) -> list[str]:
    """`remember` as it was first written (the reference for a list with duplicates)."""
    have = set(seen)
    out = list(seen)
    for m in marks:
        if m not in have:
            have.add(m)
            out.append(m)
    return out[-MAX_SEEN:]


__all__ = [
    "MAX_SEEN",
    "CallFact",
    "Moves",
    "changes",
    "digest",
    "failure_hash",
    "failure_key",
    "moves",
    "normalise",
    "remember",
    "result_hash",
    "seen_set",
]
