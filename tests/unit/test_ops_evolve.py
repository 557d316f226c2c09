"""`ops.journal.evolve` is `dataclasses.replace` for op records, without `__init__`:
the same record for any changes, the same refusal of a field that does not exist."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.runtime.ops.journal import evolve
from tether.store.base import OpRecord

BASE = OpRecord("t.r1.c0", "t", 1, 0, "do_step", {"step": 1}, "h", "write", "intended")

changes = st.fixed_dictionaries(
    {},
    optional={
        "status": st.sampled_from(("dispatched", "succeeded", "failed", "retry_wait")),
        "attempts": st.integers(0, 9),
        "next_attempt_at": st.one_of(st.none(), st.floats(0, 1e9)),
        "result": st.one_of(st.none(), st.fixed_dictionaries({"content": st.text(max_size=9)})),
        "error": st.one_of(st.none(), st.fixed_dictionaries({"class": st.just("transient")})),
        "args": st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
        "args_hash": st.text(max_size=8),
        "task_version": st.integers(1, 5),
    },
)


@given(changes)
def test_evolve_is_replace(change: dict[str, Any]) -> None:
    new = evolve(BASE, **change)
    assert new == dataclasses.replace(BASE, **change)
    assert type(new) is OpRecord
    assert new is not BASE
    assert BASE.status == "intended"  # the original is left as it was
    assert BASE.attempts == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        new.status = "x"  # type: ignore[misc]


def test_evolve_refuses_unknown_fields() -> None:
    with pytest.raises(TypeError, match="no field"):
        evolve(BASE, colour="red")


def test_op_record_stays_a_plain_dataclass() -> None:
    """`evolve` copies the instance dict: it is right only while an op record has one
    and nothing of its own runs at construction."""
    assert not hasattr(OpRecord, "__post_init__")
    assert not hasattr(OpRecord, "__slots__")
    assert hasattr(BASE, "__dict__")
