"""The completion check: a proposed `satisfied` must pass the contract's acceptance
checks and, when configured, an independent reviewer model.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tether import _imports
from tether import ledger as L
from tether.errors import UserError
from tether.models.base import Message, ModelRequest
from tether.runtime.judge.judges import _run_command
from tether.spec import CallableCheck, CommandCheck, TaskSpec


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
            code, out = await _run_command(check.command, workspace, check.timeout)
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
    return ModelRequest(
        purpose="review",
        system=REVIEW_INSTRUCTIONS,
        messages=(Message("user", json.dumps(payload, ensure_ascii=False, sort_keys=True)),),
        max_output_tokens=1024,
        json_output=True,
        task_id=task_id,
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
