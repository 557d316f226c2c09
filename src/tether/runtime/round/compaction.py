"""Compaction: fold older rounds into a summary when the history outgrows the budget.

The compressor (a `compact` model call) is given the current ledger and told never to
turn pending work into done work. Whatever it writes, the ledger is not touched: the
summary enters the history as a user message that defers to the ledger, and the system
prompt is re-rendered with the current ledger at its tail (a new cache epoch). A summary
that claims completion the ledger does not record, in any wording (read by `claims`),
raises an audit warning, and the runtime appends a note to it: the claim was not
accepted, and here is the ledger. If the compressor fails, a mechanical summary is used
so the task never dies of compaction.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tether import errors, failpoints, ledger_view, tokens
from tether import events as ev
from tether.ledger import Ledger
from tether.models.base import Message, ModelRequest
from tether.runtime import hints
from tether.runtime.round import history
from tether.runtime.round.claims import (
    FINISHED_STATUSES,
    ClaimFindings,
    completion_claims,
    may_claim,
    parse_summary_audit,
    summary_audit_request,
)
from tether.runtime.round.context import SUMMARY_PREFIX, Context, Entry, render_system
from tether.runtime.run import outcome as out
from tether.runtime.run.outcome import Stop
from tether.runtime.run.ports import Commit
from tether.store.base import ArtifactRecord

if TYPE_CHECKING:
    from tether.runtime.run.ports import CompactHost

COMPACT_INSTRUCTIONS = """\
You compress the history of a long-running agent task so that it fits the context
window. Write a concise summary of what was tried, what was learned, and what the tool
results showed, keeping ids, paths and numbers that later work needs.

The GOAL LEDGER below is the audited truth about progress. Never describe an item as
done unless the ledger says it is done; pending work stays pending. Do not invent
results.
"""


async def _read_claims(
    run: CompactHost, summary: str, fallback: bool, events: list[ev.Event]
) -> tuple[ClaimFindings, str]:
    """What the summary claims beyond the ledger, and who found it ("rules", "judge").

    A mechanical summary is the runtime's own and claims nothing. The rules read the
    summary first; a judge model, when configured, may find a claim they missed."""
    if fallback:
        return ClaimFindings(), "rules"
    findings = completion_claims(summary, run.view.ledger)
    if findings:
        return findings, "rules"
    return await _second_reading(run, summary, events), "judge"


async def _second_reading(run: CompactHost, summary: str, events: list[ev.Event]) -> ClaimFindings:
    """Ask the judge model what `summary` claims, when one is configured and the summary
    speaks of completion: what it finds adds to the rules' reading, never removes."""
    judge = run.calls.models.judge
    if judge is None or not may_claim(summary, run.view.ledger):
        return ClaimFindings()
    request = summary_audit_request(summary, run.view.ledger, run.journal.task_id)
    try:
        response = await run.calls.call_model(judge, request)
    except errors.ModelError as exc:
        # The rules' reading is the floor. The failure is journaled, so that a replay
        # meets it at the same point (and goes on the same way).
        events.append(
            ev.ModelFailed(
                call_id=f"{run.journal.task_id}.judge.summary.failed",
                purpose="judge",
                model=judge.name,
                error=str(exc),
                transient=exc.transient,
                attempts=exc.attempts,
            )
        )
        return ClaimFindings()
    events.append(await run.calls.record_call("judge", judge, request, response, None))
    return parse_summary_audit(response.text, run.view.ledger)


def _rejection_note(findings: ClaimFindings, ledger: Ledger, *, short: bool = False) -> str:
    """The runtime's note after a summary whose completion claim was refused."""
    head = (
        f"\n\n----------\nNOTE FROM THE RUNTIME: the summary above claims "
        f"{findings.describe()}; that claim was not accepted."
    )
    if short:
        return head + " The goal ledger in the system prompt is the truth."
    return head + " The goal ledger is the truth:\n" + ledger_view.render(ledger, compact=True)


def _mechanical_summary(entries: list[Entry]) -> str:
    lines = ["(mechanical summary: the compressor was unavailable)"]
    for e in entries:
        for m in e.messages:
            if m.role == "assistant" and m.tool_calls:
                calls = ", ".join(f"{c.name}({c.raw_arguments[:80]})" for c in m.tool_calls)
                lines.append(f"round {e.round}: called {calls}")
            elif m.role == "tool" and m.content.startswith("ERROR"):
                lines.append(f"round {e.round}: {m.content[:120]}")
    return "\n".join(lines[-60:])


def latest_round_entries(entries: list[Entry]) -> int:
    """How many entries, from the end, make up the latest round: its `round` entry and
    all that follows it (its continuation, a turn's opening message, a user's words).
    0 when there is no round (the history holds only a summary and turn messages)."""
    for n in range(len(entries) - 1, -1, -1):
        if entries[n].kind == "round":
            return len(entries) - n
    return 0


def _trim_results(entry: Entry) -> None:
    """Cut the long tool results of one entry to their first 300 characters."""
    entry.messages = [
        Message(m.role, m.content[:300] + "\n[trimmed]", m.tool_calls, m.tool_call_id, m.name)
        if m.role == "tool" and len(m.content) > 300
        else m
        for m in entry.messages
    ]
    entry.tokens = sum(tokens.estimate_message(m) for m in entry.messages)


#: How much of a long message of the latest round the model still sees when nothing
#: else can give way (its text, each long string argument of its calls, each tool
#: result): the first cut, then shorter ones while the context still does not fit (a
#: round of many calls with long arguments).
_LAST_RESORT_CHARS = (2_000, 500, 120)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "\n[trimmed]"


def _cut_value(value: Any, limit: int) -> Any:
    """An argument as the model sees it again: a long string cut, and any other value
    whose JSON is long replaced by its cut JSON text (a provider that is sent the
    arguments object, not their text, must not get the whole value back)."""
    if isinstance(value, str):
        return _cut(value, limit)
    if isinstance(value, (bool, int, float)) or value is None:
        return value
    text = json.dumps(value, ensure_ascii=False, default=str)
    return value if len(text) <= limit else _cut(text, limit)


def _trim_messages(entry: Entry, limit: int) -> None:
    """Cut every long part of one entry's messages to `limit` characters: tool results
    (to 300 at most, as `_trim_results` does), and the model's own text and arguments
    (`_cut_value`; the call's record in the journal is untouched: only what the model sees
    again is shortened)."""
    _trim_results(entry)
    out = []
    for m in entry.messages:
        calls = tuple(
            dataclasses.replace(
                c,
                arguments={k: _cut_value(v, limit) for k, v in c.arguments.items()},
                raw_arguments=_cut(c.raw_arguments, limit),
            )
            if c.arguments is not None
            else dataclasses.replace(c, raw_arguments=_cut(c.raw_arguments, limit))
            for c in m.tool_calls
        )
        out.append(Message(m.role, _cut(m.content, limit), calls, m.tool_call_id, m.name))
    entry.messages = out
    entry.tokens = sum(tokens.estimate_message(m) for m in entry.messages)


def _fit(
    ctx: Context,
    budget: int,
    kept: str,
    note: str,
    findings: ClaimFindings,
    ledger: Ledger,
    older: list[Entry],
) -> None:
    """Make the compacted context fit `budget` if it can (the caller checks): the
    summary entry is `ctx.entries[0]`, with the runtime's `note` at its end; rounds
    folded into it are appended to `older`."""
    # Still too big: trim long tool outputs, then fold the oldest kept rounds into the
    # summary one by one, then shorten the summary; give up clearly only when the system
    # prompt and tools alone do not fit. The runtime's note always stays at the end.
    # The latest round is left for last: its results are trimmed only when nothing else
    # can give way, and it is never folded into the summary.
    pinned = min(latest_round_entries(ctx.entries), len(ctx.entries) - 1)
    if ctx.estimate() > budget:
        for e in ctx.entries[1 : len(ctx.entries) - pinned]:
            _trim_results(e)
        ctx.recount()  # the entries changed in place
    while ctx.estimate() > budget and len(ctx.entries) > 1 + pinned:
        dropped = ctx.drop(1)
        older.append(dropped)
        folded = _mechanical_summary([dropped]).splitlines()[1:]
        kept += ("\n" + "\n".join(folded)) if folded else ""
        head = ctx.entries[0]
        head.messages = [Message("user", SUMMARY_PREFIX + kept + note)]
        head.tokens = tokens.estimate_message(head.messages[0])
        ctx.recount()
    # Then the summary is shortened (its note kept whole); then, as a last resort, the
    # latest round's long results are trimmed and the summary (and its note) shortened
    # again.
    for cut in (None, *_LAST_RESORT_CHARS):
        last_resort = cut is not None
        if ctx.estimate() <= budget:
            break
        if cut is not None:
            for e in ctx.entries[1:]:
                _trim_messages(e, cut)
            ctx.recount()
        head = ctx.entries[0]
        room = max(0, budget - (ctx.estimate() - head.tokens)) * 3
        if last_resort and note and room <= len(SUMMARY_PREFIX) + len(note) + 40:
            note = _rejection_note(findings, ledger, short=True)
        if last_resort and note and room <= len(SUMMARY_PREFIX) + len(note) + 40:
            note = ""
        if room > len(SUMMARY_PREFIX) + len(note) + 40:
            keep = room - 20 - len(SUMMARY_PREFIX) - len(note)
            head.messages = [Message("user", SUMMARY_PREFIX + kept[:keep] + "\n[cut]" + note)]
            head.tokens = tokens.estimate_message(head.messages[0])
            ctx.recount()


def _too_small(
    run: CompactHost, needed: int, message: str, events: Sequence[ev.Event] = ()
) -> Stop:
    """The task waits for a person: no compaction can make its requests fit the budget
    (its system prompt and tools alone take the room, or the provider counts its
    requests far above the estimate). Nothing of the round is lost (the compaction's
    own calls are journaled with the wait); an edit of the budget or the tools queues
    it again."""
    raise_to = max(needed, run.view.spec.context.input_budget_tokens) * 2
    command = hints.set_field(run.journal.task_id, "context.input_budget_tokens", raise_to)
    ratio = run.ctx.calibrator.ratio
    if ratio > 1.05:
        message += (
            f"; the provider counts about {ratio:.2f} tokens for every token estimated, "
            "and the figures are scaled by that"
        )
    return Stop(
        out.waiting(
            "human",
            f"{message}. Allow fewer or smaller tools in the contract, or raise the "
            f"budget: {command}",
            why="context_budget",
            events=events,
        )
    )


def _fixed_parts(ctx: Context) -> str:
    """What takes the room no compaction frees, for a budget error: the system prompt's
    and the tools' estimated tokens, and the largest tools (a server's tool with a huge
    description or schema is the usual culprit)."""
    scale = ctx.calibrator.scale
    sizes = sorted(
        ((scale(tokens.estimate_tools((t,))), t.name) for t in ctx.tools), key=lambda p: -p[0]
    )
    total = sum(n for n, _ in sizes)
    parts = f"system prompt ~{scale(tokens.estimate_text(ctx.system))}, {len(sizes)} tools ~{total}"
    if sizes:
        parts += "; largest: " + ", ".join(f"{name[:80]} ~{n}" for n, name in sizes[:3])
    return parts + " tokens"


def _request_ref(
    run: CompactHost, request: ModelRequest, older: list[Entry], room_chars: int
) -> dict[str, Any] | None:
    """The compaction request by reference (`history.compact_ref`): its transcript is
    the history the store holds already (the context's entries up to the last event,
    as an act request's). None, and it is stored whole, when the folded entries are not
    the context's first ones."""
    entries = run.ctx.entries
    if len(older) > len(entries) or any(a is not b for a, b in zip(older, entries, strict=False)):
        return None
    st = run.view.state
    return history.compact_ref(
        request,
        system_blob=run.journal.stage_blob(request.system.encode("utf-8")),
        snapshot=st.ctx_blob,
        after_seq=st.ctx_after_seq,
        upto_seq=st.last_seq,
        fold=len(older),
        room_chars=room_chars,
    )


#: The share of the budget that compaction keeps as verbatim recent rounds (the latest
#: round is kept whatever its size). It sets how far below the budget a compaction
#: brings the request, hence how many rounds pass before the next one: each compaction
#: makes one request the prompt cache cannot reuse (only the tools stay), and each
#: round appends what it cannot reuse either. A quarter balances the two
#: (`benchmarks/loop_bench.py`: the unchanged-prefix share peaks between 0.25 and 0.35)
#: and sends fewer input tokens per round than a third did.
KEEP_SHARE = 0.25


async def compact_context(run: CompactHost, budget: int) -> None:
    """Compact `run.ctx` until the next request fits `budget` tokens."""
    ctx = run.ctx
    before = ctx.estimate()
    keep = int(budget * KEEP_SHARE)
    older, recent = ctx.split(keep)
    # The latest round (its calls and results, its continuation and whatever came after
    # it) is always kept verbatim, even when it alone is over `keep`: the model must see
    # what it has just done. Only older history is summarised.
    n_latest = latest_round_entries(ctx.entries)
    start = len(ctx.entries) - (n_latest or 1)
    if len(older) > start or not older:
        # The most recent round alone is over `keep`, or everything fits in it while the
        # request does not: fold all that came before the latest round.
        older, recent = ctx.entries[:start], ctx.entries[start:]
    if not older:
        raise _too_small(
            run,
            budget,
            f"the context budget of {budget} tokens is too small for this task's system "
            f"prompt and tools ({_fixed_parts(ctx)})",
        )
    ledger_text = ledger_view.render(run.view.ledger, header="GOAL LEDGER")
    system = COMPACT_INSTRUCTIONS + "\n\n" + ledger_text
    fixed = tokens.estimate_text(system) + 200
    room_chars = max(2000, (budget - fixed) * 3)
    request = ModelRequest(
        purpose="compact",
        system=system,
        messages=(Message("user", history.compact_body(older, room_chars)),),
        max_output_tokens=max(256, budget // 8),
        task_id=run.journal.task_id,
    )
    failpoints.hit("during_compaction")
    model = run.calls.models.compact or run.calls.models.actor
    events: list[ev.Event] = []
    fallback = False
    try:
        response = await run.calls.call_model(model, request)
        summary = response.text.strip()
        ref = _request_ref(run, request, older, room_chars)
        events.append(await run.calls.record_call("compact", model, request, response, None, ref))
    except errors.ModelError as exc:
        summary = _mechanical_summary(older)
        fallback = True
        events.append(
            ev.AuditWarning(code="compaction_fallback", message=f"compressor failed: {exc}")
        )
    if not summary:
        summary, fallback = _mechanical_summary(older), True
    max_chars = max(800, int(budget * 0.15) * 3)
    summary = summary[:max_chars]
    findings, by = await _read_claims(run, summary, fallback, events)
    claimed = list(findings.items)
    note = ""
    if findings:
        unfinished = [
            d.id for d, s in run.view.ledger.items() if str(s.status) not in FINISHED_STATUSES
        ]
        events.append(
            ev.AuditWarning(
                code="summary_claims_done",
                message=f"the compaction summary claims {findings.describe()}, which the "
                "ledger does not record; the claim was not accepted",
                details={
                    "items": claimed,
                    "global": findings.global_phrase,
                    "unfinished": unfinished,
                    "found_by": by,
                },
            )
        )
        # The next request must say that the claim was refused, next to the true ledger.
        note = _rejection_note(findings, run.view.ledger)
    kept = summary
    ctx.entries = [Entry("summary", [Message("user", SUMMARY_PREFIX + kept + note)]), *recent]
    # A compaction breaks the cached prefix anyway: start a new epoch with the current
    # ledger at the tail of the system prompt.
    ctx.system = render_system(run.view.spec, run.view.ledger)
    run.view.state.system_blob = run.journal.stage_blob(ctx.system.encode())
    run.view.state.system_version = run.view.task.version
    run.view.state.system_at = run.view.clock.now()
    _fit(ctx, budget, kept, note, findings, run.view.ledger, older)
    if ctx.estimate() > budget:
        raise _too_small(
            run,
            ctx.estimate(),
            f"the context budget of {budget} tokens cannot hold this task's system prompt, "
            f"tools and a summary ({ctx.estimate()} tokens needed: {_fixed_parts(ctx)})",
            events,
        )
    snapshot = {
        "entries": [
            {"kind": e.kind, "round": e.round, "messages": [m.to_dict() for m in e.messages]}
            for e in ctx.entries
        ]
    }
    blob = run.journal.stage_blob(history.pack(snapshot))
    summary_blob = run.journal.stage_blob(summary.encode())
    run.view.state.ctx_blob = blob
    run.view.state.ctx_after_seq = run.view.state.last_seq
    # The model no longer has what the rounds read: reading it again is progress
    # (`progress.moves` keys what was read by this count).
    run.view.state.compactions += 1
    upto = max((e.round or 0) for e in older) if older else 0
    events.append(
        ev.ContextCompacted(
            summary_blob=summary_blob,
            rounds_compacted=sum(1 for e in older if e.kind == "round"),
            upto_round=upto,
            tokens_before=before,
            tokens_after=ctx.estimate(),
            claimed_done=claimed,
            fallback=fallback,
        )
    )
    # The summary is an artifact too, so `search_artifacts` finds what it says after
    # later compactions have folded it away (its id is fixed by the compaction count,
    # so a compaction redone after a crash writes the same one).
    summary_art = ArtifactRecord(
        artifact_id=f"{run.journal.task_id}.summary{run.view.state.compactions}",
        task_id=run.journal.task_id,
        kind="summary",
        name=f"summary of rounds up to {upto}",
        blob_hash=summary_blob,
        size=len(summary),
        source="compaction",
        task_version=run.view.task.version,
    )
    await run.journal.write(Commit(events, artifacts=[summary_art]))
