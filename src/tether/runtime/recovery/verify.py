"""Verifying delivered work again: `tether verify TASK` (and the API, and a worker's
`--verify-every`).

A task's chain is checked end to end — every stored source snapshot, evidence, claim,
report section and report (its content present and hashing to what was recorded, and
nothing it cites gone or invalid), each source read pinned by fingerprint against the
source now, and the deliverables behind done items (`deliverables.verify`, the check
recovery and delivery run). What broke is reopened: the broken artifacts and everything
built on them become invalid, the items whose evidence rests on them go back to pending,
and a delivered task goes back to work (`queued`), journaled with the reason.

A snapshot whose content is lost is read again from its source: the same bytes (the
hash on record) restore it, nothing breaks. Other bytes are a drift — a pinned version's
bytes never change, so nothing can rebuild that evidence: the affected items reopen and
the task waits for a person's decision ("source X changed under version V": pin a new
version with an edit, or abandon). That, or a task that cannot be reopened (abandoned,
failed, cancelled), is a gap the verification reports without sending the task to work.
"""

from __future__ import annotations

import shlex
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tether import artifacts as A
from tether import errors, failpoints, lifecycle
from tether import events as ev
from tether import ledger as L
from tether.decisions import store_time
from tether.runtime import launch
from tether.runtime.recovery import deliverables
from tether.runtime.recovery.deliverables import Broken
from tether.runtime.run.ports import Commit
from tether.runtime.run.state import RunState
from tether.spec import Source, parse_spec
from tether.store.base import ArtifactRecord, LedgerWrite, Store, TaskPatch, blob_hash
from tether.tools.builtin.pinned import Drift, fingerprint_drift, snapshot_drift
from tether.tools.builtin.sources import MAX_SNAPSHOT_BYTES, fetch_source

if TYPE_CHECKING:
    from tether.runtime.run.ports import JudgeStore, PartsHost

#: The artifacts of a task's chain, in the order the table lists them.
CHAIN: dict[str, str] = {
    "source_snapshot": "source snapshots",
    "evidence": "evidence",
    "claim": "claims",
    "report_section": "report sections",
    "report": "reports",
}
#: Fail points around the one write a verification makes.
BEFORE_COMMIT = "before_verify_commit"
AFTER_COMMIT = "after_verify_commit"
#: Statuses a verification may write in: delivered, or not run by a worker now.
_WRITABLE = frozenset({"satisfied", "queued", "waiting", "suspended", "stalled"})


@dataclass
class Verification:
    """What one verification checked, found and did."""

    task_id: str
    #: The task's status before, and after the verification.
    before: str
    status: str
    #: Per part of the chain: how many were checked, how many broke.
    checked: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    broken: list[Broken] = field(default_factory=list)
    drifts: list[Drift] = field(default_factory=list)
    invalidated: list[str] = field(default_factory=list)
    reopened: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    #: What broke that the verification could not send back to work.
    gaps: list[str] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        """Nothing broke."""
        return not (self.broken or self.drifts or self.invalidated or self.gaps)

    @property
    def outcome(self) -> str:
        """`holds`, `reopened` (back to work), or `gap` (a person must act)."""
        if self.gaps:
            return "gap"
        return "holds" if self.holds else "reopened"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (`tether verify --json`, the API)."""
        return {
            "task_id": self.task_id,
            "outcome": self.outcome,
            "status_before": self.before,
            "status": self.status,
            "checked": [
                {"what": what, "checked": n, "broken": self.failed.get(what, 0)}
                for what, n in self.checked.items()
            ],
            "broken": [b.to_dict() for b in self.broken],
            "drifts": [d.to_dict() for d in self.drifts],
            "invalidated": self.invalidated,
            "reopened": self.reopened,
            "restored": self.restored,
            "gaps": self.gaps,
        }


async def _content_ok(store: JudgeStore, art: ArtifactRecord) -> bool:
    try:
        return blob_hash(await store.get_blob(art.blob_hash)) == art.blob_hash
    except KeyError:
        return False


async def _read(src: Source, workspace: Path | None, *, cap: int | None) -> Any:
    """The source now (`fetch_source`'s read), or None when it cannot be read."""
    try:
        return await fetch_source(src, workspace, cap=cap)
    except (OSError, errors.ToolFailed):
        return None


class _Pass:
    """One verification's reads and findings, before anything is written."""

    def __init__(self, store: JudgeStore, task_id: str, result: Verification) -> None:
        self.store, self.task_id, self.result = store, task_id, result
        #: Roots found broken, with why: artifact id -> reason.
        self.roots: dict[str, str] = {}
        self.blobs: list[bytes] = []

    def count(self, what: str, broken: bool) -> None:
        self.result.checked[what] = self.result.checked.get(what, 0) + 1
        if broken:
            self.result.failed[what] = self.result.failed.get(what, 0) + 1

    async def sources(
        self,
        arts: list[ArtifactRecord],
        spec_sources: dict[str, Source],
        ws: Path | None,
        *,
        fingerprints: bool = True,
    ) -> set[str]:
        """Each snapshot's stored content; each fingerprint against its source now.
        Returns the snapshots whose content is back (the same bytes read again)."""
        ok: set[str] = set()
        for art in arts:
            src = spec_sources.get(str(art.meta.get("source", "")))
            current = src is not None and A.source_ref(src.id, src.version) in art.deps
            if art.meta.get("pin") == "fingerprint":
                if not fingerprints or not current or src is None:
                    continue
                got = await _read(src, ws, cap=None)
                drift = fingerprint_drift(art, src, None if got is None else got.fingerprint)
                self.count("source fingerprints", drift is not None)
                if drift is not None:
                    self.roots[art.artifact_id] = drift.reason
                continue
            if await _content_ok(self.store, art):
                ok.add(art.artifact_id)
                continue
            if current and src is not None:
                got = await _read(src, ws, cap=MAX_SNAPSHOT_BYTES)
                data = None if got is None else got.data
                drift = snapshot_drift(art, src, data)
                if drift is None and data is not None:
                    self.blobs.append(data)  # the recorded bytes: the snapshot is whole again
                    self.result.restored.append(art.artifact_id)
                    ok.add(art.artifact_id)
                    continue
                if drift is not None:
                    self.result.drifts.append(drift)
                    self.roots[art.artifact_id] = f"{drift.reason}; its stored content is lost"
                    continue
            self.roots[art.artifact_id] = "its content is missing from the store"
        return ok

    async def chain(self, arts: list[ArtifactRecord], whole: set[str]) -> None:
        """Every artifact of the chain: its content, and what it cites."""
        by_id = {a.artifact_id: a for a in arts}
        for art in arts:
            if art.kind not in CHAIN:
                continue
            problem = None
            if art.artifact_id in self.roots:
                problem = self.roots[art.artifact_id]
            elif art.artifact_id not in whole and not await _content_ok(self.store, art):
                problem = "its content is missing from the store"
            else:
                for dep in art.deps:
                    kind, _, ident = dep.partition(":")
                    cited = by_id.get(ident)
                    if kind == "artifact" and (cited is None or not cited.valid):
                        problem = f"it cites artifact {ident}, which is missing or invalid"
                        break
            self.count(CHAIN[art.kind], problem is not None)
            if problem is not None:
                self.roots.setdefault(art.artifact_id, problem)


async def verify_task(store: Store, task_id: str, *, by: str = "user") -> Verification:
    """Check `task_id`'s whole chain and reopen what broke (see the module). Raises
    `UserError` while a worker runs the task (its round owns the ledger)."""
    task = await store.get_task(task_id)
    held = task.lease_owner is not None and (task.lease_expiry or 0) > store_time(store)
    if task.status == "running" or held:
        raise errors.UserError(
            f"task {task_id} is {task.status}: a worker holds it; verify it when it is delivered "
            "or waits (its own recovery and delivery check what it rests on)"
        )
    spec = parse_spec(task.spec, source=f"task {task_id}", stored=True)
    ws = Path(task.workspace) if task.workspace else None
    if task.workspace is not None:
        # A folder renamed or not mounted: every done item would be reopened.
        done = "nothing was checked or reopened"
        await launch.workspace_here(store, task_id, task.workspace, done)
    result = Verification(task_id, task.status, task.status)
    arts = [a for a in await store.get_artifacts(task_id) if a.valid]
    check = _Pass(store, task_id, result)
    snaps = [a for a in arts if a.kind == "source_snapshot"]
    whole = await check.sources(snaps, {s.id: s for s in spec.sources}, ws)
    await check.chain(arts, whole)
    if check.blobs:
        # The same bytes read again: stored before anything else is checked (the blob is
        # content-addressed, so a crash here leaves nothing half done).
        await store.commit(
            task_id,
            None,
            [ev.RecoveryStep(step="restore", details={"restored": result.restored, "by": by})],
            blobs=check.blobs,
        )
    rec = await store.get_ledger(task_id)
    before = rec.to_ledger()
    state = RunState.from_dict(task.usage)
    ledger, broken, stale = await deliverables.verify(
        store, task_id, before, ws, focus_log=state.focus_log
    )
    cited = [r for _, st in before.items() if st.status == "done" for r in st.evidence]
    result.checked["done items' evidence"] = len(cited)
    result.failed["done items' evidence"] = len({b.ref for b in broken})
    # What broke, with everything built on it.
    roots = [a for a in arts if a.artifact_id in check.roots]
    hit = {a.artifact_id: a for a in stale}
    for art in roots:
        hit.setdefault(art.artifact_id, A.invalidated([art], check.roots[art.artifact_id])[0])
    for dep in A.dependents(arts, [A.artifact_ref(a.artifact_id) for a in roots]):
        if dep.artifact_id not in hit:
            why = f"it rests on {', '.join(sorted(check.roots))}, which broke"
            hit[dep.artifact_id] = A.invalidated([dep], why)[0]
    gone = set(hit)
    seen = {(b.item, b.ref) for b in broken}
    for d, s in ledger.items():
        if s.status != "done":
            continue
        for ref in s.evidence:
            ident = ref.partition(":")[2]
            if ref.startswith("artifact:") and ident in gone and (d.id, ref) not in seen:
                mark = hit[ident].meta.get(A.INVALIDATED)
                because = mark.get("reason") if isinstance(mark, dict) else "it broke"
                broken.append(Broken(d.id, ref, f"evidence artifact {ident}: {because}"))
    ledger = deliverables.reopen(ledger, broken)
    result.broken = broken
    result.invalidated = list(hit)
    result.reopened = list(dict.fromkeys(b.item for b in broken))
    if result.holds:
        return result
    if task.status not in _WRITABLE:
        result.gaps.append(
            f"task {task_id} is {task.status} ({task.stop_reason}): nothing reopens it; "
            f"give it a new goal to redo the work (tether edit {shlex.quote(task_id)} ...)"
        )
        return result
    change, patch = _plan(task, result)
    events = [
        ev.RecoveryStep(step="verify", details={**result.to_dict(), "by": by}),
        *deliverables.invalidation_events(list(hit.values()), result.reopened),
        ev.LedgerUpdated(
            version=ledger.version, diff=L.diff(before, ledger).to_list(), cause="verify"
        ),
        *change,
    ]
    failpoints.hit(BEFORE_COMMIT)
    await store.commit(
        task_id,
        None,
        events,
        task=patch,
        ledger=LedgerWrite.of(ledger, before.version) if ledger.version != before.version else None,
        artifacts=list(hit.values()),
    )
    failpoints.hit(AFTER_COMMIT)
    return result


def drift_text(task_id: str, drifts: list[Drift]) -> str:
    """What a person reads when pinned versions drifted, with the commands that settle it."""
    tid = shlex.quote(task_id)
    names = "; ".join(dict.fromkeys(d.reason for d in drifts))
    return (
        f"{names}: the stored bytes of the pinned version are lost and nothing can "
        f"rebuild its evidence. Decide: pin a new version (tether edit {tid} --source "
        f"{shlex.quote(drifts[0].source)}=VERSION@LOCATION) or tether abandon {tid} "
        "--reason 'REASON'"
    )


async def lost_snapshots(run: PartsHost, ledger: L.Ledger) -> list[Drift]:
    """Recovery's pinned re-reads: the snapshots below done items' evidence whose
    content is lost are read again from their sources. The recorded bytes are stored
    again (committed at once, so the check of the deliverables that follows finds them
    whole); other bytes are drifts, returned for a person's decision (the snapshot stays
    lost, and what rests on it reopens)."""
    cited = {
        r.partition(":")[2]
        for _, st in ledger.items()
        if st.status == "done"
        for r in st.evidence
        if r.startswith("artifact:")
    }
    if not cited:
        return []
    task_id = run.journal.task_id
    arts = await deliverables.closure(run.store, task_id, cited)
    snaps = [a for a in arts.values() if a.valid and a.kind == "source_snapshot"]
    if not snaps:
        return []
    result = Verification(task_id, run.journal.status, run.journal.status)
    check = _Pass(run.store, task_id, result)
    sources = {s.id: s for s in run.view.spec.sources}
    await check.sources(snaps, sources, run.view.workspace, fingerprints=False)
    if check.blobs:
        for data in check.blobs:
            run.journal.stage_blob(data)
        details = {"restored": result.restored, "by": "recovery"}
        await run.journal.write(Commit([ev.RecoveryStep(step="restore", details=details)]))
    return result.drifts


def _plan(task: Any, result: Verification) -> tuple[list[ev.Event], TaskPatch | None]:
    """The status change a verification's findings call for (and the gap it reports)."""
    if result.drifts:
        first = result.drifts[0]
        text = drift_text(result.task_id, result.drifts)
        result.gaps.append(text)
        if task.status != "satisfied":
            return [ev.DecisionRequested(reason=text)], None
        change, moved = lifecycle.transition(
            task,
            "waiting",
            f"verify: {first.reason}",
            waiting={"kind": "decision", "reason": text},
        )
        result.status = "waiting"
        return [ev.DecisionRequested(reason=text), change], TaskPatch(**moved)
    if task.status != "satisfied":
        return [], None
    why = result.broken[0].reason if result.broken else "an artifact of its chain broke"
    n = Counter(b.item for b in result.broken)
    change, moved = lifecycle.transition(
        task, "queued", f"verify reopened {len(n)} item(s): {why}"[:500]
    )
    result.status = "queued"
    return [change], TaskPatch(**moved)
