"""The audit: the only way a verdict reaches the ledger (a pure function).

Evidence must resolve to committed ops or valid artifacts and belong to its item;
`satisfied` with open items is refused; a judge's `blocked`, `skipped` or `waived` is a
proposal; rounds without progress raise the focus item's breaker and past the limits
block it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from tether import ledger as L
from tether.ledger_tally import Owners, tally
from tether.runtime.judge.facts import (
    AuditOutcome,
    AuditWarning,
    Decision,
    Evidence,
    ItemPolicy,
    ProposedChange,
    RoundFacts,
    RuntimeDecision,
    Verdict,
    belongs,
    focus_change,
    measures_progress,
)
from tether.runtime.round import progress as P
from tether.spec import Limits


def _warning(code: str, message: str, details: Mapping[str, Any] | None = None) -> AuditWarning:
    return AuditWarning(code=code, message=message, details=dict(details or {}))


#: Statuses a judge may only propose: the runtime blocks, a human skips or waives.
_PROPOSAL_ONLY = frozenset({"blocked", "skipped", "waived"})
#: The policy of an item the contract says nothing about (frozen: one serves all).
_NO_POLICY = ItemPolicy()


# --- the audit (pure) -------------------------------------------------------------------


class _Audit:
    """One audit: the verdicts' changes checked one by one against the evidence."""

    def __init__(
        self,
        ledger: L.Ledger,
        evidence: Callable[[str], Evidence | None],
        policies: Mapping[str, ItemPolicy],
    ) -> None:
        self.ledger = ledger
        self.evidence = evidence
        self.policies = policies
        self.warnings: list[AuditWarning] = []
        self.accepted: list[ProposedChange] = []
        self.proposals: dict[str, tuple[str, str]] = {}
        # Who holds each evidence ref already (the ledger's, then this audit's).
        self.owner = Owners(ledger)
        self.credited: dict[str, list[str]] = {}

    def warn(self, code: str, message: str, **details: Any) -> None:
        self.warnings.append(_warning(code, message, details))

    def policy(self, item_id: str) -> ItemPolicy:
        return self.policies.get(item_id) or _NO_POLICY

    def ready(self, item_id: str) -> bool:
        """Every predecessor is finished, or made done earlier in this audit."""
        done_now = {c.item_id for c in self.accepted if c.status == "done"}
        return all(p in done_now for p in self.ledger.waiting_for(item_id))

    def own_evidence(self, source: str, ch: ProposedChange) -> tuple[Evidence, ...]:
        """The cited refs that resolve and belong to the item; warnings for the rest."""
        item, policy = ch.item_id, self.policy(ch.item_id)
        good: list[Evidence] = []
        unresolved, foreign, taken = [], [], []
        for ref in dict.fromkeys(ch.evidence):
            found = self.evidence(ref)
            if found is None:
                unresolved.append(ref)
            elif not belongs(found, item, policy, from_rule=source == "rules"):
                foreign.append(ref)
            elif self.owner.get(ref, item) != item and not policy.shared_evidence:
                taken.append(f"{ref} ({self.owner[ref]})")
            else:
                good.append(found)
        if unresolved:
            self.warn(
                "unresolved_evidence",
                f"{source} judge cited evidence that does not resolve for {item}: "
                + ", ".join(unresolved),
                item=item,
                refs=unresolved,
            )
        if foreign:
            self.warn(
                "evidence_not_item",
                f"{source} judge cited evidence for {item} that has nothing to do with it "
                f"(not its rule's result, not made while working on it, not linked by the "
                f"contract): {', '.join(foreign)}",
                item=item,
                refs=foreign,
            )
        if taken:
            self.warn(
                "evidence_already_credited",
                f"{source} judge cited evidence for {item} that already proves another item "
                f"(the contract does not allow shared evidence for it): {', '.join(taken)}",
                item=item,
                refs=taken,
            )
        return tuple(good)

    def check(self, verdicts: Sequence[Verdict]) -> list[ProposedChange]:
        """Consider each change in turn (an item given a status once is settled)."""
        done_items: set[str] = set()
        for verdict in verdicts:
            for ch in verdict.changes:
                if ch.item_id in done_items:
                    continue
                before = len(self.accepted)
                self.consider(verdict.source, ch)
                if len(self.accepted) > before and self.accepted[-1].status is not None:
                    done_items.add(ch.item_id)
        return self.accepted

    def consider(self, source: str, ch: ProposedChange) -> None:
        """Accept, trim or refuse one proposed change."""
        item = ch.item_id
        if not self.ledger.has_item(item):
            self.warn("unknown_item", f"{source} judge named unknown item {item!r}", item=item)
            return
        current = self.ledger.item(item)
        status = ch.status
        if current.status == "waived" and source != "rules":
            # A human's waiver stands until a human retries the item.
            if status not in (None, "waived"):
                self.warn(
                    "waived_item_changed_by_judge",
                    f"{source} judge proposed {status} for {item}, which a human waived; refused",
                    item=item,
                )
            return
        if (
            current.status == "blocked"
            and source != "rules"
            and status in ("pending", "in_progress")
        ):
            # Only the runtime blocks and only a human unblocks (`retry`, which resets
            # the counters): a judge that wants the item tried again says so in a note.
            self.warn(
                "blocked_item_reopened_by_judge",
                f"{source} judge proposed {status} for {item}, which the runtime blocked; "
                "a human decides (retry); refused",
                item=item,
            )
            self.proposals[item] = (str(status), ch.note or "")
            status = None
        if status == "skipped" and self.policy(item).optional and source != "rules":
            pass  # the contract lets an optional item end skipped: not only a proposal
        elif status in _PROPOSAL_ONLY and source != "rules":
            self.proposals[item] = (str(status), ch.note or "")
            self.warn(
                f"judge_proposed_{status}",
                f"{source} judge proposed {status} for {item}"
                + (f" ({ch.note})" if ch.note else "")
                + "; only the runtime blocks and only a human or the contract skips or "
                "waives: status unchanged",
                item=item,
                note=ch.note or "",
            )
            status = None
        if status in ("done", "in_progress") and not self.ready(item):
            waiting = self.ledger.waiting_for(item)
            self.warn(
                "item_not_ready",
                f"{source} judge proposed {status} for {item}, which comes after "
                f"{', '.join(waiting)} (not finished yet); refused",
                item=item,
                waiting_for=waiting,
            )
            status = None
        if status == "done" and source != "rules" and self.policy(item).rule:
            self.warn(
                "rule_item_done_by_judge",
                f"{source} judge marked {item} done, but its done_when rule decides that; refused",
                item=item,
            )
            status = None
        if current.status not in L.OPEN_STATUSES and status is None:
            return  # evidence for a finished or blocked item changes nothing
        good = self.own_evidence(source, ch)
        if status == "done" and not good:
            # Evidence attached earlier (maybe an unrelated read) does not carry an item
            # to done: the verdict that says done must cite its own proof.
            self.warn(
                "done_without_evidence",
                f"{source} judge marked {item} done without citing evidence of its own that "
                "resolves; refused",
                item=item,
            )
            status = None
        new = tuple(e for e in good if e.ref not in current.evidence)
        if status == current.status or (status is None and not new):
            if not new:
                return
            status = None
        refs = tuple(e.ref for e in new) if status != "done" else tuple(e.ref for e in good)
        self.accepted.append(ProposedChange(item, status, refs, ch.note))
        for e in good:
            self.owner.setdefault(e.ref, item)
        self.credited.setdefault(item, []).extend(e.fingerprint for e in new if e.fingerprint)


def _decide(
    ledger: L.Ledger,
    verdicts: Sequence[Verdict],
    facts: RoundFacts,
    warnings: list[AuditWarning],
) -> tuple[RuntimeDecision, str]:
    """The runtime's decision: the judge proposes, the ledger decides."""
    llm = [v for v in verdicts if v.source != "rules"]
    proposed: Decision = llm[-1].decision if llm else "continue"
    reason = llm[-1].reason if llm else ""
    # Carried counts say whether anything is open or missing; lists only for a refusal.
    if ledger.has_open():
        if proposed == "satisfied":
            open_items = ledger.open_items()
            warnings.append(
                _warning(
                    "satisfied_with_pending",
                    f"judge said satisfied but {len(open_items)} items are still open "
                    f"({', '.join(open_items[:5])}{'...' if len(open_items) > 5 else ''}); "
                    "refused",
                    {"open": open_items},
                )
            )
            return "continue", reason
        if facts.non_convergent and (facts.focus is None or not ledger.has_item(facts.focus)):
            warnings.append(
                _warning("non_convergent", f"needs human judgement: {facts.non_convergent}")
            )
            return "need_user", f"needs human judgement: {facts.non_convergent}"
        if proposed == "abandon":
            # Giving up is a human's call: the judge's proposal goes to one.
            warnings.append(
                _warning("judge_proposed_abandon", f"judge proposed to abandon: {reason}")
            )
            return "need_user", f"the judge proposes to abandon the task: {reason}"[:800]
        if proposed == "need_user":
            return "need_user", reason
        return "continue", reason
    if tally(ledger).gaps and (gaps := ledger.gaps()):
        if proposed == "satisfied":
            warnings.append(
                _warning(
                    "satisfied_with_gaps",
                    f"judge said satisfied but {len(gaps)} items are not done "
                    f"({', '.join(gaps[:5])}{'...' if len(gaps) > 5 else ''}); refused",
                    {"gaps": gaps},
                )
            )
        held = [f"{g} waits for {', '.join(ledger.held_by(g))}" for g in gaps if ledger.held_by(g)]
        return "need_decision", f"{len(gaps)} of {len(ledger.states)} items are not done" + (
            f" ({'; '.join(held[:5])})" if held else ""
        )
    return "satisfied", reason or "every item is finished"


def audit(
    ledger: L.Ledger,
    verdicts: Sequence[Verdict],
    *,
    evidence: Callable[[str], Evidence | None],
    facts: RoundFacts,
    limits: Limits,
    policies: Mapping[str, ItemPolicy] | None = None,
    seen: Mapping[str, Collection[str]] | None = None,
    rounds: int = 0,
    compactions: int = 0,
    total: int = 0,
) -> AuditOutcome:
    """Check the verdicts against the ledger and the evidence; return what may be written.

    - An item becomes `done` only with evidence cited in that verdict that resolves and
      belongs to it (see `belongs`); evidence already credited to another item needs
      the item's `shared_evidence`. An item with a `done_when` rule is done only by it.
    - A judge's `blocked`, `skipped` or `waived` is a proposal (a warning and a record
      for the human), never a status change.
    - The focus item's breaker rises on a round that did nothing new for it (measured
      from the round's calls and the item's rule check, `progress.moves`, whatever the
      judges attached); past the limits the runtime blocks the item.
    - The decision is the runtime's: `satisfied` only when every item is finished.

    Rule verdicts come first and win over LLM verdicts for the same item. `seen` holds
    each item's progress fingerprints from earlier rounds (`RunState.seen`), `rounds`
    the focus item's rounds (this one included; started again by a round that finished
    another item), `total` all of them (never started again), `compactions` the task's."""
    policies = policies or {}
    # Most rounds propose no change: nothing to check one by one.
    run = _Audit(ledger, evidence, policies) if any(v.changes for v in verdicts) else None
    accepted, warnings = (run.check(verdicts), run.warnings) if run else ([], [])
    # An item a `done_when` rule accepts is proven by what the rule checked: the refs a
    # judge attached while it was in progress are not carried into its `done`.
    changes = [
        L.ItemChange(
            c.item_id,
            status=c.status,
            evidence=c.evidence,
            note=c.note,
            evidence_replaces=c.status == "done" and (policies.get(c.item_id) or _NO_POLICY).rule,
        )
        for c in accepted
    ]
    focus = facts.focus
    checks = [v.checks for v in verdicts if v.source == "rules" and focus in v.checks]
    rule_state = checks[0].get(focus or "") if checks else None
    marks = (seen or {}).get(focus or "", ())
    moved = P.moves(facts.ops, rule_state, P.seen_set(marks), P.changes(marks), compactions)
    policy = (policies.get(focus) or _NO_POLICY) if focus else _NO_POLICY
    # Measured progress: the rule's check says something new of how far the item got,
    # in a round that changed something itself (a check that moves while the agent idles
    # measures the world, not the item's work).
    measured = (
        moved.ruled
        and measures_progress(rule_state)
        and any(o.status == "succeeded" and o.effect != "read" for o in facts.ops)
    )
    change, blocked = focus_change(
        ledger, facts, accepted, moved, limits, policy, rounds, measured, total
    )
    if change is not None:
        changes.append(change)
    if blocked is not None:
        warnings.append(blocked)
    update = L.apply(ledger, changes)
    decision, reason = _decide(update.ledger, verdicts, facts, warnings)
    return AuditOutcome(
        update,
        decision,
        reason,
        tuple(accepted),
        tuple(warnings),
        {k: tuple(v) for k, v in run.credited.items()} if run is not None else {},
        dict(run.proposals) if run is not None else {},
        moved.marks if focus is not None and not facts.deferred else (),
    )
