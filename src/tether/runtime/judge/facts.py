"""What the judges exchange: a round's facts, their verdicts, evidence, item policies.

Plain frozen values, no I/O: the rule judge (`rules`) and the LLM judge (`llm`) produce
`Verdict`s about a `RoundFacts`; the audit (`audit`) checks them against `Evidence` and
each item's `ItemPolicy`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from tether import events as ev
from tether import ledger as L
from tether.models.base import direct_init
from tether.runtime.round import progress as P
from tether.spec import ChecklistItem, Limits, TaskSpec

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


#: How a file rule's state (`Verdict.checks`) begins: the file's hash, which says that
#: something changed, not how far the item got (`measures_progress`).
FILE_STATE: Final = "file "


#: How many times `limits.max_rounds_per_item` an item whose rule check keeps saying
#: something new of how far it got (`measures_progress`) may take: a sync of 1,000
#: files at ten a round fits, a check that moves forever ends there.
MEASURED_CAPS: Final = 3
#: The rounds as the focus an item gets back, in all (`RunState.item_focus_total`), for
#: each other item a round of its finished: a checklist taken in the agent's own order
#: (each easy item read, then written) leaves the hard item last its rounds, and an
#: item kept alive by finishing one on the side every cap's worth of rounds does not.
SIDE_ROUNDS: Final = 3


def measures_progress(state: str | None) -> bool:
    """Whether a rule's state says how far its item got (a check's output, a count of
    artifacts toward `min_count`) rather than only that its file changed: a new state of
    the first kind lets an item go on past `limits.max_rounds_per_item`."""
    return state is not None and not state.startswith(FILE_STATE)


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


@direct_init
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
    #: The tool's effect (`read`, `write`, ...): a successful call of any but `read`
    #: changed the item's world, so a failure seen before it is not a repeat after it.
    effect: str = "read"
    #: A read whose answer can change by itself (`Tool.volatile`): the same answer again
    #: is waiting on the world, not a loop.
    volatile: bool = False
    #: A read of a tool whose answers can change by themselves, whatever this call's
    #: outcome (`OpOutcome.shifting`): after the item's own work started, its failure
    #: heard again is waiting (`progress.moves`).
    shifting: bool = False

    def __post_init__(self) -> None:
        if not self.args_hash:
            text = json.dumps(dict(self.args), sort_keys=True, default=str)
            object.__setattr__(self, "args_hash", P.digest("args", text))
        if not self.result_hash:
            got = (
                P.result_hash(self.summary)
                if self.status == "succeeded"
                else P.failure_hash(self.error_class, self.error, self.args, self.tool)
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
    #: A words-only answer the output token limit cut off: the model's failure to end
    #: it, not the agent idling (no progress, but not counted as a round without it).
    cut_off: bool = False
    _deferred: bool = field(default=False, init=False, repr=False, compare=False)

    @property
    def failed_ops(self) -> int:
        """How many ops failed (calls deferred by an open breaker are not failures)."""
        return sum(1 for o in self.ops if o.status not in ("succeeded", "deferred"))

    def __post_init__(self) -> None:
        # Worked out once (the facts are frozen): a judging asks half a dozen times.
        deferred = bool(self.ops) and all(o.status == "deferred" for o in self.ops)
        object.__setattr__(self, "_deferred", deferred)

    @property
    def deferred(self) -> bool:
        """True when every call of the round was held back by an open breaker: the round
        was no attempt at its item and must not count against it."""
        return self._deferred


#: Something the audit refused or flagged: the `audit.warning` event itself, so what the
#: audit returns is journaled as it is.
AuditWarning = ev.AuditWarning


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
    def of_item(cls, i: ChecklistItem) -> ItemPolicy:
        """One item's policy."""
        return cls(
            rule=i.done_when is not None,
            optional=i.optional,
            shared_evidence=i.shared_evidence,
            link_tools=frozenset(i.evidence_from.tools),
            link_artifacts=frozenset(i.evidence_from.artifacts),
            max_attempts=i.max_attempts,
        )

    @classmethod
    def of_spec(cls, spec: TaskSpec) -> Mapping[str, ItemPolicy]:
        """Every item's policy, by id: each made when first asked for (a round asks for
        a few; a checklist may have ten thousand)."""
        return _Policies({i.id: i for i in spec.items})


def belongs(ev: Evidence, item_id: str, policy: ItemPolicy, *, from_rule: bool) -> bool:
    """Whether evidence may prove `item_id`: the item's own rule result, produced in a
    round focused on the item, or linked to it by the contract."""
    if from_rule or ev.rule_item == item_id or ev.focus == item_id:
        return True
    if ev.tool is not None and ev.tool in policy.link_tools:
        return True
    return ev.name is not None and ev.name in policy.link_artifacts


class _Policies(Mapping[str, ItemPolicy]):
    def __init__(self, items: dict[str, ChecklistItem]) -> None:
        self._items = items
        self._made: dict[str, ItemPolicy] = {}

    def __getitem__(self, item_id: str) -> ItemPolicy:
        made = self._made.get(item_id)
        if made is None:
            made = self._made[item_id] = ItemPolicy.of_item(self._items[item_id])
        return made

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


@direct_init
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


def finished_other(focus: str | None, accepted: Sequence[ProposedChange]) -> bool:
    """Whether a round's accepted changes finished an item other than its `focus`: the
    round was that item's, and the focus's count of rounds starts again."""
    return any(c.status == "done" and c.item_id != focus for c in accepted)


def past_cap(cap: int | None, rounds: int, total: int, measured: bool, waiting: bool) -> str | None:
    """Why an item is blocked for its rounds (`limits.max_rounds_per_item`), or None:
    `rounds` since its count last started again, `total` all of them as the focus."""
    if cap is None:
        return None
    if rounds >= cap and not (measured and rounds < MEASURED_CAPS * cap):
        # A round of the item's own work in which its rule check says something new of how
        # far it got (a sync's count of files rising) is measured progress, not padding:
        # the cap waits for a round without it, up to `MEASURED_CAPS` times the cap (a
        # check moving away from done is not told apart). A file's new hash says only
        # that it changed.
        waited = "; still asking again with the same answers" if waiting else ""
        return f"not finished in {rounds} rounds (limits.max_rounds_per_item){waited}"
    if total >= MEASURED_CAPS * cap:
        # Its count started again by rounds that finished other items (a checklist in
        # the agent's own order), the item has had the most any item may have (less
        # `SIDE_ROUNDS` for each item finished meanwhile).
        return (
            f"not finished in {MEASURED_CAPS * cap} rounds as the focus beyond those that "
            f"finished other items ({MEASURED_CAPS} x limits.max_rounds_per_item)"
        )
    return None


RuntimeDecision = Literal["continue", "satisfied", "need_decision", "need_user"]


# --- the focus item's breaker ----------------------------------------------------------


def focus_change(
    ledger: L.Ledger,
    facts: RoundFacts,
    accepted: Sequence[ProposedChange],
    moved: P.Moves,
    limits: Limits,
    policy: ItemPolicy,
    rounds: int,
    measured: bool = False,
    total: int = 0,
) -> tuple[L.ItemChange | None, AuditWarning | None]:
    """The mechanical breaker on the focus item, from what the round did (`moved`), not
    from what a judge attached. Progress is the item becoming done, or the round doing
    something new for it (`progress.moves`). A round without progress raises the breaker
    (waiting, `Moves.waiting`, leaves it); a round whose failure the item has seen
    before is an attempt; a non-convergent round (the same call failing the same way
    again and again) blocks the item whatever else it did; and an item still open after
    `limits.max_rounds_per_item` rounds is blocked at its first round in which its rule
    check saw no new state that says how far it got (`measured`; a wait, or padding with
    ever-new arguments, ends there)."""
    focus = facts.focus
    if facts.deferred or focus is None or not ledger.has_item(focus):
        return None, None
    state = ledger.item(focus)
    if state.status not in L.OPEN_STATUSES:
        return None, None
    done = any(c.item_id == focus and c.status == "done" for c in accepted)
    if finished_other(focus, accepted):
        rounds = 1  # another item's round (a checklist taken in the agent's own order)
    progressed = done or (moved.moved and not facts.non_convergent)
    failed = moved.repeated and not done
    attempts = state.attempts + (1 if failed else 0)
    if progressed or moved.waiting:
        breaker = 0
    elif facts.cut_off or moved.held:
        # Told of the cut (`verdicts.CUT_OFF_NOTE`), the model tries again; a service
        # said "not now" to a call it had not answered before: the item's rounds stay
        # bounded by its cap, not by `no_progress_rounds`.
        breaker = state.breaker
    else:
        breaker = state.breaker + 1
    max_attempts = policy.max_attempts or limits.max_attempts_per_item
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
    else:
        reason = past_cap(limits.max_rounds_per_item, rounds, total, measured, moved.waiting)
    if not reason:  # a change that changes nothing (most rounds) is left out
        if not failed and breaker == state.breaker:
            return None, None
        return L.ItemChange(focus, attempts_delta=1 if failed else 0, breaker=breaker), None
    last_error = next((o.error for o in reversed(facts.ops) if o.error), None)
    if last_error and not facts.blocked:
        reason += f"; last error: {last_error[:160]}"
    # An optional item the runtime would block ends skipped: the contract allows it.
    stop: L.ItemStatus = "skipped" if policy.optional else "blocked"
    change = L.ItemChange(
        focus,
        attempts_delta=1 if failed else 0,
        breaker=breaker,
        status=stop,
        note=f"optional, skipped: {reason}" if policy.optional else reason,
    )
    code = "item_skipped" if policy.optional else "item_blocked"
    return change, AuditWarning(
        code=code, message=f"{focus} {stop}: {reason}", details={"item": focus}
    )
