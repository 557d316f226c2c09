"""What a plain round's judging no longer does gives what doing it gave.

- `progress.digest` hashes its parts joined at once: the digest of a part at a time.
- `progress.normalise` tests each pattern's needles inline: the text the regexes alone
  make (no substring test at all).
- A run's record of its own commits keeps nothing until an index first asks for it
  (`own.own_commits`); a window reaching back before then is a hole (the store is read).
- `Ledger.current_milestone` is kept per ledger: the milestone of `next_item`.
- The rule judge walks the contract's items with a rule only (`scope.ruled_items`).
- A store's last number per task (`store._latest`), which spares the judge its read of
  what came after the run's last commit, is never below a number committed through it.
"""

from __future__ import annotations

import hashlib
import random
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from tether import events as ev
from tether import ledger as L
from tether import volatile_text as V
from tether.runtime.judge.rules import own, scope
from tether.runtime.round import progress as P
from tether.spec import parse_spec
from tether.store import _latest
from tether.store._latest import Latest
from tether.store.base import CommitResult


def _digest_reference(*parts: str) -> str:
    """`progress.digest` as it was written: each part, then the separator, fed in turn."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode("utf-8", errors="replace"))
        h.update(b"\x1f")
    return h.hexdigest()[:16]


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.text(), max_size=5))
def test_digest_is_the_digest_of_a_part_at_a_time(parts: list[str]) -> None:
    assert P.digest(*parts) == _digest_reference(*parts)


def test_digest_of_lone_surrogates_and_no_parts() -> None:
    for parts in [(), ("",), ("\ud83d", "x"), ("a\x1f", "b"), ("a", "\x1fb")]:
        assert P.digest(*parts) == _digest_reference(*parts)
    assert P.digest("a\x1f", "b") == P.digest("a", "\x1fb")  # as before: one byte stream


def _normalise_reference(text: str) -> str:
    """`normalise` with every pattern applied (no needle or shape test to skip one)."""
    out = text[: V._MAX_CHARS]
    for pattern, repl in V._VOLATILE:
        out = pattern.sub(repl, out)
    return " ".join(out.split())


_PIECES = st.sampled_from(
    [
        "gave up after 3 attempts",
        "attempt 2 of 5",
        "task-1.r3.c0.out",
        "2026-12-06T08:45:00Z",
        "12:34:56",
        "Sun, 06 Dec 2026 <time> GMT",
        "0xdeadbeef",
        "0123456789abcdef0123",
        "request_id=abc123",
        "/tmp/pytest-of-me/pytest-3/x",
        "pid 4242",
        "1733474700.5",
        "took 35 ms",
        "localhost:8080",
        "3 failed, 2 passed",
        "  \t\n",
        "K\u212a",
        "plain words",
    ]
)


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(_PIECES, max_size=6), glue=st.sampled_from([" ", "", "\n", "-", ":"]))
def test_normalise_is_the_patterns_applied_in_turn(pieces: list[str], glue: str) -> None:
    text = glue.join(pieces)
    assert P.normalise(text) == _normalise_reference(text)


class _Run:
    """Something a record can be kept for (by weak reference)."""


def _events(n: int) -> list[ev.Event]:
    return [ev.OpDispatched(op_id=f"o{k}") for k in range(n)]


def test_a_runs_record_keeps_its_commits_from_the_first_ask_on() -> None:
    run = _Run()
    record = own.recording(run)
    record.add(CommitResult(1, 2), _events(2), [])
    assert not record.commits  # no index asked yet: nothing kept
    assert own.own_commits(run) is record
    record.add(CommitResult(3, 4), _events(2), [])
    win = record.window(2, 4)
    assert win is not None and [e.seq for e in win.events] == [3, 4]
    # Numbers from before the first ask are not known here: the store is read.
    assert record.window(0, 4) is None
    assert own.own_commits(_Run()) is None


def test_a_record_made_directly_keeps_every_commit() -> None:
    record = own.OwnCommits(own.CHANGE_EVENTS)
    record.add(CommitResult(1, 2), _events(2), [])
    assert record.window(0, 2) is not None


@settings(max_examples=100, deadline=None)
@given(
    milestones=st.lists(st.sampled_from([None, "m1", "m2"]), min_size=1, max_size=8),
    changes=st.lists(
        st.tuples(st.integers(0, 7), st.sampled_from(["in_progress", "blocked", "pending"]))
    ),
)
def test_the_kept_milestone_is_that_of_the_next_item(
    milestones: list[str | None], changes: list[tuple[int, str]]
) -> None:
    n = len(milestones)
    ledger = L.from_spec("o", [(f"i{k}", f"I{k}", m) for k, m in enumerate(milestones)])
    for pos, status in [(-1, ""), *changes]:
        if pos >= 0:
            change = L.ItemChange(f"i{pos % n}", status=status)  # type: ignore[arg-type]
            ledger = L.apply(ledger, [change]).ledger
        for _ in range(2):  # made, then kept
            nxt = ledger.next_item()
            want = ledger.definition(nxt).milestone if nxt else None
            assert ledger.current_milestone() == want


def test_the_rule_judge_walks_the_items_with_a_rule() -> None:
    spec = parse_spec(
        {
            "name": "t",
            "objective": "o",
            "items": [
                {"id": "a", "title": "A"},
                {"id": "b", "title": "B", "done_when": {"kind": "op", "tool": "t"}},
                {"id": "c", "title": "C"},
                {"id": "d", "title": "D", "done_when": {"kind": "file", "path": "x.txt"}},
            ],
        }
    )
    assert [i.id for i in scope.ruled_items(spec)] == ["b", "d"]
    assert [i.id for i in scope.ruled_items(spec, {"d", "a", "zz"})] == ["d"]
    assert [i.id for i in scope.ruled_items(spec, set())] == []
    assert not scope.fingerprinted(spec)
    plain = parse_spec({"name": "t", "objective": "o", "items": [{"id": "a", "title": "A"}]})
    assert scope.ruled_items(plain) == () and scope.ruled_items(plain, {"a"}) == ()


def test_the_last_number_is_known_only_with_no_commit_under_way() -> None:
    latest = Latest()
    assert latest.get("a") is None  # never committed through it
    with latest.committing("a") as done:
        done(CommitResult(1, 3))
        assert latest.get("a") is None  # under way
    assert latest.get("a") == 3
    latest.note("a", 2)  # a commit told late: the highest is kept
    assert latest.get("a") == 3
    try:
        with latest.committing("a"):
            raise TimeoutError  # stored or not: its number is unknown
    except TimeoutError:
        pass
    latest.note("a", 9)
    assert latest.get("a") == _latest.UNKNOWN  # never taken for the last


@settings(max_examples=300, deadline=None)
@given(
    commits=st.lists(st.tuples(st.sampled_from("abc"), st.booleans()), max_size=30),
    seed=st.integers(0, 2**32),
)
def test_the_last_number_is_never_below_one_committed(
    commits: list[tuple[str, bool]], seed: int
) -> None:
    """Commits under way at once end in any order, some fail (stored or not), and tasks
    are forgotten past `KEEP`: a task's number, when known, is its highest committed."""
    rnd = random.Random(seed)
    latest = Latest()
    top: dict[str, int] = {}
    under_way: list[tuple[_latest._Committing, str, int, bool]] = []

    def end_one() -> None:
        cm, _, seq, fails = under_way.pop(rnd.randrange(len(under_way)))
        if fails:
            cm.__exit__(TimeoutError, TimeoutError(), None)
        else:
            cm(CommitResult(seq, seq))
            cm.__exit__(None, None, None)
        for t, highest in top.items():
            got = latest.get(t)
            assert got is None or got in (highest, _latest.UNKNOWN)

    with mock.patch.object(_latest, "KEEP", 2):
        for task, fails in commits:
            cm = latest.committing(task).__enter__()
            top[task] = top.get(task, 0) + 1  # the database numbers it (failed or not)
            under_way.append((cm, task, top[task], fails))
            while under_way and rnd.random() < 0.5:
                end_one()
        while under_way:
            end_one()
