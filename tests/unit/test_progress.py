"""Progress facts (`tether.runtime.round.progress`): what makes a round new for its item, and
when two failures are the same failure."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether import volatile_text as V
from tether.runtime.judge.judges import OpSummary
from tether.runtime.round import progress as P
from tether.runtime.run.state import RunState

# --- normalise: the same failure says the same thing, a different one does not -----------


@pytest.mark.parametrize(
    ("first", "again"),
    [
        (
            "1 failed, 2 passed in 0.12s",
            "1 failed, 2 passed in 3.40s",
        ),
        (
            "HTTP 503 Service Unavailable (request id 7f3a9c2e-1b4d-4e8f-9a6b-3c2d1e0f9a8b)",
            "HTTP 503 Service Unavailable (request id 0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d)",
        ),
        ("x-request-id: abc123XYZ rate limited", "x-request-id: zz99QQ rate limited"),
        ("timeout at 2026-12-04T23:12:53.123Z", "timeout at 2026-12-05T00:01:02Z"),
        ("lock held since 10:02:03", "lock held since 11:59:59.5"),
        ("<Conn object at 0x7f6290089ac0> closed", "<Conn object at 0x7f62900f7ee0> closed"),
        (
            "cannot open /tmp/pytest-of-ci/pytest-12/test_x0/out.txt",
            "cannot open /tmp/pytest-of-ci/pytest-13/test_x1/out.txt",
        ),
        ("worker pid 41234 died", "worker pid 5120 died"),
        ("deadline 1796426931.42 passed", "deadline 1796427000.01 passed"),
        ("connect 127.0.0.1:54321 refused", "connect 127.0.0.1:40001 refused"),
        (
            "sha 9f86d081884c7d659a2feaa0c55ad015 mismatch",
            "sha 2c26b46b68ffc68ff99b453c1d304134 mismatch",
        ),
        ("see t6b134ab1638239.r5.c0.out", "see t6b134ab1638239.r9.c2.out"),
        ("boom (gave up after 3 attempts)", "boom (gave up after 5 attempts)"),
        ("boom  \n  twice", "boom twice"),
    ],
)
def test_volatile_parts_do_not_make_a_new_failure(first: str, again: str) -> None:
    assert P.normalise(first) == P.normalise(again)
    assert P.failure_hash("deterministic", first) == P.failure_hash("deterministic", again)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("3 failed, 0 passed in 0.10s", "2 failed, 1 passed in 0.10s"),
        ("2 failed, 1 passed", "1 failed, 2 passed"),
        ("FAILED test_parse.py::test_dates", "FAILED test_render.py::test_dates"),
        ("SyntaxError at line 12", "SyntaxError at line 14"),
        ("no such file: a.txt", "permission denied: a.txt"),
        ("HTTP 503", "HTTP 429"),
    ],
)
def test_a_failure_that_says_something_else_is_another_failure(before: str, after: str) -> None:
    assert P.normalise(before) != P.normalise(after)
    assert P.failure_key("i", "run_tests", "h", "deterministic", before) != P.failure_key(
        "i", "run_tests", "h", "deterministic", after
    )


def test_the_failure_key_holds_item_call_and_failure() -> None:
    key = P.failure_key("fix", "run_tests", "a" * 64, "deterministic", "1 failed in 0.1s")
    assert key.startswith(f"fix|run_tests|{'a' * 16}|deterministic|")
    # The same failure of another item, another call or another class is another key.
    assert key != P.failure_key("other", "run_tests", "a" * 64, "deterministic", "1 failed")
    assert key != P.failure_key("fix", "run_tests", "b" * 64, "deterministic", "1 failed")
    assert key != P.failure_key("fix", "run_tests", "a" * 64, "transient", "1 failed")
    assert key == P.failure_key("fix", "run_tests", "a" * 64, "deterministic", "1 failed in 9s")


@given(st.text(max_size=300))
def test_normalise_is_idempotent_and_total(text: str) -> None:
    once = P.normalise(text)
    assert P.normalise(once) == once


#: `progress._VOLATILE` as the fingerprints of stored runs were made with (before the
#: epoch and duration patterns were rewritten to start at their digit): `normalise` must
#: keep giving what these give, or a resumed task's judgement would change.
_REFERENCE: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\(?gave up after \d+ attempts?\)?", re.I), "(gave up)"),
    (re.compile(r"\battempt \d+( of \d+)?\b", re.I), "attempt <n>"),
    (re.compile(r"\b[\w-]+\.r\d+\.c\d+(?:\.[A-Za-z]\w*)?\b"), "<op>"),
    (
        re.compile(
            r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?"
            r"(?:Z|[+-]\d{2}:?\d{2})?)?"
        ),
        "<time>",
    ),
    (re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b"), "<time>"),
    (
        re.compile(r"\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d{1,2} \w{3} \d{4} <time>(?: GMT)?"),
        "<time>",
    ),
    (
        re.compile(
            r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
        ),
        "<id>",
    ),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<addr>"),
    (re.compile(r"\b[0-9a-fA-F]{12,}\b"), "<hex>"),
    (
        re.compile(
            r"\b((?:x-)?(?:request|req|trace|correlation|span)[-_ ]?id)\b([\"']?\s*[:=]?\s*)"
            r"[\"']?[\w.:/+-]+",
            re.I,
        ),
        r"\1\2<id>",
    ),
    (
        re.compile(
            r"(?:/private)?(?:/tmp|/var/tmp|/var/folders|/dev/shm)/[^\s'\",;:)\]]*"
            r"|[A-Za-z]:\\[^\s'\",;]*\\Temp\\[^\s'\",;:)\]]*"
        ),
        "<tmp>",
    ),
    (re.compile(r"\bpytest-of-[^\s/]+/pytest-\d+"), "<tmp>"),
    (re.compile(r"\b(pid|process|thread)([ =:#]+)\d+\b", re.I), r"\1\2<n>"),
    (re.compile(r"\b1\d{9}(?:\d{3})?(?:\.\d+)?\b"), "<epoch>"),
    (
        re.compile(
            r"\b\d+(?:\.\d+)?\s?(?:ms|msec|milliseconds?|s|secs?|seconds?|us|µs|ns|"
            r"mins?|minutes?)\b",
            re.I,
        ),
        "<duration>",
    ),
    (re.compile(r"\b((?:127\.0\.0\.1|localhost|0\.0\.0\.0|\[::1\])):\d{2,5}\b"), r"\1:<port>"),
]


def _every_pattern(text: str) -> str:
    # `normalise` as it first read: every reference pattern in order, no pre-test, and
    # the whitespace collapsed by a regex.
    out = text[:20_000]
    for pattern, repl in _REFERENCE:
        out = pattern.sub(repl, out)
    return re.sub(r"\s+", " ", out).strip()


def test_the_reference_is_the_patterns_less_the_rewritten_ones() -> None:
    # The reference above is the old code: only the epoch and duration patterns changed.
    now = [(p.pattern, p.flags, r) for p, r in V._VOLATILE]
    then = [(p.pattern, p.flags, r) for p, r in _REFERENCE]
    assert [i for i, (a, b) in enumerate(zip(now, then, strict=True)) if a != b] == [13, 14]


#: Pieces that make the volatile patterns match, glued into texts by the property below.
_PIECES = [
    "gave up after 3 attempts",
    "(Gave Up After 2 attempt)",
    "ATTEMPT 2 of 5",
    "t6b1.r3.c0.out",
    "2026-12-04T23:12:53.123Z",
    "10:02:03",
    "Mon, 04 Dec 2026 10:02:03 GMT",
    "7f3a9c2e-1b4d-4e8f-9a6b-3c2d1e0f9a8b",
    "0x7f6290089ac0",
    "9f86d081884c7d659a2f",
    "X-Request-Id: abc123",
    "span_id=zz",
    "/tmp/a/b",
    "/var/folders/x/y",
    "/dev/shm/q",
    "C:\\Users\\me\\AppData\\Local\\Temp\\x.txt",
    "pytest-of-ci/pytest-12",
    "PID 41234",
    "thread#7",
    "1796426931.42",
    "12 ms",
    "3.5 Seconds",
    "localhost:8080",
    "[::1]:5432",
    "\u212a",  # the Kelvin sign: `k` to a case-insensitive pattern
    "proce\u017fs 12",  # a long s: `s` to a case-insensitive pattern
    " ",
    "\n",
    "-",
    ":",
    # where a rewritten pattern or a pre-test could differ: a word character before
    # digits, Unicode digits and whitespace, hex runs about 12 long
    "x1796426931",
    "_12 ms",
    "\u0661\u0662 ms",
    "1\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0660",
    "deadbeefcafe",
    "deadbeefcaf",
    "\u00e9deadbeefcafe1",
    "\x1c",
    "\xa0",
    "\u2028",
    "\u3000",
    "\x85",
]


@given(st.lists(st.sampled_from(_PIECES) | st.text(max_size=8), max_size=12))
def test_normalise_skips_only_patterns_that_cannot_match(parts: list[str]) -> None:
    text = "".join(parts)
    assert P.normalise(text) == _every_pattern(text)


@pytest.mark.parametrize("piece", _PIECES)
def test_normalise_gives_what_the_old_code_gave_on_each_piece(piece: str) -> None:
    for text in (piece, f"a {piece} b", f"a{piece}b", f"{piece}\n{piece}"):
        assert P.normalise(text) == _every_pattern(text)


@given(st.text(alphabet="0123456789abcdefAFgxMSs._ :-\n\t\x1c\xa0\u2028\u0663\u212a\u017f\u00e9"))
def test_normalise_gives_what_the_old_code_gave_on_digits_hex_and_spaces(text: str) -> None:
    assert P.normalise(text) == _every_pattern(text)


def test_normalise_reads_a_bounded_prefix() -> None:
    huge = "x" * 100_000
    assert len(P.normalise(huge)) <= 20_000


# --- moves: what makes a round new for its item --------------------------------------------


@dataclass(frozen=True)
class Call:
    tool: str
    status: str
    args_hash: str
    result_hash: str = ""
    effect: str = "read"
    volatile: bool = False
    error_class: str | None = None
    shifting: bool = False


OK = Call("read_file", "succeeded", "args-a", "result-1")
OK_CHANGED = Call("read_file", "succeeded", "args-a", "result-2")
OTHER = Call("read_file", "succeeded", "args-b", "result-1")
FAIL = Call("run_tests", "failed", "args-t", "3 failed")
FAIL_CHANGED = Call("run_tests", "failed", "args-t", "2 failed")
DEFERRED = Call("ticket", "deferred", "args-x", "")


def seen_after(*rounds: tuple[tuple[Call, ...], str | None]) -> list[str]:
    seen: list[str] = []
    for calls, rule in rounds:
        seen = P.remember(seen, P.moves(calls, rule, seen).marks)
    return seen


def test_a_new_successful_call_moves_and_the_same_one_again_does_not() -> None:
    first = P.moves([OK], None, ())
    assert first.moved and not first.repeated
    seen = P.remember([], first.marks)
    assert not P.moves([OK], None, seen).moved
    # The same call with another result, or another call, is new.
    assert P.moves([OK_CHANGED], None, seen).moved
    assert P.moves([OTHER], None, seen).moved


def test_words_only_and_held_back_calls_move_nothing() -> None:
    assert P.moves([], None, ()) == P.Moves((), (), False)
    assert P.moves([DEFERRED], None, ()) == P.Moves((), (), False)


POLL = Call("build_status", "succeeded", "args-41", "running", volatile=True)
POLL_PASSED = Call("build_status", "succeeded", "args-41", "passed", volatile=True)


def test_asking_again_what_changes_by_itself_is_waiting_not_a_move() -> None:
    first = P.moves([POLL], None, ())
    assert first.moved and not first.waiting
    seen = P.remember([], first.marks)
    for _ in range(30):
        again = P.moves([POLL], None, seen)
        assert not again.moved and again.waiting and not again.repeated
        seen = P.remember(seen, again.marks)
    # The answer changed: a move, not a wait.
    done = P.moves([POLL_PASSED], None, seen)
    assert done.moved and not done.waiting
    # Beside the poll, re-reading the same file waits too; a new read moves.
    seen = P.remember(seen, P.moves([OK], None, seen).marks)
    assert P.moves([POLL, OK], None, seen).waiting
    assert P.moves([POLL, OTHER], None, seen).moved


def test_a_poll_beside_a_failure_or_nothing_polled_is_no_wait() -> None:
    seen = seen_after(((POLL, OK, FAIL, edit("x")), None))
    # The same edit again (a `sleep` declared as a write) beside a poll is waiting too;
    # a failure beside it is not waiting on the world.
    assert P.moves([POLL, edit("x")], None, seen).waiting
    assert not P.moves([POLL, FAIL], None, seen).waiting
    assert not P.moves([POLL, edit("y")], None, seen).waiting  # a new change moves
    # A workspace file read again (not volatile) is no progress, never waiting.
    assert not P.moves([OK], None, seen).waiting
    # Words only, or a call held back, are not waiting either.
    assert not P.moves([], None, seen).waiting
    assert not P.moves([DEFERRED], None, seen).waiting
    # After a compaction the poll's answer is new to the model: it moves.
    assert P.moves([POLL], None, seen, compactions=1).moved


def test_failures_first_is_a_move_changed_is_a_move_same_again_is_an_attempt() -> None:
    # A call failing for the first time tells something (the path is not there).
    first = P.moves([FAIL], None, ())
    assert first.moved and not first.repeated
    seen = P.remember([], first.marks)
    again = P.moves([FAIL], None, seen)
    assert not again.moved and again.repeated
    changed = P.moves([FAIL_CHANGED], None, seen)
    assert changed.moved and not changed.repeated


def test_first_time_failures_are_news_a_few_times_and_never_beside_a_repeat() -> None:
    seen = seen_after(((OK,), None))
    # Each guess fails alike ("no such file: <arg>": the path it names is its own).
    guesses = [Call("read_file", "failed", f"path-{k}", "no such file <arg>") for k in range(9)]
    moved = []
    for g in guesses:
        m = P.moves([g], None, seen)
        moved.append(m.moved)
        seen = P.remember(seen, m.marks)
    # The first meets a wall the item never met; `FRESH_FAILURES` more guessed paths are
    # news; past them, more of the same are padding.
    fresh = P.FRESH_FAILURES
    assert moved == [True] * (1 + fresh) + [False] * (9 - 1 - fresh)
    # Beside a call repeated with the same outcome, a first failure is no news.
    fresh = Call("run_tests", "failed", "args-k", "1 failed")
    assert not P.moves([OK, fresh], None, seen_after(((OK,), None))).moved
    assert P.moves([fresh], None, seen_after(((OK,), None))).moved


def test_a_new_call_meeting_a_wall_never_met_is_news_past_the_fresh_failures() -> None:
    """Payloads against a WAF, each refused by another rule: every refusal says something
    new of the world, however many; the same wall met again by another payload is one of
    the item's few fresh failures."""
    seen = seen_after(((OK,), None))
    for k in range(P.FRESH_FAILURES + 4):
        payload = Call("probe", "failed", f"payload-{k}", f"403 blocked by rule 94{k}100")
        m = P.moves([payload], None, seen)
        assert m.moved and not m.repeated, k
        seen = P.remember(seen, m.marks)
    walls = [Call("probe", "failed", f"again-{k}", "403 blocked by rule 940100") for k in range(9)]
    moved = []
    for w in walls:
        m = P.moves([w], None, seen)
        moved.append(m.moved)
        seen = P.remember(seen, m.marks)
    assert moved == [True] * P.FRESH_FAILURES + [False] * (9 - P.FRESH_FAILURES)


def test_a_failure_hash_leaves_out_the_calls_own_text_arguments() -> None:
    missing = [
        P.failure_hash("deterministic", f"no such file: {p}", {"path": p})
        for p in ("a.txt", "notes/b.md", "deep/c/d.json")
    ]
    assert len(set(missing)) == 1
    refused = [
        P.failure_hash("deterministic", f"HTTP 403: blocked by rule {r}", {"q": f"' OR {n}=1--"})
        for n, r in ((1, 942100), (2, 941100))
    ]
    assert refused[0] != refused[1]  # the rule named is the world's answer, not the call's
    # Nested arguments, and short ones left alone (a one-letter value is in every message).
    assert P.failure_hash("x", "bad id abc-42 in batch", {"req": {"ids": ["abc-42"]}}) == (
        P.failure_hash("x", "bad id <arg> in batch")
    )
    assert P.failure_hash("x", "a is 1", {"v": "a"}) == P.failure_hash("x", "a is 1")
    # The tool's own name, an argument's key and a malformed call's raw text too.
    names = [
        P.failure_hash("not_permitted", f"there is no tool named {n!r}", {}, n)
        for n in ("helper_1", "helper_22")
    ]
    keys = [
        P.failure_hash("deterministic", f"unknown argument {k!r}", {k: 1})
        for k in ("opt_1", "opt_2")
    ]
    raws = [
        P.failure_hash("malformed", f"not JSON: {r}", P.call_words(None, r))
        for r in ('{"content": "draft 1', '{"content": "draft 22')
    ]
    assert len(set(names)) == len(set(keys)) == len(set(raws)) == 1


def test_a_volatile_reads_not_now_is_waiting_not_a_failure() -> None:
    later = Call("index_status", "failed", "args-i", "still indexing", volatile=True)
    first = P.moves([later], None, ())
    # Heard for the first time: held (not news, not a failure: a sweep over several
    # jobs through an outage is not blocked for it), bounded by the item's cap.
    assert first.held and not first.moved and not first.repeated and not first.waiting
    seen = P.remember([], first.marks)
    for _ in range(5):
        again = P.moves([later], None, seen)
        assert again.waiting and not again.moved and not again.repeated and not again.held
        seen = P.remember(seen, again.marks)


def test_a_workspace_reads_first_failure_after_own_work_is_a_failure() -> None:
    """After the item's own work, a workspace read failing for the first time is a
    failure (a wall, then fresh ones: guessed paths end), not held; heard again, waiting."""
    seen = seen_after(((BUILD,), None))
    first = P.moves([MISSING], None, seen)
    assert first.moved and not first.held and not first.waiting  # a wall: news once
    seen = P.remember(seen, first.marks)
    again = P.moves([MISSING], None, seen)
    assert again.waiting and not again.moved


BUILD = Call("start_build", "succeeded", "args-b", "started", effect="write")
MISSING = Call("read_file", "failed", "args-out", "no such file: out/report.csv")


#: A volatile read failing deterministically ("not ready": `ToolFailed`, not "not now").
NOT_READY = Call("job_result", "failed", "args-j7", "job 7 not ready", shifting=True)


def test_a_volatile_reads_failure_after_own_work_is_waiting_when_heard_again() -> None:
    """The job's result asked for after starting the job: its "not ready" is a failure
    the first time (a wall: news once), waiting after; before any own work it is the
    same failure repeated (a loop), as any other call's."""
    seen = seen_after(((BUILD,), None))
    first = P.moves([NOT_READY], None, seen)
    assert first.moved and not first.held and not first.waiting
    seen = P.remember(seen, first.marks)
    for _ in range(5):
        again = P.moves([NOT_READY], None, seen)
        assert again.waiting and not again.moved and not again.repeated
        seen = P.remember(seen, again.marks)
    idle = seen_after(((NOT_READY,), None))
    assert P.moves([NOT_READY], None, idle).repeated
    assert not P.moves([NOT_READY], None, idle).waiting
    # A read tool that says its answers change only by the task (`volatile=False`) is
    # not `shifting`: its failure after own work repeats, as before.
    fixed = Call("job_result", "failed", "args-j7", "job 7 not ready")
    assert P.moves([fixed], None, seen_after(((BUILD,), None), ((fixed,), None))).repeated


def test_after_the_item_started_its_own_work_a_workspace_read_heard_again_is_waiting() -> None:
    # Without work of its own: the same read is no progress, the same failure repeats.
    seen = seen_after(((OK, MISSING), None))
    assert not P.moves([OK], None, seen).waiting
    assert P.moves([MISSING], None, seen).repeated
    # A build of its own started (in an earlier round, or earlier in the same round).
    started = seen_after(((BUILD,), None), ((OK, MISSING), None))
    assert P.started(started) and not P.started(seen)
    for calls in ([OK], [MISSING], [OK, MISSING]):
        again = P.moves(calls, None, started)
        assert again.waiting and not again.moved and not again.repeated, calls
    assert P.moves([BUILD, OK], None, seen).marks.count("&") == 1
    # What the build wrote at last is news; a read tether does not know, a failure of
    # another tool, or a change by tether's own writer does not count as the item's work.
    assert P.moves([OK_CHANGED], None, started).moved
    assert not P.moves([FAIL], None, seen_after(((BUILD, FAIL), None))).waiting
    custom = Call("query_db", "succeeded", "args-q", "3 rows", volatile=False)
    assert not P.moves([custom], None, seen_after(((BUILD, custom), None))).waiting
    assert not P.started(seen_after(((edit("x"),), None)))
    failed_build = Call("start_build", "failed", "args-b", "no compiler", effect="write")
    assert not P.started(seen_after(((failed_build,), None)))


def test_tethers_own_tools_are_the_built_in_registry() -> None:
    from tether.tools.builtin.files import default_registry

    names = set(default_registry(lambda: None, env={}).names())  # type: ignore[arg-type, return-value]
    assert names == P.TETHER_TOOLS
    assert names >= P.WORKSPACE_READS


def edit(content: str) -> Call:
    return Call("write_file", "succeeded", f"args-{content}", "wrote", effect="write")


def test_the_same_failure_after_an_edit_is_another_attempt_not_a_repeat() -> None:
    # A stubborn bug: edits that do not change the failure, then the right one.
    seen = seen_after(((FAIL,), None))
    for k in range(5):
        m = P.moves([edit(f"try {k}"), FAIL], None, seen, P.changes(seen))
        assert m.moved and not m.repeated, k
        seen = P.remember(seen, m.marks)
    assert P.changes(seen) == 5
    # The edit and the test in rounds of their own count alike.
    m = P.moves([edit("try 5")], None, seen, P.changes(seen))
    seen = P.remember(seen, m.marks)
    m = P.moves([FAIL], None, seen, P.changes(seen))
    assert m.moved and not m.repeated


def test_the_same_edit_again_changes_nothing_and_its_failure_repeats() -> None:
    seen = seen_after(((edit("a"), FAIL), None))
    again = P.moves([edit("a"), FAIL], None, seen, P.changes(seen))
    assert not again.moved and again.repeated
    # A read-only call between two failures is no change either.
    seen = P.remember(seen, again.marks)
    read = P.moves([OTHER, FAIL], None, seen, P.changes(seen))
    assert read.repeated


def test_failure_keys_start_again_after_a_change() -> None:
    key = P.failure_key("fix", "run_tests", "h" * 16, "ToolFailed", "1 failed")
    assert P.failure_key("fix", "run_tests", "h" * 16, "ToolFailed", "1 failed", 0) == key
    after = P.failure_key("fix", "run_tests", "h" * 16, "ToolFailed", "1 failed", 1)
    assert after != key and after.startswith(key)


def test_after_a_compaction_what_was_read_is_new_and_a_change_is_not() -> None:
    seen = seen_after(((OK, FAIL), None), ((edit("a"),), None))
    assert P.changes(seen) == 1
    # Reading again is new to the model; the same failure is a first one again.
    after = P.moves([OK, FAIL], None, seen, P.changes(seen), compactions=1)
    assert after.moved and not after.repeated
    # The same edit is still no change, after a compaction too.
    assert not P.moves([edit("a")], None, seen, P.changes(seen), compactions=1).moved
    # Within the new epoch, the same read again is no progress.
    seen = P.remember(seen, after.marks)
    assert not P.moves([OK], None, seen, P.changes(seen), compactions=1).moved


def test_a_rule_check_moves_only_when_its_state_changed() -> None:
    seen = seen_after(((), "artifacts: 1 of 3"))
    assert not P.moves([], "artifacts: 1 of 3", seen).moved
    assert P.moves([], "artifacts: 2 of 3", seen).moved
    # The first check of an item is no change yet.
    assert not P.moves([], "file out/a.txt: missing", ()).moved


def test_a_converging_series_moves_every_round() -> None:
    seen: list[str] = []
    runs = [Call("run_tests", "failed", "t", f"{n} failed") for n in (3, 2, 1)]
    moved = []
    for call in [*runs, Call("run_tests", "succeeded", "t", "3 passed")]:
        m = P.moves([call], None, seen)
        moved.append((m.moved, m.repeated))
        seen = P.remember(seen, m.marks)
    assert moved == [(True, False), (True, False), (True, False), (True, False)]


def test_remember_keeps_order_without_repeats_and_is_bounded() -> None:
    assert P.remember(["a", "b"], ["b", "c", "a", "d"]) == ["a", "b", "c", "d"]
    many = P.remember([], [str(n) for n in range(P.MAX_SEEN + 50)])
    assert len(many) == P.MAX_SEEN and many[-1] == str(P.MAX_SEEN + 49)


@given(
    st.lists(
        st.lists(
            st.builds(
                Call,
                st.sampled_from(["read_file", "run_tests"]),
                st.sampled_from(["succeeded", "failed", "deferred"]),
                st.sampled_from(["a", "b"]),
                st.sampled_from(["r1", "r2"]),
            ),
            max_size=3,
        ),
        max_size=12,
    )
)
def test_a_round_repeated_at_once_never_moves(rounds: list[list[Call]]) -> None:
    """Whatever came before, doing exactly the same round again brings nothing new."""
    seen: list[str] = []
    for calls in rounds:
        seen = P.remember(seen, P.moves(calls, None, seen).marks)
        assert not P.moves(calls, None, seen).moved


# --- the round's op summaries carry what progress compares -------------------------------


def test_op_summaries_derive_their_hashes_when_not_given() -> None:
    a = OpSummary("t.r1.c0", "read_file", {"path": "a"}, "succeeded", "hello")
    b = OpSummary("t.r2.c0", "read_file", {"path": "a"}, "succeeded", "hello")
    c = OpSummary("t.r3.c0", "read_file", {"path": "a"}, "succeeded", "hello, changed")
    assert a.args_hash == b.args_hash and a.result_hash == b.result_hash
    assert a.result_hash != c.result_hash
    f1 = OpSummary("t.r1.c1", "x", {}, "failed", error="1 failed in 0.2s", error_class="d")
    f2 = OpSummary("t.r2.c1", "x", {}, "failed", error="1 failed in 0.9s", error_class="d")
    assert f1.result_hash == f2.result_hash
    seen = P.remember([], P.moves([a], None, ()).marks)
    assert not P.moves([b], None, seen).moved and P.moves([c], None, seen).moved


def test_seen_and_item_rounds_survive_the_stored_state() -> None:
    st_ = RunState()
    st_.seen["fix"] = ["aa", "bb"]
    st_.item_rounds["fix"] = 7
    back = RunState.from_dict(st_.to_dict())
    assert back.seen == {"fix": ["aa", "bb"]} and back.item_rounds == {"fix": 7}
    # Rows written before these fields existed read as empty.
    old = {k: v for k, v in st_.to_dict().items() if k not in ("seen", "item_rounds")}
    assert RunState.from_dict(old).seen == {} and RunState.from_dict(old).item_rounds == {}


@given(
    st.text(alphabet="0123456789 \t\x0b\x1c\x1fmsunMSUNiecotdx._:\u00b5\u017f\u0663", max_size=60)
)
def test_normalise_gives_what_the_old_code_gave_on_digits_and_units(text: str) -> None:
    # The `<epoch>` and `<duration>` pre-tests (`_SHAPES`): ten digits in a row, a digit
    # then at most one whitespace character then a unit's first letter.
    assert P.normalise(text) == _every_pattern(text)


@pytest.mark.parametrize(
    "text",
    [
        "12ms",
        "12 MS",
        "3\tsec",
        "3\x1cs",
        "4  s",
        "5 min",
        "6\nus",
        "7 ns",
        "1796426931",
        "179642693",
        "x1796426931",
        "1796426931123.5",
        "8 µs",
        "9 ſ",
        "took 1.5 seconds",
    ],
)
def test_normalise_gives_what_the_old_code_gave_on_units(text: str) -> None:
    for t in (text, f"a {text} b", f"{text}.{text}"):
        assert P.normalise(t) == _every_pattern(t)


@given(st.text(alphabet="0123456789:-.,TZ+ x", max_size=40))
def test_normalise_gives_what_the_old_code_gave_on_dates_and_clock_times(text: str) -> None:
    # The ISO date and clock time pre-tests (`_SHAPES`): `dddd-dd-dd`, `d:dd:dd`.
    assert P.normalise(text) == _every_pattern(text)


@pytest.mark.parametrize(
    "text",
    [
        "2024-01-02",
        "2024-01-02T10:11:12Z",
        "2024-01-02 10:11:12.5+02:00",
        "12:30:45",
        "1:02:03,5",
        "12:3:45",
        "57:" + "x" * 40,
        '{"a": 1, "b": "2024-1-02"}',
        "x-y: 10:11",
    ],
)
def test_normalise_gives_what_the_old_code_gave_on_dates(text: str) -> None:
    for t in (text, f"a {text} b", f"{text}.{text}"):
        assert P.normalise(t) == _every_pattern(t)


@pytest.mark.parametrize(
    "text",
    ["", " ", "a", " a", "a ", "a b", "a  b", "a\tb", "a\x1fb", "a\x0bb", "a\r\nb", "a\x85b"],
)
def test_normalise_collapses_whitespace_as_the_old_code_did(text: str) -> None:
    # Text with nothing to collapse is returned as it is (its shape tells).
    for t in (text, f"{text}x", f"x{text}", f"{text}12 ms{text}"):
        assert P.normalise(t) == _every_pattern(t)


@given(st.text(alphabet=" \t\n\x0b\x0c\r\x1c\x1d\x1e\x1fab1", max_size=20))
def test_normalise_collapses_any_ascii_whitespace_as_the_old_code_did(text: str) -> None:
    assert P.normalise(text) == _every_pattern(text)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from(["~a", "~b", "b", "c", *map(str, range(40))]), max_size=30),
        max_size=60,
    )
)
def test_the_kept_count_of_changes_is_the_count_in_the_list(rounds: list[list[str]]) -> None:
    """`changes` of a list `remember` made (its kept count) equals a scan of the list,
    past `MAX_SEEN` too."""
    seen: list[str] = []
    for k, marks in enumerate(rounds):
        marks = [f"{m}{k % 7}" if m[0] == "~" else m for m in marks]
        seen = P.remember(seen, marks)
        assert P.changes(seen) == sum(1 for m in seen if m.startswith("~"))
    assert P.changes(list(seen)) == P.changes(seen)  # a copy: counted afresh
