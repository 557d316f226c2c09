"""The typed run state reads every stored `usage` document and writes the same keys."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tether.runtime.run.state import STATE_VERSION, RunState, Spend

OLD_ROW: dict[str, Any] = {
    "rounds": 12,
    "turns": 2.0,  # an old writer stored a float now and then
    "last_seq": 140,
    "input_tokens": 1000,
    "output_tokens": 200,
    "cost_usd": 0.5,
    "by_purpose": {"act": {"calls": 12, "input": 900, "cached": 600}},
    "milestone_rounds": {"m1": 7},
    "inflight": {"round": 13, "focus": "i2", "response_blob": "sha256:ab"},
    "failure_keys": {"i2|write_file|abcd|transient": 2},
    "budget_marks": ["task:tokens:50"],
    "system_blob": "sha256:cd",
    "some_future_key": {"x": 1},
}


def test_an_old_row_reads_into_typed_fields() -> None:
    s = RunState.from_dict(OLD_ROW)
    assert (s.rounds, s.turns, s.last_seq) == (12, 2, 140)
    assert isinstance(s.turns, int)
    assert s.tokens == 1200
    assert s.by_purpose["act"] == Spend(calls=12, input=900, cached=600)
    assert s.inflight == {"round": 13, "focus": "i2", "response_blob": "sha256:ab"}
    assert s.unjudged is None and s.ctx_blob is None and s.token_ratio is None
    assert s.extra == {"some_future_key": {"x": 1}}


def test_writing_keeps_the_key_names_and_unknown_keys() -> None:
    out = RunState.from_dict(OLD_ROW).to_dict()
    assert out["state_version"] == STATE_VERSION
    for key in ("rounds", "last_seq", "inflight", "failure_keys", "system_blob"):
        assert out[key] == OLD_ROW[key]
    assert out["turns"] == 2
    assert out["some_future_key"] == {"x": 1}
    assert out["by_purpose"]["act"]["calls"] == 12
    assert "unjudged" not in out  # None is not written


def test_bad_shapes_fall_back_to_defaults() -> None:
    s = RunState.from_dict({"rounds": "many", "credited": [1, 2], "focus_log": {"a": 1}})
    assert s.rounds == 0 and s.credited == {} and s.focus_log == []
    assert RunState.from_dict(None) == RunState()


async def test_a_stored_document_does_not_follow_later_changes() -> None:
    """`to_dict` shares its containers (it is written with every commit); the store keeps
    its own copy, so a change after the commit is not a change of the stored row."""
    from tether import ledger as L
    from tether.store.base import TaskPatch
    from tether.store.memory import MemoryStore

    store = await MemoryStore.open()
    await store.create_task(
        task_id="t", name="t", spec={}, ledger=L.from_spec("o", [("a", "a", None)]), events=[]
    )
    s = RunState()
    s.failure_keys["k"] = 1
    await store.commit("t", None, [], task=TaskPatch(usage=s.to_dict()))
    s.failure_keys["k"] = 99
    assert (await store.get_task("t")).usage["failure_keys"] == {"k": 1}


@given(
    rounds=st.integers(0, 10**9),
    cost=st.floats(0, 1e6, allow_nan=False),
    marks=st.lists(st.text(max_size=10), max_size=5),
    credited=st.dictionaries(st.text(max_size=5), st.lists(st.text(max_size=8), max_size=3)),
)
def test_round_trip(
    rounds: int, cost: float, marks: list[str], credited: dict[str, list[str]]
) -> None:
    s = RunState(rounds=rounds, cost_usd=cost, budget_marks=marks, credited=credited)
    s.spend("judge").calls = 3
    back = RunState.from_dict(s.to_dict())
    assert back == s
