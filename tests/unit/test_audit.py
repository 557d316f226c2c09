"""The audit by table: `tether.runtime.judge.judges.audit`, `belongs` and `partial_record`.

Every case starts from a small ledger (items `a`, `b`, `c`), a catalogue of evidence
the runtime knows (round, focus, tool, fingerprint), one round's facts (round 5, focus
`a` unless a case says otherwise) and the verdicts of the rule judge and an LLM judge,
and checks what the audit lets through: statuses, evidence, counters, warning codes,
the runtime's decision, proposals and credited fingerprints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from tether import ledger as L
from tether.runtime.judge.judges import (
    AuditOutcome,
    Evidence,
    ItemPolicy,
    OpSummary,
    ProposedChange,
    RoundFacts,
    Verdict,
    audit,
    belongs,
    partial_record,
)
from tether.runtime.round import progress as P
from tether.spec import Limits

ROUND = 5

#: The evidence the runtime can resolve. `op:a5`: made this round (focus a); `op:a3`:
#: an earlier round of a; `op:b4`: b's round; `op:ls5`/`op:ls4`: the same listing call in
#: this round and an earlier one of a; `artifact:rule-b`: b's rule result;
#: `artifact:report`: a named artifact from no round; `op:tk5`: a linked tool this round.
EVIDENCE: dict[str, Evidence] = {
    e.ref: e
    for e in (
        Evidence("op:a5", ROUND, "a", "write_file", fingerprint="write_file|a5"),
        Evidence("op:a5b", ROUND, "a", "write_file", fingerprint="write_file|a5b"),
        Evidence("op:a3", 3, "a", "read_file", fingerprint="read_file|a3"),
        Evidence("op:b4", 4, "b", "write_file", fingerprint="write_file|b4"),
        Evidence("op:ls5", ROUND, "a", "list_files", fingerprint="list_files|same"),
        Evidence("op:ls4", 4, "a", "list_files", fingerprint="list_files|same"),
        Evidence("artifact:rule-b", None, None, None, "b", rule_item="b", fingerprint="blob-b"),
        Evidence("artifact:report", None, None, None, "report", fingerprint="blob-r"),
        Evidence("op:tk5", ROUND, "a", "create_ticket", fingerprint="create_ticket|t"),
    )
}

OK = OpSummary("x.r5.c0", "write_file", {"path": "a"}, "succeeded")
FAILED = OpSummary("x.r5.c1", "read_file", {"path": "gone"}, "failed", error="no such file")
DEFERRED = OpSummary("x.r5.c2", "ticket", {}, "deferred")
UPLOADED = OpSummary("x.r5.c3", "upload", {"batch": 41}, "succeeded", effect="write")
#: The same calls with another outcome: the file read says something else, the read
#: fails in another way.
OK_CHANGED = OpSummary("x.r5.c0", "write_file", {"path": "a"}, "succeeded", "other text")
FAILED_CHANGED = OpSummary(
    "x.r5.c1", "read_file", {"path": "gone"}, "failed", error="permission denied"
)
#: A status asked of the outside world (`Tool.volatile`), and a read of the workspace.
POLL = OpSummary("x.r5.c3", "build_status", {"id": 41}, "succeeded", "running", volatile=True)
POLL_DONE = OpSummary("x.r5.c3", "build_status", {"id": 41}, "succeeded", "passed", volatile=True)
READ = OpSummary("x.r5.c4", "read_file", {"path": "a"}, "succeeded", "text")
EDIT = OpSummary("x.r5.c5", "write_file", {"path": "a"}, "succeeded", "ok", effect="write")


def marks(*ops: OpSummary) -> tuple[str, ...]:
    """What an earlier round with these calls left in the item's `seen`."""
    return P.moves(ops, None, ()).marks


def rule_marks(state: str) -> tuple[str, ...]:
    """What an earlier round left when the item's rule check found `state`."""
    return P.moves((), state, ()).marks


def ch(item: str, status: Any = None, *refs: str, note: str | None = None) -> ProposedChange:
    return ProposedChange(item, status, tuple(refs), note)


def llm(decision: str = "continue", *changes: ProposedChange, reason: str = "") -> Verdict:
    return Verdict(decision, tuple(changes), reason, source="llm")  # type: ignore[arg-type]


def rules(*changes: ProposedChange) -> Verdict:
    return Verdict("continue", tuple(changes), "", source="rules")


def rules_checked(checks: Mapping[str, str]) -> Verdict:
    """The rule judge's verdict with unmet checks (`{item: state}`) and no change."""
    return Verdict("continue", (), "", source="rules", checks=dict(checks))


def facts(
    focus: str | None = "a",
    *ops: OpSummary,
    non_convergent: str | None = None,
    round_no: int = ROUND,
) -> RoundFacts:
    return RoundFacts(round_no, focus, "agent text", tuple(ops), non_convergent)


def make_ledger(
    items: Sequence[str] = ("a", "b", "c"),
    optional: Sequence[str] = (),
    state: Mapping[str, Mapping[str, Any]] | None = None,
) -> L.Ledger:
    led = L.from_spec("objective", [(i, f"title {i}", None, i in optional) for i in items])
    changes = [
        L.ItemChange(
            item,
            status=s.get("status"),
            evidence=tuple(s.get("evidence", ())),
            note=s.get("note"),
            attempts_delta=s.get("attempts", 0),
            breaker=s.get("breaker"),
        )
        for item, s in (state or {}).items()
    ]
    return L.apply(led, changes).ledger if changes else led


@dataclass
class Case:
    name: str
    verdicts: list[Verdict]
    state: dict[str, dict[str, Any]] = field(default_factory=dict)
    facts: RoundFacts = field(default_factory=facts)
    policies: dict[str, ItemPolicy] = field(default_factory=dict)
    seen: dict[str, tuple[str, ...]] = field(default_factory=dict)
    rounds: int = 0
    items: tuple[str, ...] = ("a", "b", "c")
    optional: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)
    # expectations (None: not checked)
    status: dict[str, str] | None = None
    evidence: dict[str, tuple[str, ...]] | None = None
    codes: list[str] | None = None
    decision: str | None = None
    proposals: dict[str, tuple[str, str]] | None = None
    credited: dict[str, tuple[str, ...]] | None = None
    counters: dict[str, tuple[int, int]] | None = None  # item: (attempts, breaker)
    note: dict[str, str] | None = None  # item: note prefix


def run(case: Case) -> AuditOutcome:
    led = make_ledger(case.items, case.optional, case.state)
    return audit(
        led,
        case.verdicts,
        evidence=EVIDENCE.get,
        facts=case.facts,
        limits=case.limits,
        policies=case.policies,
        seen=case.seen,
        rounds=case.rounds,
    )


def linked(*tools: str, artifacts: Sequence[str] = (), shared: bool = False) -> ItemPolicy:
    return ItemPolicy(
        link_tools=frozenset(tools), link_artifacts=frozenset(artifacts), shared_evidence=shared
    )


IN_A = {"a": {"status": "in_progress"}}
ALL_DONE_BUT_A = {
    "a": {"status": "in_progress"},
    "b": {"status": "done", "evidence": ["op:b4"]},
    "c": {"status": "done", "evidence": ["artifact:report"]},
}

CASES = [
    # --- done needs evidence of its own, cited in that verdict ---------------------------
    Case(
        "done-with-this-rounds-op",
        [llm("continue", ch("a", "done", "op:a5"))],
        IN_A,
        facts("a", OK),
        status={"a": "done", "b": "pending"},
        evidence={"a": ("op:a5",)},
        codes=[],
        decision="continue",
        credited={"a": ("write_file|a5",)},
        counters={"a": (0, 0)},
    ),
    Case(
        "done-last-item-is-satisfied",
        [llm("continue", ch("a", "done", "op:a5"))],
        ALL_DONE_BUT_A,
        status={"a": "done"},
        codes=[],
        decision="satisfied",
    ),
    Case(
        "done-without-evidence",
        [llm("satisfied", ch("a", "done"))],
        IN_A,
        status={"a": "in_progress"},
        codes=["done_without_evidence", "satisfied_with_pending"],
        decision="continue",
        counters={"a": (0, 1)},
    ),
    Case(
        "done-with-unresolved-refs",
        [llm("continue", ch("a", "done", "op:nope", "artifact:nope", "op:", "garbage"))],
        IN_A,
        status={"a": "in_progress"},
        evidence={"a": ()},
        codes=["unresolved_evidence", "done_without_evidence"],
    ),
    Case(
        "done-with-another-items-round",
        [llm("continue", ch("a", "done", "op:b4"))],
        IN_A,
        status={"a": "in_progress"},
        codes=["evidence_not_item", "done_without_evidence"],
    ),
    Case(
        "done-with-another-items-rule-result",
        [llm("continue", ch("a", "done", "artifact:rule-b"))],
        IN_A,
        status={"a": "in_progress"},
        codes=["evidence_not_item", "done_without_evidence"],
    ),
    Case(
        "good-ref-among-bad-ones-is-enough-and-only-it-is-kept",
        [llm("continue", ch("a", "done", "op:nope", "op:b4", "op:a5"))],
        IN_A,
        status={"a": "done"},
        evidence={"a": ("op:a5",)},
        codes=["unresolved_evidence", "evidence_not_item"],
    ),
    Case(
        "earlier-attached-evidence-does-not-carry-to-done",
        [llm("continue", ch("a", "done", note="see attached"))],
        {"a": {"status": "in_progress", "evidence": ["op:a3"]}},
        status={"a": "in_progress"},
        evidence={"a": ("op:a3",)},
        codes=["done_without_evidence"],
    ),
    Case(
        "citing-attached-evidence-again-in-the-done-verdict",
        [llm("continue", ch("a", "done", "op:a3"))],
        {"a": {"status": "in_progress", "evidence": ["op:a3"]}},
        status={"a": "done"},
        evidence={"a": ("op:a3",)},
        codes=[],
    ),
    Case(
        "done-for-a-non-focus-item-with-the-focus-op",
        [llm("continue", ch("a", "done", "op:a5"), ch("b", "done", "op:a5"))],
        IN_A,
        status={"a": "done", "b": "pending"},
        codes=["evidence_not_item", "done_without_evidence"],
    ),
    # --- evidence credited elsewhere -----------------------------------------------------
    Case(
        "linked-but-already-credited-in-the-ledger",
        [llm("continue", ch("b", "done", "op:a3"))],
        {"a": {"status": "done", "evidence": ["op:a3"]}},
        policies={"b": linked("read_file")},
        status={"b": "pending"},
        codes=["evidence_already_credited", "done_without_evidence"],
    ),
    Case(
        "linked-but-credited-earlier-in-the-same-audit",
        [llm("continue", ch("a", "done", "op:a5"), ch("b", "done", "op:a5"))],
        IN_A,
        policies={"b": linked("write_file")},
        status={"a": "done", "b": "pending"},
        codes=["evidence_already_credited", "done_without_evidence"],
    ),
    Case(
        "linked-and-shared",
        [llm("continue", ch("a", "done", "op:a5"), ch("b", "done", "op:a5"))],
        IN_A,
        policies={"b": linked("write_file", shared=True)},
        status={"a": "done", "b": "done"},
        evidence={"a": ("op:a5",), "b": ("op:a5",)},
        codes=[],
    ),
    Case(
        "shared-but-not-linked",
        [llm("continue", ch("b", "done", "op:a5"))],
        IN_A,
        policies={"b": ItemPolicy(shared_evidence=True)},
        status={"b": "pending"},
        codes=["evidence_not_item", "done_without_evidence"],
    ),
    Case(
        "attached-evidence-counts-as-credited",
        [llm("continue", ch("b", "done", "op:a3"))],
        {"a": {"status": "in_progress", "evidence": ["op:a3"]}},
        policies={"b": linked("read_file")},
        status={"b": "pending"},
        codes=["evidence_already_credited", "done_without_evidence"],
    ),
    Case(
        "linked-artifact-name",
        [llm("continue", ch("b", "done", "artifact:report"))],
        IN_A,
        policies={"b": linked(artifacts=["report"])},
        status={"b": "done"},
        codes=[],
    ),
    Case(
        "unlinked-artifact-from-no-round",
        [llm("continue", ch("a", "done", "artifact:report"))],
        IN_A,
        status={"a": "in_progress"},
        codes=["evidence_not_item", "done_without_evidence"],
    ),
    Case(
        "linked-tool-from-the-focus-of-another-item",
        [llm("continue", ch("c", "done", "op:tk5"))],
        IN_A,
        policies={"c": linked("create_ticket")},
        status={"c": "done"},
        codes=[],
    ),
    # --- rules ---------------------------------------------------------------------------
    Case(
        "rule-result-proves-its-item-outside-its-focus",
        [rules(ch("b", "done", "artifact:rule-b", note="rule: file"))],
        IN_A,
        status={"b": "done", "a": "in_progress"},
        codes=[],
        counters={"a": (0, 1)},
    ),
    Case(
        "rule-verdict-op-from-another-round",
        [rules(ch("b", "done", "op:a3"))],
        IN_A,
        status={"b": "done"},
        codes=[],
    ),
    Case(
        "llm-cannot-mark-a-rule-item-done",
        [llm("continue", ch("a", "done", "op:a5"))],
        IN_A,
        facts("a", OK),
        policies={"a": ItemPolicy(rule=True)},
        status={"a": "in_progress"},
        evidence={"a": ("op:a5",)},  # attached, since it belongs
        codes=["rule_item_done_by_judge"],
        counters={"a": (0, 0)},  # and fresh: progress
    ),
    Case(
        "rule-wins-over-llm-for-the-same-item",
        [rules(ch("a", "done", "op:a5")), llm("continue", ch("a", "pending"))],
        IN_A,
        policies={"a": ItemPolicy(rule=True)},
        status={"a": "done"},
        codes=[],
    ),
    Case(
        "rules-cannot-share-an-op-between-exclusive-items",
        [rules(ch("a", "done", "op:a5"), ch("b", "done", "op:a5"))],
        IN_A,
        policies={"a": ItemPolicy(rule=True), "b": ItemPolicy(rule=True)},
        status={"a": "done", "b": "pending"},
        codes=["evidence_already_credited", "done_without_evidence"],
    ),
    # --- proposals only ------------------------------------------------------------------
    Case(
        "judge-blocked-skipped-waived-are-proposals",
        [
            llm(
                "satisfied",
                ch("a", "blocked", note="too hard"),
                ch("b", "skipped", note="not needed"),
                ch("c", "waived", note="user will not mind"),
            )
        ],
        IN_A,
        status={"a": "in_progress", "b": "pending", "c": "pending"},
        codes=[
            "judge_proposed_blocked",
            "judge_proposed_skipped",
            "judge_proposed_waived",
            "satisfied_with_pending",
        ],
        decision="continue",
        proposals={
            "a": ("blocked", "too hard"),
            "b": ("skipped", "not needed"),
            "c": ("waived", "user will not mind"),
        },
    ),
    Case(
        "a-proposal-with-evidence-still-attaches-what-belongs",
        [llm("continue", ch("a", "skipped", "op:a5", note="skip"))],
        IN_A,
        facts("a", OK),
        status={"a": "in_progress"},
        evidence={"a": ("op:a5",)},
        codes=["judge_proposed_skipped"],
        proposals={"a": ("skipped", "skip")},
    ),
    Case(
        "proposal-for-a-blocked-item-is-recorded",
        [llm("continue", ch("b", "skipped", note="give up"))],
        {"a": {"status": "in_progress"}, "b": {"status": "blocked", "note": "no progress"}},
        status={"b": "blocked"},
        codes=["judge_proposed_skipped"],
        proposals={"b": ("skipped", "give up")},
    ),
    Case(
        "the-contract-lets-an-optional-item-be-skipped",
        [llm("continue", ch("b", "skipped", note="nice to have"))],
        IN_A,
        optional=("b",),
        policies={"b": ItemPolicy(optional=True)},
        status={"b": "skipped"},
        codes=[],
        proposals={},
    ),
    Case(
        "a-waived-item-stays-waived-whatever-the-judge-says",
        [llm("continue", ch("b", "done", "op:b4"), ch("c", "blocked", note="x"))],
        {
            "a": {"status": "in_progress"},
            "b": {"status": "waived", "note": "w"},
            "c": {"status": "waived", "note": "w"},
        },
        status={"b": "waived", "c": "waived"},
        evidence={"b": (), "c": ()},
        codes=["waived_item_changed_by_judge", "waived_item_changed_by_judge"],
    ),
    Case(
        "unknown-item",
        [llm("continue", ch("zzz", "done", "op:a5"))],
        IN_A,
        codes=["unknown_item"],
        status={"a": "in_progress"},
    ),
    Case(
        "evidence-for-a-finished-item-changes-nothing",
        [llm("continue", ch("b", None, "op:b4"))],
        {"a": {"status": "in_progress"}, "b": {"status": "done", "evidence": ["artifact:rule-b"]}},
        status={"b": "done"},
        evidence={"b": ("artifact:rule-b",)},
        codes=[],
    ),
    # --- the runtime's decision ----------------------------------------------------------
    Case(
        "satisfied-with-gaps-waits-for-a-decision",
        [llm("satisfied")],
        {
            "a": {"status": "blocked", "note": "x"},
            "b": {"status": "done", "evidence": ["op:b4"]},
            "c": {"status": "waived", "note": "w"},
        },
        facts(None),
        codes=["satisfied_with_gaps"],
        decision="need_decision",
    ),
    Case(
        "done-and-waived-is-satisfied",
        [llm("continue")],
        {"a": {"status": "waived", "note": "w"}, "b": {"status": "done", "evidence": ["op:b4"]}},
        facts(None),
        items=("a", "b"),
        codes=[],
        decision="satisfied",
    ),
    Case(
        "optional-skipped-is-finished",
        [llm("continue")],
        {"a": {"status": "skipped", "note": "s"}, "b": {"status": "done", "evidence": ["op:b4"]}},
        facts(None),
        items=("a", "b"),
        optional=("a",),
        decision="satisfied",
    ),
    Case(
        "skipped-without-the-contracts-leave-is-a-gap",
        [llm("satisfied")],
        {"a": {"status": "skipped", "note": "s"}, "b": {"status": "done", "evidence": ["op:b4"]}},
        facts(None),
        items=("a", "b"),
        codes=["satisfied_with_gaps"],
        decision="need_decision",
    ),
    Case(
        "abandon-is-a-question-for-a-human",
        [llm("abandon", reason="hopeless")],
        IN_A,
        codes=["judge_proposed_abandon"],
        decision="need_user",
    ),
    Case(
        "abandon-with-nothing-open-is-the-runtimes-decision",
        [llm("abandon")],
        {"a": {"status": "blocked", "note": "x"}},
        facts(None),
        items=("a",),
        codes=[],
        decision="need_decision",
    ),
    Case(
        "need-user",
        [llm("need_user", reason="which bucket?")],
        IN_A,
        codes=[],
        decision="need_user",
    ),
    Case(
        "any-decision-with-everything-done-is-satisfied",
        [llm("abandon", ch("a", "done", "op:a5"))],
        ALL_DONE_BUT_A,
        decision="satisfied",
        codes=[],
    ),
    # --- the breaker on the focus item: progress from what the round did -----------------
    Case(
        "no-progress-raises-the-breaker",
        [llm("continue")],
        {"a": {"status": "in_progress", "breaker": 1}},
        counters={"a": (0, 2)},
        status={"a": "in_progress"},
        codes=[],
    ),
    Case(
        "no-progress-at-the-limit-blocks",
        [llm("continue")],
        {"a": {"status": "in_progress", "breaker": 2}},
        status={"a": "blocked"},
        counters={"a": (0, 3)},
        note={"a": "no progress in 3 rounds"},
        codes=["item_blocked"],
    ),
    Case(
        "a-new-successful-call-is-progress-with-nothing-attached",
        [llm("continue")],
        {"a": {"status": "in_progress", "breaker": 2}},
        facts("a", OK),
        status={"a": "in_progress"},
        counters={"a": (0, 0)},
        codes=[],
    ),
    Case(
        "the-same-call-with-the-same-result-is-no-progress",
        [llm("continue")],
        {"a": {"status": "in_progress", "breaker": 2}},
        facts("a", OK),
        seen={"a": marks(OK)},
        status={"a": "blocked"},
        codes=["item_blocked"],
    ),
    Case(
        "the-same-call-with-a-new-result-is-progress",
        [llm("continue")],
        {"a": {"status": "in_progress", "breaker": 2}},
        facts("a", OK_CHANGED),
        seen={"a": marks(OK)},
        counters={"a": (0, 0)},
    ),
    Case(
        "attached-evidence-of-a-repeat-is-no-progress",
        [llm("continue", ch("a", "in_progress", "op:a5"))],
        {"a": {"status": "in_progress", "breaker": 2}},
        facts("a", OK),
        seen={"a": marks(OK)},
        status={"a": "blocked"},
        evidence={"a": ("op:a5",)},
        codes=["item_blocked"],
    ),
    Case(
        "a-repeat-with-other-items-evidence-is-no-progress-on-the-focus",
        [llm("continue", ch("c", None, "op:tk5"))],
        {"a": {"status": "in_progress", "breaker": 2}},
        facts("a", OK),
        seen={"a": marks(OK)},
        policies={"c": linked("create_ticket")},
        status={"a": "blocked", "c": "pending"},
        evidence={"c": ("op:tk5",)},
        codes=["item_blocked"],
    ),
    Case(
        "asking-again-what-changes-by-itself-is-waiting",
        [llm("continue")],
        {"a": {"status": "in_progress", "breaker": 2}},
        facts("a", POLL, READ),
        seen={"a": marks(POLL, READ)},
        status={"a": "in_progress"},
        counters={"a": (0, 0)},  # waiting clears the count of rounds without progress
        codes=[],
    ),
    Case(
        "a-changed-answer-after-waiting-is-progress",
        [llm("continue")],
        {"a": {"status": "in_progress", "breaker": 2}},
        facts("a", POLL_DONE),
        seen={"a": marks(POLL)},
        counters={"a": (0, 0)},
    ),
    Case(
        "re-reading-the-workspace-is-no-progress-even-beside-a-poll-of-nothing-new",
        [llm("continue")],
        {"a": {"status": "in_progress", "breaker": 2}},
        facts("a", READ),
        seen={"a": marks(POLL, READ)},
        status={"a": "blocked"},
        codes=["item_blocked"],
    ),
    Case(
        "the-same-edit-again-beside-a-poll-is-waiting",
        [llm("continue")],
        {"a": {"status": "in_progress", "breaker": 2}},
        facts("a", POLL, EDIT),
        seen={"a": marks(POLL, EDIT)},
        status={"a": "in_progress"},
        counters={"a": (0, 0)},
        codes=[],
    ),
    Case(
        "a-failure-seen-before-beside-a-poll-is-no-waiting",
        [llm("continue")],
        {"a": {"status": "in_progress", "breaker": 1}},
        facts("a", POLL, FAILED),
        seen={"a": marks(POLL, FAILED)},
        counters={"a": (1, 2)},
    ),
    Case(
        "a-wait-that-never-ends-stops-at-the-per-item-cap",
        [llm("continue")],
        IN_A,
        facts("a", POLL),
        seen={"a": marks(POLL)},
        rounds=40,
        status={"a": "blocked"},
        note={
            "a": "not finished in 40 rounds (limits.max_rounds_per_item); still asking "
            "again with the same answers"
        },
        codes=["item_blocked"],
    ),
    Case(
        "a-first-failure-is-new-and-no-attempt",
        [llm("continue")],
        {"a": {"status": "in_progress", "breaker": 2}},
        facts("a", FAILED),
        status={"a": "in_progress"},
        counters={"a": (0, 0)},
    ),
    Case(
        "the-same-failure-again-is-an-attempt",
        [llm("continue")],
        {"a": {"status": "in_progress", "attempts": 1}},
        facts("a", OK, FAILED),
        seen={"a": marks(FAILED)},
        status={"a": "in_progress"},
        counters={"a": (2, 0)},
    ),
    Case(
        "a-failure-that-changed-is-progress-and-no-attempt",
        [llm("continue")],
        {"a": {"status": "in_progress", "breaker": 2}},
        facts("a", FAILED_CHANGED),
        seen={"a": marks(FAILED)},
        status={"a": "in_progress"},
        counters={"a": (0, 0)},
    ),
    Case(
        "attempts-at-the-limit-block-despite-new-work",
        [llm("continue", ch("a", None, "op:ls5"))],
        {"a": {"status": "in_progress", "attempts": 2}},
        facts("a", OK, FAILED),
        seen={"a": marks(FAILED)},
        status={"a": "blocked"},
        note={"a": "failed 3 attempts (the same failures again); last error: no such file"},
        codes=["item_blocked"],
    ),
    Case(
        "the-items-own-attempt-limit",
        [llm("continue")],
        {"a": {"status": "in_progress", "attempts": 0}},
        facts("a", FAILED),
        seen={"a": marks(FAILED)},
        policies={"a": ItemPolicy(max_attempts=1)},
        status={"a": "blocked"},
        note={"a": "failed 1 attempts"},
    ),
    Case(
        "non-convergent-blocks-whatever-is-attached",
        [llm("continue", ch("a", "in_progress", "op:ls5", "op:a5b"))],
        IN_A,
        facts("a", OK, FAILED, non_convergent="read_file failed 3 times"),
        seen={"a": marks(FAILED)},
        status={"a": "blocked"},
        evidence={"a": ("op:ls5", "op:a5b")},
        counters={"a": (1, 1)},
        note={"a": "non-convergent: read_file failed 3 times"},
        codes=["item_blocked"],
    ),
    Case(
        "done-beats-non-convergence-and-counts-no-attempt",
        [llm("continue", ch("a", "done", "op:a5"))],
        IN_A,
        facts("a", OK, FAILED, non_convergent="read_file failed 3 times"),
        seen={"a": marks(FAILED)},
        status={"a": "done"},
        counters={"a": (0, 0)},
    ),
    Case(
        "non-convergent-without-a-focus-asks-a-human",
        [llm("continue")],
        IN_A,
        facts(None, FAILED, non_convergent="read_file failed 3 times"),
        codes=["non_convergent"],
        decision="need_user",
        counters={"a": (0, 0)},
    ),
    Case(
        "a-rule-check-whose-state-changed-is-progress",
        [rules_checked({"a": "artifacts: 2 of 3"}), llm("continue")],
        {"a": {"status": "in_progress", "breaker": 2}},
        seen={"a": rule_marks("artifacts: 1 of 3")},
        status={"a": "in_progress"},
        counters={"a": (0, 0)},
    ),
    Case(
        "a-rule-check-in-the-same-state-is-no-progress",
        [rules_checked({"a": "artifacts: 1 of 3"}), llm("continue")],
        {"a": {"status": "in_progress", "breaker": 2}},
        seen={"a": rule_marks("artifacts: 1 of 3")},
        status={"a": "blocked"},
        codes=["item_blocked"],
    ),
    Case(
        "the-per-item-round-cap-blocks-however-new",
        [llm("continue")],
        IN_A,
        facts("a", OK),
        rounds=40,
        status={"a": "blocked"},
        note={"a": "not finished in 40 rounds (limits.max_rounds_per_item)"},
        codes=["item_blocked"],
    ),
    Case(
        "past-the-cap-a-rule-check-that-moved-with-work-goes-on",
        [rules_checked({"a": "synced 410 of 500"}), llm("continue")],
        IN_A,
        facts("a", UPLOADED),
        seen={"a": rule_marks("synced 400 of 500")},
        rounds=41,
        status={"a": "in_progress"},
        codes=[],
    ),
    Case(
        "past-the-cap-a-rule-check-that-moved-without-work-blocks",
        [rules_checked({"a": "synced 410 of 500"}), llm("continue")],
        IN_A,
        facts("a", OK),
        seen={"a": rule_marks("synced 400 of 500")},
        rounds=41,
        status={"a": "blocked"},
        codes=["item_blocked"],
    ),
    Case(
        "three-caps-end-even-a-moving-check",
        [rules_checked({"a": "synced 490 of 500"}), llm("continue")],
        IN_A,
        facts("a", UPLOADED),
        seen={"a": rule_marks("synced 480 of 500")},
        rounds=120,
        status={"a": "blocked"},
        note={"a": "not finished in 120 rounds (limits.max_rounds_per_item)"},
        codes=["item_blocked"],
    ),
    Case(
        "past-the-cap-a-rule-check-that-stood-still-blocks",
        [rules_checked({"a": "synced 400 of 500"}), llm("continue")],
        IN_A,
        facts("a", OK),
        seen={"a": rule_marks("synced 400 of 500")},
        rounds=41,
        status={"a": "blocked"},
        note={"a": "not finished in 41 rounds (limits.max_rounds_per_item)"},
        codes=["item_blocked"],
    ),
    Case(
        "past-the-cap-a-file-that-changed-blocks",
        [rules_checked({"a": "file out/a.md: sha256 b2"}), llm("continue")],
        IN_A,
        facts("a", OK),
        seen={"a": rule_marks("file out/a.md: sha256 b1")},
        rounds=41,
        status={"a": "blocked"},
        note={"a": "not finished in 41 rounds (limits.max_rounds_per_item)"},
        codes=["item_blocked"],
    ),
    Case(
        "below-the-cap-new-work-goes-on",
        [llm("continue")],
        IN_A,
        facts("a", OK),
        rounds=39,
        status={"a": "in_progress"},
        codes=[],
    ),
    Case(
        "no-cap-when-the-contract-turns-it-off",
        [llm("continue")],
        IN_A,
        facts("a", OK),
        rounds=10_000,
        limits=Limits(max_rounds_per_item=None),
        status={"a": "in_progress"},
        codes=[],
    ),
    Case(
        "done-in-the-last-round-the-cap-allows",
        [llm("continue", ch("a", "done", "op:a5"))],
        IN_A,
        facts("a", OK),
        rounds=40,
        status={"a": "done"},
        codes=[],
    ),
    Case(
        "a-deferred-round-is-no-attempt",
        [llm("continue")],
        {"a": {"status": "in_progress", "breaker": 2}},
        facts("a", DEFERRED),
        status={"a": "in_progress"},
        counters={"a": (0, 2)},
        codes=[],
    ),
    Case(
        "an-optional-focus-the-runtime-would-block-is-skipped",
        [llm("continue")],
        {"a": {"status": "in_progress", "breaker": 2}},
        optional=("a",),
        policies={"a": ItemPolicy(optional=True)},
        status={"a": "skipped"},
        codes=["item_skipped"],
    ),
    Case(
        "a-blocked-focus-is-left-alone",
        [llm("continue")],
        {"a": {"status": "blocked", "note": "x", "breaker": 3}},
        facts("a", FAILED),
        status={"a": "blocked"},
        counters={"a": (0, 3)},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_audit(case: Case) -> None:
    out = run(case)
    led = out.update.ledger
    if case.status is not None:
        assert {i: led.item(i).status for i in case.status} == case.status
    if case.evidence is not None:
        assert {i: led.item(i).evidence for i in case.evidence} == case.evidence
    if case.codes is not None:
        assert sorted(w.code for w in out.warnings) == sorted(case.codes)
    if case.decision is not None:
        assert out.decision == case.decision
    if case.proposals is not None:
        assert dict(out.proposals) == case.proposals
    if case.credited is not None:
        assert dict(out.credited) == case.credited
    if case.counters is not None:
        assert {i: (led.item(i).attempts, led.item(i).breaker) for i in case.counters} == (
            case.counters
        )
    if case.note is not None:
        for item, prefix in case.note.items():
            assert led.item(item).note.startswith(prefix), led.item(item).note
    # Whatever the case: satisfied only with every item finished, done only with evidence.
    if out.decision == "satisfied":
        assert led.gaps() == []
    for d, s in led.items():
        if s.status == "done":
            assert s.evidence
        before = make_ledger(case.items, case.optional, case.state).item(d.id).status
        if s.status == "waived":
            assert before == "waived", "a judge waived an item"
        if s.status == "skipped" and before != "skipped":
            assert d.optional, "a judge skipped an item the contract does not make optional"
        if s.status == "blocked" and before != "blocked":
            assert any(w.code == "item_blocked" for w in out.warnings)


@pytest.mark.parametrize("status", ["in_progress", "pending"])
def test_a_judge_cannot_undo_a_waiver(status: str) -> None:
    led = make_ledger(state={"a": {"status": "waived", "note": "waived by pm: retired"}})
    out = audit(
        led,
        [llm("continue", ch("a", status, note="let us do it after all"))],
        evidence=EVIDENCE.get,
        facts=facts("b"),
        limits=Limits(),
    )
    assert out.update.ledger.item("a").status == "waived"
    assert [w.code for w in out.warnings] == ["waived_item_changed_by_judge"]


def test_audit_is_pure() -> None:
    led = make_ledger(state=IN_A)
    frozen = led.to_dict()
    seen = {"a": ("x",)}
    verdicts = [llm("satisfied", ch("a", "done", "op:a5"), ch("b", "blocked", note="n"))]
    first = audit(
        led, verdicts, evidence=EVIDENCE.get, facts=facts("a", OK), limits=Limits(), seen=seen
    )
    second = audit(
        led, verdicts, evidence=EVIDENCE.get, facts=facts("a", OK), limits=Limits(), seen=seen
    )
    assert led.to_dict() == frozen and seen == {"a": ("x",)}
    assert first.update.ledger.to_dict() == second.update.ledger.to_dict()
    assert first.warnings == second.warnings and first.decision == second.decision


def test_audit_never_writes_an_unchanged_ledger() -> None:
    led = make_ledger(state={"a": {"status": "blocked", "note": "x"}})
    out = audit(led, [llm("continue")], evidence=EVIDENCE.get, facts=facts("a"), limits=Limits())
    assert not out.update.changed and out.update.ledger.version == led.version


# --- belongs ---------------------------------------------------------------------------------

BELONGS = [
    ("own-rule-verdict", EVIDENCE["op:b4"], "a", ItemPolicy(), True, True),
    ("rule-result-artifact", EVIDENCE["artifact:rule-b"], "b", ItemPolicy(), False, True),
    ("other-items-rule-result", EVIDENCE["artifact:rule-b"], "a", ItemPolicy(), False, False),
    ("focus-round", EVIDENCE["op:a3"], "a", ItemPolicy(), False, True),
    ("other-focus-round", EVIDENCE["op:b4"], "a", ItemPolicy(), False, False),
    ("linked-tool", EVIDENCE["op:b4"], "a", linked("write_file"), False, True),
    ("unlinked-tool", EVIDENCE["op:b4"], "a", linked("read_file"), False, False),
    (
        "linked-artifact",
        EVIDENCE["artifact:report"],
        "a",
        linked(artifacts=["report"]),
        False,
        True,
    ),
    (
        "unlinked-artifact",
        EVIDENCE["artifact:report"],
        "a",
        linked(artifacts=["other"]),
        False,
        False,
    ),
    ("no-round-no-link", Evidence("op:z"), "a", linked("write_file"), False, False),
    (
        "sharing-is-not-belonging",
        EVIDENCE["op:b4"],
        "a",
        ItemPolicy(shared_evidence=True),
        False,
        False,
    ),
]


@pytest.mark.parametrize(
    ("ev", "item", "policy", "from_rule", "expected"),
    [b[1:] for b in BELONGS],
    ids=[b[0] for b in BELONGS],
)
def test_belongs(
    ev: Evidence, item: str, policy: ItemPolicy, from_rule: bool, expected: bool
) -> None:
    assert belongs(ev, item, policy, from_rule=from_rule) is expected


# --- partial_record --------------------------------------------------------------------------


def test_partial_record_lists_every_item_where_it_is() -> None:
    led = make_ledger(
        ("d1", "b1", "w1", "s1", "p1", "r1"),
        optional=("s1",),
        state={
            "d1": {"status": "done", "evidence": ["op:a5"]},
            "b1": {
                "status": "blocked",
                "note": "no progress in 3 rounds",
                "attempts": 2,
                "evidence": ["op:a3"],
            },
            "w1": {"status": "waived", "note": "waived by pm: later"},
            "s1": {"status": "skipped", "note": "optional"},
            "r1": {"status": "in_progress"},
        },
    )
    proposals = {"b1": {"status": "skipped", "note": "hopeless"}}
    rec = partial_record(led, proposals)
    assert rec == {
        "done": [{"id": "d1", "title": "title d1", "evidence": ["op:a5"]}],
        "blocked": [
            {
                "id": "b1",
                "title": "title b1",
                "reason": "no progress in 3 rounds",
                "attempts": 2,
                "evidence": ["op:a3"],
            }
        ],
        "waived": [
            {"id": "w1", "title": "title w1", "reason": "waived by pm: later", "optional": False}
        ],
        "skipped": [{"id": "s1", "title": "title s1", "reason": "optional", "optional": True}],
        "remaining": [
            {"id": "p1", "title": "title p1", "status": "pending"},
            {"id": "r1", "title": "title r1", "status": "in_progress"},
        ],
        "proposed": {"b1": {"status": "skipped", "note": "hopeless"}},
    }
    # A copy: changing the record does not change the proposals given.
    rec["proposed"]["x"] = {}
    assert "x" not in proposals


def test_partial_record_without_proposals() -> None:
    rec = partial_record(make_ledger())
    assert rec["proposed"] == {} and [r["id"] for r in rec["remaining"]] == ["a", "b", "c"]
    assert rec["done"] == rec["blocked"] == rec["waived"] == rec["skipped"] == []
