"""After a round: rule judge, LLM judge, audits, the verdict, and the completion check."""

from __future__ import annotations

import shlex
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tether import errors, failpoints
from tether import events as ev
from tether import ledger as L
from tether.models.base import Message
from tether.runtime import hints
from tether.runtime.judge import judges as J
from tether.runtime.judge.completion import parse_review, review_request, run_acceptance
from tether.runtime.judge.index import OpIndex, args_match, index_of
from tether.runtime.judge.rule_scope import rule_scope
from tether.runtime.ops.runner import history_only
from tether.runtime.recovery import deliverables
from tether.runtime.round import progress as P
from tether.runtime.round.context import Entry, continuation_message
from tether.runtime.run import outcome as out
from tether.runtime.run.outcome import Outcome
from tether.spec import OpRule, TaskSpec
from tether.store.base import ArtifactRecord, OpRecord
from tether.tools.builtin.sources import snapshot_read_by, stale_reads

if TYPE_CHECKING:
    from tether.runtime.run.ports import JudgeHost, PendingRound


def facts_from_dict(d: Mapping[str, Any]) -> J.RoundFacts:
    """The round facts saved before a crash (`RunState.unjudged`), for judging it after."""
    return J.RoundFacts(
        round=int(d["round"]),
        focus=d.get("focus"),
        text=str(d.get("text", "")),
        non_convergent=d.get("non_convergent"),
        blocked=d.get("blocked"),
        ops=tuple(
            J.OpSummary(
                o["op_id"],
                o["tool"],
                o.get("args", {}),
                o["status"],
                o.get("summary", ""),
                o.get("error"),
                o.get("artifact_id"),
                o.get("error_class"),
                str(o.get("args_hash") or ""),
                str(o.get("result_hash") or ""),
            )
            for o in d.get("ops", [])
        ),
    )


def facts_to_dict(facts: J.RoundFacts) -> dict[str, Any]:
    """The round facts as saved with the results (`RunState.unjudged`) when an LLM judge
    is called after the results are committed."""
    return {
        "round": facts.round,
        "focus": facts.focus,
        "text": facts.text[:2000],
        "non_convergent": facts.non_convergent,
        "blocked": facts.blocked,
        "ops": [
            {
                "op_id": o.op_id,
                "tool": o.tool,
                "args": dict(o.args),
                "status": o.status,
                "summary": o.summary,
                "error": o.error,
                "artifact_id": o.artifact_id,
                "error_class": o.error_class,
                "args_hash": o.args_hash,
                "result_hash": o.result_hash,
            }
            for o in facts.ops
        ],
    }


async def judge_round(
    run: JudgeHost, facts: J.RoundFacts, text: str, pending: PendingRound | None = None
) -> Outcome | None:
    """Rule judge, LLM judge, audit; commit the verdict (with the round's results when
    they are still `pending`); act on the decision: the outcome that ends the run, or
    None to go on."""
    env = _RuleEnv(run, pending)
    only = rule_scope(run.spec, run.ledger, facts.focus, [(o.tool, o.args) for o in facts.ops])
    verdicts = [await J.rule_verdict(run.spec, run.ledger, env, only)]
    extra_events: list[ev.Event] = list(env.events)
    judge_model = run.models.judge
    judges = ["rules"]
    if judge_model is not None:
        judges.append(judge_model.name)
        retry_note = None
        verdict = None
        for _attempt in range(2):
            req = J.judge_request(
                run.spec,
                run.ledger,
                facts,
                user_words=run.user_words,
                task_id=run.task_id,
                retry_note=retry_note,
            )
            try:
                resp = await run.call_model(judge_model, req)
            except errors.ModelError as exc:
                await run.commit(extra_events, artifacts=env.artifacts)  # results are in
                await run.model_failed("judge", judge_model, exc)
                raise
            extra_events.append(await run.record_call("judge", judge_model, req, resp, facts.round))
            try:
                verdict = J.parse_verdict(resp.text)
                break
            except J.VerdictParseError as exc:
                retry_note = str(exc)
        if verdict is None:
            extra_events.append(
                ev.AuditWarning(
                    code="verdict_unparsed",
                    message=f"the judge's verdict could not be parsed twice ({retry_note}); "
                    "treated as no change",
                )
            )
        else:
            verdicts.append(verdict)
    # Resolve only the refs the verdicts cite: a long task never reads its whole journal.
    cited = {ref for v in verdicts for c in v.changes for ref in c.evidence}
    staged = [*env.artifacts, *(pending.artifacts if pending else ())]
    known = await resolve_evidence(run, cited, staged, facts, pending.ops if pending else ())
    outcome = J.audit(
        run.ledger,
        verdicts,
        evidence=known.get,
        facts=facts,
        limits=run.spec.limits,
        policies=_policies(run.spec),
        seen=run.state.seen,
        rounds=_count_round(run, facts),
    )
    _remember(run, facts, outcome)
    new = outcome.update.ledger
    p = new.progress()
    extra_events.extend(outcome.warnings)  # the audit's warnings are events already
    continuation = ""
    if outcome.decision == "continue":
        changed = list(dict.fromkeys(outcome.update.diff.status_changes()))
        continuation = continuation_message(new, outcome.reason, changed=changed)
    verdict_event = ev.JudgeVerdict(
        round=facts.round,
        decision=outcome.decision,
        reason=outcome.reason,
        done=p.done,
        total=p.total,
        percent=p.percent,
        changes=outcome.update.diff.to_list(),
        judges=judges,
        continuation=continuation,
    )
    events: list[ev.Event] = [*extra_events, verdict_event]
    if outcome.update.changed:
        events.append(ev.LedgerUpdated(version=new.version, diff=outcome.update.diff.to_list()))
    run.state.unjudged = None
    failpoints.hit("before_ledger_write")
    if pending is not None:
        await run.commit_round(pending, events=events, ledger=new, artifacts=env.artifacts)
    else:
        await run.commit(events, ledger=new, artifacts=env.artifacts)
    if continuation:
        run.ctx.append(Entry("continuation", [Message("user", continuation)], facts.round))
    run.snapshot(f"round {facts.round}: {outcome.decision} ({p.done}/{p.total} done)")
    if outcome.decision == "satisfied":
        return await complete(run, facts.round)
    if outcome.decision == "need_decision":
        return await_decision(run, outcome.reason)
    if outcome.decision == "need_user":
        return out.waiting(
            "human",
            f"{outcome.reason or 'the judge asks for a human'}; answer with: "
            f"{hints.tell(run.task_id)}",
            why="needs_user_input",
        )
    return None


#: The item policies of the contract a run judges with: built once per contract object
#: (a run keeps its spec for its whole turn), not once per round.
_POLICY_CACHE: dict[int, tuple[TaskSpec, dict[str, J.ItemPolicy]]] = {}


def _policies(spec: TaskSpec) -> dict[str, J.ItemPolicy]:
    hit = _POLICY_CACHE.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    policies = J.ItemPolicy.of_spec(spec)
    if len(_POLICY_CACHE) >= 16:
        _POLICY_CACHE.clear()
    _POLICY_CACHE[id(spec)] = (spec, policies)
    return policies


def _count_round(run: JudgeHost, facts: J.RoundFacts) -> int:
    """How many rounds the round's focus item has had, this one included (a round whose
    every call an open breaker held back is not one)."""
    focus = facts.focus
    if focus is None or facts.deferred:
        return 0
    return run.state.item_rounds.get(focus, 0) + 1


def _remember(run: JudgeHost, facts: J.RoundFacts, outcome: J.AuditOutcome) -> None:
    """Keep what the next audits need: what the round did for its focus item (to tell
    progress from repetition, `progress.moves`), its round count, and statuses a judge
    proposed for a human. Only open items are remembered: a finished or blocked item's
    memory is dropped (a human's retry or a reopening starts it afresh), so the state
    stays as small as the work in hand."""
    st = run.state
    focus = facts.focus
    if focus is not None and not facts.deferred:
        st.item_rounds[focus] = _count_round(run, facts)
        st.seen[focus] = P.remember(st.seen.get(focus, []), outcome.marks)
    led = outcome.update.ledger
    for memory in (st.seen, st.item_rounds):
        for item in [
            k for k in memory if not (led.has_item(k) and led.item(k).status in L.OPEN_STATUSES)
        ]:
            del memory[item]
    for item, (status, note) in outcome.proposals.items():
        st.proposals[item] = {"status": status, "note": note}


def focus_of(run: JudgeHost, round_no: int) -> str | None:
    """The focus item of a past round, from the run's focus log."""
    log = run.state.focus_log
    found: str | None = None
    for start, item in log:
        if int(start) > round_no:
            break
        found = item
    return found


def note_focus(run: JudgeHost, round_no: int, focus: str | None) -> None:
    """Log the focus of a round when it changes (a few entries per item, not per round)."""
    log = run.state.focus_log
    if not log or log[-1][1] != focus:
        log.append([round_no, focus])
        del log[:-2000]


async def resolve_evidence(
    run: JudgeHost,
    refs: set[str],
    staged: Sequence[ArtifactRecord],
    facts: J.RoundFacts,
    staged_ops: Sequence[OpRecord] = (),
) -> dict[str, J.Evidence]:
    """What the runtime knows of each cited ref that resolves: a succeeded op or a valid
    artifact of this task, with the round (and its focus) that produced it. `staged`
    and `staged_ops` are this round's, not yet committed: read from memory."""
    # A ref with a NUL names nothing stored (and PostgreSQL's text cannot hold one: the
    # lookup would fail as if the store were down): it stays unresolved.
    refs = {r for r in refs if "\x00" not in r}
    art_ids = {r.partition(":")[2] for r in refs if r.startswith("artifact:")}
    arts = {a.artifact_id: a for a in staged if a.artifact_id in art_ids}
    missing = art_ids - set(arts)
    if missing:
        for a in await run.store.get_artifacts(run.task_id, artifact_ids=missing):
            if a.valid:
                arts[a.artifact_id] = a
    op_ids = {r.partition(":")[2] for r in refs if r.startswith("op:")}
    op_ids |= {a.source for a in arts.values() if a.kind == "tool_output" and a.source}
    ops = {o.op_id: o for o in staged_ops if o.op_id in op_ids and o.status == "succeeded"}
    missing = op_ids - set(ops) - {o.op_id for o in staged_ops}
    if missing:
        for o in await run.store.get_ops(run.task_id, statuses={"succeeded"}, op_ids=missing):
            ops[o.op_id] = o

    def where(round_no: int) -> str | None:
        return facts.focus if round_no == facts.round else focus_of(run, round_no)

    ops = {k: o for k, o in ops.items() if not history_only(o)}  # late or compensated
    stale = await stale_reads(run.store, run.task_id, list(ops.values()), staged)
    ops = {k: o for k, o in ops.items() if k not in stale}  # read a version since changed
    known: dict[str, J.Evidence] = {}
    for op in ops.values():
        known[f"op:{op.op_id}"] = J.Evidence(
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
        known[ref] = J.Evidence(
            ref,
            round=made_by.round if made_by else None,
            focus=where(made_by.round) if made_by else None,
            tool=made_by.tool if made_by else None,
            name=art.name,
            rule_item=rule_item,
            fingerprint=f"{made_by.tool}|{made_by.args_hash}" if made_by else art.blob_hash,
        )
    return known


def await_decision(run: JudgeHost, reason: str) -> Outcome:
    """Nothing is open but not everything is finished: wait for a human's decision
    (retry an item, waive it, or abandon the task) with the partial-completion record."""
    partial = J.partial_record(run.ledger, run.state.proposals)
    blocked = ", ".join(b["id"] for b in partial["blocked"][:10])
    # The first blocked item by name: each command runs as printed.
    item = shlex.quote(str(partial["blocked"][0]["id"])) if partial["blocked"] else "ITEM"
    tid = shlex.quote(run.task_id)
    text = (
        f"{reason}"
        + (f"; blocked: {blocked}" if blocked else "")
        + f". Decide: tether retry {tid} {item} --hint 'HINT', "
        f"tether waive {tid} {item} --reason 'REASON', or "
        f"tether abandon {tid} --reason 'REASON'"
    )
    return out.waiting(
        "decision",
        text,
        why="needs_user_input",
        events=[ev.DecisionRequested(reason=text, partial=partial)],
        partial=partial,
    )


async def settle(run: JudgeHost, round_no: int) -> Outcome | None:
    """Before a round: with nothing open there is nothing to ask the model; finish
    (through the completion check) or wait for a human's decision."""
    if run.ledger.open_items():
        return None
    gaps = run.ledger.gaps()
    if gaps:
        return await_decision(run, f"{len(gaps)} of {len(run.ledger.states)} items are not done")
    if run.state.completion_failed_round == run.state.rounds:
        return None  # the check just failed: the model gets a round to mend what it found
    return await complete(run, round_no)


async def complete(run: JudgeHost, round_no: int) -> Outcome | None:
    """The completion check on a proposed `satisfied`: `satisfied` when it passes, else
    a continuation for the model (None) or, after repeated failures, a human."""
    if await deliverables.hold_delivery(run, round_no):
        return None  # a done item's deliverable broke: it is open again
    checks = await run_acceptance(run.spec, run.workspace)
    gaps = [f"acceptance {c.id} failed: {c.detail}" for c in checks if not c.passed]
    reviewer = run.models.review if run.spec.review else None
    if run.spec.review and reviewer is None:
        reviewer = run.models.judge or run.models.actor
    events: list[ev.Event] = []
    reopen: tuple[str, ...] = ()
    if not gaps and reviewer is not None:
        arts = [
            {"artifact_id": a.artifact_id, "name": a.name, "kind": a.kind, "size": a.size}
            for a in (await run.store.get_artifacts(run.task_id))[-50:]
            if a.valid
        ]
        req = review_request(run.spec, run.ledger, checks, arts, run.task_id)
        try:
            resp = await run.call_model(reviewer, req)
        except errors.ModelError as exc:
            await run.model_failed("review", reviewer, exc)
            raise
        events.append(await run.record_call("review", reviewer, req, resp, round_no))
        review = parse_review(resp.text)
        if not review.passed:
            gaps += list(review.gaps) or ["the reviewer did not accept the work"]
            # A human's waiver is not the reviewer's to undo.
            reopen = tuple(
                r
                for r in review.reopen
                if run.ledger.has_item(r) and run.ledger.item(r).status != "waived"
            )
    passed = not gaps
    events.append(
        ev.CompletionChecked(
            passed=passed,
            results=[c.to_dict() for c in checks],
            reviewer=reviewer.name if reviewer else None,
            gaps=gaps,
        )
    )
    if passed and run.ledger.gaps():
        # Defence in depth: no path reaches delivery with an unfinished item.
        return await_decision(run, f"{len(run.ledger.gaps())} items are not done")
    if passed:
        waived = run.ledger.waivers()
        why = "completion check passed" + (f"; waived: {', '.join(waived)}" if waived else "")
        stop = "delivered_with_waivers" if waived else "delivered"
        return out.finished("satisfied", stop, why, events=events)
    run.state.completion_failures += 1
    failures = run.state.completion_failures
    run.state.completion_failed_round = run.state.rounds
    ledger = run.ledger
    for r in reopen:
        ledger = L.reopen(ledger, r, "reviewer: redo").ledger
    if ledger.version != run.ledger.version:
        events.append(ev.LedgerUpdated(version=ledger.version, diff=[], cause="review"))
    if failures >= 3 or (not ledger.open_items() and failures >= 2):
        await run.commit(events, ledger=ledger)
        return out.waiting(
            "human",
            f"the completion check failed {failures} times: "
            + "; ".join(gaps)[:800]
            + f"; answer with: {hints.tell(run.task_id)}",
            why="needs_user_input",
        )
    text = continuation_message(ledger, "the completion check failed", gaps)
    events.append(
        ev.JudgeVerdict(
            round=round_no,
            decision="continue",
            reason="completion check failed",
            done=ledger.progress().done,
            total=ledger.progress().total,
            percent=ledger.progress().percent,
            continuation=text,
            judges=["completion"],
        )
    )
    await run.commit(events, ledger=ledger)
    run.ctx.append(Entry("continuation", [Message("user", text)], round_no))
    return None


class _RuleEnv:
    """What the rule judge may look at, with evidence artifacts it creates."""

    def __init__(self, run: JudgeHost, pending: PendingRound | None = None) -> None:
        self.run = run
        self.pending = pending
        self.workspace = run.workspace
        self.preexisting = run.preexisting
        self.artifacts: list[ArtifactRecord] = []
        self.events: list[ev.Event] = []

    async def _index(self) -> OpIndex:
        """The run's op index, brought up to date with what was committed since."""
        idx = index_of(self.run, self.run.spec)
        await idx.sync(self.run.store, self.run.task_id, self.run.state.last_seq)
        return idx

    async def latest_op(
        self, item_id: str, rule: OpRule, taken: Collection[str]
    ) -> OpRecord | None:
        """The newest succeeded op (arguments as sent) that `rule` matches, not `taken`:
        this round's first (still pending), then the stored ones. With the round
        pending, a late result of an older task version, an op since compensated
        (`ops.history_only`) or a read of a source version since changed proves nothing."""
        idx = await self._index()
        if self.pending is None:
            return next(
                (o for o in idx.newest_first(item_id) if f"op:{o.op_id}" not in taken), None
            )
        mine = {o.op_id for o in self.pending.ops}
        fresh = [
            o
            for o in self.pending.ops
            if o.status == "succeeded" and o.tool == rule.tool and args_match(rule.args, o.args)
        ]
        stored = (o for o in idx.newest_first(item_id) if o.op_id not in mine)
        for op in (*reversed(fresh), *stored):
            if f"op:{op.op_id}" in taken or history_only(op):
                continue
            if not await self._fresh_read(idx, op, stored=op.op_id not in mine):
                continue
            return op
        return None

    async def _fresh_read(self, idx: OpIndex, op: OpRecord, *, stored: bool) -> bool:
        """Not a read of a source version since changed (`stale_reads`); a stored read
        found fresh is asked again only after an artifact is invalidated."""
        if snapshot_read_by(op) is None or (stored and op.op_id in idx.fresh_reads):
            return True
        if await stale_reads(self.run.store, self.run.task_id, [op]):
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
            stored = await self.run.store.get_ops(
                self.run.task_id, statuses={"succeeded"}, op_ids=ask
            )
            found = [o for o in stored if o.op_id not in mine] + list(mine.values())
            found = [o for o in found if o.status == "succeeded" and not history_only(o)]
            stale = await stale_reads(self.run.store, self.run.task_id, found)
            found_now = {o.op_id for o in found} - stale
        idx.holding = held | found_now
        return held | found_now

    async def valid_artifacts(self) -> list[ArtifactRecord]:
        stored = [a for a in await self.run.store.get_artifacts(self.run.task_id) if a.valid]
        return stored + (list(self.pending.artifacts) if self.pending else [])

    async def record_evidence(
        self, item_id: str, text: str, meta: Mapping[str, Any] | None = None
    ) -> str:
        ref = self.run.stage_blob(text.encode("utf-8"))
        self.run.state.evidence_count += 1
        n = self.run.state.evidence_count
        art = ArtifactRecord(
            artifact_id=f"{self.run.task_id}.ev{n}",
            task_id=self.run.task_id,
            kind="evidence",
            name=item_id,
            blob_hash=ref,
            size=len(text),
            source="rule judge",
            task_version=self.run.task.version,
            meta=dict(meta or {}),
        )
        self.artifacts.append(art)
        self.events.append(
            ev.ArtifactStored(
                artifact_id=art.artifact_id,
                kind="evidence",
                name=item_id,
                blob=ref,
                size=len(text),
                source="rule judge",
            )
        )
        return f"artifact:{art.artifact_id}"
