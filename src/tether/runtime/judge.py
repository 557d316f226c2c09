"""The judge: after every round, what changed in the ledger and whether to go on.

Two judges compose: a *rule judge* (items' `done_when` rules over ops, artifacts, files
and commands; no model) and an *LLM judge* (the `judge` purpose, a structured verdict).
Their verdicts then pass the mechanical *audit*, a pure function: evidence must resolve
to committed ops or valid artifacts; `satisfied` with open items is refused; rounds
without progress raise the focus item's breaker and past the limit block it. The audit
is the only way a verdict reaches the ledger.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tether import ledger as L
from tether.models.base import Message, ModelRequest
from tether.spec import ArtifactRule, CommandRule, FileRule, Limits, OpRule, TaskSpec
from tether.store.base import ArtifactRecord, OpRecord

Decision = Literal["continue", "satisfied", "abandon", "need_user"]


@dataclass(frozen=True)
class ProposedChange:
    """A judge's proposal for one item."""

    item_id: str
    status: L.ItemStatus | None = None
    evidence: tuple[str, ...] = ()
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "item": self.item_id,
            "status": self.status,
            "evidence": list(self.evidence),
            "note": self.note,
        }


@dataclass(frozen=True)
class Verdict:
    """One judge's structured verdict."""

    decision: Decision
    changes: tuple[ProposedChange, ...] = ()
    reason: str = ""
    source: str = "llm"


@dataclass(frozen=True)
class OpSummary:
    """What the judges see of one op of the round."""

    op_id: str
    tool: str
    args: Mapping[str, Any]
    status: str
    summary: str = ""
    error: str | None = None
    artifact_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "op_id": self.op_id,
            "evidence_ref": f"op:{self.op_id}",
            "tool": self.tool,
            "args": dict(self.args),
            "status": self.status,
            "result": self.summary,
            "error": self.error,
            "artifact_id": self.artifact_id,
        }


@dataclass(frozen=True)
class RoundFacts:
    """The round as the judges see it."""

    round: int
    focus: str | None
    text: str
    ops: tuple[OpSummary, ...] = ()
    non_convergent: str | None = None

    @property
    def failed_ops(self) -> int:
        """How many ops failed (calls deferred by an open breaker are not failures)."""
        return sum(1 for o in self.ops if o.status not in ("succeeded", "deferred"))

    @property
    def deferred(self) -> bool:
        """True when every call of the round was held back by an open breaker: the round
        was no attempt at its item and must not count against it."""
        return bool(self.ops) and all(o.status == "deferred" for o in self.ops)


@dataclass(frozen=True)
class AuditWarning:
    """Something the audit refused or flagged."""

    code: str
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AuditOutcome:
    """The audited result: the ledger update, the decision, and warnings."""

    update: L.LedgerUpdate
    decision: Decision
    reason: str
    accepted: tuple[ProposedChange, ...]
    warnings: tuple[AuditWarning, ...]


# --- the audit (pure) -------------------------------------------------------------------


def audit(
    ledger: L.Ledger,
    verdicts: Sequence[Verdict],
    *,
    resolves: Callable[[str], bool],
    facts: RoundFacts,
    limits: Limits,
    item_limits: Mapping[str, int] | None = None,
    rule_items: frozenset[str] = frozenset(),
) -> AuditOutcome:
    """Check the verdicts against the ledger and the evidence; return what may be written.

    Rule verdicts come first and win over LLM verdicts for the same item. An item with a
    `done_when` rule (`rule_items`) becomes done only through its rule: a model cannot
    talk it into done.
    """
    warnings: list[AuditWarning] = []
    accepted: list[ProposedChange] = []
    seen: set[str] = set()
    for verdict in verdicts:
        for ch in verdict.changes:
            if not ledger.has_item(ch.item_id):
                warnings.append(
                    AuditWarning(
                        "unknown_item",
                        f"{verdict.source} judge named unknown item {ch.item_id!r}",
                        {"item": ch.item_id},
                    )
                )
                continue
            if ch.item_id in seen:
                continue
            current = ledger.item(ch.item_id)
            good = tuple(e for e in ch.evidence if resolves(e))
            bad = [e for e in ch.evidence if not resolves(e)]
            if bad:
                warnings.append(
                    AuditWarning(
                        "unresolved_evidence",
                        f"{verdict.source} judge cited evidence that does not resolve for "
                        f"{ch.item_id}: {', '.join(bad)}",
                        {"item": ch.item_id, "refs": bad},
                    )
                )
            status = ch.status
            if status == "done" and verdict.source != "rules" and ch.item_id in rule_items:
                warnings.append(
                    AuditWarning(
                        "rule_item_done_by_judge",
                        f"{verdict.source} judge marked {ch.item_id} done, but its done_when "
                        "rule decides that; refused",
                        {"item": ch.item_id},
                    )
                )
                continue
            if status == "done" and not good and not current.evidence:
                warnings.append(
                    AuditWarning(
                        "done_without_evidence",
                        f"{verdict.source} judge marked {ch.item_id} done without evidence "
                        "that resolves; refused",
                        {"item": ch.item_id},
                    )
                )
                continue
            if status == current.status and not good:
                continue
            accepted.append(ProposedChange(ch.item_id, status, good, ch.note))
            seen.add(ch.item_id)

    changes = [
        L.ItemChange(c.item_id, status=c.status, evidence=c.evidence, note=c.note) for c in accepted
    ]
    # Mechanical breaker on the focus item: no progress raises it, progress resets it.
    focus = facts.focus
    if (
        not facts.deferred
        and focus is not None
        and ledger.has_item(focus)
        and ledger.item(focus).status in L.OPEN_STATUSES
    ):
        state = ledger.item(focus)
        progressed = any(
            c.item_id == focus and (c.status not in (None, "in_progress", "pending") or c.evidence)
            for c in accepted
        )
        if progressed:
            if state.breaker:
                changes.append(L.ItemChange(focus, breaker=0))
        else:
            failed = facts.failed_ops > 0
            breaker = state.breaker + 1
            attempts = state.attempts + (1 if failed else 0)
            max_attempts = (item_limits or {}).get(focus, limits.max_attempts_per_item)
            last_error = next((o.error for o in reversed(facts.ops) if o.error), None)
            reason = None
            if facts.non_convergent:
                reason = f"non-convergent: {facts.non_convergent}"
            elif breaker >= limits.no_progress_rounds:
                reason = f"no progress in {breaker} rounds"
            elif failed and attempts >= max_attempts:
                reason = f"failed {attempts} attempts"
            if reason and last_error:
                reason += f"; last error: {last_error[:160]}"
            changes.append(
                L.ItemChange(
                    focus,
                    attempts_delta=1 if failed else 0,
                    breaker=breaker,
                    status="blocked" if reason else None,
                    note=reason if reason else None,
                )
            )
            if reason:
                warnings.append(
                    AuditWarning("item_blocked", f"{focus} blocked: {reason}", {"item": focus})
                )
    update = L.apply(ledger, changes)
    new = update.ledger

    # The decision: the runtime owns completion.
    llm = [v for v in verdicts if v.source != "rules"]
    proposed: Decision = llm[-1].decision if llm else "continue"
    reason = llm[-1].reason if llm else ""
    open_items = new.open_items()
    decision: Decision = proposed
    if proposed == "satisfied" and open_items:
        warnings.append(
            AuditWarning(
                "satisfied_with_pending",
                f"judge said satisfied but {len(open_items)} items are still open "
                f"({', '.join(open_items[:5])}{'...' if len(open_items) > 5 else ''}); refused",
                {"open": open_items},
            )
        )
        decision = "continue"
    elif facts.non_convergent and (focus is None or not ledger.has_item(focus)):
        warnings.append(
            AuditWarning("non_convergent", f"needs human judgement: {facts.non_convergent}")
        )
        decision = "need_user"
        reason = f"needs human judgement: {facts.non_convergent}"
    elif not open_items and proposed == "continue":
        decision = "satisfied"
        reason = reason or "no open items left"
    return AuditOutcome(update, decision, reason, tuple(accepted), tuple(warnings))


# --- the LLM judge ----------------------------------------------------------------------

JUDGE_INSTRUCTIONS = """\
You are the judge of a long-running agent task. After each round you read the goal
ledger, the round's op journal (tool calls with their status and results) and the
agent's words, and you decide which ledger items changed.

Rules:
- Mark an item done only when a succeeded op or an artifact in the journal proves it;
  cite it in "evidence" by its evidence_ref (e.g. "op:..." or "artifact:...").
- The agent's own claims ("all done") are not evidence.
- Mark an item blocked only with a note saying why.
- decision is one of: continue, satisfied (every item is done, blocked or skipped),
  abandon (the task cannot be done at all), need_user (a human must decide).

Answer with one JSON object and nothing else:
{"changes": [{"item": "<id>", "status": "done|blocked|skipped|in_progress|pending",
  "evidence": ["op:..."], "note": "..."}], "decision": "continue", "reason": "..."}
"""


class _ChangeModel(BaseModel):
    model_config = ConfigDict(extra="ignore")
    item: str
    status: Literal["pending", "in_progress", "done", "blocked", "skipped"] | None = None
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
    """The ledger as the judge sees it: open and blocked items in full, done ones by id."""
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
    messages = [Message("user", json.dumps(payload, ensure_ascii=False, sort_keys=True))]
    if retry_note:
        messages.append(
            Message(
                "user",
                f"Your previous answer could not be used ({retry_note}). "
                "Answer again with one JSON object only.",
            )
        )
    return ModelRequest(
        purpose="judge",
        system=JUDGE_INSTRUCTIONS,
        messages=tuple(messages),
        max_output_tokens=1024,
        json_output=True,
        task_id=task_id,
    )


# --- the rule judge ---------------------------------------------------------------------


class RuleEnv(Protocol):
    """What the rule judge may look at."""

    workspace: Path | None
    #: Hashes of files that existed before the task (see `FileRule.fresh`).
    preexisting: dict[str, str]

    async def succeeded_ops(self, tools: Sequence[str] = ()) -> list[OpRecord]:
        """Committed ops that succeeded (of these tools, if given)."""
        ...

    async def valid_artifacts(self) -> list[ArtifactRecord]:
        """Valid artifacts of the task."""
        ...

    async def record_evidence(self, item_id: str, text: str) -> str:
        """Store an evidence artifact; return its ref (`artifact:<id>`)."""
        ...


def _args_match(want: Mapping[str, Any], have: Mapping[str, Any]) -> bool:
    return all(k in have and have[k] == v for k, v in want.items())


async def _run_command(command: str, cwd: Path | None, timeout: float) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_shell(
        command,
        cwd=str(cwd) if cwd else None,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return -1, f"timed out after {timeout}s"
    return proc.returncode if proc.returncode is not None else -1, out.decode(errors="replace")


async def rule_verdict(spec: TaskSpec, ledger: L.Ledger, env: RuleEnv) -> Verdict:
    """Check open items' `done_when` rules; propose `done` with evidence for those met."""
    changes: list[ProposedChange] = []
    ops: list[OpRecord] | None = None
    arts: list[ArtifactRecord] | None = None
    rule_tools = sorted(
        {
            i.done_when.tool
            for i in spec.items
            if isinstance(i.done_when, OpRule)
            and ledger.has_item(i.id)
            and ledger.item(i.id).status in L.OPEN_STATUSES
        }
    )
    for item in spec.items:
        rule = item.done_when
        if rule is None or not ledger.has_item(item.id):
            continue
        if ledger.item(item.id).status not in L.OPEN_STATUSES:
            continue
        if isinstance(rule, OpRule):
            ops = ops if ops is not None else await env.succeeded_ops(rule_tools)
            hit = next(
                (
                    o
                    for o in reversed(ops)
                    if o.tool == rule.tool and _args_match(rule.args, o.args)
                ),
                None,
            )
            if hit:
                changes.append(ProposedChange(item.id, "done", (f"op:{hit.op_id}",), "rule: op"))
        elif isinstance(rule, ArtifactRule):
            arts = arts if arts is not None else await env.valid_artifacts()
            found = next(
                (
                    a
                    for a in reversed(arts)
                    if a.name == rule.name
                    and (rule.artifact_kind is None or a.kind == rule.artifact_kind)
                ),
                None,
            )
            if found:
                changes.append(
                    ProposedChange(
                        item.id, "done", (f"artifact:{found.artifact_id}",), "rule: artifact"
                    )
                )
        elif isinstance(rule, FileRule):
            if env.workspace is None:
                continue
            path = (env.workspace / rule.path).resolve()
            if not path.is_relative_to(env.workspace.resolve()) or not path.is_file():
                continue
            try:
                content = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            if rule.contains is not None and rule.contains not in content:
                continue
            import hashlib

            try:
                full = hashlib.sha256(path.read_bytes()).hexdigest()
            except OSError:
                continue
            if rule.fresh and env.preexisting.get(rule.path) == full:
                continue  # the same file was there before the task started
            digest = full[:16]
            ref = await env.record_evidence(
                item.id, f"file {rule.path} exists ({len(content)} chars, sha256 {digest})"
            )
            changes.append(ProposedChange(item.id, "done", (ref,), f"rule: file {rule.path}"))
        elif isinstance(rule, CommandRule):
            code, out = await _run_command(rule.command, env.workspace, rule.timeout)
            if code == rule.exit_code:
                ref = await env.record_evidence(
                    item.id, f"command `{rule.command}` exited {code}\n{out[-2000:]}"
                )
                changes.append(ProposedChange(item.id, "done", (ref,), "rule: command"))
    return Verdict("continue", tuple(changes), "", source="rules")
