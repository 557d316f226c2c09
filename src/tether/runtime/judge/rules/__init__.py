"""The rule judge: open items' `done_when` rules over ops, artifacts, files and
commands, checked without a model; and done items whose evidence no longer holds."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Collection, Container, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Protocol

from tether import ledger as L
from tether._by_object import keep
from tether.artifacts import CALL_KEY, deliverable_meta
from tether.ledger_tally import refs as ledger_refs
from tether.runtime.judge.facts import FILE_STATE, ProposedChange, Verdict
from tether.runtime.judge.rules.commands import run_command
from tether.runtime.judge.rules.scope import fingerprinted, ruled_items, ruleless
from tether.runtime.round import progress as P
from tether.spec import (
    ArtifactRule,
    ChecklistItem,
    CommandRule,
    FileRule,
    OpRule,
    TaskSpec,
)
from tether.store.base import ArtifactRecord, OpRecord


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

    async def op_candidates(self) -> Container[str] | None:
        """The items whose `op` rule some succeeded op may match (stored, or this
        round's): `latest_op` finds nothing for any other item. None: it may for any."""
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


#: The rule judge's verdict when it has nothing to check (`idle`), made once: a verdict
#: is frozen and its (empty) checks a read-only view, so one serves every round.
IDLE: Final = Verdict("continue", (), "", source="rules", checks=MappingProxyType({}))


def idle(spec: TaskSpec, ledger: L.Ledger) -> bool:
    """True when the rule judge has nothing to look at, whatever the round did: no item
    has a `done_when` rule, no source is pinned by fingerprint, no done item cites an op
    (most contracts): its verdict is `IDLE` (what `rule_verdict` returns then), and
    neither the round's rule scope nor a `RuleEnv` is needed to know it."""
    return ruleless(spec) and not _cited_ids(ledger)


async def rule_verdict(
    spec: TaskSpec, ledger: L.Ledger, env: RuleEnv, only: Collection[str] | None = None
) -> Verdict:
    """Check open items' `done_when` rules (of the items in `only`, when given; see
    `rule_scope`); propose `done` with evidence for those met."""
    ruled = ruled_items(spec, only)
    if not ruled and not fingerprinted(spec) and not _cited_ids(ledger):
        return IDLE  # no rule in scope, nothing to undo
    check = _RuleCheck(spec, ledger, env)
    changes: list[ProposedChange] = []
    # Items whose rule is met in this verdict: their successors may be judged after them.
    met: set[str] = set()
    # Without `after` in the contract no item waits (most contracts): not asked per item.
    ordered = ledger.skeleton.ordered
    # The items whose op rule some op matches (`op_candidates`), asked at the first
    # open item with an op rule: a long checklist's op rules are mostly unmet, and an
    # unmet one (no op: no change, no state) needs no `latest_op`.
    maybe: Container[str] | None = None
    asked = False
    for item in ruled:
        rule = item.done_when
        if rule is None or not ledger.has_item(item.id):
            continue
        if ledger.item(item.id).status not in L.OPEN_STATUSES:
            continue
        if ordered and any(p not in met for p in ledger.waiting_for(item.id)):
            continue  # it may not start before its predecessors are finished
        if isinstance(rule, OpRule):
            # (`_RuleCheck.op` inlined: most of a long checklist's rules are op rules,
            # most not met.) An op proving another item proves this one only with leave.
            if not asked:
                maybe, asked = await env.op_candidates(), True
            if maybe is not None and item.id not in maybe:
                continue
            taken = set() if item.shared_evidence else check.credited
            hit = await env.latest_op(item.id, rule, taken)
            change = None
            if hit is not None:
                change = ProposedChange(item.id, "done", (f"op:{hit.op_id}",), "rule: op")
        elif isinstance(rule, ArtifactRule):
            change = await check.artifact(item, rule)
        elif isinstance(rule, FileRule):
            change = await check.file(item, rule)
        else:
            change = await check.command(item, rule)
        if change is not None:
            changes.append(change)
            met.add(item.id)
    if fingerprinted(spec):
        # A re-read may have found a source changed and invalidated artifacts mid-run:
        # items they proved go back to work now, not only at the check before delivery.
        changes += await check.stale_evidence(ledger)
    # Likewise an op undone since it proved its item (a compensation of another item's
    # stretch, a human's decision), gone to history, or a read found stale since.
    changes += await check.undone_ops(ledger)
    return Verdict("continue", tuple(changes), "", source="rules", checks=dict(check.states))


#: The op ids done items cite, by evidence index object (`_cited_ids`), while it lives
#: (a worker judges many runs in turn: one entry was made again at every judging).
_IDS: dict[int, frozenset[str]] = {}


def _cited_ids(ledger: L.Ledger) -> frozenset[str]:
    """The op ids the done items cite, kept for the ledger's evidence index: it is the
    same object while no item changes, and a long checklist's done items were walked
    every round. (Which item cites which is asked only when some op no longer holds.)"""
    index = ledger_refs(ledger)
    hit = _IDS.get(id(index))
    if hit is not None:
        return hit
    return keep(_IDS, index, frozenset(r[3:] for refs in index.done_ops.values() for r in refs))


def _cited_ops(ledger: L.Ledger) -> dict[str, tuple[str, ...]]:
    """`{item: its op refs}` of the done items citing ops (contract order)."""
    items = ledger.skeleton.items
    return {items[n].id: ops for n, ops in sorted(ledger_refs(ledger).done_ops.items())}


class _RuleCheck:
    """One rule judging: the journal and artifacts read once, each rule kind checked."""

    def __init__(self, spec: TaskSpec, ledger: L.Ledger, env: RuleEnv) -> None:
        self.env = env
        #: What each unmet rule found (`Verdict.checks`): how far its item got.
        self.states: dict[str, str] = {}
        # Refs some item cites already (the ledger's carried index: no walk per round).
        self.credited = ledger_refs(ledger).holders.keys()
        self.arts: list[ArtifactRecord] | None = None
        #: The workspace, resolved once per judging (at its first file that exists).
        self.root: Path | None = None

    async def artifact(self, item: ChecklistItem, rule: ArtifactRule) -> ProposedChange | None:
        if self.arts is None:
            self.arts = await self.env.valid_artifacts()
        taken = set() if item.shared_evidence else self.credited
        # One work counts once (the newest): a tool's outputs once per call, whatever
        # they said (the same page fetched five times is one page, not five, though
        # stamped with the time it was made), other artifacts once per content.
        found = []
        works: set[object] = set()
        for a in reversed(self.arts):
            if (
                (rule.name is None or a.name == rule.name)
                and (rule.artifact_kind is None or a.kind == rule.artifact_kind)
                and f"artifact:{a.artifact_id}" not in taken
            ):
                call = a.meta.get(CALL_KEY)
                work = a.blob_hash if call is None else (a.name, call)
                if work not in works:
                    works.add(work)
                    found.append(a)
        if len(found) < rule.min_count:
            self.states[item.id] = f"artifacts: {len(found)} of {rule.min_count}"
            return None
        refs = tuple(
            f"artifact:{a.artifact_id}" for a in reversed(found[: max(rule.min_count, 20)])
        )
        return ProposedChange(item.id, "done", refs, "rule: artifact")

    async def undone_ops(self, ledger: L.Ledger) -> list[ProposedChange]:
        """`pending` for each done item citing an op that no longer proves anything."""
        ids = _cited_ids(ledger)
        if not ids:
            return []
        current = await self.env.current_ops(ids)
        if current >= ids:
            return []  # every cited op still holds (most rounds): no item to walk
        out = []
        for item, refs in _cited_ops(ledger).items():
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
        self.states[item.id] = f"{FILE_STATE}{rule.path}: missing"
        try:
            # Most files a round checks are not there yet: one stat says so, before the
            # symlink-following resolve (a dozen system calls) that guards the workspace.
            if not os.path.isfile(ws / rule.path):
                return None
            if self.root is None:
                self.root = ws.resolve()
            path = (ws / rule.path).resolve()
            if not path.is_relative_to(self.root) or not path.is_file():
                return None
            data = path.read_bytes()
        except (OSError, ValueError):  # a name too long, a NUL: the rule is not met
            return None
        full = hashlib.sha256(data).hexdigest()
        # Not met (yet): the file as it is now, so a changed draft counts as progress.
        self.states[item.id] = f"{FILE_STATE}{rule.path}: sha256 {full}"
        content = data.decode("utf-8", errors="replace")
        if rule.contains is not None and rule.contains not in content:
            return None
        before = self.env.preexisting.get(rule.path) if rule.fresh else None
        if before == full:
            return None  # the same file was there before the task started
        del self.states[item.id]
        # The path and full hash go with the evidence: recovery and the check before
        # delivery verify that the deliverable is still there with this content.
        ref = await self.env.record_evidence(
            item.id,
            f"file {rule.path} exists ({len(content)} chars, sha256 {full[:16]})",
            deliverable_meta(rule.path, data, rule.contains, before),
        )
        return ProposedChange(item.id, "done", (ref,), f"rule: file {rule.path}")

    async def command(self, item: ChecklistItem, rule: CommandRule) -> ProposedChange | None:
        code, out = await run_command(rule.command, self.env.workspace, rule.timeout)
        if code != rule.exit_code:
            # What the failing check said, without its timings: another answer is progress.
            self.states[item.id] = f"command exited {code}: {P.normalise(out)[-4000:]}"
            return None
        ref = await self.env.record_evidence(
            item.id, f"command `{rule.command}` exited {code}\n{out[-2000:]}"
        )
        return ProposedChange(item.id, "done", (ref,), "rule: command")
