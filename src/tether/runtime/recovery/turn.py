"""Turn starts and recovery: claim, recover in order, rebuild the context, open a turn.

Recovery, in order (docs/architecture.md): read the task version and cancellation; verify
stored artifacts; list ops whose outcome is unknown (the interrupted round settles each
one: reconcile, re-send with its op id, or leave it to a human); restore ledger items
whose evidence no longer resolves; assemble a fresh context from the snapshot, the
summary and recent events. Each step is a `recovery.*` event.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tether import artifacts as A
from tether import events as ev
from tether import ledger as L
from tether import lifecycle
from tether.models.base import Message
from tether.runtime.recovery import deliverables, verify
from tether.runtime.round.context import Context, Entry, render_system, turn_message
from tether.runtime.run import outcome as out
from tether.runtime.run.outcome import Outcome
from tether.runtime.run.ports import Commit
from tether.store.base import ArtifactRecord, blob_hash

if TYPE_CHECKING:
    from tether.runtime.run.ports import Records, TaskView, TurnHost


async def start_turn(run: TurnHost) -> Outcome | None:
    """Recover if needed, move to running, assemble the context, open a turn. Returns
    the outcome that ends the run before any round (cancelled, a crash loop), or None."""
    events: list[ev.Event] = []
    first = run.view.state.turns == 0
    kind = "start" if first else "resume"
    ledger = run.view.ledger
    if run.view.task.cancel_requested:
        return out.cancelled()
    if not first and run.journal.status in ("running", "stalled"):
        crashed = _count_crash(run.view)
        if crashed is not None:
            return crashed
    events.append(
        ev.LeaseClaimed(
            worker_id=run.config.worker_id,
            token=run.flow.token,
            expires_at=run.view.clock.now() + run.config.lease_ttl,
        )
    )
    invalidated: list[ArtifactRecord] = []
    drifts = []
    if not first:
        # A lost snapshot: the same bytes read again restore it; other bytes never
        # stand for its version (a person decides, once the turn's recovery is in).
        drifts = await verify.lost_snapshots(run.parts, ledger)
        ledger, invalidated = await _recover(run, ledger, events)
    change, running = lifecycle.transition(run.journal, "running", kind)
    if run.journal.status != "running":
        events.append(change)
    await rebuild_context(run)
    epoch, why = epoch_needed(run, first)
    if epoch:
        run.ctx.system = render_system(run.view.spec, ledger)
        run.view.state.system_blob = run.journal.stage_blob(run.ctx.system.encode())
        run.view.state.system_version = run.view.task.version
        run.view.state.system_at = run.view.clock.now()
    text = turn_message(kind, ledger, epoch=epoch)
    if not first:
        text += await invalidation_notice(run.records, invalidated, ledger)
    turn = run.view.state.turns + 1
    run.view.state.turns = turn
    if not first:
        events.append(ev.RecoveryStep(step="context", details={"entries": len(run.ctx.entries)}))
    events.append(
        ev.TurnStarted(
            turn=turn,
            kind=kind,
            epoch=epoch,
            epoch_reason=why,
            system_blob=run.view.state.system_blob,
            system_chars=len(run.ctx.system),
            message=text,
        )
    )
    await run.journal.write(Commit(events, **running, ledger=ledger, artifacts=invalidated))
    run.ctx.append(Entry("turn", [Message("user", text)]))
    run.journal.snapshot(f"turn {turn} ({kind})")
    if drifts:
        why = verify.drift_text(run.journal.task_id, drifts)
        return out.waiting(
            "decision", why, why="needs_user_input", events=[ev.DecisionRequested(reason=why)]
        )
    return None


async def invalidation_notice(
    records: Records, found: Sequence[ArtifactRecord], ledger: L.Ledger
) -> str:
    """What the model must hear at a new turn: the artifacts invalidated since its last
    turn (an edit of a source's version, content found missing by recovery) and the
    items reopened with why. Without it a model would cite stale artifacts, or not know
    what to redo. Empty when nothing changed."""
    why: dict[str, str] = {}
    for e in await records.events({"turn.started", "artifacts.invalidated"}):
        if e.type == "turn.started":
            why.clear()  # the model heard of the earlier ones
            continue
        for ident in e.data.get("artifacts", []):
            why[str(ident)] = str(e.data.get("reason", ""))
    for art in found:
        mark = art.meta.get(A.INVALIDATED)
        reason = mark.get("reason") if isinstance(mark, dict) else None
        why.setdefault(art.artifact_id, str(reason or "its content is missing from the store"))
    reopened = [(d.id, s.note) for d, s in ledger.items() if s.status == "pending" and s.note]
    if not why and not reopened:
        return ""
    parts = []
    if why:
        parts.append(
            "Invalidated since your last turn (never cite these; redo what rested on them):\n"
            + "\n".join(f"  - {ident}: {reason}" for ident, reason in why.items())
        )
    if reopened:
        parts.append("Open again:\n" + "\n".join(f"  - {item}: {note}" for item, note in reopened))
    return "\n\n" + "\n\n".join(parts)


async def _recover(
    run: TurnHost, ledger: L.Ledger, events: list[ev.Event]
) -> tuple[L.Ledger, list[ArtifactRecord]]:
    """The recovery steps of a turn after a crash or a pause: the version, the stored
    artifacts the ledger rests on, the ops in doubt, the ledger's evidence. Appends the
    `recovery.*` events; returns the ledger (items whose evidence no longer resolves
    reopened) and the artifacts found invalid."""
    reopened: list[str] = []
    invalidated: list[ArtifactRecord] = []
    before = ledger
    events.append(
        ev.RecoveryStarted(worker_id=run.config.worker_id, previous_owner=run.config.previous_owner)
    )
    events.append(
        ev.RecoveryStep(
            step="version",
            details={"version": run.view.task.version, "cancel": run.view.task.cancel_requested},
        )
    )
    # Verify what the ledger's evidence rests on (hash and presence). Reading every
    # artifact of a long task at each turn would grow without bound.
    cited = {ref for _, st in ledger.items() for ref in st.evidence}
    art_ids = {r.partition(":")[2] for r in cited if r.startswith("artifact:")}
    op_ids = {r.partition(":")[2] for r in cited if r.startswith("op:")}
    artifacts = await run.records.artifacts(artifact_ids=art_ids)
    missing = []
    for art in artifacts:
        if not art.valid:
            continue
        try:
            data = await run.records.blob(art.blob_hash)
            ok = blob_hash(data) == art.blob_hash
        except KeyError:
            ok = False
        if not ok:
            missing.append(art.artifact_id)
            invalidated.append(A.invalidated([art], "its content is missing from the store")[0])
    events.append(
        ev.RecoveryStep(step="artifacts", details={"checked": len(artifacts), "invalid": missing})
    )
    # Ops in doubt are settled by the interrupted round when it resumes: each one
    # is reconciled, re-sent with its original op id, or left to a human.
    in_doubt = await run.records.ops(
        {"intended", "dispatched", "unknown", "retry_wait", "awaiting_approval"}
    )
    events.append(ev.RecoveryStep(step="ops", details={"in_doubt": [o.op_id for o in in_doubt]}))
    good_ops = {o.op_id for o in await run.records.ops({"succeeded"}, op_ids=op_ids)}
    good_arts = {a.artifact_id for a in artifacts if a.valid and a.artifact_id not in missing}

    def resolves(ref: str) -> bool:
        kind_, _, ident = ref.partition(":")
        return (kind_ == "op" and ident in good_ops) or (kind_ == "artifact" and ident in good_arts)

    for d, s in ledger.items():
        if s.status == "done" and not any(resolves(r) for r in s.evidence):
            ledger = L.reopen(ledger, d.id, "evidence no longer resolves").ledger
            reopened.append(d.id)
    # Deliverables (workspace files behind done items) are outside the store.
    ledger, broken, stale = await deliverables.recover(run.parts, ledger, events)
    invalidated += stale
    events.append(
        ev.RecoveryStep(
            step="deliverables", details=deliverables.details(broken, len(cited), stale)
        )
    )
    reopened += [i for i in dict.fromkeys(b.item for b in broken) if i not in reopened]
    events.append(ev.RecoveryStep(step="ledger", details={"reopened": reopened}))
    events += deliverables.invalidation_events(invalidated, reopened)
    if reopened:
        events.append(
            ev.LedgerUpdated(
                version=ledger.version,
                diff=L.diff(before, ledger).to_list(),
                cause="recovery",
            )
        )
    return ledger, invalidated


def _count_crash(view: TaskView) -> Outcome | None:
    """The last run ended in a crash (the task was still `running`). Crashing again
    before a round finishes is a loop: past the contract's limit the task fails instead
    of being retried forever."""
    st = view.state
    if st.rounds == st.crash_rounds_mark:
        st.crash_streak += 1
    else:
        st.crash_streak, st.crash_rounds_mark = 1, st.rounds
    limit = view.spec.limits.max_crash_restarts
    if st.crash_streak > limit:
        why = (
            f"crashed {st.crash_streak} times in a row at round {st.rounds + 1} without "
            f"finishing it (limits.max_crash_restarts = {limit})"
        )
        warning = ev.AuditWarning(code="crash_loop", message=why, details={"round": st.rounds + 1})
        return out.finished("failed", "environment_unrecoverable", why, events=[warning])
    return None


def epoch_needed(run: TurnHost, first: bool) -> tuple[bool, str]:
    """Whether this turn re-renders the system prompt (an epoch boundary)."""
    if first or not run.view.state.system_blob or not run.ctx.system:
        return True, "task start"
    if run.config.epoch_every_turn:
        return True, "every turn (naive policy)"
    if run.view.state.system_version != run.view.task.version:
        return True, "goal changed"
    last = run.view.state.last_call_at
    if run.view.clock.now() - last > run.view.spec.context.cache_ttl_seconds:
        return True, "provider cache expired"
    return False, ""


async def rebuild_context(run: TurnHost) -> None:
    """Context from the last snapshot plus the history entries after it."""
    schemas = tuple(t.schema() for t in run.tools)
    run.ctx = Context(system="", tools=schemas)
    if run.view.state.system_blob:
        with contextlib.suppress(KeyError):
            run.ctx.system = (await run.records.blob(run.view.state.system_blob)).decode()
    pending_round = int((run.view.state.inflight or {}).get("round", 0))
    for entry in await run.records.entries(
        snapshot=run.view.state.ctx_blob,
        after_seq=run.view.state.ctx_after_seq,
        skip_round=pending_round,
    ):
        run.ctx.append(entry)
    ratio = run.view.state.token_ratio
    if ratio:
        run.ctx.calibrator.ratio = float(ratio)
        run.ctx.calibrator.samples = 1
