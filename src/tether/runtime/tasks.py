"""Creating tasks from specs, reading their status, and cancelling them."""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tether import events as ev
from tether import ledger as L
from tether import lifecycle
from tether.runtime.state import RunState
from tether.spec import FileRule, TaskSpec
from tether.store.base import Store, TaskPatch, TaskRecord


def new_task_id() -> str:
    """A short, sortable, unique task id."""
    return f"t{int(time.time()):x}{secrets.token_hex(3)}"


def ledger_from_spec(spec: TaskSpec) -> L.Ledger:
    """A fresh ledger whose skeleton is the spec's objective, acceptance and items."""
    return L.from_spec(
        spec.objective,
        [(i.id, i.title, i.milestone, i.optional) for i in spec.items],
        acceptance=[(a.id, a.description) for a in spec.acceptance],
        milestones=[(m.id, m.title) for m in spec.milestones],
    )


async def create_task(
    store: Store,
    spec: TaskSpec,
    *,
    task_id: str | None = None,
    workspace: str | Path | None = None,
) -> TaskRecord:
    """Store a new queued task with its ledger; returns the task record."""
    tid = task_id or new_task_id()
    ws = workspace if workspace is not None else spec.workspace
    ws_str = str(Path(ws).resolve()) if ws is not None else None
    ledger = ledger_from_spec(spec)
    preexisting = _preexisting(spec, Path(ws_str)) if ws_str else {}
    return await store.create_task(
        task_id=tid,
        name=spec.name,
        spec=spec.model_dump(mode="json"),
        ledger=ledger,
        workspace=ws_str,
        events=[
            ev.TaskCreated(
                name=spec.name,
                objective=spec.objective,
                items=len(spec.items),
                workspace=ws_str,
                preexisting=preexisting,
            )
        ],
    )


def _preexisting(spec: TaskSpec, workspace: Path) -> dict[str, str]:
    """Hashes of the files `done_when` file rules name that already exist, so that a
    leftover from an earlier run does not count as this task's work."""
    out: dict[str, str] = {}
    for item in spec.items:
        rule = item.done_when
        if isinstance(rule, FileRule) and rule.fresh:
            path = workspace / rule.path
            if path.is_file():
                out[rule.path] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def budget_view(task: TaskRecord) -> dict[str, Any]:
    """Limits and use of the task's budget."""
    spec_budget = dict(task.spec.get("budget", {}))
    st = RunState.from_dict(task.usage)
    return {
        "limits": spec_budget,
        "used": {
            "tokens": st.tokens,
            "input_tokens": st.input_tokens,
            "output_tokens": st.output_tokens,
            "cached_tokens": st.cached_tokens,
            "money_usd": round(st.cost_usd, 6),
            "wall_seconds": round(st.wall_seconds, 3),
            "rounds": st.rounds,
            "model_calls": st.model_calls,
        },
    }


async def status_dict(store: Store, task_id: str) -> dict[str, Any]:
    """The `status --json` document (a public contract: keep its fields)."""
    task = await store.get_task(task_id)
    rec = await store.get_ledger(task_id)
    ledger = rec.to_ledger()
    items = [
        {
            "id": d.id,
            "title": d.title,
            "milestone": d.milestone,
            "status": s.status,
            "evidence": list(s.evidence),
            "attempts": s.attempts,
            "breaker": s.breaker,
            "note": s.note,
        }
        for d, s in ledger.items()
    ]
    return {
        "task_id": task.task_id,
        "name": task.name,
        "version": task.version,
        "status": task.status,
        "stop_reason": task.stop_reason,
        "current_milestone": task.current_milestone,
        "workspace": task.workspace,
        "ledger": {
            "objective": ledger.skeleton.objective,
            "version": ledger.version,
            "progress": ledger.progress().to_dict(),
            "items": items,
        },
        "waivers": [
            {"id": d.id, "status": s.status, "reason": s.note}
            for d, s in ledger.items()
            if s.status in ("waived", "skipped")
        ],
        "budget": budget_view(task),
        "waiting": task.waiting,
        "lease": {
            "owner": task.lease_owner,
            "expires_at": task.lease_expiry,
            "fencing_token": task.fencing_token,
        },
        "heartbeat_at": task.heartbeat_at,
        "created_at": task.created_at,
        "updated_at": task.updated_at,
        "last_seq": task.last_seq,
    }


@dataclass(frozen=True)
class CancelResult:
    """What `cancel` did: `outcome` is `already_ended` (the task was terminal; nothing
    written), `cancelled` (nobody ran it: it is cancelled now) or `requested` (a worker
    holds a live lease and stops between steps)."""

    task_id: str
    outcome: Literal["already_ended", "cancelled", "requested"]
    status: str
    lease_owner: str | None = None

    @property
    def message(self) -> str:
        """One line for a person."""
        if self.outcome == "already_ended":
            return f"task {self.task_id} is already {self.status}"
        if self.outcome == "cancelled":
            return f"task {self.task_id} cancelled"
        return f"cancel requested; worker {self.lease_owner} stops between steps"


async def cancel(store: Store, task_id: str, *, by: str = "user") -> CancelResult:
    """Ask a task to stop.

    A task nobody runs (no lease, or an expired one, by the store's clock) is cancelled
    at once (`cancelled_by_user`); a task a worker is running gets `cancel_requested`,
    and the worker stops between steps. A terminal task is left as it is. Raises
    `TaskNotFound` for an unknown id.
    """
    task = await store.get_task(task_id)
    if lifecycle.is_terminal(task.status):
        return CancelResult(task_id, "already_ended", task.status)
    clock = getattr(store, "clock", None)
    now = clock.now() if clock is not None else time.time()
    if task.lease_owner is None or (task.lease_expiry or 0) <= now:
        await store.commit(
            task_id,
            None,
            [
                ev.CancelRequested(by=by),
                ev.TaskStatusChanged(
                    src=task.status,
                    dst="cancelled",
                    stop_reason="cancelled_by_user",
                    reason="cancelled",
                ),
            ],
            task=TaskPatch(
                status="cancelled",
                stop_reason="cancelled_by_user",
                cancel_requested=True,
                waiting=None,
            ),
        )
        return CancelResult(task_id, "cancelled", "cancelled")
    await store.commit(
        task_id, None, [ev.CancelRequested(by=by)], task=TaskPatch(cancel_requested=True)
    )
    return CancelResult(task_id, "requested", task.status, task.lease_owner)
