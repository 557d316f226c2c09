"""The counts a ledger carries from round to round (`ledger_tally`) are the counts a walk
over every item would find, after any sequence of changes."""

from __future__ import annotations

from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from tether import ledger as L
from tether import ledger_tally as T
from tether import ledger_view as V

STATUSES = ["pending", "in_progress", "done", "blocked", "skipped", "waived"]


def ledger_of(n: int, ordered: bool) -> L.Ledger:
    items = [
        (f"i{k}", f"Item {k}", f"m{k % 3}", k % 4 == 0, (f"i{k - 1}",) if ordered and k else ())
        for k in range(n)
    ]
    return L.from_spec("Do it", items, milestones=[("m0", "A"), ("m1", "B"), ("m2", "C")])


changes = st.lists(
    st.lists(st.tuples(st.integers(0, 11), st.sampled_from(STATUSES)), min_size=1, max_size=3),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(changes, st.booleans())
def test_the_carried_tally_is_the_counted_one(
    steps: list[list[tuple[int, str]]], ordered: bool
) -> None:
    led = ledger_of(12, ordered)
    T.tally(led)  # counted once; from here on each new ledger carries it
    for step in steps:
        proposed = [
            L.ItemChange(f"i{k}", status=s, evidence=("e1",) if s == "done" else ())  # type: ignore[arg-type]
            for k, s in step
        ]
        led = L.apply(led, proposed).ledger
        carried = T.tally(led)
        counted = T._count(led)
        assert carried.counts.items() >= {k: v for k, v in counted.counts.items()}.items()
        assert {k: v for k, v in carried.counts.items() if v} == dict(counted.counts)
        for m, c in counted.by_milestone.items():
            assert {k: v for k, v in carried.by_milestone[m].items() if v} == dict(c)
        assert carried.blocked == counted.blocked
        assert carried.stuck_skipped == counted.stuck_skipped
        assert carried.gaps == len(led.gaps())
        assert led.has_open() == bool(led.open_items())
        assert led.progress().total == 12
        assert led.progress() == L.Progress.of(
            {s: sum(1 for st_ in led.states if st_.status == s) for s in STATUSES}
        )


def test_the_view_lists_the_blocked_items_from_the_tally_in_contract_order() -> None:
    led = ledger_of(30, ordered=False)
    for k in (20, 3, 11):
        led = L.block(led, f"i{k}", f"reason {k}").ledger
    text = V.render_view(led, header="LEDGER")
    lines = [ln for ln in text.splitlines() if "reason" in ln]
    assert [ln.split(":")[0].split()[-1] for ln in lines] == ["i3", "i11", "i20"]


def test_a_ledger_read_from_storage_counts_itself_once() -> None:
    led = ledger_of(5, ordered=False)
    again = L.Ledger.from_parts(led.skeleton.to_dict(), led.state_dict(), led.version)
    assert T.tally(again) == T._count(led)


evidence_changes = st.lists(
    st.lists(
        st.tuples(
            st.integers(0, 11),
            st.sampled_from(STATUSES),
            st.lists(st.sampled_from(["op:a", "op:b", "artifact:c", "file:d"]), max_size=2),
        ),
        min_size=1,
        max_size=3,
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(evidence_changes)
def test_the_carried_evidence_index_is_the_one_a_walk_builds(
    steps: list[list[tuple[int, str, list[str]]]],
) -> None:
    led = ledger_of(12, ordered=False)
    T.refs(led)  # built once; from here on each new ledger carries it
    for step in steps:
        proposed = [
            L.ItemChange(f"i{k}", status=s, evidence=(*refs, "e1") if s == "done" else tuple(refs))  # type: ignore[arg-type]
            for k, s, refs in step
        ]
        led = L.apply(led, proposed).ledger
        carried, built = T.refs(led), T._index(led)
        assert dict(carried.holders) == dict(built.holders)
        assert dict(carried.done_ops) == dict(built.done_ops)
        # What the judges read it for: the first holder of each ref, the refs cited.
        first = {}
        for d, s in led.items():
            for ref in s.evidence:
                first.setdefault(ref, d.id)
        owners = T.Owners(led)
        assert {r: owners[r] for r in carried.holders} == first
        assert owners.get("artifact:new") is None
        assert owners.setdefault("artifact:new", "i3") == owners.setdefault("artifact:new", "i4")
        assert owners.get("artifact:new") == "i3"


def _walked_next(led: L.Ledger) -> str | None:
    """The next item by a walk over every item (what `next_item` must answer)."""
    for wanted in ("in_progress", "pending"):
        for d, s in led.items():
            if s.status == wanted and led.is_ready(d.id):
                return d.id
    return None


@settings(max_examples=60, deadline=None)
@given(changes, st.booleans())
def test_the_next_item_is_worked_out_once_per_ledger_and_is_the_walked_one(
    steps: list[list[tuple[int, str]]], ordered: bool
) -> None:
    led = ledger_of(12, ordered)
    for step in steps:
        proposed = [
            L.ItemChange(f"i{k}", status=s, evidence=("e1",) if s == "done" else ())  # type: ignore[arg-type]
            for k, s in step
        ]
        led = L.apply(led, proposed).ledger
        assert led.next_item() == _walked_next(led)
        with mock.patch.object(T, "_first_ready", wraps=T._first_ready) as walk:
            # Asked again, the same ledger answers without another walk.
            assert [led.next_item() for _ in range(3)] == [_walked_next(led)] * 3
        assert walk.call_count == 0
