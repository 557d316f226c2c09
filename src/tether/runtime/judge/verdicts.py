"""After a round: the rule judge, the LLM judge, the audit, the verdict committed, and
the decision acted on (the completion check, a human's decision: `completion`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tether import errors, failpoints
from tether import events as ev
from tether import ledger as L
from tether._by_object import keep
from tether.models.base import Message
from tether.runtime import hints
from tether.runtime.judge import audit as A
from tether.runtime.judge import facts as F
from tether.runtime.judge import rules
from tether.runtime.judge.rules.evidence import StoreRuleEnv, note_focus, resolve_evidence
from tether.runtime.judge.rules.scope import rule_scope
from tether.runtime.recovery import rewrites
from tether.runtime.round import history
from tether.runtime.round import progress as P
from tether.runtime.round.context import Entry, continuation_message
from tether.runtime.run import outcome as out
from tether.runtime.run.outcome import Outcome
from tether.spec import TaskSpec

__all__ = [
    "facts_from_dict",
    "facts_to_dict",
    "judge_round",
    "note_focus",
    "resolve_evidence",
]

if TYPE_CHECKING:
    from tether.runtime.run.ports import JudgeHost, PendingRound
    from tether.store.base import ArtifactRecord


def facts_from_dict(d: Mapping[str, Any]) -> F.RoundFacts:
    """The round facts saved before a crash (`RunState.unjudged`), for judging it after."""
    return F.RoundFacts(
        round=int(d["round"]),
        focus=d.get("focus"),
        text=str(d.get("text", "")),
        non_convergent=d.get("non_convergent"),
        blocked=d.get("blocked"),
        cut_off=bool(d.get("cut_off")),
        ops=tuple(
            F.OpSummary(
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
                str(o.get("effect") or "read"),
                bool(o.get("volatile")),
                bool(o.get("shifting")),
            )
            for o in d.get("ops", [])
        ),
    )


def facts_to_dict(facts: F.RoundFacts) -> dict[str, Any]:
    """The round facts as saved with the results (`RunState.unjudged`) when an LLM judge
    is called after the results are committed."""
    return {
        "round": facts.round,
        "focus": facts.focus,
        "text": facts.text[:2000],
        "non_convergent": facts.non_convergent,
        "blocked": facts.blocked,
        "cut_off": facts.cut_off,
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
                "effect": o.effect,
                "volatile": o.volatile,
                "shifting": o.shifting,
            }
            for o in facts.ops
        ],
    }


#: Told after a words-only answer the output token limit cut off (`RoundFacts.cut_off`).
CUT_OFF_NOTE = (
    "Your last answer was cut off by the output token limit before you ended it: what "
    "came after the cut was lost. Put long content into files with tool calls, a part at "
    "a time, rather than into your reply."
)


async def judge_round(
    run: JudgeHost, facts: F.RoundFacts, text: str, pending: PendingRound | None = None
) -> Outcome | None:
    """Rule judge, LLM judge, audit; commit the verdict (with the round's results when
    they are still `pending`); act on the decision: the outcome that ends the run, or
    None to go on."""
    view = run.view
    spec, ledger = view.spec, view.ledger
    # The rule judge's evidence artifacts and events (none when it has nothing to check).
    artifacts: list[ArtifactRecord] = []
    extra_events: list[ev.Event] = []
    if rules.idle(spec, ledger):
        # No rule to check, nothing to undo (most contracts): its verdict is known
        # without its environment or the round's rule scope.
        verdicts = [rules.IDLE]
    else:
        env = StoreRuleEnv(run, pending)
        only = rule_scope(spec, ledger, facts.focus, ((o.tool, o.args) for o in facts.ops))
        verdicts = [await rules.rule_verdict(spec, ledger, env, only)]
        artifacts = env.artifacts
        extra_events.extend(env.events)
    judge_model = run.calls.models.judge
    judges = ["rules"]
    if judge_model is not None:
        # Loaded here: a task without a judge model (and a resume, before its first event)
        # never needs the LLM judge's models and prompts.
        from tether.runtime.judge import llm

        judges.append(judge_model.name)
        retry_note = None
        verdict = None
        for _attempt in range(2):
            req = llm.judge_request(
                run.view.spec,
                run.view.ledger,
                facts,
                user_words=run.user_words,
                task_id=run.journal.task_id,
                retry_note=retry_note,
            )
            try:
                resp = await run.calls.call_model(judge_model, req)
            except errors.ModelError as exc:
                await run.journal.commit(extra_events, artifacts=artifacts)  # results are in
                await run.calls.model_failed("judge", judge_model, exc)
                raise
            extra_events.append(
                await run.calls.record_call("judge", judge_model, req, resp, facts.round)
            )
            try:
                verdict = llm.parse_verdict(resp.text)
                break
            except llm.VerdictParseError as exc:
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
    known: Mapping[str, F.Evidence] = {}
    if cited:  # most rounds cite nothing: nothing to look up
        staged = [*artifacts, *(pending.artifacts if pending else ())]
        known = await resolve_evidence(run, cited, staged, facts, pending.ops if pending else ())
    rounds = _count_round(run, facts)
    outcome = A.audit(
        # A read-only round's focus start is still staged (it commits with the verdict):
        # the verdict builds on it, or the log would say started and the ledger pending.
        run.journal.staged_ledger or view.ledger,
        verdicts,
        evidence=known.get,
        facts=facts,
        limits=spec.limits,
        policies=_policies(spec),
        seen=view.state.seen,
        rounds=rounds,
        total=view.state.item_focus_total.get(facts.focus or "", 0) + 1 if rounds else 0,
        compactions=view.state.compactions,
    )
    _remember(run, facts, outcome, rounds)
    new = outcome.update.ledger
    p = new.progress()
    extra_events.extend(outcome.warnings)  # the audit's warnings are events already
    continuation = ""
    diff = outcome.update.diff
    if outcome.decision == "continue":
        changed = list(dict.fromkeys(diff.status_changes())) if diff.changes else []
        continuation = _continuation(new, outcome.reason, changed, cut_off=facts.cut_off)
    # A continuation the history holds already (the last one, often the same round
    # after round) is stored once: the verdict says so instead of repeating it.
    same = bool(continuation) and continuation == history.last_continuation(run.ctx.entries)
    verdict_event = ev.JudgeVerdict(
        round=facts.round,
        decision=outcome.decision,
        reason=outcome.reason,
        done=p.done,
        total=p.total,
        percent=p.percent,
        changes=diff.to_list() if diff.changes else [],
        judges=judges,
        continuation="" if same else continuation,
        same_continuation=same,
        item=facts.focus if facts.focus is not None and not facts.deferred else None,
        marks=list(outcome.marks),
    )
    events: list[ev.Event] = [*extra_events, verdict_event]
    if diff.changes:
        events.append(ev.LedgerUpdated(version=new.version, diff=diff.to_list()))
    run.view.state.unjudged = None
    # Accepted files the round's own tools may have rewritten (a formatter, a
    # generator): what they left is the task's, not a change from outside.
    await rewrites.note(run, facts.round, facts.ops)
    failpoints.hit("before_ledger_write")
    if pending is not None:
        await run.commit_round(pending, events=events, ledger=new, artifacts=artifacts)
    else:
        await run.journal.commit(events, ledger=new, artifacts=artifacts)
    if continuation:
        run.ctx.append(Entry("continuation", [Message("user", continuation)], facts.round))
    run.journal.snapshot(f"round {facts.round}: {outcome.decision} ({p.done}/{p.total} done)")
    if outcome.decision in ("satisfied", "need_decision"):
        # The completion check (its reviewer's model) is loaded when a round gets there.
        from tether.runtime.judge.completion import await_decision, complete

        if outcome.decision == "satisfied":
            return await complete(run, facts.round)
        return await_decision(run, outcome.reason)
    if outcome.decision == "need_user":
        return out.waiting(
            "human",
            f"{outcome.reason or 'the judge asks for a human'}; answer with: "
            f"{hints.tell(run.journal.task_id)}",
            why="needs_user_input",
        )
    return None


#: The item policies of each live contract a run judges with, by object id: built once
#: per contract object (a run keeps its spec for its whole turn), not once per round,
#: and kept while it lives (a worker judges many runs in turn: a bounded cache was
#: rebuilt at every judging once more runs than it held took turns).
_POLICY_CACHE: dict[int, Mapping[str, F.ItemPolicy]] = {}


def _policies(spec: TaskSpec) -> Mapping[str, F.ItemPolicy]:
    hit = _POLICY_CACHE.get(id(spec))
    if hit is not None:
        return hit
    return keep(_POLICY_CACHE, spec, F.ItemPolicy.of_spec(spec))


#: The last continuation built per live ledger object, by id (a ledger is immutable: the
#: same object, reason and changes give the same message): most rounds change nothing
#: in the ledger, and the message (the whole ledger rendered) was built again each round.
_CONTINUATIONS: dict[int, tuple[str, tuple[str, ...], str]] = {}


def _continuation(
    ledger: L.Ledger, reason: str, changed: list[str], *, cut_off: bool = False
) -> str:
    """`continuation_message(ledger, reason, changed=changed)`, kept per ledger object;
    after an answer the output token limit cut off, `CUT_OFF_NOTE` first."""
    if cut_off:
        return f"{CUT_OFF_NOTE}\n\n{_continuation(ledger, reason, changed)}"
    key = tuple(changed)
    hit = _CONTINUATIONS.get(id(ledger))
    if hit is not None and hit[0] == reason and hit[1] == key:
        return hit[2]
    text = continuation_message(ledger, reason, changed=changed)
    keep(_CONTINUATIONS, ledger, (reason, key, text))
    return text


def _count_round(run: JudgeHost, facts: F.RoundFacts) -> int:
    """How many rounds the round's focus item has had, this one included (a round whose
    every call an open breaker held back is not one)."""
    focus = facts.focus
    if focus is None or facts.deferred:
        return 0
    return run.view.state.item_rounds.get(focus, 0) + 1


def _remember(run: JudgeHost, facts: F.RoundFacts, outcome: F.AuditOutcome, rounds: int) -> None:
    """Keep what the next audits need: what the round did for its focus item (to tell
    progress from repetition, `progress.moves`), its round count, and statuses a judge
    proposed for a human. Only open items are remembered: a finished or blocked item's
    memory is dropped (a human's retry or a reopening starts it afresh), so the state
    stays as small as the work in hand. `rounds`: the focus item's (`_count_round`)."""
    st = run.view.state
    focus = facts.focus
    if focus is not None and not facts.deferred:
        # A round that finished another item is that item's: the focus's count of
        # rounds (`limits.max_rounds_per_item`) starts again (`audit.finished_other`).
        other = F.finished_other(focus, outcome.accepted)
        st.item_rounds[focus] = 1 if other else rounds
        total = st.item_focus_total.get(focus, 0) + 1
        st.item_focus_total[focus] = max(0, total - F.SIDE_ROUNDS) if other else total
        st.seen[focus] = P.remember(st.seen.get(focus, []), outcome.marks)
    led = outcome.update.ledger
    for memory in (st.seen, st.item_rounds, st.item_focus_total):
        for k in memory:
            if not (led.has_item(k) and led.item(k).status in L.OPEN_STATUSES):
                break
        else:
            continue  # every item remembered is open (most rounds): nothing to drop
        for item in [
            k for k in memory if not (led.has_item(k) and led.item(k).status in L.OPEN_STATUSES)
        ]:
            del memory[item]
    for item, (status, note) in outcome.proposals.items():
        st.proposals[item] = {"status": status, "note": note}
