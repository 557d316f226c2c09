"""The judge's per-round shortcuts give what the plain algorithms they replace gave.

- `progress.remember` keeps each list's set for the next round (`progress.seen_set`)
  instead of building it afresh: the same lists, and the same sets, as the plain
  `set(seen)` / `list(seen) + new` / `[-MAX_SEEN:]` of before.
- `OwnCommits` merges an op's stored record when an index reads the commit, not at
  each commit: the same windows as the merge made at each commit.
- The continuation of a ledger object is kept: the same text as building it again.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Iterable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether import events as ev
from tether import ledger as L
from tether.runtime.judge import verdicts
from tether.runtime.judge.rules import own
from tether.runtime.round import progress as P
from tether.runtime.round.context import continuation_message
from tether.store._rules import merge_op
from tether.store.base import CommitResult, OpRecord

# --- progress marks ---------------------------------------------------------------------


def _remember_reference(seen: Sequence[str], marks: Iterable[str], keep: int) -> list[str]:
    """`progress.remember` as it was written before its set was kept."""
    have = set(seen)
    out = list(seen)
    for m in marks:
        if m not in have:
            have.add(m)
            out.append(m)
    return out[-keep:]


_MARK = st.text(alphabet="abcdefgh", min_size=1, max_size=2)


@settings(max_examples=300, deadline=None)
@given(
    start=st.lists(_MARK, max_size=12),
    rounds=st.lists(st.lists(_MARK, max_size=9), max_size=12),
    keep=st.integers(min_value=1, max_value=12),
    stray=st.lists(st.booleans(), max_size=12),
)
def test_remember_and_seen_set_match_the_plain_algorithm(
    start: list[str], rounds: list[list[str]], keep: int, stray: list[bool]
) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(P, "MAX_SEEN", keep)
        fast: list[str] = list(start)  # may hold duplicates (a hand-written state)
        plain: list[str] = list(start)
        for n, marks in enumerate(rounds):
            assert P.seen_set(fast) == set(plain)
            if n < len(stray) and stray[n]:
                # Another list's turn in between (another run in the same process).
                P.remember(list(marks), marks)
            new_fast = P.remember(fast, marks)
            plain = _remember_reference(plain, marks, keep)
            assert new_fast == plain
            assert new_fast is not fast  # a changed list is a new list (`marks_write`)
            assert P.seen_set(new_fast) == set(plain)
            fast = new_fast
        # The list a round gave is not changed by the next round.
        before = list(fast)
        P.remember(fast, ["zz", "yy"])
        assert fast == before
        assert P.seen_set(fast) == set(before)


def test_remember_the_same_list_twice_gives_the_same_result() -> None:
    seen = P.remember([], ["a", "b"])
    first = P.remember(seen, ["c"])
    again = P.remember(seen, ["c"])  # the set went to `first`: built afresh, same answer
    assert first == again == ["a", "b", "c"]
    assert P.seen_set(seen) == {"a", "b"}


def test_moves_sees_the_marks_a_kept_set_holds() -> None:
    seen = P.remember([], [P.digest("ok", "t", "h", "r")])
    call = type(
        "Call",
        (),
        {"tool": "t", "status": "succeeded", "args_hash": "h", "effect": "read", "volatile": False},
    )()
    call.result_hash = "r"
    assert not P.moves([call], None, P.seen_set(seen)).moved
    call.result_hash = "r2"
    assert P.moves([call], None, P.seen_set(seen)).moved


# --- the run's own commits ------------------------------------------------------------


class _EagerCommits(own.OwnCommits):
    """`OwnCommits` as it was: the stored record merged at each commit."""

    def __init__(self, types: Iterable[str]) -> None:
        super().__init__(types)
        self.eager_first: OrderedDict[str, OpRecord] = OrderedDict()

    def add(self, res: CommitResult, events: Sequence[ev.Event], ops: Sequence[OpRecord]) -> None:
        intended = {e.op_id for e in events if isinstance(e, ev.OpIntended)}
        stored: dict[str, OpRecord | None] = {}
        for op in ops:
            base = self.eager_first.get(op.op_id)
            if base is None and op.op_id in intended and op.op_id not in stored:
                base = dataclasses.replace(op, result=None, error=None)
                self.eager_first[op.op_id] = base
                if len(self.eager_first) > own.KEEP_OPS:
                    self.eager_first.popitem(last=False)
            stored[op.op_id] = None if base is None else merge_op(base, op, base.updated_at)
        if res.last_seq < res.first_seq and not stored:
            return
        kept = [(res.first_seq + n, e) for n, e in enumerate(events) if e.TYPE in self.types]
        whole = res.last_seq - res.first_seq + 1 == len(events)
        self.commits.append(own._Commit(res.first_seq, res.last_seq, whole, kept, stored))


def _op(op_id: str, status: str, at: float, outcome: int) -> OpRecord:
    return OpRecord(
        op_id=op_id,
        task_id="t",
        round=int(op_id[1:]),
        call_index=0,
        tool="tool",
        args={"n": op_id},
        args_hash="h" + op_id,
        effect="write",
        status=status,
        attempts=outcome,
        result={"content": f"r{outcome}"} if status == "succeeded" else None,
        error={"message": f"e{outcome}"} if status == "failed" else None,
        created_at=at,
        updated_at=at,
    )


_WRITE = st.tuples(
    st.sampled_from(["o1", "o2", "o3", "o4"]),
    st.sampled_from(["intended", "dispatched", "succeeded", "failed"]),
    st.integers(0, 3),
)
_COMMIT = st.tuples(
    st.lists(_WRITE, max_size=4),
    st.booleans(),  # an event of the store's own (the commit is not whole)
    st.booleans(),  # no events at all (ops written between two numbers)
)


@settings(max_examples=200, deadline=None)
@given(commits=st.lists(_COMMIT, max_size=10), looks=st.lists(st.integers(0, 12), max_size=4))
def test_own_commits_windows_match_the_merge_at_each_commit(
    commits: list[tuple[list[tuple[str, str, int]], bool, bool]], looks: list[int]
) -> None:
    types = (*own.CHANGE_EVENTS, *own.ARTIFACT_EVENTS)
    lazy, eager = own.OwnCommits(types), _EagerCommits(types)
    seq = 0
    for n, (writes, foreign, silent) in enumerate(commits):
        events: list[ev.Event] = []
        ops = []
        for op_id, kind, outcome in writes:
            status = "pending" if kind in ("intended", "dispatched") else kind
            ops.append(_op(op_id, status, float(n), outcome))
            if not silent:
                if kind == "intended":
                    events.append(ev.OpIntended(op_id=op_id, tool="tool"))
                else:
                    events.append(ev.OpDispatched(op_id=op_id))
        if silent:
            events = []
        res = CommitResult(seq + 1, seq + len(events) + (1 if foreign and events else 0))
        seq = max(seq, res.last_seq)
        for c in (lazy, eager):
            c.add(res, events, ops)
        for after in looks:
            assert lazy.window(after, seq) == eager.window(after, seq)
    for after in range(seq + 1):
        assert lazy.window(after, seq) == eager.window(after, seq)


# --- the continuation ---------------------------------------------------------------------


def test_a_kept_continuation_is_the_one_built_again() -> None:
    ledger = L.from_spec("Ship it", [("a", "A", None), ("b", "B", None)])
    done = L.complete(ledger, "a", ["op:x"]).ledger
    for led, reason, changed in [
        (ledger, "", []),
        (ledger, "", []),
        (ledger, "why", []),
        (done, "why", ["a"]),
        (done, "why", []),
        (ledger, "", []),
    ]:
        got = verdicts._continuation(led, reason, changed)
        assert got == continuation_message(led, reason, changed=changed)


# --- the focus item's change that changes nothing ---------------------------------------

_STATE = st.builds(
    L.ItemState,
    status=st.sampled_from(["pending", "in_progress", "blocked"]),
    evidence=st.lists(st.sampled_from(["op:a", "op:b"]), max_size=2, unique=True).map(tuple),
    attempts=st.integers(0, 3),
    breaker=st.integers(0, 3),
    note=st.sampled_from(["", "n"]),
)
_JUDGED = st.builds(
    L.ItemChange,
    item_id=st.sampled_from(["a", "b"]),
    status=st.sampled_from([None, "in_progress", "done", "pending"]),
    evidence=st.lists(st.sampled_from(["op:a", "op:c"]), max_size=2).map(tuple),
    note=st.sampled_from([None, "", "m"]),
)


@settings(max_examples=300, deadline=None)
@given(states=st.tuples(_STATE, _STATE), judged=st.lists(_JUDGED, max_size=3))
def test_leaving_out_a_change_that_changes_nothing_gives_the_same_update(
    states: tuple[L.ItemState, L.ItemState], judged: list[L.ItemChange]
) -> None:
    # What the audit leaves out: the focus item's change when the round neither failed
    # again nor moved its breaker (the judges' changes never touch the breaker).
    ledger = L.from_spec("o", [("a", "A", None), ("b", "B", None)])
    ledger = L.Ledger(ledger.skeleton, states, 3)
    noop = L.ItemChange("a", attempts_delta=0, breaker=ledger.item("a").breaker)
    try:
        with_noop = L.apply(ledger, [*judged, noop])
    except Exception as exc:  # an impossible change: refused the same way without it
        with pytest.raises(type(exc)):
            L.apply(ledger, judged)
        return
    without = L.apply(ledger, judged)
    assert without == with_noop
    assert without.ledger.version == with_noop.ledger.version
    if not judged:
        assert without.ledger is ledger and not without.diff


# --- the rule judge's open window ------------------------------------------------------


def _window_walk(ledger: L.Ledger, size: int) -> set[str]:
    """The walk `rule_scope` made every round before its window was kept."""
    found: set[str] = set()
    for d, s in ledger.items():
        if s.status in L.OPEN_STATUSES:
            found.add(d.id)
            if len(found) >= size:
                break
    return found


@settings(max_examples=100, deadline=None)
@given(
    statuses=st.lists(
        st.sampled_from(["pending", "in_progress", "done", "blocked", "skipped"]),
        min_size=1,
        max_size=80,
    ),
    changes=st.lists(st.tuples(st.integers(0, 79), st.sampled_from(["blocked", "pending"]))),
)
def test_the_kept_open_window_is_the_walk(
    statuses: list[str], changes: list[tuple[int, str]]
) -> None:
    from tether.runtime.judge.rules import scope

    n = len(statuses)
    base = L.from_spec("o", [(f"i{k}", f"I{k}", None) for k in range(n)])
    states = tuple(
        L.ItemState(status=s, evidence=("op:x",) if s == "done" else ())  # type: ignore[arg-type]
        for s in statuses
    )
    ledger = L.Ledger(base.skeleton, states, 1)
    for pos, status in [(-1, ""), *changes]:
        if pos >= 0:
            ledger = L.apply(ledger, [L.ItemChange(f"i{pos % n}", status=status)]).ledger  # type: ignore[arg-type]
        for _ in range(2):  # built, then kept
            assert set(scope.open_window(ledger)) == _window_walk(ledger, scope.RULE_WINDOW)
            assert (
                list(scope.open_window(ledger))
                == [d.id for d, s in ledger.items() if s.status in L.OPEN_STATUSES][
                    : scope.RULE_WINDOW
                ]
            )


# --- the op refs done items cite --------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.integers(0, 5),
            st.sampled_from(["done", "pending", "in_progress"]),
            st.sampled_from(["op:a", "op:b", "artifact:c", "op:d"]),
        ),
        max_size=12,
    )
)
def test_the_kept_cited_ops_are_the_walk(steps: list[tuple[int, str, str]]) -> None:
    from tether.ledger_tally import refs
    from tether.runtime.judge import rules

    ledger = L.from_spec("o", [(f"i{k}", f"I{k}", None) for k in range(6)])
    for pos, status, ref in [(0, "pending", "op:z"), *steps]:
        change = L.ItemChange(f"i{pos}", status=status, evidence=(ref,))  # type: ignore[arg-type]
        ledger = L.apply(ledger, [change]).ledger
        for _ in range(2):  # made, then kept
            items = ledger.skeleton.items
            want = {items[n].id: ops for n, ops in sorted(refs(ledger).done_ops.items())}
            cited, ids = rules._cited_ops(ledger), rules._cited_ids(ledger)
            assert list(cited.items()) == list(want.items())
            assert ids == {r[3:] for ops in want.values() for r in ops}
            walked = {
                d.id: tuple(r for r in s.evidence if r.startswith("op:"))
                for d, s in ledger.items()
                if s.status == "done"
            }
            assert cited == {k: v for k, v in walked.items() if v}


# --- the data an index reads of the run's own events ------------------------------------


def test_the_read_keys_of_the_kept_types_are_plain_fields() -> None:
    """`own.read_data` takes the fields as they are: for each kept type, each of those
    fields is a string, a list of strings or None (JSON-ready as it is), and no type
    changes its payload (`data`) or a field's serialization."""
    plain = {str, str | None, list[str]}
    for name in {*own.CHANGE_EVENTS, *own.ARTIFACT_EVENTS}:
        cls = ev.EVENT_TYPES[name]
        assert all("data" not in c.__dict__ for c in cls.__mro__[: cls.__mro__.index(ev.Event)])
        for key, field in cls.model_fields.items():
            if key in own.READ_KEYS:
                assert field.annotation in plain, (name, key)
                assert field.alias is None and field.serialization_alias is None
                assert not field.exclude, (name, key)


@pytest.mark.parametrize(
    "event",
    [
        ev.OpIntended(op_id="o1", tool="t", args={"item": "w1", "n": [1, {"a": None}]}),
        ev.OpResult(op_id="o2", tool="t", status="succeeded", artifact_id=None),
        ev.OpExhausted(op_id="o3", tool="t", attempts=2, policy="p", compensate=["a", "b"]),
        ev.OpCompensated(op_id="o4", by="o5"),
        ev.ApprovalClosed(request_id="o6.approval", reason="r", op_id=None),
        ev.ArtifactsInvalidated(artifacts=["x"], reason="r", ops=["o7"]),
        ev.ArtifactStored(artifact_id="a1", kind="k", name="n", blob="h", size=1),
    ],
)
def test_read_data_is_the_payload_cut_to_the_read_keys(event: ev.Event) -> None:
    want = {k: v for k, v in event.data().items() if k in own.READ_KEYS}
    assert own.read_data(event) == want


# --- the rule judge with nothing to check -----------------------------------------------


async def test_an_idle_rule_judge_gives_what_rule_verdict_gives() -> None:
    """`rules.idle` holds only when `rule_verdict` has nothing to look at: its verdict is
    then `rules.IDLE` (the judging skips the rule judge's environment); a `done_when`
    rule or a done item citing an op makes it not idle."""
    from tether.runtime.judge import rules
    from tether.runtime.tasks import ledger_from_spec
    from tether.spec import parse_spec

    plain = parse_spec({"name": "n", "objective": "o", "items": [{"id": "a", "title": "A"}]})
    ledger = ledger_from_spec(plain)
    assert rules.idle(plain, ledger)
    got = await rules.rule_verdict(plain, ledger, None)  # type: ignore[arg-type]
    assert got == rules.IDLE and dict(got.checks) == dict(rules.IDLE.checks) == {}
    done = L.complete(ledger, "a", ["op:x"]).ledger
    assert not rules.idle(plain, done)
    assert L.complete(ledger, "a", ["artifact:x"]).ledger is not ledger
    assert rules.idle(plain, L.complete(ledger, "a", ["artifact:x"]).ledger)
    ruled = parse_spec(
        {
            "name": "n",
            "objective": "o",
            "items": [{"id": "a", "title": "A", "done_when": {"kind": "op", "tool": "t"}}],
        }
    )
    assert not rules.idle(ruled, ledger_from_spec(ruled))
