"""What the judges look at in the store: the rule judge's view of a run (`StoreRuleEnv`,
kept up to date from what changed, see `index`), the evidence refs a verdict cites
resolved, and the run's focus log (which item each round worked on)."""

from __future__ import annotations

from collections.abc import Collection, Container, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tether import events as ev
from tether.artifacts import DELIVERABLE_KEY, ROUND_KEY, stored_event
from tether.runtime.judge.facts import Evidence, RoundFacts
from tether.runtime.judge.rules.index import OpIndex, args_match, artifacts_of, index_of
from tether.runtime.judge.rules.own import own_commits
from tether.runtime.ops.runner import history_only
from tether.spec import OpRule
from tether.store.base import ArtifactRecord, OpRecord
from tether.tools.builtin.sources import snapshot_read_by, stale_reads

if TYPE_CHECKING:
    from tether.runtime.run.ports import JudgeHost, PendingRound


def note_focus(run: JudgeHost, round_no: int, focus: str | None) -> None:
    """Log the focus of a round when it changes (a few entries per item, not per round)."""
    log = run.view.state.focus_log
    if not log or log[-1][1] != focus:
        log.append([round_no, focus])
        del log[:-2000]


async def resolve_evidence(
    run: JudgeHost,
    refs: set[str],
    staged: Sequence[ArtifactRecord],
    facts: RoundFacts,
    staged_ops: Sequence[OpRecord] = (),
) -> dict[str, Evidence]:
    """What the runtime knows of each cited ref that resolves: a succeeded op or a valid
    artifact of this task, with the round (and its focus) that produced it. `staged`
    and `staged_ops` are this round's, not yet committed: read from memory."""
    # A ref with a NUL names nothing stored (and PostgreSQL's text cannot hold one: the
    # lookup would fail as if the store were down): it stays unresolved.
    refs = {r for r in refs if "\x00" not in r}
    if not refs:
        return {}  # most rounds cite nothing: no lookups to make
    art_ids = {r.partition(":")[2] for r in refs if r.startswith("artifact:")}
    arts = {a.artifact_id: a for a in staged if a.artifact_id in art_ids}
    missing = art_ids - set(arts)
    if missing:
        for a in await run.store.get_artifacts(run.journal.task_id, artifact_ids=missing):
            if a.valid:
                arts[a.artifact_id] = a
    op_ids = {r.partition(":")[2] for r in refs if r.startswith("op:")}
    op_ids |= {a.source for a in arts.values() if a.kind == "tool_output" and a.source}
    ops = {o.op_id: o for o in staged_ops if o.op_id in op_ids and o.status == "succeeded"}
    missing = op_ids - set(ops) - {o.op_id for o in staged_ops}
    if missing:
        for o in await run.store.get_ops(
            run.journal.task_id, statuses={"succeeded"}, op_ids=missing
        ):
            ops[o.op_id] = o

    def where(round_no: int) -> str | None:
        return facts.focus if round_no == facts.round else run.view.state.focus_of(round_no)

    ops = {k: o for k, o in ops.items() if not history_only(o)}  # late or compensated
    stale = await stale_reads(run.store, run.journal.task_id, list(ops.values()), staged)
    ops = {k: o for k, o in ops.items() if k not in stale}  # read a version since changed
    known: dict[str, Evidence] = {}
    for op in ops.values():
        known[f"op:{op.op_id}"] = Evidence(
            f"op:{op.op_id}",
            round=op.round,
            focus=where(op.round),
            tool=op.tool,
            fingerprint=f"{op.tool}|{op.args_hash}",
        )
    for art in arts.values():
        ref = f"artifact:{art.artifact_id}"
        made_by = ops.get(art.source) if art.kind == "tool_output" else None
        if art.kind == "tool_output" and made_by is None:
            continue  # the output of an op that did not succeed proves nothing
        rule_item = art.name if art.source == "rule judge" else None
        known[ref] = Evidence(
            ref,
            round=made_by.round if made_by else None,
            focus=where(made_by.round) if made_by else None,
            tool=made_by.tool if made_by else None,
            name=art.name,
            rule_item=rule_item,
            fingerprint=f"{made_by.tool}|{made_by.args_hash}" if made_by else art.blob_hash,
        )
    return known


class StoreRuleEnv:
    """What the rule judge may look at, with evidence artifacts it creates."""

    def __init__(self, run: JudgeHost, pending: PendingRound | None = None) -> None:
        self.run = run
        self.pending = pending
        self.workspace = run.view.workspace
        self.preexisting = run.preexisting
        self.artifacts: list[ArtifactRecord] = []
        self.events: list[ev.Event] = []
        #: The op index once brought up to date: a judging commits nothing, so one look
        #: serves each of its rules (a long checklist's op rules were one look each).
        self._idx: OpIndex | None = None
        #: This round's ops (ids), and its succeeded ones by tool, in call order.
        self._mine: set[str] = set()
        self._fresh: dict[str, list[OpRecord]] = {}
        for o in pending.ops if pending is not None else ():
            self._mine.add(o.op_id)
            if o.status == "succeeded":
                self._fresh.setdefault(o.tool, []).append(o)
        #: The op rules (index keys) this round's succeeded ops match (`_fresh_keys`).
        self._matched: set[tuple[str, str]] | None = None

    async def _index(self) -> OpIndex:
        """The run's op index, brought up to date with what was committed since."""
        idx = self._idx
        if idx is None:
            run = self.run
            idx = index_of(run, run.view.spec)
            state = run.view.state
            await idx.sync(run.store, run.journal.task_id, state.last_seq, own_commits(run))
            self._idx = idx
        return idx

    async def latest_op(
        self, item_id: str, rule: OpRule, taken: Collection[str]
    ) -> OpRecord | None:
        """The newest succeeded op (arguments as sent) that `rule` matches, not `taken`:
        this round's first (still pending), then the stored ones. With the round
        pending, a late result of an older task version, an op since compensated
        (`ops.history_only`) or a read of a source version since changed proves nothing."""
        idx = self._idx or await self._index()
        if self.pending is None:
            return next(
                (o for o in idx.newest_first(item_id) if f"op:{o.op_id}" not in taken), None
            )
        if not idx.has_ops(item_id) and not self._fresh_match(idx, item_id):
            return None  # most rules of a long checklist: nothing matches them yet
        mine = self._mine
        fresh = [o for o in self._fresh.get(rule.tool, ()) if args_match(rule.args, o.args)]
        stored = (o for o in idx.newest_first(item_id) if o.op_id not in mine)
        for op in (*reversed(fresh), *stored):
            if f"op:{op.op_id}" in taken or history_only(op):
                continue
            if not await self._fresh_read(idx, op, stored=op.op_id not in mine):
                continue
            return op
        return None

    async def op_candidates(self) -> Container[str]:
        """The items whose `op` rule a stored succeeded op or (with the round pending)
        one of this round's matches: `latest_op` finds nothing for the others."""
        idx = self._idx or await self._index()
        return idx.candidates(self._fresh_keys(idx) if self.pending is not None else ())

    def _fresh_match(self, idx: OpIndex, item_id: str) -> bool:
        """Whether one of this round's succeeded ops matches the item's `op` rule."""
        return idx.rule_of.get(item_id) in self._fresh_keys(idx)

    def _fresh_keys(self, idx: OpIndex) -> set[tuple[str, str]]:
        """The op rules (index keys) this round's succeeded ops match: the rules each op
        matches found once (`ToolRules.matching`), not each rule's arguments compared
        with each op."""
        matched = self._matched
        if matched is None:
            matched = self._matched = set()
            for tool, ops in self._fresh.items():
                if (rules := idx.by_tool.get(tool)) is not None:
                    for o in ops:
                        matched.update(rules.matching(o.args))
        return matched

    async def _fresh_read(self, idx: OpIndex, op: OpRecord, *, stored: bool) -> bool:
        """Not a read of a source version since changed (`stale_reads`); a stored read
        found fresh is asked again only after an artifact is invalidated."""
        if snapshot_read_by(op) is None or (stored and op.op_id in idx.fresh_reads):
            return True
        if await stale_reads(self.run.store, self.run.journal.task_id, [op]):
            return False
        if stored:
            idx.fresh_reads.add(op.op_id)
        return True

    async def current_ops(self, op_ids: Collection[str]) -> set[str]:
        ids = {i for i in op_ids if "\x00" not in i}
        if not ids:
            return set()
        idx = await self._index()
        mine = {o.op_id: o for o in (self.pending.ops if self.pending else ()) if o.op_id in ids}
        # Ops found current before and unchanged since (no event names them) still are:
        # only the rest is read again.
        held = (ids & idx.holding) - set(mine)
        ask = ids - held
        found_now: set[str] = set()
        if ask:
            # A succeeded op the index holds is the stored record as of its last look
            # (any change since names it): read are only the others.
            indexed = [idx.ops[i] for i in ask - set(mine) if i in idx.ops]
            rest = ask - {o.op_id for o in indexed} - set(mine)
            stored = (
                await self.run.store.get_ops(
                    self.run.journal.task_id, statuses={"succeeded"}, op_ids=rest
                )
                if rest
                else []
            )
            found = [o for o in [*stored, *indexed] if o.op_id not in mine] + list(mine.values())
            found = [o for o in found if o.status == "succeeded" and not history_only(o)]
            stale = await stale_reads(self.run.store, self.run.journal.task_id, found)
            found_now = {o.op_id for o in found} - stale
        idx.holding = held | found_now
        return held | found_now

    async def valid_artifacts(self) -> list[ArtifactRecord]:
        run = self.run
        idx = artifacts_of(run)
        state = run.view.state
        await idx.sync(
            run.store, run.journal.task_id, state.last_seq, state.compactions, own_commits(run)
        )
        return idx.valid() + (list(self.pending.artifacts) if self.pending else [])

    async def record_evidence(
        self, item_id: str, text: str, meta: Mapping[str, Any] | None = None
    ) -> str:
        ref = self.run.journal.stage_blob(text.encode("utf-8"))
        self.run.view.state.evidence_count += 1
        n = self.run.view.state.evidence_count
        art = ArtifactRecord(
            artifact_id=f"{self.run.journal.task_id}.ev{n}",
            task_id=self.run.journal.task_id,
            kind="evidence",
            name=item_id,
            blob_hash=ref,
            size=len(text),
            source="rule judge",
            task_version=self.run.view.task.version,
            meta=dict(meta or {}),
        )
        if DELIVERABLE_KEY in art.meta:
            # The round it was accepted in: the task's own later writes of the file are
            # revisions of shared work (`recovery.deliverables`), not tampering.
            art.meta[ROUND_KEY] = self.run.view.state.rounds
        self.artifacts.append(art)
        self.events.append(stored_event(art))
        return f"artifact:{art.artifact_id}"
