"""The LLM judge: its instructions, its request for a round, and its verdict parsed."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tether import ledger as L
from tether import ledger_view
from tether.models.base import Message, ModelRequest, Purpose
from tether.runtime.judge.facts import Decision, ProposedChange, RoundFacts, Verdict
from tether.spec import TaskSpec

JUDGE_INSTRUCTIONS = """\
You are the judge of a long-running agent task. After each round you read the goal
ledger, the round's op journal (tool calls with their status and results) and the
agent's words, and you decide which ledger items changed.

Rules (the runtime audits every verdict against them; what breaks them is refused):
- Mark an item done only when a succeeded op or an artifact proves it, and cite that
  proof in the same change's "evidence" by its evidence_ref ("op:..." or
  "artifact:..."). Evidence attached earlier does not carry an item to done.
- Evidence must belong to the item: its own done_when rule's result, an op or artifact
  made in a round whose focus_item was that item, or one the contract links to it.
  One piece of evidence proves one item, unless the contract allows sharing.
- The agent's own claims ("all done") are not evidence.
- In-progress evidence is optional: a succeeded op or artifact of this round that is
  work toward the focus_item but does not prove it done yet (a draft it wrote, a source
  it read, a claim recorded toward a count) may be attached to the focus_item with
  status "in_progress"; it stays with the item and is shown to the human. Attach only
  this round's work for the focus_item, never earlier evidence or another item's.
- You do not need to attach anything for an item to count as moving: the runtime
  measures progress itself from the op journal (a call it has not seen for the item, a
  result that changed, a failure that changed), and a repeat is no progress whatever
  is attached to it.
- You may only propose "blocked" or "skipped" (with a note): the runtime blocks items
  that make no progress, and only a human (or the contract, for optional items) skips
  or waives them. Your proposal is shown to the human; it changes no status.
- decision is one of: continue, satisfied (every item is done with its own evidence),
  abandon (propose giving up; a human decides), need_user (a human must decide).
  The runtime decides when the task is finished, whatever you answer.

Answer with one JSON object and nothing else:
{"changes": [{"item": "<id>", "status": "done|in_progress|pending|blocked|skipped",
  "evidence": ["op:..."], "note": "..."}], "decision": "continue", "reason": "..."}
"""


class _ChangeModel(BaseModel):
    model_config = ConfigDict(extra="ignore")
    item: str
    status: L.ItemStatus | None = None
    evidence: list[str] = Field(default_factory=list)
    note: str | None = None


class _VerdictModel(BaseModel):
    model_config = ConfigDict(extra="ignore")
    changes: list[_ChangeModel] = Field(default_factory=list)
    decision: Decision
    reason: str = ""


class VerdictParseError(ValueError):
    """The judge's answer is not a valid verdict."""


def parse_verdict(text: str) -> Verdict:
    """Parse a judge's JSON answer (a fenced block is accepted)."""
    body = text.strip()
    fence = re.search(r"```(?:json)?\s*(\{.*\})\s*```", body, re.S)
    if fence:
        body = fence.group(1)
    elif not body.startswith("{"):
        start, end = body.find("{"), body.rfind("}")
        if start == -1 or end <= start:
            raise VerdictParseError("no JSON object in the judge's answer")
        body = body[start : end + 1]
    try:
        raw = json.loads(body)
    except json.JSONDecodeError as exc:
        raise VerdictParseError(f"the judge's answer is not valid JSON: {exc}") from None
    try:
        m = _VerdictModel.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise VerdictParseError(f"bad verdict at {where}: {first['msg']}") from None
    return Verdict(
        decision=m.decision,
        changes=tuple(
            ProposedChange(c.item, c.status, tuple(c.evidence), c.note) for c in m.changes
        ),
        reason=m.reason,
        source="llm",
    )


def compact_ledger(ledger: L.Ledger) -> dict[str, Any]:
    """The ledger as the judge sees it: open and blocked items in full, done ones by id.

    A long ledger (`ledger_view.paged`) is shown in part, so that the judge's request
    does not grow with the checklist: the first `JUDGE_ITEMS` items not done, in order
    (the focus among them, as it is the first open one, or named apart), and the count
    of those left out; done items by count only."""
    if ledger_view.paged(ledger):
        return _partial_ledger(ledger)
    items = []
    done = []
    for d, s in ledger.items():
        if s.status == "done":
            done.append(d.id)
        else:
            items.append({"id": d.id, "title": d.title, "status": s.status, "note": s.note})
    return {
        "version": ledger.version,
        "progress": ledger.progress().to_dict(),
        "items": items,
        "done": done,
        "next": ledger.next_item(),
    }


#: Items not done that a long ledger shows the judge (see `compact_ledger`).
JUDGE_ITEMS = 25


def _partial_ledger(ledger: L.Ledger) -> dict[str, Any]:
    nxt = ledger.next_item()
    items: list[dict[str, Any]] = []
    left_out = done = 0
    for d, s in ledger.items():
        if s.status == "done":
            done += 1
        elif len(items) < JUDGE_ITEMS or d.id == nxt:
            items.append({"id": d.id, "title": d.title, "status": s.status, "note": s.note})
        else:
            left_out += 1
    return {
        "version": ledger.version,
        "progress": ledger.progress().to_dict(),
        "items": items,
        "items_left_out": left_out,
        "done": f"{done} items (ids left out of this long ledger)",
        "next": nxt,
    }


def json_request(
    purpose: Purpose,
    system: str,
    payload: Mapping[str, Any],
    *,
    max_output_tokens: int,
    task_id: str | None,
    follow_up: Sequence[Message] = (),
    **more: Any,
) -> ModelRequest:
    """A question to a judging model (the judge, the reviewer, a summary's audit):
    `payload` as one JSON message (then `follow_up`), one JSON object asked back."""
    return ModelRequest(
        purpose=purpose,
        system=system,
        messages=(
            Message("user", json.dumps(payload, ensure_ascii=False, sort_keys=True)),
            *follow_up,
        ),
        max_output_tokens=max_output_tokens,
        json_output=True,
        task_id=task_id,
        **more,
    )


def judge_request(
    spec: TaskSpec,
    ledger: L.Ledger,
    facts: RoundFacts,
    *,
    user_words: Sequence[str] = (),
    task_id: str | None = None,
    retry_note: str | None = None,
) -> ModelRequest:
    """The `judge` request for one round."""
    payload = {
        "objective": spec.objective,
        "user_messages": list(user_words),
        "ledger": compact_ledger(ledger),
        "round": facts.round,
        "focus_item": facts.focus,
        "agent_text": facts.text[:4000],
        "op_journal": [o.to_dict() for o in facts.ops],
    }
    retry = (
        Message(
            "user",
            f"Your previous answer could not be used ({retry_note}). "
            "Answer again with one JSON object only.",
        ),
    )
    return json_request(
        "judge",
        JUDGE_INSTRUCTIONS,
        payload,
        max_output_tokens=1024,
        task_id=task_id,
        follow_up=retry if retry_note else (),
        ledger=ledger_view.LedgerData(ledger, ledger.next_item()),
    )
