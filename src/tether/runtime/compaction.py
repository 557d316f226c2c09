"""Compaction: fold older rounds into a summary when the history outgrows the budget.

The compressor (a `compact` model call) is given the current ledger and told never to
turn pending work into done work. Whatever it writes, the ledger is not touched: the
summary enters the history as a user message that defers to the ledger, and the system
prompt is re-rendered with the current ledger at its tail (a new cache epoch). If the
compressor fails, a mechanical summary is used so the task never dies of compaction.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from tether import errors, failpoints, tokens
from tether import events as ev
from tether.models.base import Message, ModelRequest
from tether.runtime.context import SUMMARY_PREFIX, Entry, render_system, transcript

if TYPE_CHECKING:
    from tether.runtime.engine import _TaskRun

COMPACT_INSTRUCTIONS = """\
You compress the history of a long-running agent task so that it fits the context
window. Write a concise summary of what was tried, what was learned, and what the tool
results showed, keeping ids, paths and numbers that later work needs.

The GOAL LEDGER below is the audited truth about progress. Never describe an item as
done unless the ledger says it is done; pending work stays pending. Do not invent
results.
"""


def _claimed_done(summary: str, open_items: list[str]) -> list[str]:
    hits = []
    for item in open_items:
        for line in summary.splitlines():
            if re.search(rf"(?<![\w.-]){re.escape(item)}(?![\w-])", line) and re.search(
                r"\b(done|complete[d]?|finished)\b", line, re.I
            ):
                hits.append(item)
                break
    return hits


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


async def compact_context(run: _TaskRun, budget: int) -> None:
    """Compact `run.ctx` until the next request fits `budget` tokens."""
    ctx = run.ctx
    before = ctx.estimate()
    keep = int(budget * 0.35)
    older, recent = ctx.split(keep)
    if not older:
        # Even the most recent round alone is too large: fold all but it.
        older, recent = ctx.entries[:-1], ctx.entries[-1:]
    if not older:
        raise errors.UserError(
            f"the context budget of {budget} tokens is too small for this task's system "
            "prompt and tools; raise context.input_budget_tokens in the spec"
        )
    ledger_text = run.ledger.render(header="GOAL LEDGER")
    system = COMPACT_INSTRUCTIONS + "\n\n" + ledger_text
    fixed = tokens.estimate_text(system) + 200
    room_chars = max(2000, (budget - fixed) * 3)
    prior = "\n\n".join(m.content for e in older if e.kind == "summary" for m in e.messages)
    body = ""
    if prior:
        body += "Earlier summary:\n" + prior[-room_chars // 3 :] + "\n\n"
    body += "Transcript to compress:\n" + transcript(
        [e for e in older if e.kind != "summary"], room_chars - len(body)
    )
    request = ModelRequest(
        purpose="compact",
        system=system,
        messages=(Message("user", body),),
        max_output_tokens=max(256, budget // 8),
        task_id=run.task_id,
    )
    failpoints.hit("during_compaction")
    model = run.e.models.compact or run.e.models.actor
    events: list[ev.Event] = []
    fallback = False
    try:
        response = await run.call_model(model, request)
        summary = response.text.strip()
        events.append(await run.record_call("compact", model, request, response, None))
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
    claimed = _claimed_done(summary, run.ledger.open_items())
    if claimed:
        events.append(
            ev.AuditWarning(
                code="summary_claims_done",
                message="the compaction summary calls open items done; the ledger keeps them "
                f"open: {', '.join(claimed[:10])}",
                details={"items": claimed},
            )
        )
    ctx.entries = [Entry("summary", [Message("user", SUMMARY_PREFIX + summary)]), *recent]
    # A compaction breaks the cached prefix anyway: start a new epoch with the current
    # ledger at the tail of the system prompt.
    ctx.system = render_system(run.spec, run.ledger)
    run.usage["system_blob"] = run.stage_blob(ctx.system.encode())
    run.usage["system_version"] = run.task.version
    run.usage["system_at"] = run.e.clock.now()
    # Still too big: trim long tool outputs, then fold the oldest kept rounds into the
    # summary one by one, then shorten the summary; give up clearly only when the system
    # prompt and tools alone do not fit.
    if ctx.estimate() > budget:
        for e in ctx.entries[1:]:
            e.messages = [
                Message(
                    m.role, m.content[:300] + "\n[trimmed]", m.tool_calls, m.tool_call_id, m.name
                )
                if m.role == "tool" and len(m.content) > 300
                else m
                for m in e.messages
            ]
            e.tokens = sum(tokens.estimate_message(m) for m in e.messages)
    while ctx.estimate() > budget and len(ctx.entries) > 1:
        dropped = ctx.entries.pop(1)
        older.append(dropped)
        note = _mechanical_summary([dropped]).splitlines()[1:]
        head = ctx.entries[0]
        text = head.messages[0].content + ("\n" + "\n".join(note) if note else "")
        head.messages = [Message("user", text)]
        head.tokens = tokens.estimate_message(head.messages[0])
    if ctx.estimate() > budget:
        head = ctx.entries[0]
        room = max(0, budget - (ctx.estimate() - head.tokens)) * 3
        if room > len(SUMMARY_PREFIX) + 40:
            head.messages = [Message("user", head.messages[0].content[: room - 20] + "\n[cut]")]
            head.tokens = tokens.estimate_message(head.messages[0])
    if ctx.estimate() > budget:
        raise errors.UserError(
            f"the context budget of {budget} tokens cannot hold this task's system prompt, "
            f"tools and a summary ({ctx.estimate()} tokens needed); raise "
            "context.input_budget_tokens in the spec"
        )
    snapshot = {
        "entries": [
            {"kind": e.kind, "round": e.round, "messages": [m.to_dict() for m in e.messages]}
            for e in ctx.entries
        ]
    }
    blob = run.stage_blob(json.dumps(snapshot, sort_keys=True).encode())
    summary_blob = run.stage_blob(summary.encode())
    run.usage["ctx_blob"] = blob
    run.usage["ctx_after_seq"] = int(run.usage.get("last_seq", 0))
    run.usage["compactions"] = int(run.usage.get("compactions", 0)) + 1
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
    await run.commit(events)
