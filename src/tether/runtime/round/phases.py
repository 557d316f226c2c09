"""One round of a task, as six named phases.

    read → assemble → decide → act → write back → verify

- **read**: the checks between rounds (`checks.control`: lease, stop, cancel, goal
  change), settling a ledger with nothing open (`completion.settle`: finish or ask a
  human), the limits and the budget (`checks.limits`).
- **assemble**: the focus item (started in the ledger), compaction when the context
  would outgrow its budget, and the model request.
- **decide**: the one model call, journaled (its request by reference, its response in
  its event) and *staged*: it reaches the store with the round's first commit.
- **act**: every tool call through permissions, approvals, breakers and the op journal
  (`ops.OpRunner`); a round with side effects commits its decision with its op intents
  before anything is sent.
- **write back**: the round's results as one pending write (`PendingRound`).
- **verify**: NEED_HELP, the rule judge and an LLM judge, the audit and the verdict,
  committed with the results (`verdicts.judge_round`).

Each phase is a function of what it uses, and the round returns what happens next:
None to go on, or an `Outcome` (waiting, suspended, finished, interrupted, cancelled)
that the engine hands to `outcome.apply`, the one place a status changes. Two ends
arise deep inside a phase and travel as a `Stop` exception to this module's entry
points, where they become returned outcomes like the others: a model call that failed
after its retries, and a tool call that must pause the round (`ops.Pause`: an
approval, a long backoff, an op in doubt).

Transactions: a round with side effects commits twice (decision + op intents; results
+ verdict + ledger), a third time only when an LLM judge is called in between, so that
results are never held in memory across a model call; a read-only round commits once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tether import errors, failpoints, ledger_view, telemetry
from tether import events as ev
from tether import ledger as L
from tether.models.base import Message, ModelRequest, ModelResponse
from tether.runtime import hints
from tether.runtime.judge import facts as J
from tether.runtime.judge import verdicts
from tether.runtime.ops.runner import OpOutcome, OpRunner
from tether.runtime.round import checks, history
from tether.runtime.round import progress as P
from tether.runtime.round.compaction import compact_context
from tether.runtime.round.round_calls import admit_calls
from tether.runtime.run import outcome as out
from tether.runtime.run.outcome import Outcome, Stop
from tether.runtime.run.ports import Commit, PendingRound

if TYPE_CHECKING:
    from tether.clock import Clock
    from tether.runtime.run.ports import Journal, RoundHost, RunConfig, TaskView

#: The actor asks for a human with a line that starts NEED_HELP: (as its prompt says;
#: a dash or the line's end may stand for the colon, markdown emphasis around it). The
#: words quoted inside a sentence are not a request, nor a line that muses on it
#: ("NEED_HELP? No: ..."), nor one in the model's reasoning (`_THINKING`).
_NEED_HELP = re.compile(r"^[ \t>*_-]*NEED_HELP[*_]*[ \t]*(?:[:\uff1a\u2013\u2014-]|$)", re.M)
#: A reasoning block some models write into their answer's text, its tag opening a line
#: (closed, or open to the end of a cut-off answer): thinking aloud, not words to a
#: person. A tag named in a sentence opens no block.
_THINKING = re.compile(r"^[ \t]*<(think|thinking|reasoning)>.*?(?:</\1>|\Z)", re.S | re.I | re.M)


def asks_for_help(text: str) -> str | None:
    """The words from the model's NEED_HELP line on (at most 500 characters), or None
    when its answer asks no person for help."""
    if "NEED_HELP" not in text:  # most answers: no scan
        return None
    if "<" in text:
        text = _THINKING.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    asks = _NEED_HELP.search(text)
    return None if asks is None else text[asks.start() :][:500].rstrip()


#: The most failure keys a task keeps (`track_failures`).
_FAILURE_KEYS = 200


# --- entry points ---------------------------------------------------------------------


async def run_round(run: RoundHost) -> Outcome | None:
    """One round from the start: None to go on, else how the run ends."""
    with telemetry.span("tether.round", {"tether.task_id": run.journal.task_id}) as span:
        try:
            outcome = await _round(run, span)
        except Stop as stop_:
            outcome = stop_.outcome
        if outcome is not None:
            # How the round ended the run (waiting, suspended, satisfied, ...).
            telemetry.set_attributes(span, {"tether.stopped": outcome.status})
        return outcome


async def _round(run: RoundHost, span: telemetry.SpanLike) -> Outcome | None:
    # A phase's span has no attributes: with nobody to tell (no listener, no tracer:
    # most runs) it does nothing, and one look a round saves making four.
    quiet = telemetry.quiet()
    with telemetry.NO_SPAN if quiet else telemetry.span("tether.phase.read"):
        stop = await read(run)
    if stop is not None:
        return stop
    round_no = run.view.state.rounds + 1
    with telemetry.NO_SPAN if quiet else telemetry.span("tether.phase.assemble"):
        focus, request = await assemble(run, round_no)
    telemetry.set_attributes(span, {"tether.round": round_no, "tether.item": focus})
    with telemetry.NO_SPAN if quiet else telemetry.span("tether.phase.decide"):
        response = await decide(run, round_no, focus, request)
    # Act, write back and verify.
    with telemetry.NO_SPAN if quiet else telemetry.span("tether.phase.act"):
        return await _finish(run, round_no, focus, response, resumed=False)


async def finish_interrupted(run: RoundHost) -> Outcome | None:
    """A round a crash (or a pause) interrupted: finish it from its recorded decision,
    or judge it from its saved facts when only the verdict was missing."""
    try:
        state = run.view.state
        inflight = state.inflight
        if inflight:
            response = ModelResponse.from_dict(await _decision(run, inflight))
            stop = await _finish(
                run, int(inflight["round"]), inflight.get("focus"), response, resumed=True
            )
            if stop is not None:
                return stop
        if state.unjudged:
            facts = verdicts.facts_from_dict(state.unjudged)
            return await verdicts.judge_round(run.parts, facts, text="")
        return None
    except Stop as stop_:
        return stop_.outcome


async def _decision(run: RoundHost, inflight: Mapping[str, Any]) -> Any:
    """The stored response of an interrupted round's act call: its `model.called` event
    (committed with the round's first commit, as `inflight` was), read from the events
    after `inflight["after"]` (the few of the round: no scan of the log); the blob an
    older tether's `inflight` names."""
    if "response_blob" in inflight:
        return await run.journal.get_json(inflight["response_blob"])
    call_id = inflight["call"]
    store, task_id = run.ops_host.store, run.journal.task_id
    for after in dict.fromkeys((int(inflight.get("after", 0)), 0)):
        for e in await store.read_events(task_id, after=after, types={"model.called"}):
            if e.data.get("call_id") == call_id:
                doc = history.called_response(e.data)
                return (
                    doc if doc is not None else await run.journal.get_json(e.data["response_blob"])
                )
    raise KeyError(f"the model call {call_id} of the interrupted round is not stored")


async def _finish(
    run: RoundHost, round_no: int, focus: str | None, response: ModelResponse, *, resumed: bool
) -> Outcome | None:
    """The phases after the decision: act, write back, verify."""
    runner = OpRunner(run.ops_host)
    outcomes = await act(run.journal, runner, round_no, response, resumed=resumed)
    pending = write_back(run.view, round_no, focus, response, outcomes, runner.pending_events)
    return await verify(run, round_no, focus, response, outcomes, pending)


# --- the phases -----------------------------------------------------------------------


async def read(run: RoundHost) -> Outcome | None:
    """Phase 1: may the round run? With nothing open no model is called: finishing (or
    asking a human) is not held back by a limit on rounds or spend."""
    # Loaded with the first round, not before a resume's first event.
    from tether.runtime.judge.completion import settle

    stop = await checks.control(run)
    if stop is None:
        stop = await settle(run.parts, run.view.state.rounds + 1)
    if stop is None:
        stop = await checks.limits(run.view, run.journal)
    return stop


async def assemble(run: RoundHost, round_no: int) -> tuple[str | None, ModelRequest]:
    """Phase 2: the focus item (started in the staged ledger), compaction if the context
    would not fit, and the request."""
    ledger = run.view.ledger
    focus = ledger.next_item()
    verdicts.note_focus(run.parts, round_no, focus)
    started: list[ev.Event] = []
    if focus is not None and ledger.item(focus).status == "pending":
        up = L.start(ledger, focus)
        ledger = up.ledger
        started.append(
            ev.LedgerUpdated(version=ledger.version, diff=up.diff.to_list(), cause="runtime")
        )
    budget = run.view.spec.context.input_budget_tokens
    if run.ctx.estimate() > budget:
        # Compaction commits on its own: the focus item's start is staged after it.
        await compact_context(run, budget)
    request = run.ctx.request(
        "act", task_id=run.journal.task_id, ledger=ledger_view.LedgerData(ledger, focus)
    )
    run.journal.staged_events = started
    run.journal.staged_ledger = ledger
    return focus, request


async def decide(
    run: RoundHost, round_no: int, focus: str | None, request: ModelRequest
) -> ModelResponse:
    """Phase 3: the one model call, journaled and staged.

    The decision (the focus item's start, the call's record, the response) goes into
    the store with the round's first commit — with its op intents when the round has
    side effects, or with the results when it is read-only. Until then `inflight`
    (staged too) says how to finish the round from the recorded response: which call,
    found among the events after the last one committed before it (`_decision`).
    """
    calls, journal, state = run.calls, run.journal, run.view.state
    actor = calls.models.actor
    estimate = run.ctx.raw_estimate()
    failpoints.hit("before_model_call")
    try:
        response = await calls.call_model(actor, request)
    except errors.ModelError as exc:
        await calls.model_failed("act", actor, exc)
        raise
    failpoints.hit("after_model_response")
    limit = run.view.spec.limits.max_calls_per_round
    response, admitted = admit_calls(response, limit, round_no, run.ops_host.known_tools)
    if response.usage.input_tokens:
        run.ctx.calibrator.observe(estimate, response.usage.input_tokens)
        state.token_ratio = run.ctx.calibrator.ratio
    called = await calls.record_call("act", actor, request, response, round_no)
    ms = (journal.staged_ledger or run.view.ledger).current_milestone()
    if ms is not None:
        state.milestone_rounds[ms] = state.milestone_rounds.get(ms, 0) + 1
    state.inflight = {
        "round": round_no,
        "focus": focus,
        "call": called.call_id,
        "after": state.last_seq,
    }
    journal.staged_events = [
        ev.RoundStarted(round=round_no, turn=state.turns or 1, item=focus),
        *journal.staged_events,
        called,
        *admitted,
    ]
    return response


async def act(
    journal: Journal,
    runner: OpRunner,
    round_no: int,
    response: ModelResponse,
    *,
    resumed: bool,
) -> list[OpOutcome]:
    """Phase 4: the round's tool calls. Side effects ahead: the decision and its op
    intents are durable first (a resumed round's intents already are)."""
    if not resumed:
        intents = await runner.plan(round_no, response)
        if intents:
            await journal.write(Commit(runner.intent_events(intents), ops=[r for _, r in intents]))
            for _ in intents:
                failpoints.hit("after_op_intent")
    return await runner.act(round_no, response, resumed=resumed)


def write_back(
    view: TaskView,
    round_no: int,
    focus: str | None,
    response: ModelResponse,
    outcomes: list[OpOutcome],
    extra: Sequence[ev.Event] = (),
) -> PendingRound:
    """Phase 5: the round's results as one write (committed with the verdict, or before
    an LLM judge's call). Every message is stored once: the assistant's is the response
    in the round's `model.called` event, a tool's is its op's journaled result."""
    failpoints.hit("after_op_result")
    assistant = Message(
        "assistant", response.text, tool_calls=response.tool_calls, reasoning=response.reasoning
    )
    tool_msgs = [
        Message("tool", o.content, tool_call_id=o.call.id, name=o.call.name) for o in outcomes
    ]
    doc = history.round_doc(
        [
            (
                m,
                o.op_id if o.record is not None else None,
                str((o.record.result or {}).get("content")) if o.record else None,
            )
            for m, o in zip(tool_msgs, outcomes, strict=True)
        ],
        response.tool_calls,
    )
    ops = []
    arts = []
    events: list[ev.Event] = list(extra)
    for o in outcomes:
        if not o.replayed:
            events.extend(o.result_events())
            if o.artifact is not None:
                arts.append(o.artifact)
            if o.record is not None:
                ops.append(o.record)
        # A replayed op's result was committed before a crash or a pause: commit it.
        events.append(ev.OpCommitted(op_id=o.op_id, round=round_no))
    events.append(
        ev.RoundCommitted(
            round=round_no,
            turn=view.state.turns or 1,
            ops=len(outcomes),
            text=response.text[:200],
            messages=doc,
            item=focus,
        )
    )
    view.state.rounds = round_no
    view.state.inflight = None
    return PendingRound(
        round_no,
        events,
        ops,
        arts,
        [assistant, *tool_msgs],
        track_failures(view, outcomes, focus),
        len(outcomes),
    )


async def verify(
    run: RoundHost,
    round_no: int,
    focus: str | None,
    response: ModelResponse,
    outcomes: Sequence[OpOutcome],
    pending: PendingRound,
) -> Outcome | None:
    """Phase 6: NEED_HELP, then the judges and the audited verdict, committed with the
    round's results; a round whose every call met an open breaker waits for the
    service."""
    facts = round_facts(round_no, focus, response, outcomes, pending)
    parts = run.parts
    help_text = asks_for_help(response.text)
    if help_text is not None:
        await parts.commit_round(pending)
        return out.waiting(
            "human",
            f"{help_text}; answer with: {hints.tell(run.journal.task_id)}",
            why="needs_user_input",
        )
    rest: PendingRound | None = pending
    if run.calls.models.judge is not None:
        # Results are durable before the judge's model call; a crash in between is
        # judged after recovery from the saved facts.
        run.view.state.unjudged = verdicts.facts_to_dict(facts)
        await parts.commit_round(pending)
        rest = None
    stop = await verdicts.judge_round(parts, facts, response.text, rest)
    if stop is None and facts.deferred:
        held = [o for o in outcomes if o.retry_at is not None]
        stop = await wait_for_services(run.view.clock, run.config, held)
    return stop


# --- helpers of the phases ------------------------------------------------------------


def round_facts(
    round_no: int,
    focus: str | None,
    response: ModelResponse,
    outcomes: Sequence[OpOutcome],
    pending: PendingRound,
) -> J.RoundFacts:
    """What the judges see of a round."""
    return J.RoundFacts(
        round=round_no,
        focus=focus,
        text=response.text,
        non_convergent=pending.non_convergent,
        blocked=next((o.blocks for o in outcomes if o.blocks), None),
        cut_off=not response.tool_calls and response.cut_off,
        ops=tuple(
            J.OpSummary(
                o.op_id,
                o.tool,
                dict(o.call.arguments or {}),
                "deferred" if o.retry_at is not None else o.status,
                o.summary,
                o.error,
                o.artifact.artifact_id if o.artifact else None,
                o.error_class,
                o.args_hash,
                P.result_hash(o.content, o.artifact.blob_hash if o.artifact else None)
                if o.status == "succeeded"
                else P.failure_hash(
                    o.error_class,
                    o.error,
                    P.call_words(o.call.arguments, o.call.raw_arguments),
                    o.call.name,
                ),
                o.effect,
                o.volatile,
                o.shifting,
            )
            for o in outcomes
        ),
    )


async def wait_for_services(
    clock: Clock, config: RunConfig, held: Sequence[OpOutcome]
) -> Outcome | None:
    """Every call of the round met an open breaker or a service that stays down
    (`errors.ServiceDown`): rather than spend model calls (and the item's attempts) on a
    service known to be down, wait for its next chance — in the worker if short, else
    parked as `waiting` until then."""
    now = clock.now()
    until = min((o.retry_at for o in held if o.retry_at), default=now + 1.0)
    delay = until - now
    if delay <= 0:
        return None
    if delay <= config.inline_wait_max:
        await clock.sleep(delay)
        return None
    services = sorted({o.tool for o in held})
    # Why each was held back (an open breaker, or a server that stays down and the tail
    # of its stderr), so `status` tells it.
    why = "; ".join(dict.fromkeys(o.error for o in held if o.error))[:800]
    return out.waiting(
        "external",
        f"{', '.join(services)}: the service is unavailable until {until:.0f}"
        f"{f' ({why})' if why else ''}; the task continues then",
        why="service unavailable",
        until=until,
    )


def track_failures(view: TaskView, outcomes: Sequence[OpOutcome], focus: str | None) -> str | None:
    """Count identical failures: the same item, tool and arguments, failing the same way
    (error class and normalised message, `progress.failure_key`), so a converging series
    ("3 failed", "2 failed", "1 failed") is not a loop. The first key that reaches the
    limit makes the round non-convergent. Keys carry the item so a human's retry of it
    starts the count afresh."""
    failed = [o for o in outcomes if o.status == "failed"]
    if not failed and len(view.state.failure_keys) <= _FAILURE_KEYS:
        return None  # nothing to count, and the map is small already
    counts = dict(view.state.failure_keys)
    hit = None
    limit = view.spec.limits.same_failure_repeats
    # A failure after a change of the item's world (another edit, then the same test
    # failing the same way) starts a count of its own (`progress.failure_key`).
    seen = view.state.seen.get(focus, ()) if failed and focus is not None else ()
    changed = P.changes(seen) if seen else 0
    # After the item started work of its own (a build, a job), a workspace read that
    # fails (its output not there yet), or a read of a tool whose answers change by
    # themselves ("job 7 not ready"), is waiting too (`progress.started`).
    working = bool(seen) and P.started(P.seen_set(seen))
    for o in outcomes:
        if o.status == "succeeded" and o.effect != "read":
            changed += 1  # a change made earlier in this round
            working = working or P.own_work(o.tool, o.effect, o.status)
        if o.status != "failed" or o.replayed or o.retry_at is not None or o.volatile:
            continue  # a volatile read's "not now" is waiting, not a failure repeated
        if working and (o.shifting or o.tool in P.WORKSPACE_READS):
            continue
        key = P.failure_key(focus, o.tool, o.args_hash, o.error_class, o.error, changed)
        counts[key] = int(counts.get(key, 0)) + 1
        if counts[key] >= limit and hit is None:
            hit = (
                f"{o.tool} failed {counts[key]} times the same way with the same arguments "
                f"({o.error_class}: {(o.error or '')[:120]})"
            )
    # Keep the map small: only the most recent keys matter.
    view.state.failure_keys = dict(list(counts.items())[-_FAILURE_KEYS:])
    return hit


__all__ = [
    "act",
    "assemble",
    "decide",
    "finish_interrupted",
    "read",
    "round_facts",
    "run_round",
    "track_failures",
    "verify",
    "wait_for_services",
    "write_back",
]
