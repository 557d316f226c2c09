"""The compaction audit reads completion claims in any wording, and only those the ledger
contradicts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

import pytest

from tether import ledger as L
from tether.ledger import Ledger
from tether.runtime.round.claims import (
    FINISHED_STATUSES,
    SUMMARY_AUDIT_INSTRUCTIONS,
    ClaimFindings,
    completion_claims,
    may_claim,
    parse_summary_audit,
    summary_audit_request,
)


def _ledger(done: tuple[str, ...] = ("i1", "i2"), n: int = 3) -> Ledger:
    """Items i1..iN titled "write out/iK.txt"; `done` are done with evidence."""
    led = L.from_spec(
        f"write {n} files", [(f"i{k}", f"write out/i{k}.txt", None) for k in range(1, n + 1)]
    )
    for item in done:
        led = L.complete(led, item, [f"op:{item}"]).ledger
    return led


def _with_status(led: Ledger, item: str, status: str) -> Ledger:
    """`led` with one item's status set directly (also to statuses the type may not list)."""
    states = list(led.states)
    idx = [d.id for d, _ in led.items()].index(item)
    states[idx] = replace(states[idx], status=cast(Any, status))
    return Ledger(led.skeleton, tuple(states), led.version + 1)


LEDGER = _ledger()  # i1 and i2 done, i3 pending


# --- whole-task claims ------------------------------------------------------------------

GLOBAL_CLAIMS = [
    ("Everything finished, all items done.", "everything finished"),
    ("All done!", "all done"),
    ("ALL DONE", "all done"),
    ("all items are complete", "all items are complete"),
    ("All of the items have been completed.", "all of the items have been completed"),
    ("Every item is finished.", "every item is finished"),
    ("Task complete.", "task complete"),
    ("The task is finished.", "the task is finished"),
    ("the task is now complete", "the task is now complete"),
    ("Everything is done.", "everything is done"),
    ("everything's done", "everything's done"),
    ("Objective achieved.", "objective achieved"),
    ("objective met", "objective met"),
    ("Objective accomplished", "objective accomplished"),
    ("Nothing left to do.", "nothing left"),
    ("Nothing remains.", "nothing remains"),
    ("No items remaining.", "no items remaining"),
    ("Work is complete.", "work is complete"),
    ("All work done.", "all work done"),
    ("The objective is fully completed.", "the objective is fully completed"),
    ("Fully completed.", "fully completed"),
    ("100% complete", "100% complete"),
    ("Progress: 100%", "progress: 100%"),
    ("3/3 done", "3/3 done"),
    ("All 3 items done.", "all 3 items done"),
    ("Finished all the items.", "finished all the items"),
    ("Completed everything.", "completed everything"),
    ("Mission accomplished!", "mission accomplished"),
    ("We're done.", "we're done"),
    ("I have finished.", "i have finished"),
    ("Status: COMPLETE", "status: complete"),
    ("All acceptance criteria are met.", "all acceptance criteria are met"),
    ("Done.", "done"),
    ("**ALL ITEMS ARE DONE**", "all items are done"),
    ("## Task complete", "task complete"),
    ("> Summary: the whole task is done", "the whole task is done"),
    ("Read big.txt three times.\n\nResult: everything finished", "everything finished"),
    ("Summary - all the work is complete, nothing is left.", "all the work is complete"),
]


@pytest.mark.parametrize(("summary", "phrase"), GLOBAL_CLAIMS, ids=[s for s, _ in GLOBAL_CLAIMS])
def test_a_global_claim_is_found_while_work_is_open(summary: str, phrase: str) -> None:
    found = completion_claims(summary, LEDGER)
    assert found.global_phrase == phrase
    assert found  # truthy


@pytest.mark.parametrize("status", ["pending", "in_progress", "blocked"])
def test_any_unfinished_item_makes_a_global_claim_false(status: str) -> None:
    led = _with_status(_ledger(("i1", "i2", "i3")), "i3", status)
    assert completion_claims("All done.", led).global_phrase == "all done"


@pytest.mark.parametrize("status", ["done", "skipped", "waived"])
def test_a_global_claim_is_true_once_every_item_is_finished(status: str) -> None:
    assert status in FINISHED_STATUSES
    led = _ledger(("i1", "i2", "i3"))
    if status != "done":
        led = _with_status(led, "i3", status)
    found = completion_claims("Everything finished, all items done. Mission accomplished.", led)
    assert found == ClaimFindings()
    assert not found


# --- per-item claims --------------------------------------------------------------------

ITEM_CLAIMS = [
    ("i3 is done", ["i3"]),
    ("I3 DONE", ["i3"]),
    ("i3: done", ["i3"]),
    ("i3 complete.", ["i3"]),
    ("i3 has been completed", ["i3"]),
    ("i3 finished", ["i3"]),
    ("i3 resolved", ["i3"]),
    ("i3 delivered", ["i3"]),
    ("i3 succeeded.", ["i3"]),
    ("i3 was handled as well", ["i3"]),
    ("Completed i3.", ["i3"]),
    ("Finished i3 after two retries.", ["i3"]),
    ("Marked i3 as done.", ["i3"]),
    ("- [x] i3", ["i3"]),
    ("* [X] i3: write out/i3.txt", ["i3"]),
    ("1. [x] i1\n2. [x] i2\n3. [x] i3", ["i3"]),
    ("i3 ✅", ["i3"]),
    ("- ✔️ i3", ["i3"]),
    ("**i3** — delivered", ["i3"]),
    ("`i3`: *finished*", ["i3"]),
    ("Done: i1, i2, i3", ["i3"]),
    ("i1, i2 and i3 are complete.", ["i3"]),
    ("i1 and i2 were completed; i3 was resolved too.", ["i3"]),
    ("| item | status |\n|---|---|\n| i1 | done |\n| i3 | done |", ["i3"]),
    ("Completed:\n- i1\n- i2\n- i3", ["i3"]),
    ("## Done\n\n- i1\n- i3", ["i3"]),
    ("**Finished items**\n- i3 (write out/i3.txt)", ["i3"]),
    ("i3: pending -> done", ["i3"]),
    ("i1, i2 and\ni3 are done", ["i3"]),
    ("write out/i3.txt: finished", ["i3"]),  # named by its title
    ("Everything is done except i2.", ["i3"]),  # i2 is done anyway: i3 is claimed
    ("i2 is pending, everything else is done.", ["i3"]),
]


@pytest.mark.parametrize(("summary", "items"), ITEM_CLAIMS, ids=[s for s, _ in ITEM_CLAIMS])
def test_an_item_claim_is_found(summary: str, items: list[str]) -> None:
    found = completion_claims(summary, LEDGER)
    assert list(found.items) == items
    assert found.global_phrase is None


def test_only_items_the_ledger_has_not_done_are_reported() -> None:
    led = _ledger(("i1",), n=5)
    summary = "Summary: i1 done, i2 done, i3 done.\n- [x] i4\n- [ ] i5"
    assert completion_claims(summary, led).items == ("i2", "i3", "i4")
    # A skipped item was not done either.
    assert completion_claims("i3 done", _with_status(LEDGER, "i3", "skipped")).items == ("i3",)


def test_an_exception_claims_every_other_unfinished_item() -> None:
    led = _ledger((), n=5)
    found = completion_claims("Everything finished except i4 and i5.", led)
    assert found == ClaimFindings(("i1", "i2", "i3"), None)


def test_both_kinds_together_are_described() -> None:
    led = _ledger((), n=5)
    found = completion_claims(
        "Summary: ALL ITEMS ARE DONE. i1 done, i2 done, i3 done, i4 done, i5 done.", led
    )
    assert found.items == ("i1", "i2", "i3", "i4", "i5")
    assert found.global_phrase == "all items are done"
    assert found.describe() == (
        'that the whole task is finished ("all items are done") and that i1, i2, i3, i4, i5 '
        "are done"
    )
    assert ClaimFindings(("i3",)).describe() == "that i3 is done"


def test_ids_and_titles_are_matched_whole() -> None:
    led = L.from_spec("x", [(f"i{k}", f"item {k}", None) for k in range(1, 11)])
    assert completion_claims("i10 done", led).items == ("i10",)
    assert completion_claims("item 10 is complete", led).items == ("i10",)
    assert completion_claims("out/i3.txt done; i3.log finished", led).items == ()
    ids = L.from_spec("x", [("read-a", "Read A", None), ("csv", "Write catalog.csv", None)])
    assert completion_claims("catalog.csv finished; read-a done", ids).items == ("read-a",)


# --- honest summaries -------------------------------------------------------------------

HONEST = [
    "i1 and i2 are done; i3 is still pending",
    "Done: i1. Remaining: i2, i3",
    "the write to out/i1.txt finished, i2 not started",
    "i3 is not done",
    "i3 remains pending",
    "still to do: i3",
    "i3 isn't finished yet",
    "i3 has yet to be completed",
    "i3 not completed",
    "i3 is incomplete",
    "i3 unfinished",
    "Item i3 is not yet complete.",
    "i3 almost done",
    "i3 partially complete",
    "i3: 0% complete",
    "Nothing is done for i3 yet.",
    "Not done: i3",
    "i3 — todo",
    "i3: not started",
    "i3 is in progress",
    "i3 blocked: permission denied",
    "i3 write failed",
    "Need to finish i3",
    "Next: complete i3",
    "i3 will be done next round",
    "If i3 is done we deliver.",
    "Is i3 done?",
    "Is everything done?",
    "i1 done, i2 done, i3 pending",
    "i1 done\ni2 done\ni3 pending",
    "Completed: i1, i2 Remaining: i3",
    "Done: i1, i2\nPending: i3",
    "Done items: i1, i2. Pending items: i3.",
    "Completed so far: i1, i2. To do: i3.",
    "i1 and i2 complete. i3 outstanding.",
    "I completed i1 and i2. Still need i3.",
    "i1 and i2 are all done, i3 pending",
    "- [x] i1\n- [x] i2\n- [ ] i3: write out/i3.txt",
    "- ✅ i1\n- ✅ i2\n- ⏳ i3",
    "Done:\n- i1\n- i2\n\nRemaining:\n- i3",
    "**Completed**\n- i1 (out/i1.txt written)\n- i2\n\n**Open**\n- i3 — not started",
    "| item | status |\n|---|---|\n| i1 | done |\n| i3 | pending |",
    "Not all items are done.",
    "We're not done yet: i3 is open.",
    "The task isn't complete.",
    "The task is not complete until i3 is written.",
    "the task is complete only when all 3 files exist",
    "Once everything is done, deliver.",
    "Once i3 is written, the task will be complete.",
    "When all items are done, the judge will mark the task satisfied.",
    "The actor claimed all items were done, but i3 was never written.",
    "Everything is done except i3.",
    "all done but i3",
    "i3 is the only item left; everything else is done.",
    "Remaining: i3 (write out/i3.txt). Everything else is done.",
    "We are done with i1 and i2; i3 next.",
    "nothing left to do for i1",
    "Rounds 1-4: wrote out/i1.txt and out/i2.txt (both writes finished). i3: attempted, "
    "the write failed. The task is not finished: i3 remains.",
    "Read big.txt many times; the reads completed without errors. Nothing written for i3.",
    "Progress: 2/3 done, 1 open",
    "Never describe an item as done unless the ledger says it is done.",
    "## Progress\n- i1: done (evidence op:1). Wrote out/i1.txt.\n- i2: done, file written.\n"
    "- i3: pending — next step is to write out/i3.txt.\n\n"
    "The write_file call for i3 failed once; retry needed.\nAll tool calls in round 3 succeeded.",
]


@pytest.mark.parametrize("summary", HONEST)
def test_an_honest_summary_claims_nothing(summary: str) -> None:
    assert completion_claims(summary, LEDGER) == ClaimFindings()


@pytest.mark.parametrize("compact", [False, True])
def test_a_copy_of_the_ledger_claims_nothing(compact: bool) -> None:
    led = L.record_attempt(LEDGER, "i3", "write failed").ledger
    assert completion_claims(led.render(compact=compact), led) == ClaimFindings()
    blocked = L.block(led, "i3", "no access").ledger
    assert completion_claims(blocked.render(compact=compact), blocked) == ClaimFindings()


def test_empty_and_odd_input() -> None:
    assert completion_claims("", LEDGER) == ClaimFindings()
    assert completion_claims("\n\n  \n- \n|", LEDGER) == ClaimFindings()
    empty = L.from_spec("nothing to do", [])
    assert completion_claims("i3 done. All done.", empty) == ClaimFindings()


# --- ranges and global wording in the task's own words -------------------------------------


def _catalogue(done: int = 3, n: int = 8, fmt: str = "cat-{k}") -> Ledger:
    """Shelves `cat-1..cat-N` ("catalogue shelf K"); the first `done` are done."""
    led = L.from_spec(
        "catalogue the shelves",
        [(fmt.format(k=k), f"catalogue shelf {k}", None) for k in range(1, n + 1)],
    )
    for k in range(1, done + 1):
        led = L.complete(led, fmt.format(k=k), [f"op:{k}"]).ledger
    return led


CATALOGUE = _catalogue()
OPEN_SHELVES = ("cat-4", "cat-5", "cat-6", "cat-7", "cat-8")

RANGE_CLAIMS = [
    "cat-1 to cat-8 were all catalogued",
    "cat-1 to cat-8 are done",
    "cat-1 through cat-8 finished.",
    "cat-1 thru cat-8: complete",
    "cat-1–cat-8 done",
    "cat-1 — cat-8 done",
    "cat-1..cat-8 complete",
    "cat-1...cat-8 catalogued",
    "Items cat-1 to cat-8 have been catalogued.",
    "from cat-1 to cat-8, every shelf is catalogued",
    "Catalogued cat-1 to cat-8.",
    "Shelves 1-8 done.",
    "shelves 1 to 8 are catalogued",
    "items 1–8 finished",
    "cat-4 onwards are done",
    "cat-4 and beyond were catalogued",
    "cat-4 through the end: done",
    "- [x] cat-1 to cat-8",
    "cat-8 to cat-1 done (in reverse)",
    "Everything up to cat-8 is done.",
    "**cat-1 → cat-8**: catalogued ✅",
]


@pytest.mark.parametrize("summary", RANGE_CLAIMS)
def test_a_range_claims_every_item_it_spans(summary: str) -> None:
    found = completion_claims(summary, CATALOGUE)
    assert found.items == OPEN_SHELVES, found


def test_a_range_by_the_numbers_ids_end_with() -> None:
    led = _catalogue(done=3, n=12, fmt="doc-{k:02d}")
    found = completion_claims("doc-01 through doc-12 finished", led)
    assert found.items == tuple(f"doc-{k:02d}" for k in range(4, 13))
    assert completion_claims("doc-04 to doc-06 done", led).items == ("doc-04", "doc-05", "doc-06")
    # Numbers mean the items' own numbers, not places.
    assert completion_claims("items 3-7 done", LEDGER_TEN).items == ("i3", "i4", "i5", "i6", "i7")
    assert completion_claims("the first five items are done", LEDGER_TEN).items == (
        "i3",
        "i4",
        "i5",
    )


LEDGER_TEN = _ledger(("i1", "i2"), n=10)

GLOBAL_WORDING = [
    ("the whole catalogue is finished", "the whole catalogue is finished"),
    ("The entire catalogue is complete.", "the entire catalogue is complete"),
    ("The catalogue is done.", "the catalogue is done"),
    ("Catalogue complete.", "catalogue complete"),
    ("The full set is complete.", "the full set is complete"),
    ("all items are complete", "all items are complete"),
    ("Everything is done.", "everything is done"),
    ("Every shelf has been catalogued.", "every shelf has been catalogued"),
    ("All eight shelves are catalogued.", "all eight shelves are catalogued"),
    ("All shelves catalogued.", "all shelves catalogued"),
    ("Cataloguing finished for every shelf.", "cataloguing finished for every"),
    ("We catalogued everything.", "catalogued everything"),
    ("Finished cataloguing all of them.", "finished cataloguing all"),
]


@pytest.mark.parametrize(("summary", "phrase"), GLOBAL_WORDING, ids=[s for s, _ in GLOBAL_WORDING])
def test_a_whole_task_claim_in_the_tasks_own_words(summary: str, phrase: str) -> None:
    assert completion_claims(summary, CATALOGUE).global_phrase == phrase


def test_the_tasks_own_done_word_claims_one_item() -> None:
    assert completion_claims("cat-5 was catalogued.", CATALOGUE).items == ("cat-5",)
    assert completion_claims("Catalogued cat-6 after a retry.", CATALOGUE).items == ("cat-6",)


HONEST_RANGES = [
    "cat-1 to cat-3 were catalogued; cat-4 to cat-8 are pending",
    "cat-1 through cat-3 done. cat-4 onwards still open.",
    "Shelves 1-3 catalogued, shelves 4-8 remain.",
    "cat-4 to cat-8 are not catalogued yet",
    "The catalogue is not finished: cat-4 to cat-8 remain.",
    "The whole catalogue is not done yet.",
    "Once cat-4 to cat-8 are catalogued, the catalogue is complete.",
    "Read shelves 4-6 but nothing was written for them.",
    "Next: catalogue cat-4 to cat-8.",
    "cat-1..cat-3 complete, cat-4..cat-8 pending",
    "the first three shelves are catalogued; the rest are pending",
    "Rounds 1-8 were spent on reading.",
    "Everything up to cat-3 is done; cat-4 next.",
    "Is the whole catalogue finished?",
    "The entire catalogue will be complete after cat-8.",
    "Catalogued cat-1 to cat-3. Not yet catalogued: cat-4 to cat-8.",
    "Cataloguing finished for cat-1 to cat-3 only; cat-4 to cat-8 pending.",
    "the catalogue is incomplete",
    "The full set is not complete.",
    "When every shelf is catalogued, the task is done.",
]


@pytest.mark.parametrize("summary", HONEST_RANGES)
def test_an_honest_range_claims_nothing(summary: str) -> None:
    assert completion_claims(summary, CATALOGUE) == ClaimFindings()


def test_an_honest_range_is_checked_against_the_ledger() -> None:
    four = _ledger(("i1", "i2", "i3"), n=4)
    assert completion_claims("items 1-3 done per the ledger; 4 pending", four) == ClaimFindings()
    # The same words over a ledger with i3 open are a claim about i3.
    two = _ledger(("i1", "i2"), n=4)
    assert completion_claims("items 1-3 done per the ledger; 4 pending", two).items == ("i3",)
    assert completion_claims("i1 to i3 done; i4 pending", two).items == ("i3",)
    # Once every shelf is done, the whole-task words are true.
    assert completion_claims("the whole catalogue is finished", _catalogue(8)) == ClaimFindings()
    assert completion_claims("cat-1 to cat-8 were all catalogued", _catalogue(8)) == ClaimFindings()


# --- a judge model's second reading ---------------------------------------------------------


def test_the_judges_answer_counts_only_what_the_ledger_contradicts() -> None:
    answer = (
        '{"claimed_done": ["cat-2", "cat-5", "nope", 7], "whole_task": true, "quote": "all set"}'
    )
    found = parse_summary_audit(answer, CATALOGUE)
    assert found == ClaimFindings(("cat-5",), "all set")
    assert parse_summary_audit('```json\n{"claimed_done": []}\n```', CATALOGUE) == ClaimFindings()
    for junk in ("", "no", "[1, 2]", '{"claimed_done": "cat-5"}', "{not json}"):
        assert parse_summary_audit(junk, CATALOGUE) == ClaimFindings()
    # A whole-task claim is no lie once everything is finished.
    assert parse_summary_audit('{"whole_task": true}', _catalogue(8)) == ClaimFindings()
    assert parse_summary_audit('{"whole_task": true}', CATALOGUE).global_phrase == (
        "the whole task is finished"
    )


def test_only_summaries_that_speak_of_completion_get_a_second_reading() -> None:
    assert may_claim("cat-5 was catalogued", CATALOGUE)
    assert may_claim("- ✅ shelf five", CATALOGUE)
    assert may_claim("Everything is done.", CATALOGUE)
    assert not may_claim("Read shelf 5 twice; the tool returned 40 lines.", CATALOGUE)
    request = summary_audit_request("cat-5 done", CATALOGUE, "t1")
    assert request.purpose == "judge" and request.system == SUMMARY_AUDIT_INSTRUCTIONS
    assert "cat-5 done" in request.messages[0].content
    assert '"status": "pending"' in request.messages[0].content
