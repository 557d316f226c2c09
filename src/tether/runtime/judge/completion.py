"""The completion check: a proposed `satisfied` must pass the contract's acceptance
checks and, when configured, an independent reviewer model; with `review: human`, a
person then signs off on the execution report before delivery.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tether import _imports, errors
from tether import events as ev
from tether import ledger as L
from tether.errors import UserError
from tether.models.base import Message, ModelRequest
from tether.runtime import hints
from tether.runtime.judge.execution import execution_report
from tether.runtime.judge.rules.commands import run_command
from tether.runtime.recovery import deliverables
from tether.runtime.round.context import Entry, continuation_message
from tether.runtime.run import outcome as out
from tether.runtime.run.outcome import Outcome
from tether.spec import CallableCheck, CommandCheck, TaskSpec

if TYPE_CHECKING:
    from tether.runtime.run.ports import JudgeHost


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one acceptance criterion."""

    id: str
    passed: bool
    detail: str = ""
    checked: bool = True

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "id": self.id,
            "passed": self.passed,
            "detail": self.detail,
            "checked": self.checked,
        }


def _call_check(target: str, workspace: Path | None) -> tuple[bool, str]:
    try:
        fn = _imports.load_ref(target, what="check", context=f"check {target}")
    except UserError as exc:
        return False, str(exc)
    try:
        out = fn(workspace)
    except Exception as exc:  # a failing check is a result, not a crash
        return False, f"check {target} raised {type(exc).__name__}: {exc}"
    if isinstance(out, tuple) and len(out) == 2:
        return bool(out[0]), str(out[1])
    if isinstance(out, str):
        return (False, out) if out else (True, "")
    return bool(out), "" if out else f"check {target} returned {out!r}"


async def run_acceptance(spec: TaskSpec, workspace: Path | None) -> list[CheckResult]:
    """Run every acceptance criterion that has a machine check."""
    results = []
    for crit in spec.acceptance:
        check = crit.check
        if check is None:
            results.append(CheckResult(crit.id, True, "no machine check", checked=False))
        elif isinstance(check, CommandCheck):
            code, out = await run_command(check.command, workspace, check.timeout)
            ok = code == check.exit_code
            detail = f"exit {code}" + ("" if ok else f" (expected {check.exit_code}): {out[-500:]}")
            results.append(CheckResult(crit.id, ok, detail))
        elif isinstance(check, CallableCheck):
            ok, detail = await asyncio.to_thread(_call_check, check.callable, workspace)
            results.append(CheckResult(crit.id, ok, detail))
    return results


REVIEW_INSTRUCTIONS = """\
You are an independent reviewer. The agent claims the task below is complete. Read the
contract, the ledger with its evidence, and the final artifacts. Decide whether the
work meets the objective and acceptance criteria.

Answer with one JSON object only:
{"passed": true|false, "gaps": ["what is missing or wrong"], "reopen": ["item ids to redo"]}
"""


class _Review(BaseModel):
    model_config = ConfigDict(extra="ignore")
    passed: bool
    gaps: list[str] = Field(default_factory=list)
    reopen: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class Review:
    """The reviewer's answer."""

    passed: bool
    gaps: tuple[str, ...] = ()
    reopen: tuple[str, ...] = ()


def review_request(
    spec: TaskSpec,
    ledger: L.Ledger,
    checks: Sequence[CheckResult],
    artifacts: Sequence[dict[str, Any]],
    task_id: str | None = None,
) -> ModelRequest:
    """The `review` request."""
    payload = {
        "objective": spec.objective,
        "acceptance": [{"id": a.id, "description": a.description} for a in spec.acceptance],
        "ledger": ledger.to_dict(),
        "acceptance_checks": [c.to_dict() for c in checks],
        "artifacts": list(artifacts),
    }
    from tether.runtime.judge.llm import json_request  # only when a review is asked for

    return json_request(
        "review", REVIEW_INSTRUCTIONS, payload, max_output_tokens=1024, task_id=task_id
    )


def parse_review(text: str) -> Review:
    """Parse the reviewer's JSON; an unreadable review counts as a failed one."""
    body = text.strip()
    start, end = body.find("{"), body.rfind("}")
    try:
        raw = json.loads(body[start : end + 1]) if start != -1 and end > start else None
        r = _Review.model_validate(raw)
    except (json.JSONDecodeError, ValidationError):
        return Review(False, ("the reviewer's answer could not be read",))
    return Review(r.passed, tuple(r.gaps), tuple(r.reopen))


# --- ending a task ------------------------------------------------------------------------


def await_decision(run: JudgeHost, reason: str) -> Outcome:
    """Nothing is open but not everything is finished: wait for a human's decision
    (retry an item, waive it, or abandon the task) with the partial-completion record."""
    partial = partial_record(run.view.ledger, run.view.state.proposals)
    blocked = ", ".join(b["id"] for b in partial["blocked"][:10])
    # The first blocked item by name: each command runs as printed.
    item = shlex.quote(str(partial["blocked"][0]["id"])) if partial["blocked"] else "ITEM"
    tid = shlex.quote(run.journal.task_id)
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
    if run.view.ledger.has_open():
        return None
    gaps = run.view.ledger.gaps()
    if gaps:
        return await_decision(
            run, f"{len(gaps)} of {len(run.view.ledger.states)} items are not done"
        )
    if run.view.state.completion_failed_round == run.view.state.rounds:
        return None  # the check just failed: the model gets a round to mend what it found
    return await complete(run, round_no)


async def complete(run: JudgeHost, round_no: int) -> Outcome | None:
    """The completion check on a proposed `satisfied`: `satisfied` when it passes, else
    a continuation for the model (None) or, after repeated failures, a human."""
    if await deliverables.hold_delivery(run, round_no):
        return None  # a done item's deliverable broke: it is open again
    signed = signed_off(run)
    if signed is not None:
        return _deliver(run, f"signed off by {signed}", [])
    checks = await run_acceptance(run.view.spec, run.view.workspace)
    gaps = [f"acceptance {c.id} failed: {c.detail}" for c in checks if not c.passed]
    reviewer = run.calls.models.review if run.view.spec.review.by_model else None
    if run.view.spec.review.by_model and reviewer is None:
        reviewer = run.calls.models.judge or run.calls.models.actor
    events: list[ev.Event] = []
    reopen: tuple[str, ...] = ()
    if not gaps and reviewer is not None:
        arts = [
            {"artifact_id": a.artifact_id, "name": a.name, "kind": a.kind, "size": a.size}
            for a in (await run.store.get_artifacts(run.journal.task_id))[-50:]
            if a.valid
        ]
        req = review_request(run.view.spec, run.view.ledger, checks, arts, run.journal.task_id)
        try:
            resp = await run.calls.call_model(reviewer, req)
        except errors.ModelError as exc:
            await run.calls.model_failed("review", reviewer, exc)
            raise
        events.append(await run.calls.record_call("review", reviewer, req, resp, round_no))
        review = parse_review(resp.text)
        if not review.passed:
            gaps += list(review.gaps) or ["the reviewer did not accept the work"]
            # A human's waiver is not the reviewer's to undo.
            reopen = tuple(
                r
                for r in review.reopen
                if run.view.ledger.has_item(r) and run.view.ledger.item(r).status != "waived"
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
    if passed and run.view.ledger.gaps():
        # Defence in depth: no path reaches delivery with an unfinished item.
        return await_decision(run, f"{len(run.view.ledger.gaps())} items are not done")
    if passed and run.view.spec.review.human:
        return await await_signoff(run, checks, events)
    if passed:
        return _deliver(run, "completion check passed", events)
    run.view.state.completion_failures += 1
    failures = run.view.state.completion_failures
    run.view.state.completion_failed_round = run.view.state.rounds
    ledger = run.view.ledger
    diff: list[dict[str, Any]] = []
    for r in reopen:
        update = L.reopen(ledger, r, "reviewer: redo")
        ledger, diff = update.ledger, diff + update.diff.to_list()
    if ledger.version != run.view.ledger.version:
        events.append(ev.LedgerUpdated(version=ledger.version, diff=diff, cause="review"))
    if failures >= 3 or (not ledger.has_open() and failures >= 2):
        await run.journal.commit(events, ledger=ledger)
        return out.waiting(
            "human",
            f"the completion check failed {failures} times: "
            + "; ".join(gaps)[:800]
            + f"; answer with: {hints.tell(run.journal.task_id)}",
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
    await run.journal.commit(events, ledger=ledger)
    run.ctx.append(Entry("continuation", [Message("user", text)], round_no))
    return None


def _deliver(run: JudgeHost, why: str, events: list[ev.Event]) -> Outcome:
    waived = run.view.ledger.waivers()
    why += f"; waived: {', '.join(waived)}" if waived else ""
    stop = "delivered_with_waivers" if waived else "delivered"
    return out.finished("satisfied", stop, why, events=events)


def signed_off(run: JudgeHost) -> str | None:
    """Who signed off on the ledger as it is now (`review: human`), or None: a sign-off
    is for the work the person saw; any change of the ledger since asks again."""
    mark = run.view.state.signed_off
    if not run.view.spec.review.human or not isinstance(mark, dict):
        return None
    if mark.get("ledger_version") != run.view.ledger.version:
        return None
    return str(mark.get("by") or "user")


async def await_signoff(
    run: JudgeHost, checks: Sequence[CheckResult], events: list[ev.Event]
) -> Outcome:
    """The completion check passed and the contract wants a person's sign-off: wait
    with the execution report (`tether approve TASK` or `tether reject TASK --hint`)."""
    stored = await run.store.read_events(run.journal.task_id)
    report = execution_report(run.view.spec, run.view.ledger, stored, [c.to_dict() for c in checks])
    tid = shlex.quote(run.journal.task_id)
    text = (
        "the completion check passed; a person signs off before delivery "
        f"(execution report: tether report {tid} --execution). Decide: tether approve {tid}, "
        f"or tether reject {tid} --hint 'WHAT TO REDO' --reopen ITEM"
    )
    partial = partial_record(run.view.ledger, run.view.state.proposals)
    events.append(ev.DecisionRequested(reason=text, partial=partial, report=report))
    return out.waiting(
        "decision", text, why="needs_user_input", events=events, signoff=True, report=report
    )


def partial_record(ledger: L.Ledger, proposals: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What was done and what was not, for a human deciding how a task ends."""
    rec: dict[str, Any] = {
        "done": [],
        "blocked": [],
        "waived": [],
        "skipped": [],
        "remaining": [],
        # A proposal about an item that is finished since is history, not a question.
        "proposed": {
            k: v
            for k, v in (proposals or {}).items()
            if ledger.has_item(k) and not ledger.is_finished(k)
        },
    }
    for d, s in ledger.items():
        entry: dict[str, Any] = {"id": d.id, "title": d.title}
        if s.status == "done":
            rec["done"].append({**entry, "evidence": list(s.evidence)})
        elif s.status == "blocked":
            rec["blocked"].append(
                {**entry, "reason": s.note, "attempts": s.attempts, "evidence": list(s.evidence)}
            )
        elif s.status in ("waived", "skipped"):
            rec[s.status].append({**entry, "reason": s.note, "optional": d.optional})
        else:
            rec["remaining"].append({**entry, "status": s.status, **_waits(ledger, d.id)})
    return rec


def _waits(ledger: L.Ledger, item_id: str) -> dict[str, Any]:
    """What an unfinished item waits for: predecessors not finished, and the stuck ones
    (blocked, skipped) that hold it until a human decides about them."""
    out: dict[str, Any] = {}
    waiting = ledger.waiting_for(item_id)
    if waiting:
        out["waiting_for"] = waiting
    held = ledger.held_by(item_id)
    if held:
        out["held_by"] = held
        out["reason"] = (
            f"waits for {', '.join(held)}, which "
            + ("is" if len(held) == 1 else "are")
            + " not finished and not open"
        )
    return out
