"""The goal ledger by example: transitions, progress and the two renderings."""

from __future__ import annotations

import json

import pytest

from tether import errors, ledger
from tether.ledger import ItemChange, ItemState, Ledger, Progress, Skeleton


@pytest.fixture
def led() -> Ledger:
    return ledger.from_spec(
        "Catalogue the documents",
        [
            ("read-a", "Read A", "m1"),
            ("read-b", "Read B", "m1"),
            ("csv", "Write catalog.csv", "m2"),
            ("notice", "Write the notice", "m2"),
        ],
        acceptance=[("csv-ok", "catalog.csv has a row per document")],
        milestones=[("m1", "Read"), ("m2", "Write")],
    )


# --- construction and reading ---------------------------------------------------------


def test_new_ledger_is_all_pending(led: Ledger) -> None:
    assert led.version == 0
    assert all(s == ItemState() for s in led.states)
    assert led.open_items() == ["read-a", "read-b", "csv", "notice"]
    assert led.next_item() == "read-a"
    assert led.current_milestone() == "m1"
    assert led.has_item("csv") and not led.has_item("nope")
    assert led.definition("csv").title == "Write catalog.csv"
    ledger.check_invariants(led)


def test_unknown_item_is_a_ledger_error(led: Ledger) -> None:
    with pytest.raises(errors.LedgerError, match="unknown ledger item 'nope'"):
        led.item("nope")
    with pytest.raises(errors.LedgerError):
        led.definition("nope")
    for fn in (ledger.start, lambda lg, i: ledger.block(lg, i, "x")):
        with pytest.raises(errors.LedgerError, match="'nope'"):
            fn(led, "nope")


def test_state_must_match_skeleton(led: Ledger) -> None:
    with pytest.raises(errors.LedgerError, match="does not match"):
        Ledger(led.skeleton, led.states[:2])


def test_item_state_refuses_unknown_status() -> None:
    with pytest.raises(errors.LedgerError, match="unknown item status 'finished'"):
        ItemState.from_dict({"status": "finished"})
    assert ItemState.from_dict({}) == ItemState()


def test_from_parts_fills_missing_states(led: Ledger) -> None:
    done = ledger.complete(led, "csv", ["op:1"]).ledger
    state = done.state_dict()
    del state["read-a"]
    back = Ledger.from_parts(done.skeleton.to_dict(), state, done.version)
    assert back.item("read-a") == ItemState()
    assert back.item("csv").evidence == ("op:1",)
    assert back.version == 1


# --- transitions -----------------------------------------------------------------------


def test_done_needs_evidence(led: Ledger) -> None:
    with pytest.raises(errors.LedgerError, match="'csv' cannot become done without evidence"):
        ledger.complete(led, "csv", [])
    with pytest.raises(errors.LedgerError):
        ledger.apply(led, [ItemChange("csv", status="done")])
    # Evidence given earlier counts.
    with_ev = ledger.apply(led, [ItemChange("csv", evidence=("art:csv",))]).ledger
    up = ledger.complete(with_ev, "csv", [])
    assert up.ledger.item("csv").status == "done"
    assert up.ledger.item("csv").evidence == ("art:csv",)


def test_complete_records_evidence_and_note(led: Ledger) -> None:
    up = ledger.complete(led, "read-a", ["op:1", "art:a"], note="title found")
    assert up.changed
    assert up.ledger.version == 1
    s = up.ledger.item("read-a")
    assert (s.status, s.evidence, s.note) == ("done", ("op:1", "art:a"), "title found")
    assert up.diff.status_changes() == {"read-a": ("pending", "done")}
    assert up.diff.to_list() == [
        {"item": "read-a", "field": "status", "before": "pending", "after": "done"},
        {"item": "read-a", "field": "evidence", "before": [], "after": ["op:1", "art:a"]},
        {"item": "read-a", "field": "note", "before": "", "after": "title found"},
    ]
    # Completing again with the same evidence changes nothing.
    again = ledger.complete(up.ledger, "read-a", ["op:1"], note="title found")
    assert not again.changed and again.ledger is up.ledger


def test_start_only_moves_pending_items(led: Ledger) -> None:
    up = ledger.start(led, "csv")
    assert up.ledger.item("csv").status == "in_progress"
    assert up.ledger.next_item() == "csv"  # in progress comes before earlier pending
    assert not ledger.start(up.ledger, "csv").changed
    blocked = ledger.block(led, "csv", "no input").ledger
    assert not ledger.start(blocked, "csv").changed


def test_block_skip_and_reopen(led: Ledger) -> None:
    lg = ledger.block(led, "read-b", "cannot parse").ledger
    lg = ledger.skip(lg, "notice", "not asked for").ledger
    assert lg.item("read-b").status == "blocked"
    assert lg.item("read-b").note == "cannot parse"
    assert lg.item("notice").status == "skipped"
    assert lg.open_items() == ["read-a", "csv"]
    lg = ledger.set_breaker(lg, "read-b", 4).ledger
    lg = ledger.reopen(lg, "read-b", "new input arrived").ledger
    s = lg.item("read-b")
    assert (s.status, s.note, s.breaker) == ("pending", "new input arrived", 0)


def test_reopen_drops_the_evidence_of_done_work(led: Ledger) -> None:
    lg = ledger.complete(led, "csv", ["op:7"]).ledger
    up = ledger.reopen(lg, "csv", "source changed")
    assert up.ledger.item("csv").status == "pending"
    assert up.ledger.item("csv").evidence == ()
    assert {c.field for c in up.diff.changes} == {"status", "evidence", "note"}


def test_attempts_and_breaker(led: Ledger) -> None:
    lg = led
    for n in range(3):
        lg = ledger.record_attempt(lg, "read-b", note=f"try {n}").ledger
    assert lg.item("read-b").attempts == 3
    assert lg.item("read-b").note == "try 2"
    assert lg.version == 3
    # A note of None keeps the old note.
    lg = ledger.record_attempt(lg, "read-b").ledger
    assert lg.item("read-b").note == "try 2"
    lg = ledger.set_breaker(lg, "read-b", 2).ledger
    assert lg.item("read-b").breaker == 2
    assert not ledger.set_breaker(lg, "read-b", 2).changed
    assert ledger.set_breaker(lg, "read-b", -5).ledger.item("read-b").breaker == 0
    down = ledger.apply(lg, [ItemChange("read-b", attempts_delta=-10)]).ledger
    assert down.item("read-b").attempts == 0


def test_apply_is_all_or_nothing(led: Ledger) -> None:
    batch = [
        ItemChange("read-a", status="done", evidence=("op:1",)),
        ItemChange("ghost", status="done", evidence=("op:2",)),
    ]
    with pytest.raises(errors.LedgerError, match="'ghost'"):
        ledger.apply(led, batch)
    with pytest.raises(errors.LedgerError, match="without evidence"):
        ledger.apply(
            led,
            [
                ItemChange("read-a", status="done", evidence=("op:1",)),
                ItemChange("csv", status="done"),
            ],
        )
    with pytest.raises(errors.LedgerError, match="unknown item status"):
        ledger.apply(led, [ItemChange("csv", status="finished")])  # type: ignore[arg-type]
    assert led.version == 0
    assert all(s == ItemState() for s in led.states)


def test_batch_changes_several_items_under_one_version(led: Ledger) -> None:
    up = ledger.apply(
        led,
        [
            ItemChange("read-a", status="done", evidence=("op:1",)),
            ItemChange("read-b", status="in_progress"),
            ItemChange("csv", note="waiting for reads"),
        ],
    )
    assert up.ledger.version == 1
    assert up.diff.status_changes() == {
        "read-a": ("pending", "done"),
        "read-b": ("pending", "in_progress"),
    }


def test_no_change_keeps_the_version(led: Ledger) -> None:
    up = ledger.apply(led, [ItemChange("csv"), ItemChange("read-a", status="pending")])
    assert not up.changed
    assert up.ledger is led
    assert up.diff.to_list() == []


def test_changes_that_cancel_out_are_no_change(led: Ledger) -> None:
    # Two changes to the same item in one verdict that end where they began: the
    # ledger did not change, so its version must not rise (DESIGN 4: "the ledger is
    # written only when the verdict changes something").
    up = ledger.apply(
        led,
        [ItemChange("csv", note="maybe later"), ItemChange("csv", note="")],
    )
    assert up.ledger.state_dict() == led.state_dict()
    assert not up.changed
    assert up.ledger.version == led.version


def test_diff_of_two_changes_to_one_item_is_the_net_change(led: Ledger) -> None:
    up = ledger.apply(
        led,
        [ItemChange("csv", status="in_progress"), ItemChange("csv", status="blocked", note="x")],
    )
    assert up.ledger.item("csv").status == "blocked"
    assert up.diff.status_changes() == {"csv": ("pending", "blocked")}


def test_duplicate_evidence_in_one_change_is_kept_once(led: Ledger) -> None:
    up = ledger.complete(led, "csv", ["op:1", "op:1", "art:csv"])
    assert up.ledger.item("csv").evidence == ("op:1", "art:csv")


def test_transitions_do_not_touch_the_old_ledger(led: Ledger) -> None:
    before = led.render()
    ledger.complete(led, "csv", ["op:1"])
    ledger.block(led, "read-a", "x")
    assert led.render() == before and led.version == 0


def test_check_invariants_catches_done_without_evidence(led: Ledger) -> None:
    states = (ItemState(status="done"), *led.states[1:])
    broken = Ledger(led.skeleton, states, 3)
    with pytest.raises(errors.LedgerError, match="'read-a' is done without evidence"):
        ledger.check_invariants(broken)


# --- progress --------------------------------------------------------------------------


def test_progress_counts(led: Ledger) -> None:
    lg = ledger.complete(led, "read-a", ["op:1"]).ledger
    lg = ledger.start(lg, "read-b").ledger
    lg = ledger.block(lg, "csv", "x").ledger
    p = lg.progress()
    assert p == Progress(total=4, done=1, pending=1, in_progress=1, blocked=1, skipped=0)
    assert p.percent == 25.0
    assert p.open == 2
    assert p.to_dict() == {
        "total": 4,
        "done": 1,
        "pending": 1,
        "in_progress": 1,
        "blocked": 1,
        "skipped": 0,
        "waived": 0,
        "percent": 25.0,
    }
    assert lg.progress("m1") == Progress(2, 1, 0, 1, 0, 0)
    assert lg.progress("m2") == Progress(2, 0, 1, 0, 1, 0)
    assert lg.progress("nope").total == 0
    assert lg.current_milestone() == "m1"


def test_progress_percent_rounding_and_empty() -> None:
    three = ledger.from_spec("x", [("a", "A", None), ("b", "B", None), ("c", "C", None)])
    one = ledger.complete(three, "a", ["op:1"]).ledger
    assert one.progress().percent == 33.3
    two = ledger.complete(one, "b", ["op:2"]).ledger
    assert two.progress().percent == 66.7
    empty = ledger.from_spec("nothing to do", [])
    assert empty.progress().percent == 100.0
    assert empty.next_item() is None and empty.current_milestone() is None


def test_skipped_and_blocked_are_not_done(led: Ledger) -> None:
    lg = led
    for i in ("read-a", "read-b"):
        lg = ledger.skip(lg, i, "n/a").ledger
    for i in ("csv", "notice"):
        lg = ledger.block(lg, i, "stuck").ledger
    assert lg.progress().percent == 0.0
    assert lg.progress().open == 0
    assert lg.next_item() is None


# --- rendering ---------------------------------------------------------------------------


def test_render_fresh(led: Ledger) -> None:
    assert led.render() == (
        "GOAL LEDGER (version 0)\n"
        "Objective: Catalogue the documents\n"
        "Progress: 0/4 done, 4 open, 0 blocked, 0 skipped\n"
        "Acceptance:\n"
        "  - [csv-ok] catalog.csv has a row per document\n"
        "Milestone m1: Read\n"
        "  [ ] read-a: Read A\n"
        "  [ ] read-b: Read B\n"
        "Milestone m2: Write\n"
        "  [ ] csv: Write catalog.csv\n"
        "  [ ] notice: Write the notice\n"
        "Next: read-a"
    )


def test_render_every_status(led: Ledger) -> None:
    lg = ledger.complete(led, "read-a", ["op:1", "op:2", "op:3", "op:4"]).ledger
    lg = ledger.record_attempt(lg, "read-b", "parse error").ledger
    lg = ledger.start(lg, "read-b").ledger
    lg = ledger.block(lg, "csv", "no data").ledger
    lg = ledger.skip(lg, "notice", "not needed").ledger
    assert lg.render(header="LEDGER NOW") == (
        "LEDGER NOW (version 5)\n"
        "Objective: Catalogue the documents\n"
        "Progress: 1/4 done, 1 open, 1 blocked, 1 skipped\n"
        "Acceptance:\n"
        "  - [csv-ok] catalog.csv has a row per document\n"
        "Milestone m1: Read\n"
        "  [x] read-a: Read A (evidence op:1, op:2, op:3)\n"
        "  [~] read-b: Read B (attempts 1; last: parse error)\n"
        "Milestone m2: Write\n"
        "  [!] csv: Write catalog.csv (blocked: no data)\n"
        "  [-] notice: Write the notice (skipped: not needed)\n"
        "Next: read-b"
    )


def test_render_without_milestones_or_acceptance() -> None:
    lg = ledger.from_spec("Say hi", [("hi", "Say hi", None)])
    lg = ledger.complete(lg, "hi", ["op:1"]).ledger
    assert lg.render() == (
        "GOAL LEDGER (version 1)\n"
        "Objective: Say hi\n"
        "Progress: 1/1 done, 0 open, 0 blocked, 0 skipped\n"
        "  [x] hi: Say hi (evidence op:1)\n"
        "Next: nothing open"
    )


def test_item_without_milestone_is_not_shown_under_another_milestone() -> None:
    # An item with no milestone that follows a milestone's items must not read as part
    # of that milestone: the model would attribute it (and its budget) wrongly.
    lg = ledger.from_spec(
        "x",
        [("a", "A", "m1"), ("loose", "Loose item", None)],
        milestones=[("m1", "First")],
    )
    lines = lg.render().splitlines()
    loose = next(n for n, line in enumerate(lines) if "loose: Loose item" in line)
    headers_above = [line for line in lines[:loose] if not line.startswith("  ")]
    assert headers_above[-1] != "Milestone m1: First", lg.render()


def test_render_is_byte_identical_for_equal_states(led: Ledger) -> None:
    a = ledger.complete(led, "csv", ["op:1"]).ledger
    b = ledger.complete(led, "csv", ["op:1"]).ledger
    assert a is not b
    assert a.render().encode() == b.render().encode()
    rebuilt = Ledger.from_parts(a.skeleton.to_dict(), a.state_dict(), a.version)
    assert rebuilt.render() == a.render()
    assert rebuilt.render_json() == a.render_json()


def test_render_json_is_canonical(led: Ledger) -> None:
    lg = ledger.complete(led, "csv", ["op:1"]).ledger
    text = lg.render_json()
    assert " " not in text.replace("Catalogue the documents", "").replace(
        "catalog.csv has a row per document", ""
    ).replace("Read A", "").replace("Read B", "").replace("Write catalog.csv", "").replace(
        "Write the notice", ""
    )
    data = json.loads(text)
    assert data == lg.to_dict()
    assert json.dumps(data, sort_keys=True, separators=(",", ":")) == text
    assert data["version"] == 1
    assert data["progress"]["done"] == 1
    assert [i["id"] for i in data["items"]] == ["read-a", "read-b", "csv", "notice"]
    csv = data["items"][2]
    assert csv == {
        "id": "csv",
        "title": "Write catalog.csv",
        "milestone": "m2",
        "status": "done",
        "evidence": ["op:1"],
        "attempts": 0,
        "breaker": 0,
        "note": "",
    }


def test_skeleton_round_trip(led: Ledger) -> None:
    sk = led.skeleton
    assert Skeleton.from_dict(json.loads(json.dumps(sk.to_dict()))) == sk
