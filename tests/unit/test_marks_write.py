"""`MarksWrite`: the change a run's commit sends for its progress marks. Applied the
way the SQL stores apply it (per item: drop the oldest `k`, or all, then append), the
deltas `RunState.marks_write` returns rebuild exactly the `seen` the state holds, for
any sequence of rounds `progress.remember` records, items forgotten and started again."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tether.runtime.round import progress as P
from tether.runtime.run.state import RunState
from tether.store.base import MarksWrite


def apply(stored: dict[str, list[str]], write: MarksWrite) -> dict[str, list[str]]:
    out = {k: list(v) for k, v in stored.items()}
    for item, (cut, add) in write.items.items():
        kept = [] if cut is None else out.get(item, [])[cut:]
        out[item] = kept + list(add)
        if not out[item]:
            del out[item]
    return out


def test_growth_and_trim_are_sent_as_a_cut_and_the_new_marks() -> None:
    old = ["a", "b", "c"]
    assert MarksWrite.between({"i": old}, {"i": [*old, "d"]}).items == {"i": (0, ("d",))}
    assert MarksWrite.between({"i": old}, {"i": ["b", "c", "d", "e"]}).items == {
        "i": (1, ("d", "e"))
    }
    assert MarksWrite.between({"i": old}, {}).items == {"i": (None, ())}
    assert MarksWrite.between({}, {"i": old}).items == {"i": (0, ("a", "b", "c"))}
    # A dropped mark seen again is new again; anything else rewrites the item.
    assert MarksWrite.between({"i": old}, {"i": ["c", "a"]}).items == {"i": (2, ("a",))}
    assert MarksWrite.between({"i": old}, {"i": ["b", "a"]}).items == {"i": (None, ("b", "a"))}
    assert MarksWrite.between({"i": old}, {"i": ["a", "c", "d"]}).items == {
        "i": (None, ("a", "c", "d"))
    }
    assert MarksWrite.between({"i": old}, {"i": list(old)}).items == {}
    # Lists and tuples of the same marks are the same marks, either way round.
    assert MarksWrite.between({"i": tuple(old)}, {"i": list(old)}).items == {}
    assert MarksWrite.between({"i": old}, {"i": ("b", "c", "d")}).items == {"i": (1, ("d",))}
    assert MarksWrite.between({"i": ("a", "b")}, {"i": ["b", "a"]}).items == {"i": (1, ("a",))}
    assert MarksWrite.between({"i": tuple(old)}, {"i": ["b", "a"]}).items == {
        "i": (None, ("b", "a"))
    }


rounds = st.lists(
    st.tuples(
        st.sampled_from(["i1", "i2", "i3"]),
        st.lists(st.integers(0, 40).map(lambda n: f"m{n}"), max_size=4),
        st.booleans(),  # forget another item after the round
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(rounds=rounds, cap=st.integers(1, 6), sent_whole_at=st.integers(-1, 40))
def test_the_deltas_rebuild_what_the_state_holds(
    rounds: list[tuple[str, list[str], bool]], cap: int, sent_whole_at: int
) -> None:
    state = RunState.from_dict({})
    stored: dict[str, list[str]] = {}
    for n, (item, marks, forget) in enumerate(rounds):
        state.seen[item] = P.remember(state.seen.get(item, []), marks)[-cap:]
        if forget:
            for other in [k for k in state.seen if k != item][:1]:
                del state.seen[other]
        if n == sent_whole_at:
            state.marks_unsure()
        write = state.marks_write()
        if write is None:  # the store rewrites them from `usage`
            stored = {k: list(v) for k, v in state.seen.items() if v}
        else:
            stored = apply(stored, write)
        assert stored == {k: v for k, v in state.seen.items() if v}
