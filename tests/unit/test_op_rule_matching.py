"""`ToolRules` finds the same rules for an op as checking every rule (`args_match`), by
way of one argument of each rule (issue 27: building a run's index checked every rule
of a tool against every op, ~0.3 s at each resume of a 10,000-round task)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tether.runtime.judge.rules.index import OpIndex, ToolRules, args_match
from tether.spec import parse_spec
from tether.store.base import OpRecord

# Few names and values, so that rules and ops share them often; 1, 1.0 and True are
# equal in Python and in `args_match`, and must be found alike.
VALUES = st.one_of(
    st.sampled_from(["a", "b", "it1-c99", ""]),
    st.sampled_from([0, 1, 2, 1.0, 2.5, True, False, None]),
    st.lists(st.sampled_from([1, "a"]), max_size=2),
    st.dictionaries(st.sampled_from(["x", "y"]), st.sampled_from([1, "a"]), max_size=2),
)
ARGS = st.dictionaries(st.sampled_from(["title", "step", "path", "n"]), VALUES, max_size=3)


def _key(n: int, args: dict[str, Any]) -> tuple[str, str]:
    return f"tool{n}", json.dumps(args, sort_keys=True, default=str)


@settings(max_examples=300, deadline=None)
@given(rules=st.lists(ARGS, max_size=12), ops=st.lists(ARGS, min_size=1, max_size=8))
def test_the_rules_found_are_those_every_rule_checked_finds(
    rules: list[dict[str, Any]], ops: list[dict[str, Any]]
) -> None:
    filed = ToolRules()
    every: dict[tuple[str, str], dict[str, Any]] = {}
    for n, args in enumerate(rules):
        key = _key(n, args)
        filed.add(key, args)
        every.setdefault(key, args)
    for op in ops:
        want = sorted(k for k, args in every.items() if args_match(args, op))
        assert sorted(filed.matching(op)) == want


def test_a_rule_is_found_by_an_equal_value_of_another_type_and_not_by_a_near_one() -> None:
    rules = ToolRules()
    rules.add(("t", "1"), {"step": 1, "title": ["x"]})
    rules.add(("t", "2"), {})
    rules.add(("t", "3"), {"title": "it1-c99"})
    assert sorted(rules.matching({"step": True, "title": ["x"]})) == [("t", "1"), ("t", "2")]
    assert sorted(rules.matching({"step": 1.0, "title": ["y"]})) == [("t", "2")]
    assert sorted(rules.matching({"title": "it1-c99", "n": 3})) == [("t", "2"), ("t", "3")]
    assert rules.matching({"title": "it1-c98"}) == [("t", "2")]


def _op(n: int, item: str, rnd: int) -> OpRecord:
    return OpRecord(
        op_id=f"o{n}",
        task_id="t",
        round=rnd,
        call_index=0,
        tool="work",
        args={"item": item},
        args_hash="h",
        effect="write",
        status="succeeded",
    )


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.booleans(), st.integers(0, 5), st.sampled_from(["w1", "w2", "w3", "x"])),
        max_size=20,
    ),
    fresh=st.sets(st.sampled_from(["w1", "w2", "w3"])),
)
def test_the_op_candidates_are_the_items_whose_rule_an_op_matches(
    steps: list[tuple[bool, int, str]], fresh: set[str]
) -> None:
    """`OpIndex.candidates` (what the rule judge checks, `RuleEnv.op_candidates`) holds
    exactly the items with a stored op (`has_ops`, `newest_first`) or a fresh match."""
    spec = parse_spec(
        {
            "objective": "o",
            "items": [
                {"id": f"w{k}", "title": "t", "done_when": {"kind": "op", "tool": "work",
                                                             "args": {"item": f"w{k}"}}}
                for k in (1, 2, 3)
            ] + [{"id": "free", "title": "no rule"}],
            "tools": ["work"],
        }
    )  # fmt: skip
    idx = OpIndex(spec)
    for put, n, item in steps:
        if put:
            idx._put(_op(n, item, n))
        else:
            idx._drop(f"o{n}")
        keys = {idx.rule_of[i] for i in fresh}
        found = idx.candidates(keys)
        for item_id in ("w1", "w2", "w3", "free", "nope"):
            stored = any(True for _ in idx.newest_first(item_id))
            assert idx.has_ops(item_id) == stored
            assert (item_id in found) == (stored or item_id in fresh)
