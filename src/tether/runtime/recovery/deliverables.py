"""Verified deliverables: a `done` item's evidence is checked again before it is trusted.

An item is done on evidence; some evidence stands for a file in the workspace (the
deliverable): a `done_when: {kind: file}` rule records the file's path and content hash
when it accepts it, and a succeeded `write_file` or `append_file` op names the file it
made. Files live outside tether's store, so they can vanish or change behind its back.
Whenever recovery runs, and once more before a task is delivered, every done item's
deliverables are checked: the file must still exist and, where a hash was recorded (or
the op that wrote it is the file's last writer), still have that content; a file the
task wrote over since must still hold what the accepted op wrote (a later append or a
fuller version keeps it; emptying or replacing it does not). A file a `done_when` rule
accepted may grow after it (the accepted content still its beginning: a log, a
changelog appended to), or be what the task's own later `write_file` made of it (one
file shared by several items, rewritten whole) or what its own tools left of it (a
formatter, a generator: `rewrites`) while it still holds the rule's text; any other
change breaks it. A draft is not what was accepted: when the item itself wrote
the file again (a `write_file` in a round whose focus was that item, so before it was
done), its evidence stands for that revision, and only a change made after it (by other
work, or outside the task) breaks it. An op undone since it proved its item (a
compensation, a human's decision) or gone to history proves nothing. Evidence artifacts
cited by done items must still be stored with their hash. A broken one reopens
its item with the reason, so a deleted or altered deliverable can never end `satisfied`.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import inspect
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tether import artifacts as A
from tether import events as ev
from tether import ledger as L
from tether import loop_hold
from tether.models.base import Message
from tether.runtime.ops.journal import compensation_of, history_only, superseded_by
from tether.runtime.recovery import rewrites
from tether.runtime.round.context import Entry, continuation_message
from tether.store.base import ArtifactRecord, OpRecord, blob_hash
from tether.tools.builtin.files import as_sent
from tether.tools.registry import ToolContext

if TYPE_CHECKING:
    from tether.runtime.run.ports import JudgeHost, JudgeStore, PartsHost

DELIVERABLE_KEY = A.DELIVERABLE_KEY
SHA256_KEY = A.SHA256_KEY
SIZE_KEY = A.SIZE_KEY
BEFORE_KEY = A.BEFORE_KEY
CONTAINS_KEY = A.CONTAINS_KEY
ROUND_KEY = A.ROUND_KEY
#: The built-in tools that write workspace files (their ops name the file in `path`).
WRITERS = ("write_file", "append_file")


@dataclass(frozen=True)
class Broken:
    """One piece of a done item's evidence that no longer holds."""

    item: str
    ref: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        """JSON-ready form."""
        return {"item": self.item, "ref": self.ref, "reason": self.reason}


def _file_bytes(workspace: Path | None, path: str) -> bytes | None:
    """A workspace file's content, or None when it is gone (or not a file, or outside
    the workspace)."""
    return None if workspace is None else rewrites.read(workspace, path)


def _sent(data: bytes, content: str) -> bytes:
    """A file's bytes as an op's `content` argument would hold them: PostgreSQL keeps a
    NUL of the op's arguments as U+FFFD (`store._sql`), while the file holds the NUL the
    model sent."""
    return data.replace(b"\0", "\ufffd".encode()) if "\ufffd" in content else data


def _where(workspace: Path | None, path: str) -> str:
    """One name per workspace file (`out/a.txt`, `./out/a.txt`, `out//a.txt` alike)."""
    if workspace is None:
        return path
    try:
        return str((workspace.resolve() / path).resolve())
    except (OSError, ValueError):
        return path


class _Check:
    """One verification: the cited artifacts and writer ops read once."""

    def __init__(
        self,
        workspace: Path | None,
        artifacts: Mapping[str, ArtifactRecord],
        ops: Mapping[str, OpRecord],
        last_writer: Mapping[str, OpRecord],
        blobs: Mapping[str, bool],
        history: Mapping[str, str] | None = None,
        revisions: Mapping[str, Sequence[OpRecord]] | None = None,
        focus: Callable[[int], str | None] | None = None,
        rewritten: Mapping[str, Any] | None = None,
    ) -> None:
        self.workspace = workspace
        #: Accepted files as the task's own tools left them (`rewrites.note`).
        self.rewritten = rewritten or {}
        self.history = history or {}
        #: Every succeeded `write_file` op per file, oldest first (see `revision`).
        self.revisions = revisions or {}
        self.focus = focus
        self.artifacts = artifacts
        self.ops = ops
        #: The task's last succeeded write of each file (`_where`).
        self.last_writer = last_writer
        self.blobs = blobs
        #: Artifacts whose workspace file is gone or altered: they no longer stand for
        #: it, and must not prove an item again.
        self.files_broken: dict[str, str] = {}

    def own(self, ident: str) -> str | None:
        """What is wrong with one stored artifact itself, or None."""
        art = self.artifacts.get(ident)
        if art is None or not art.valid:
            return f"artifact {ident} is missing or no longer valid"
        if not self.blobs.get(art.blob_hash, True):
            return f"artifact {ident} is missing from the store (its content is gone)"
        return None

    def artifact(self, ident: str) -> str | None:
        problem = self.own(ident)
        if problem is not None:
            return f"evidence {problem}"
        # A citation is only as good as what it was built from: a claim whose evidence
        # is gone is a dangling citation. Both checks run, so recovery reports every
        # break (a report whose file is gone and whose evidence is too).
        problems = []
        for dep in _below(ident, self.artifacts):
            problem = self.own(dep)
            if problem is not None:
                problems.append(f"evidence artifact {ident} cites {problem}")
                break
        art = self.artifacts[ident]
        path = art.meta.get(DELIVERABLE_KEY)
        if isinstance(path, str):
            problem = self.deliverable(path, art.meta)
            if problem is not None:
                problems.append(problem)
                self.files_broken[ident] = problem
        return "; ".join(problems) or None

    def deliverable(self, path: str, meta: Mapping[str, Any]) -> str | None:
        """Why the file an artifact accepted no longer holds (gone, or changed in a way
        that is not growth or the task's own revision still meeting its rule), or None."""
        data = _file_bytes(self.workspace, path)
        if data is None:
            return f"deliverable {path} is missing from the workspace"
        want = meta.get(SHA256_KEY)
        if not isinstance(want, str):
            return None
        have = hashlib.sha256(data).hexdigest()
        if have == want:
            return None
        if have == meta.get(BEFORE_KEY):
            # Back to what it was before the task: whoever put it back, the rule that
            # accepted it refuses it (`fresh`).
            return f"deliverable {path} is back to what it was before the task started"
        size = meta.get(SIZE_KEY)
        grown = isinstance(size, int) and 0 <= size <= len(data)
        if grown and hashlib.sha256(data[:size]).hexdigest() == want:
            return None  # grown since: what was accepted is still its beginning
        accepted = meta.get(ROUND_KEY)
        last = self.last_writer.get(_where(self.workspace, path))
        content = last.args.get("content") if last is not None else None
        if (
            isinstance(accepted, int)
            and last is not None
            and last.tool == "write_file"
            and last.round > accepted
            and isinstance(content, str)
            and _sent(data, content) == content.encode("utf-8")
            and str(meta.get(CONTAINS_KEY) or "") in content
        ):
            return None  # the task rewrote it whole since, still meeting its rule
        if rewrites.holds(data, meta, self.rewritten):
            return None  # the task's own tools rewrote it since, still meeting its rule
        return (
            f"deliverable {path} changed since it was accepted "
            f"(sha256 {want[:12]}..., now {have[:12]}...)"
        )

    def revision(self, op: OpRecord, path: str, item: str | None) -> OpRecord:
        """The item's own last rewrite of the file after `op` (a `write_file` made in a
        round whose focus was the item: a revision of the draft before the item was
        done), or `op` itself when there is none."""
        if self.focus is None or item is None:
            return op
        found = op
        for later in self.revisions.get(_where(self.workspace, path), ()):
            if (later.round, later.call_index) > (found.round, found.call_index) and (
                self.focus(later.round) == item
            ):
                found = later
        return found

    def op(self, ident: str, item: str | None = None) -> str | None:
        if ident in self.history:
            return self.history[ident]
        op = self.ops.get(ident)
        if op is None:
            return None  # not a writer op: the journal (recovery's own check) vouches for it
        path = op.args.get("path")
        if not isinstance(path, str):
            return None
        # A draft the item itself wrote over is not what it was accepted on: its revision is.
        op = self.revision(op, path, item)
        data = _file_bytes(self.workspace, path)
        if data is None:
            return f"deliverable {path} is missing from the workspace"
        content = op.args.get("content")
        if not isinstance(content, str):
            return None
        want = content.encode("utf-8")
        data = _sent(data, content)
        written = self.last_writer.get(_where(self.workspace, path))
        last = written is not None and written.op_id == op.op_id
        if op.tool == "write_file" and last:
            if data != want:
                return (
                    f"deliverable {path} changed since it was accepted (sha256 "
                    f"{hashlib.sha256(want).hexdigest()[:12]}..., now "
                    f"{hashlib.sha256(data).hexdigest()[:12]}...)"
                )
        elif want not in data:
            # Written over since (by the task itself: a later write of the same file):
            # what was accepted must still be in it (a later append or a fuller
            # version keeps it), or the evidence stands for content that is gone.
            return (
                f"deliverable {path} no longer holds what {op.tool} op {op.op_id} wrote "
                "(the file was written over since it was accepted)"
            )
        return None

    def ref(self, ref: str, item: str | None = None) -> str | None:
        kind, _, ident = ref.partition(":")
        if kind == "artifact":
            return self.artifact(ident)
        if kind == "op":
            return self.op(ident, item)
        return None


def _below(ident: str, arts: Mapping[str, ArtifactRecord]) -> list[str]:
    """The artifact ids `ident` depends on, transitively (iterative, cycle-safe)."""
    seen: dict[str, None] = {}
    todo = [ident]
    while todo:
        art = arts.get(todo.pop())
        for dep in art.deps if art is not None else ():
            kind, _, dep_id = dep.partition(":")
            if kind == "artifact" and dep_id not in seen and dep_id != ident:
                seen[dep_id] = None
                todo.append(dep_id)
    return list(seen)


async def closure(
    store: JudgeStore, task_id: str, ids: Collection[str]
) -> dict[str, ArtifactRecord]:
    """The artifacts `ids` and everything they depend on, read level by level."""
    found: dict[str, ArtifactRecord] = {}
    todo = set(ids)
    while todo and len(found) < 100_000:
        arts = await store.get_artifacts(task_id, artifact_ids=todo)
        found.update((a.artifact_id, a) for a in arts)
        todo = {
            d.partition(":")[2]
            for a in arts
            for d in a.deps
            if d.startswith("artifact:") and d.partition(":")[2] not in found
        }
    return found


async def _blob_states(store: JudgeStore, arts: Sequence[ArtifactRecord]) -> dict[str, bool]:
    states: dict[str, bool] = {}
    for art in arts:
        if art.blob_hash in states:
            continue
        try:
            states[art.blob_hash] = blob_hash(await store.get_blob(art.blob_hash)) == art.blob_hash
        except KeyError:
            states[art.blob_hash] = False
    return states


async def verify(
    store: JudgeStore,
    task_id: str,
    ledger: L.Ledger,
    workspace: Path | None,
    *,
    blobs: bool = True,
    focus_log: Sequence[Sequence[Any]] = (),
    rewritten: Mapping[str, Any] | None = None,
) -> tuple[L.Ledger, list[Broken], list[ArtifactRecord]]:
    """Check every done item's evidence; return the ledger with the items whose evidence
    broke reopened (the reason in their note), what broke, and the artifacts to store as
    invalid.

    An item is reopened when any of its evidence broke: a deliverable that is gone or
    altered, a cited artifact that is missing, or one it was built from (a claim's
    evidence, a section's claims) that is. Stored content is read and hashed for the
    artifacts below the cited ones, and for the cited ones too with `blobs` (recovery
    checks those itself and passes `blobs=False`). An artifact whose content is gone
    becomes invalid with everything built on it, so nothing re-accepts it. `focus_log`
    (`RunState.focus_log`) tells which item each round worked on: a file an item cited
    in a draft and then wrote again itself is checked against that revision;
    `rewritten` (`RunState.rewritten`) what the task's own tools left of accepted files."""
    done = [(d.id, s.evidence) for d, s in ledger.items() if s.status == "done"]
    refs = {r for _, evidence in done for r in evidence}
    art_ids = {r.partition(":")[2] for r in refs if r.startswith("artifact:")}
    op_ids = {r.partition(":")[2] for r in refs if r.startswith("op:")}
    arts = await closure(store, task_id, art_ids) if art_ids else {}
    hashed = [a for i, a in arts.items() if blobs or i not in art_ids]
    writers: list[OpRecord] = []
    history: dict[str, str] = {}
    if op_ids:
        # An op undone since it proved its item (a compensation, a human's decision) or
        # whose result went to history (a late result of an older task version) no
        # longer proves it: its effect is not what the item was accepted on.
        cited = await store.get_ops(task_id, op_ids=op_ids)
        for op in cited:
            how = compensation_of(op)
            if how is not None:
                history[op.op_id] = f"{op.tool} op {op.op_id} was undone since ({how})"
            elif superseded_by(op) is not None:
                history[op.op_id] = f"{op.tool} op {op.op_id} is history (a late result)"
        cites_writes = any(o.tool in WRITERS and o.status == "succeeded" for o in cited)
    else:
        cites_writes = False
    # The file writes are read for a cited write (`_Check.op`) or a file a rule accepted
    # (`_Check.deliverable`) only: without one, neither the writers nor the approvals
    # that modified them are read.
    if cites_writes or any(ROUND_KEY in a.meta for a in arts.values()):
        writers = await store.get_ops(task_id, statuses={"succeeded"}, tools=set(WRITERS))
        # The file each wrote is the one it was sent to write (after a human's `modify`).
        writers = as_sent(writers, await store.get_approvals(task_id, statuses={"approved"}))
    last_writer: dict[str, OpRecord] = {}
    revisions: dict[str, list[OpRecord]] = {}
    for op in writers:  # oldest first: the last one wins
        path = op.args.get("path")
        if isinstance(path, str):
            last_writer[_where(workspace, path)] = op
            if op.tool == "write_file" and not history_only(op):
                revisions.setdefault(_where(workspace, path), []).append(op)
    states = await _blob_states(store, hashed)
    check = _Check(
        workspace,
        arts,
        {o.op_id: o for o in writers if o.op_id in op_ids},
        last_writer,
        states,
        history,
        revisions,
        _focus_lookup(focus_log) if focus_log else None,
        rewritten,
    )
    broken: list[Broken] = []
    for item, evidence in done:
        for ref in evidence:
            reason = check.ref(ref, item)
            if reason is not None:
                broken.append(Broken(item, ref, reason))
    gone = [a for a in hashed if a.valid and not states.get(a.blob_hash, True)]
    moved = [arts[i] for i in check.files_broken if arts[i].valid]
    stale: list[ArtifactRecord] = []
    if gone or moved:
        every = await store.get_artifacts(task_id)
        seen: set[str] = set()
        for roots, why in (
            (gone, "its content is missing from the store"),
            (moved, "its file in the workspace is missing or changed"),
        ):
            hit = roots + A.dependents(every, [A.artifact_ref(a.artifact_id) for a in roots])
            hit = [a for a in {a.artifact_id: a for a in hit}.values() if a.artifact_id not in seen]
            seen.update(a.artifact_id for a in hit)
            stale += A.invalidated(hit, why)
    return reopen(ledger, broken), broken, stale


def _focus_lookup(log: Sequence[Sequence[Any]]) -> Callable[[int], str | None]:
    """The focus item of a round, from a focus log (`[[first_round, item], ...]`, one
    entry per change of focus, in order)."""
    starts = [int(e[0]) for e in log]
    items = [e[1] for e in log]

    def focus(round_no: int) -> str | None:
        at = bisect.bisect_right(starts, round_no) - 1
        return str(items[at]) if at >= 0 and items[at] is not None else None

    return focus


async def recheck_ops(
    run: PartsHost, ledger: L.Ledger, told: list[ev.Event] | None = None
) -> tuple[L.Ledger, list[Broken]]:
    """Ask the service again about the effectful ops done items rest on, for tools that
    can reconcile: an op whose effect the service no longer has (`not_done`: the ticket
    was deleted, say) reopens its item. A reconcile that fails or cannot tell changes
    nothing: doubt is not proof of loss.

    An op the service confirmed at an earlier recovery, and still cited since, is not
    asked again (`RunState.rechecked`): a recovery asks about the work done since the
    last one, not about all the finished work of the task."""
    tools = {t.name: t for t in run.tools if t.reconcile is not None and t.effect != "read"}
    done = [(d.id, s.evidence) for d, s in ledger.items() if s.status == "done"]
    op_ids = {r.partition(":")[2] for _, ev_ in done for r in ev_ if r.startswith("op:")}
    confirmed = set(run.view.state.rechecked) & op_ids
    ask = op_ids - confirmed
    if not tools or not ask:
        run.view.state.rechecked = sorted(confirmed)
        return ledger, []
    ops = await run.store.get_ops(
        run.journal.task_id, statuses={"succeeded"}, op_ids=ask, tools=set(tools)
    )
    gone: dict[str, str] = {}
    for op in ops:
        tool = tools[op.tool]
        ctx = ToolContext(
            op_id=op.op_id,
            task_id=run.journal.task_id,
            task_version=run.view.task.version,
            fencing_token=run.tool_env.token,
            workspace=run.view.workspace,
            logger=logging.getLogger(f"tether.tool.{tool.name}"),
            services=run.tool_env.services,
            round=op.round,
            call_index=op.call_index,
        )
        held = None
        try:
            assert tool.reconcile is not None
            call = tool.reconcile(op, ctx)
            if inspect.iscoroutine(call):  # timed like a round's reconcile (`loop_hold`)
                held = loop_hold.Held(call, f"reconcile {tool.name}", run.journal.task_id)
            rec = await asyncio.wait_for(held if held is not None else call, tool.timeout)
        except Exception:  # a failing check tells nothing; the op stands
            continue
        finally:
            warning = None if held is None else loop_hold.warning(held)
            if warning is not None and told is not None:
                told.append(warning)
        if rec.outcome == "not_done":
            gone[op.op_id] = (
                f"{op.tool} op {op.op_id} no longer holds: the service says it is not done"
            )
        elif rec.outcome == "done":
            confirmed.add(op.op_id)
    run.view.state.rechecked = sorted(confirmed)
    broken = [
        Broken(item, ref, gone[ref[3:]])
        for item, evidence in done
        for ref in evidence
        if ref.startswith("op:") and ref[3:] in gone
    ]
    return reopen(ledger, broken), broken


async def recover(
    run: PartsHost, ledger: L.Ledger, told: list[ev.Event] | None = None
) -> tuple[L.Ledger, list[Broken], list[ArtifactRecord]]:
    """Recovery's check of done items: deliverables and citations (`verify`; the cited
    artifacts' own content is checked by recovery itself), then effectful ops with a
    reconcile (`recheck_ops`). A reconcile that held the event loop is told in `told`
    (its `audit.warning`, `loop_hold`), journaled with the recovery."""
    ledger, broken, stale = await verify(
        run.store,
        run.journal.task_id,
        ledger,
        run.view.workspace,
        blobs=False,
        focus_log=run.view.state.focus_log,
        rewritten=run.view.state.rewritten,
    )
    ledger, lost = await recheck_ops(run, ledger, told)
    return ledger, broken + lost, stale


def reopen(ledger: L.Ledger, broken: Collection[Broken]) -> L.Ledger:
    """The ledger with every item of `broken` back to pending, its first reason noted."""
    reasons: dict[str, str] = {}
    for b in broken:
        reasons.setdefault(b.item, b.reason)
    for item, reason in reasons.items():
        ledger = L.reopen(ledger, item, reason).ledger
    return ledger


def details(
    broken: Sequence[Broken], checked: int, stale: Sequence[ArtifactRecord] = ()
) -> dict[str, Any]:
    """The findings as a `recovery.*` step's details."""
    return {
        "checked": checked,
        "broken": [b.to_dict() for b in broken],
        "invalidated": [a.artifact_id for a in stale],
    }


def invalidation_events(
    stale: Sequence[ArtifactRecord], items: Sequence[str]
) -> list[ev.ArtifactsInvalidated]:
    """One `artifacts.invalidated` event per reason for artifacts found broken, so the
    journal (and `tether artifacts --invalid`, the next turn's notice) says why each went
    to history rather than leaving the reason in a check's details only."""
    by_reason: dict[str, list[str]] = {}
    for art in stale:
        mark = art.meta.get(A.INVALIDATED)
        why = mark.get("reason") if isinstance(mark, dict) else None
        by_reason.setdefault(str(why or "its content is missing from the store"), []).append(
            art.artifact_id
        )
    return [
        ev.ArtifactsInvalidated(artifacts=ids, reason=why, items=list(items))
        for why, ids in by_reason.items()
    ]


async def hold_delivery(run: JudgeHost, round_no: int) -> bool:
    """Before a task is delivered: verify every done item's evidence once more. When
    something broke, commit the reopened items with an `audit.warning` per finding and
    return True (the task goes on instead of being delivered)."""
    ledger, broken, stale = await verify(
        run.store,
        run.journal.task_id,
        run.view.ledger,
        run.view.workspace,
        focus_log=run.view.state.focus_log,
        rewritten=run.view.state.rewritten,
    )
    if not broken and not stale:
        return False
    events: list[ev.Event] = [
        ev.AuditWarning(
            code="deliverable_broken",
            message=f"{b.item} reopened before delivery: {b.reason}",
            details={**b.to_dict(), "round": round_no},
        )
        for b in broken
    ]
    reopened = list(dict.fromkeys(b.item for b in broken))
    events += invalidation_events(stale, reopened)
    events.append(
        ev.LedgerUpdated(
            version=ledger.version,
            diff=L.diff(run.view.ledger, ledger).to_list(),
            cause="deliverables",
        )
    )
    gaps = [f"{b.item}: {b.reason}" for b in broken]
    text = continuation_message(ledger, "verified deliverables before delivery", gaps, reopened)
    p = ledger.progress()
    events.append(
        ev.JudgeVerdict(
            round=round_no,
            decision="continue",
            reason="deliverables broke before delivery",
            done=p.done,
            total=p.total,
            percent=p.percent,
            continuation=text,
            judges=["deliverables"],
        )
    )
    await run.journal.commit(events, ledger=ledger, artifacts=stale)
    run.ctx.append(Entry("continuation", [Message("user", text)], round_no))
    return True
