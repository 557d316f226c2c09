"""Item dependencies (`after`): the ledger never names an item whose predecessors are not
finished, an item held by a blocked predecessor is a gap (never silently skipped), the
audit refuses `done` before the predecessors, and the spec refuses unknown ids and
cycles."""

from __future__ import annotations

import pytest

from tether import errors
from tether import ledger as L
from tether.runtime.judge.judges import (
    Evidence,
    ProposedChange,
    RoundFacts,
    Verdict,
    audit,
    partial_record,
)
from tether.spec import Limits, parse_spec


def chain() -> L.Ledger:
    """a; b after a; c after b; d free."""
    return L.from_spec(
        "o",
        [
            ("a", "A", None, False, ()),
            ("b", "B", None, False, ("a",)),
            ("c", "C", None, False, ("b",)),
            ("d", "D", None, False, ()),
        ],
    )


def test_next_item_waits_for_predecessors() -> None:
    led = chain()
    assert led.next_item() == "a"
    assert led.waiting_for("c") == ["b"] and not led.is_ready("b")
    led = L.start(led, "b").ledger  # even in progress, b may not go before a
    assert led.next_item() == "a"
    led = L.complete(led, "a", ["op:1"]).ledger
    assert led.next_item() == "b" and led.is_ready("b")


def test_a_blocked_predecessor_holds_the_chain_and_is_a_gap() -> None:
    led = L.block(chain(), "a", "no progress").ledger
    assert led.held_by("b") == ["a"] and led.held_by("c") == ["a"]
    assert led.open_items() == ["d"] and led.next_item() == "d"
    led = L.complete(led, "d", ["op:d"]).ledger
    assert led.open_items() == [] and led.gaps() == ["a", "b", "c"]
    record = partial_record(led)
    held = {r["id"]: r for r in record["remaining"]}
    assert held["c"]["held_by"] == ["a"] and "waits for a" in held["c"]["reason"]
    assert "[held: a blocked]" in led.render()


def test_waived_predecessor_releases_its_successors() -> None:
    led = L.waive(L.block(chain(), "a", "x").ledger, "a", "human").ledger
    assert led.next_item() == "b" and led.held_by("c") == []


def test_skeleton_keeps_the_order() -> None:
    led = chain()
    again = L.Skeleton.from_dict(led.skeleton.to_dict())
    assert again == led.skeleton and again.items[2].after == ("b",)


def _facts(focus: str) -> RoundFacts:
    return RoundFacts(round=2, focus=focus, text="")


def test_audit_refuses_done_before_predecessors() -> None:
    known = {"op:b": Evidence("op:b", 2, "b", "write_file", fingerprint="b")}
    verdict = Verdict("continue", (ProposedChange("b", "done", ("op:b",)),))
    out = audit(chain(), [verdict], evidence=known.get, facts=_facts("b"), limits=Limits())
    assert out.update.ledger.item("b").status == "pending"
    assert [w.code for w in out.warnings if w.code == "item_not_ready"] == ["item_not_ready"]


def test_audit_accepts_predecessor_then_successor_in_one_verdict() -> None:
    known = {
        "op:a": Evidence("op:a", 2, "a", "write_file", fingerprint="a"),
        "op:b": Evidence("op:b", 2, "b", "write_file", fingerprint="b"),
    }
    verdict = Verdict(
        "continue",
        (ProposedChange("a", "done", ("op:a",)), ProposedChange("b", "done", ("op:b",))),
        source="rules",
    )
    out = audit(chain(), [verdict], evidence=known.get, facts=_facts("a"), limits=Limits())
    assert out.update.ledger.item("b").status == "done"


def test_decision_names_what_a_held_item_waits_for() -> None:
    led = L.complete(L.block(chain(), "a", "x").ledger, "d", ["op:d"]).ledger
    out = audit(led, [], evidence={}.get, facts=_facts("d"), limits=Limits())
    assert out.decision == "need_decision"
    assert "b waits for a" in out.reason and "c waits for a" in out.reason


def _spec(items: list[dict[str, object]]) -> object:
    return parse_spec({"objective": "o", "items": items})


def test_spec_accepts_after_and_depends_on() -> None:
    spec = parse_spec(
        {
            "objective": "o",
            "items": [
                {"id": "a", "title": "A"},
                {"id": "b", "title": "B", "after": ["a"]},
                {"id": "c", "title": "C", "depends_on": ["a", "b"]},
            ],
        }
    )
    assert [i.after for i in spec.items] == [[], ["a"], ["a", "b"]]


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([{"id": "a", "title": "A", "after": ["zz"]}], "items.0.after: 'zz' is not an item id"),
        ([{"id": "a", "title": "A", "after": ["a"]}], "cannot come after itself"),
        (
            [
                {"id": "a", "title": "A", "after": ["c"]},
                {"id": "b", "title": "B", "after": ["a"]},
                {"id": "c", "title": "C", "after": ["b"]},
            ],
            "has a cycle (a -> c -> b -> a)",
        ),
    ],
)
def test_spec_refuses_bad_order(items: list[dict[str, object]], message: str) -> None:
    with pytest.raises(errors.SpecError) as info:
        _spec(items)
    assert message in str(info.value)


def test_a_long_chain_is_checked_without_recursion() -> None:
    items = [{"id": f"i{n}", "title": "t", "after": [f"i{n + 1}"]} for n in range(3000)]
    items.append({"id": "i3000", "title": "t", "after": ["i0"]})
    with pytest.raises(errors.SpecError, match="has a cycle"):
        _spec(items)


def test_a_long_held_chain_is_computed_without_recursion() -> None:
    n = 5000
    items = [(f"i{k}", "t", None, False, (f"i{k - 1}",) if k else ()) for k in range(n)]
    led = L.block(L.from_spec("o", items), "i0", "stuck").ledger
    assert led.held_by(f"i{n - 1}") == ["i0"] and led.open_items() == []
