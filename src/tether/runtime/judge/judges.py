"""The judge: after every round, what changed in the ledger and whether to go on.

Two judges compose: a *rule judge* (items' `done_when` rules over ops, artifacts, files
and commands; no model) and an *LLM judge* (the `judge` purpose, a structured verdict).
Their verdicts then pass the mechanical *audit*, a pure function: evidence must resolve
to committed ops or valid artifacts; `satisfied` with open items is refused; rounds
without progress raise the focus item's breaker and past the limit block it. The audit
is the only way a verdict reaches the ledger.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tether import events as ev
from tether import ledger as L
from tether import ledger_view
from tether.artifacts import deliverable_meta
from tether.models.base import Message, ModelRequest
from tether.runtime.judge.rule_scope import spec_items
from tether.runtime.round import progress as P
from tether.spec import (
    ArtifactRule,
    ChecklistItem,
    CommandRule,
    FileRule,
    Limits,
    OpRule,
    TaskSpec,
)
from tether.store.base import ArtifactRecord, OpRecord

Decision = Literal["continue", "satisfied", "abandon", "need_user"]


@dataclass(frozen=True)
class ProposedChange:
    """A judge's proposal for one item."""

    item_id: str
    status: L.ItemStatus | None = None
    evidence: tuple[str, ...] = ()
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "item": self.item_id,
            "status": self.status,
            "evidence": list(self.evidence),
            "note": self.note,
        }


@dataclass(frozen=True)
class Verdict:
    """One judge's structured verdict."""

    decision: Decision
    changes: tuple[ProposedChange, ...] = ()
    reason: str = ""
    source: str = "llm"
    #: The rule judge's unmet checks, `{item: state}` (the rule's file hash, its command's
    #: exit and output, how many artifacts count toward its `min_count`): a state that
    #: changed is progress for the item (see `progress.moves`).
    checks: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class OpSummary:
    """What the judges see of one op of the round (and what progress compares: the
    call's arguments hash and its result's, see `progress.moves`)."""

    op_id: str
    tool: str
    args: Mapping[str, Any]
    status: str
    summary: str = ""
    error: str | None = None
    artifact_id: str | None = None
    error_class: str | None = None
    args_hash: str = ""
    #: A success: its output's hash (`progress.result_hash`); a failure: the failure's
    #: (`progress.failure_hash`). Derived from the summary when not given.
    result_hash: str = ""

    def __post_init__(self) -> None:
        if not self.args_hash:
            text = json.dumps(dict(self.args), sort_keys=True, default=str)
            object.__setattr__(self, "args_hash", P.digest("args", text))
        if not self.result_hash:
            got = (
                P.result_hash(self.summary)
                if self.status == "succeeded"
                else P.failure_hash(self.error_class, self.error)
            )
            object.__setattr__(self, "result_hash", got)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "op_id": self.op_id,
            "evidence_ref": f"op:{self.op_id}",
            "tool": self.tool,
            "args": dict(self.args),
            "status": self.status,
            "result": self.summary,
            "error": self.error,
            "artifact_id": self.artifact_id,
        }


@dataclass(frozen=True)
class RoundFacts:
    """The round as the judges see it."""

    round: int
    focus: str | None
    text: str
    ops: tuple[OpSummary, ...] = ()
    non_convergent: str | None = None
    #: Set when the round compensated the focus item's applied ops (`on_exhausted:
    #: compensate`): the item cannot finish and is blocked with this reason.
    blocked: str | None = None

    @property
    def failed_ops(self) -> int:
        """How many ops failed (calls deferred by an open breaker are not failures)."""
        return sum(1 for o in self.ops if o.status not in ("succeeded", "deferred"))

    @property
    def deferred(self) -> bool:
        """True when every call of the round was held back by an open breaker: the round
        was no attempt at its item and must not count against it."""
        return bool(self.ops) and all(o.status == "deferred" for o in self.ops)


#: Something the audit refused or flagged: the `audit.warning` event itself, so what the
#: audit returns is journaled as it is.
AuditWarning = ev.AuditWarning


def _warning(code: str, message: str, details: Mapping[str, Any] | None = None) -> AuditWarning:
    return AuditWarning(code=code, message=message, details=dict(details or {}))


@dataclass(frozen=True)
class Evidence:
    """What the runtime knows of one evidence ref that resolves (a committed, succeeded
    op or a valid artifact of this task)."""

    ref: str
    #: The round that produced it and that round's focus item (None: not from a round).
    round: int | None = None
    focus: str | None = None
    #: The op's tool, or the artifact's name.
    tool: str | None = None
    name: str | None = None
    #: The item whose own `done_when` rule produced it.
    rule_item: str | None = None
    #: What it is (tool and arguments, or content): repeating the same call is no
    #: progress even under a new op id.
    fingerprint: str = ""


@dataclass(frozen=True)
class ItemPolicy:
    """What the contract says about judging one item."""

    rule: bool = False
    optional: bool = False
    shared_evidence: bool = False
    link_tools: frozenset[str] = frozenset()
    link_artifacts: frozenset[str] = frozenset()
    max_attempts: int | None = None

    @classmethod
    def of_spec(cls, spec: TaskSpec) -> dict[str, ItemPolicy]:
        """Every item's policy, by id."""
        return {
            i.id: cls(
                rule=i.done_when is not None,
                optional=i.optional,
                shared_evidence=i.shared_evidence,
                link_tools=frozenset(i.evidence_from.tools),
                link_artifacts=frozenset(i.evidence_from.artifacts),
                max_attempts=i.max_attempts,
            )
            for i in spec.items
        }


@dataclass(frozen=True)
class AuditOutcome:
    """The audited result: the ledger update, the decision, and warnings.

    `decision` is the runtime's, not the judge's: `satisfied` only when every item is
    finished (done with its own evidence, waived, or optional and skipped), and
    `need_decision` when nothing is open but something is not finished.
    """

    update: L.LedgerUpdate
    decision: RuntimeDecision
    reason: str
    accepted: tuple[ProposedChange, ...]
    warnings: tuple[AuditWarning, ...]
    #: Fingerprints of the evidence newly credited to each item.
    credited: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Statuses a judge proposed that only a human may decide: `{item: (status, note)}`.
    proposals: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    #: What the round did for its focus item, to add to the item's `seen` fingerprints.
    marks: tuple[str, ...] = ()


RuntimeDecision = Literal["continue", "satisfied", "need_decision", "need_user"]

#: Statuses a judge may only propose: the runtime blocks, a human skips or waives.
_PROPOSAL_ONLY = frozenset({"blocked", "skipped", "waived"})


# --- the audit (pure) -------------------------------------------------------------------


def belongs(ev: Evidence, item_id: str, policy: ItemPolicy, *, from_rule: bool) -> bool:
    """Whether evidence may prove `item_id`: the item's own rule result, produced in a
    round focused on the item, or linked to it by the contract."""
    if from_rule or ev.rule_item == item_id or ev.focus == item_id:
        return True
    if ev.tool is not None and ev.tool in policy.link_tools:
        return True
    return ev.name is not None and ev.name in policy.link_artifacts


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
        self.owner: dict[str, str] = {}
        for d, st in ledger.items():
            for ref in st.evidence:
                self.owner.setdefault(ref, d.id)
        self.credited: dict[str, list[str]] = {}

    def warn(self, code: str, message: str, **details: Any) -> None:
        self.warnings.append(_warning(code, message, details))

    def policy(self, item_id: str) -> ItemPolicy:
        return self.policies.get(item_id, ItemPolicy())

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


def _focus_change(
    ledger: L.Ledger,
    facts: RoundFacts,
    accepted: Sequence[ProposedChange],
    moved: P.Moves,
    limits: Limits,
    policy: ItemPolicy,
    rounds: int,
) -> tuple[L.ItemChange | None, AuditWarning | None]:
    """The mechanical breaker on the focus item, from what the round did (`moved`), not
    from what a judge attached.

    Progress is the item becoming done, or the round doing something new for it (see
    `progress.moves`). A round without progress raises the breaker; a round whose failure
    the item has seen before is an attempt; a non-convergent round (the same call failing
    the same way again and again) blocks the item whatever else it did; and an item
    still open after `limits.max_rounds_per_item` rounds is blocked (padding with
    ever-new arguments ends there).
    """
    focus = facts.focus
    if facts.deferred or focus is None or not ledger.has_item(focus):
        return None, None
    state = ledger.item(focus)
    if state.status not in L.OPEN_STATUSES:
        return None, None
    done = any(c.item_id == focus and c.status == "done" for c in accepted)
    progressed = done or (moved.moved and not facts.non_convergent)
    failed = moved.repeated and not done
    attempts = state.attempts + (1 if failed else 0)
    breaker = 0 if progressed else state.breaker + 1
    max_attempts = policy.max_attempts or limits.max_attempts_per_item
    cap = limits.max_rounds_per_item
    reason = None
    if facts.blocked:
        reason = facts.blocked  # its work was undone: not done, whatever was cited
    elif done:
        pass
    elif facts.non_convergent:
        reason = f"non-convergent: {facts.non_convergent}"
    elif breaker >= limits.no_progress_rounds:
        reason = (
            f"no progress in {breaker} rounds (nothing new: the same calls with the same "
            "results, or words only)"
        )
    elif failed and attempts >= max_attempts:
        reason = f"failed {attempts} attempts (the same failures again)"
    elif cap is not None and rounds >= cap:
        reason = f"not finished in {rounds} rounds (limits.max_rounds_per_item)"
    last_error = next((o.error for o in reversed(facts.ops) if o.error), None)
    if reason and last_error and not facts.blocked:
        reason += f"; last error: {last_error[:160]}"
    # An optional item the runtime would block ends skipped: the contract allows it.
    stop: L.ItemStatus = "skipped" if policy.optional else "blocked"
    change = L.ItemChange(
        focus,
        attempts_delta=1 if failed else 0,
        breaker=breaker,
        status=stop if reason else None,
        note=(f"optional, skipped: {reason}" if policy.optional else reason) if reason else None,
    )
    code = "item_skipped" if policy.optional else "item_blocked"
    warning = _warning(code, f"{focus} {stop}: {reason}", {"item": focus})
    return change, warning if reason else None


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
    open_items = ledger.open_items()
    gaps = ledger.gaps()
    if open_items:
        if proposed == "satisfied":
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
    if gaps:
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
    each item's progress fingerprints from earlier rounds (`RunState.seen`), and
    `rounds` how many rounds the focus item has had, this one included.
    """
    run = _Audit(ledger, evidence, policies or {})
    done_items: set[str] = set()
    for verdict in verdicts:
        for ch in verdict.changes:
            if ch.item_id in done_items:
                continue
            before = len(run.accepted)
            run.consider(verdict.source, ch)
            if len(run.accepted) > before and run.accepted[-1].status is not None:
                done_items.add(ch.item_id)
    changes = [
        L.ItemChange(c.item_id, status=c.status, evidence=c.evidence, note=c.note)
        for c in run.accepted
    ]
    focus = facts.focus
    rule_state = next(
        (v.checks.get(focus or "") for v in verdicts if v.source == "rules" and focus in v.checks),
        None,
    )
    earlier = set((seen or {}).get(focus or "", ()))
    moved = P.moves(facts.ops, rule_state, earlier)
    policy = run.policy(focus) if focus else ItemPolicy()
    change, blocked = _focus_change(ledger, facts, run.accepted, moved, limits, policy, rounds)
    if change is not None:
        changes.append(change)
    if blocked is not None:
        run.warnings.append(blocked)
    update = L.apply(ledger, changes)
    decision, reason = _decide(update.ledger, verdicts, facts, run.warnings)
    return AuditOutcome(
        update,
        decision,
        reason,
        tuple(run.accepted),
        tuple(run.warnings),
        {k: tuple(v) for k, v in run.credited.items()},
        dict(run.proposals),
        moved.marks if focus is not None and not facts.deferred else (),
    )


def partial_record(ledger: L.Ledger, proposals: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What was done and what was not, for a human deciding how a task ends."""
    rec: dict[str, Any] = {
        "done": [],
        "blocked": [],
        "waived": [],
        "skipped": [],
        "remaining": [],
        # A proposal about an item that is finished since is history, not a question.
        "proposed": {
            k: v
            for k, v in (proposals or {}).items()
            if ledger.has_item(k) and not ledger.is_finished(k)
        },
    }
    for d, s in ledger.items():
        entry: dict[str, Any] = {"id": d.id, "title": d.title}
        if s.status == "done":
            rec["done"].append({**entry, "evidence": list(s.evidence)})
        elif s.status == "blocked":
            rec["blocked"].append(
                {**entry, "reason": s.note, "attempts": s.attempts, "evidence": list(s.evidence)}
            )
        elif s.status in ("waived", "skipped"):
            rec[s.status].append({**entry, "reason": s.note, "optional": d.optional})
        else:
            rec["remaining"].append({**entry, "status": s.status, **_waits(ledger, d.id)})
    return rec


def _waits(ledger: L.Ledger, item_id: str) -> dict[str, Any]:
    """What an unfinished item waits for: predecessors not finished, and the stuck ones
    (blocked, skipped) that hold it until a human decides about them."""
    out: dict[str, Any] = {}
    waiting = ledger.waiting_for(item_id)
    if waiting:
        out["waiting_for"] = waiting
    held = ledger.held_by(item_id)
    if held:
        out["held_by"] = held
        out["reason"] = (
            f"waits for {', '.join(held)}, which "
            + ("is" if len(held) == 1 else "are")
            + " not finished and not open"
        )
    return out


# --- the LLM judge ----------------------------------------------------------------------

JUDGE_INSTRUCTIONS = """\
You are the judge of a long-running agent task. After each round you read the goal
ledger, the round's op journal (tool calls with their status and results) and the
agent's words, and you decide which ledger items changed.

Rules (the runtime audits every verdict against them; what breaks them is refused):
- Mark an item done only when a succeeded op or an artifact proves it, and cite that
  proof in the same change's "evidence" by its evidence_ref ("op:..." or
  "artifact:..."). Evidence attached earlier does not carry an item to done.
- Evidence must belong to the item: its own done_when rule's result, an op or artifact
  made in a round whose focus_item was that item, or one the contract links to it.
  One piece of evidence proves one item, unless the contract allows sharing.
- The agent's own claims ("all done") are not evidence.
- In-progress evidence is optional: a succeeded op or artifact of this round that is
  work toward the focus_item but does not prove it done yet (a draft it wrote, a source
  it read, a claim recorded toward a count) may be attached to the focus_item with
  status "in_progress"; it stays with the item and is shown to the human. Attach only
  this round's work for the focus_item, never earlier evidence or another item's.
- You do not need to attach anything for an item to count as moving: the runtime
  measures progress itself from the op journal (a call it has not seen for the item, a
  result that changed, a failure that changed), and a repeat is no progress whatever
  is attached to it.
- You may only propose "blocked" or "skipped" (with a note): the runtime blocks items
  that make no progress, and only a human (or the contract, for optional items) skips
  or waives them. Your proposal is shown to the human; it changes no status.
- decision is one of: continue, satisfied (every item is done with its own evidence),
  abandon (propose giving up; a human decides), need_user (a human must decide).
  The runtime decides when the task is finished, whatever you answer.

Answer with one JSON object and nothing else:
{"changes": [{"item": "<id>", "status": "done|in_progress|pending|blocked|skipped",
  "evidence": ["op:..."], "note": "..."}], "decision": "continue", "reason": "..."}
"""


class _ChangeModel(BaseModel):
    model_config = ConfigDict(extra="ignore")
    item: str
    status: L.ItemStatus | None = None
    evidence: list[str] = Field(default_factory=list)
    note: str | None = None


class _VerdictModel(BaseModel):
    model_config = ConfigDict(extra="ignore")
    changes: list[_ChangeModel] = Field(default_factory=list)
    decision: Decision
    reason: str = ""


class VerdictParseError(ValueError):
    """The judge's answer is not a valid verdict."""


def parse_verdict(text: str) -> Verdict:
    """Parse a judge's JSON answer (a fenced block is accepted)."""
    body = text.strip()
    fence = re.search(r"```(?:json)?\s*(\{.*\})\s*```", body, re.S)
    if fence:
        body = fence.group(1)
    elif not body.startswith("{"):
        start, end = body.find("{"), body.rfind("}")
        if start == -1 or end <= start:
            raise VerdictParseError("no JSON object in the judge's answer")
        body = body[start : end + 1]
    try:
        raw = json.loads(body)
    except json.JSONDecodeError as exc:
        raise VerdictParseError(f"the judge's answer is not valid JSON: {exc}") from None
    try:
        m = _VerdictModel.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise VerdictParseError(f"bad verdict at {where}: {first['msg']}") from None
    return Verdict(
        decision=m.decision,
        changes=tuple(
            ProposedChange(c.item, c.status, tuple(c.evidence), c.note) for c in m.changes
        ),
        reason=m.reason,
        source="llm",
    )


def compact_ledger(ledger: L.Ledger) -> dict[str, Any]:
    """The ledger as the judge sees it: open and blocked items in full, done ones by id.

    A long ledger (`ledger_view.paged`) is shown in part, so that the judge's request
    does not grow with the checklist: the first `JUDGE_ITEMS` items not done, in order
    (the focus among them, as it is the first open one, or named apart), and the count
    of those left out; done items by count only."""
    if ledger_view.paged(ledger):
        return _partial_ledger(ledger)
    items = []
    done = []
    for d, s in ledger.items():
        if s.status == "done":
            done.append(d.id)
        else:
            items.append({"id": d.id, "title": d.title, "status": s.status, "note": s.note})
    return {
        "version": ledger.version,
        "progress": ledger.progress().to_dict(),
        "items": items,
        "done": done,
        "next": ledger.next_item(),
    }


#: Items not done that a long ledger shows the judge (see `compact_ledger`).
JUDGE_ITEMS = 25


def _partial_ledger(ledger: L.Ledger) -> dict[str, Any]:
    nxt = ledger.next_item()
    items: list[dict[str, Any]] = []
    left_out = done = 0
    for d, s in ledger.items():
        if s.status == "done":
            done += 1
        elif len(items) < JUDGE_ITEMS or d.id == nxt:
            items.append({"id": d.id, "title": d.title, "status": s.status, "note": s.note})
        else:
            left_out += 1
    return {
        "version": ledger.version,
        "progress": ledger.progress().to_dict(),
        "items": items,
        "items_left_out": left_out,
        "done": f"{done} items (ids left out of this long ledger)",
        "next": nxt,
    }


def judge_request(
    spec: TaskSpec,
    ledger: L.Ledger,
    facts: RoundFacts,
    *,
    user_words: Sequence[str] = (),
    task_id: str | None = None,
    retry_note: str | None = None,
) -> ModelRequest:
    """The `judge` request for one round."""
    payload = {
        "objective": spec.objective,
        "user_messages": list(user_words),
        "ledger": compact_ledger(ledger),
        "round": facts.round,
        "focus_item": facts.focus,
        "agent_text": facts.text[:4000],
        "op_journal": [o.to_dict() for o in facts.ops],
    }
    messages = [Message("user", json.dumps(payload, ensure_ascii=False, sort_keys=True))]
    if retry_note:
        messages.append(
            Message(
                "user",
                f"Your previous answer could not be used ({retry_note}). "
                "Answer again with one JSON object only.",
            )
        )
    return ModelRequest(
        purpose="judge",
        system=JUDGE_INSTRUCTIONS,
        messages=tuple(messages),
        max_output_tokens=1024,
        json_output=True,
        task_id=task_id,
        ledger=ledger_view.LedgerData(ledger, ledger.next_item()),
    )


# --- the rule judge ---------------------------------------------------------------------


class RuleEnv(Protocol):
    """What the rule judge may look at."""

    workspace: Path | None
    #: Hashes of files that existed before the task (see `FileRule.fresh`).
    preexisting: dict[str, str]

    async def latest_op(
        self, item_id: str, rule: OpRule, taken: Collection[str]
    ) -> OpRecord | None:
        """The newest succeeded op that `rule` (item `item_id`'s) matches and that is not
        in `taken` (refs `op:<id>`), or None."""
        ...

    async def valid_artifacts(self) -> list[ArtifactRecord]:
        """Valid artifacts of the task."""
        ...

    async def current_ops(self, op_ids: Collection[str]) -> set[str]:
        """Which of `op_ids` are succeeded ops that still prove something: not undone
        (compensated, or ended by a human), not a late result, not a stale read."""
        ...

    async def record_evidence(
        self, item_id: str, text: str, meta: Mapping[str, Any] | None = None
    ) -> str:
        """Store an evidence artifact (with `meta`, e.g. the deliverable file it accepts);
        return its ref (`artifact:<id>`)."""
        ...


async def _run_command(command: str, cwd: Path | None, timeout: float) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_shell(
        command,
        cwd=str(cwd) if cwd else None,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return -1, f"timed out after {timeout}s"
    return proc.returncode if proc.returncode is not None else -1, out.decode(errors="replace")


async def rule_verdict(
    spec: TaskSpec, ledger: L.Ledger, env: RuleEnv, only: Collection[str] | None = None
) -> Verdict:
    """Check open items' `done_when` rules (of the items in `only`, when given; see
    `rule_scope`); propose `done` with evidence for those met."""
    check = _RuleCheck(spec, ledger, env)
    changes: list[ProposedChange] = []
    # Items whose rule is met in this verdict: their successors may be judged after them.
    met: set[str] = set()
    for item in spec.items if only is None else spec_items(spec, only):
        rule = item.done_when
        if rule is None or not ledger.has_item(item.id):
            continue
        if ledger.item(item.id).status not in L.OPEN_STATUSES:
            continue
        if any(p not in met for p in ledger.waiting_for(item.id)):
            continue  # it may not start before its predecessors are finished
        if isinstance(rule, OpRule):
            change = await check.op(item, rule)
        elif isinstance(rule, ArtifactRule):
            change = await check.artifact(item, rule)
        elif isinstance(rule, FileRule):
            change = await check.file(item, rule)
        else:
            change = await check.command(item, rule)
        if change is not None:
            changes.append(change)
            met.add(item.id)
    if any(src.pin == "fingerprint" for src in spec.sources):
        # A re-read may have found a source changed and invalidated artifacts mid-run:
        # items they proved go back to work now, not only at the check before delivery.
        changes += await check.stale_evidence(ledger)
    # Likewise an op undone since it proved its item (a compensation of another item's
    # stretch, a human's decision), gone to history, or a read found stale since.
    changes += await check.undone_ops(ledger)
    return Verdict("continue", tuple(changes), "", source="rules", checks=dict(check.states))


class _RuleCheck:
    """One rule judging: the journal and artifacts read once, each rule kind checked."""

    def __init__(self, spec: TaskSpec, ledger: L.Ledger, env: RuleEnv) -> None:
        self.env = env
        #: What each unmet rule found (`Verdict.checks`): how far its item got.
        self.states: dict[str, str] = {}
        self.credited = {ref for _, st in ledger.items() for ref in st.evidence}
        self.arts: list[ArtifactRecord] | None = None

    async def op(self, item: ChecklistItem, rule: OpRule) -> ProposedChange | None:
        # An op that already proves another item proves this one only with leave.
        taken = set() if item.shared_evidence else self.credited
        hit = await self.env.latest_op(item.id, rule, taken)
        return ProposedChange(item.id, "done", (f"op:{hit.op_id}",), "rule: op") if hit else None

    async def artifact(self, item: ChecklistItem, rule: ArtifactRule) -> ProposedChange | None:
        if self.arts is None:
            self.arts = await self.env.valid_artifacts()
        taken = set() if item.shared_evidence else self.credited
        found = [
            a
            for a in reversed(self.arts)
            if (rule.name is None or a.name == rule.name)
            and (rule.artifact_kind is None or a.kind == rule.artifact_kind)
            and f"artifact:{a.artifact_id}" not in taken
        ]
        if len(found) < rule.min_count:
            self.states[item.id] = f"artifacts: {len(found)} of {rule.min_count}"
            return None
        refs = tuple(
            f"artifact:{a.artifact_id}" for a in reversed(found[: max(rule.min_count, 20)])
        )
        return ProposedChange(item.id, "done", refs, "rule: artifact")

    async def undone_ops(self, ledger: L.Ledger) -> list[ProposedChange]:
        """`pending` for each done item citing an op that no longer proves anything."""
        cited = {
            d.id: [r for r in st.evidence if r.startswith("op:")]
            for d, st in ledger.items()
            if st.status == "done"
        }
        ids = {r[3:] for refs in cited.values() for r in refs}
        if not ids:
            return []
        current = await self.env.current_ops(ids)
        out = []
        for item, refs in cited.items():
            gone = [r for r in refs if r[3:] not in current]
            if gone:
                note = (
                    f"its evidence {', '.join(gone[:3])} no longer holds (undone since, or history)"
                )
                out.append(ProposedChange(item, "pending", (), note))
        return out

    async def stale_evidence(self, ledger: L.Ledger) -> list[ProposedChange]:
        """`pending` for each done item citing an artifact that is no longer valid."""
        cited = {
            d.id: [r for r in st.evidence if r.startswith("artifact:")]
            for d, st in ledger.items()
            if st.status == "done"
        }
        if not any(cited.values()):
            return []
        if self.arts is None:
            self.arts = await self.env.valid_artifacts()
        valid = {f"artifact:{a.artifact_id}" for a in self.arts}
        out = []
        for item, refs in cited.items():
            stale = [r for r in refs if r not in valid]
            if stale:
                note = f"its evidence {', '.join(stale[:3])} is no longer valid (a source changed)"
                out.append(ProposedChange(item, "pending", (), note))
        return out

    async def file(self, item: ChecklistItem, rule: FileRule) -> ProposedChange | None:
        ws = self.env.workspace
        if ws is None:
            return None
        self.states[item.id] = f"file {rule.path}: missing"
        try:
            path = (ws / rule.path).resolve()
            if not path.is_relative_to(ws.resolve()) or not path.is_file():
                return None
            data = path.read_bytes()
        except (OSError, ValueError):  # a name too long, a NUL: the rule is not met
            return None
        full = hashlib.sha256(data).hexdigest()
        # Not met (yet): the file as it is now, so a changed draft counts as progress.
        self.states[item.id] = f"file {rule.path}: sha256 {full}"
        content = data.decode("utf-8", errors="replace")
        if rule.contains is not None and rule.contains not in content:
            return None
        if rule.fresh and self.env.preexisting.get(rule.path) == full:
            return None  # the same file was there before the task started
        del self.states[item.id]
        # The path and full hash go with the evidence: recovery and the check before
        # delivery verify that the deliverable is still there with this content.
        ref = await self.env.record_evidence(
            item.id,
            f"file {rule.path} exists ({len(content)} chars, sha256 {full[:16]})",
            deliverable_meta(rule.path, data),
        )
        return ProposedChange(item.id, "done", (ref,), f"rule: file {rule.path}")

    async def command(self, item: ChecklistItem, rule: CommandRule) -> ProposedChange | None:
        code, out = await _run_command(rule.command, self.env.workspace, rule.timeout)
        if code != rule.exit_code:
            # What the failing check said, without its timings: another answer is progress.
            self.states[item.id] = f"command exited {code}: {P.normalise(out)[-4000:]}"
            return None
        ref = await self.env.record_evidence(
            item.id, f"command `{rule.command}` exited {code}\n{out[-2000:]}"
        )
        return ProposedChange(item.id, "done", (ref,), "rule: command")
