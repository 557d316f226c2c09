"""Rebuilding projections from the event log: `tether rebuild TASK [--fix]`.

The task row and the ledger are projections of the events written in the same
transaction. A damaged projection (a bad restore, a hand edit of the database) must never
strand a task: `rebuild` folds the log again (`tether.report.timetravel`) and reports
every difference from the stored projections; with `fix`, the ledger is replaced by the
folded one in a commit that journals what changed (a `ledger.updated` event with cause
`rebuild`, so the log still folds to what is stored).
Differences in the task row (status, stop reason, version) and in the status of its
approval requests (pending, approved, rejected, closed: `approval.requested`, `.decided`,
`.closed`) are reported; the task's status changes only through its lifecycle and a
request's only by a decision or a close, so those are left to a human.
"""

from __future__ import annotations

from typing import Any

from tether import events as ev
from tether import ledger as L
from tether.report.timetravel import LedgerFold, TaskFold
from tether.store.base import LedgerWrite, Store, StoredEvent

_FIELDS = ("status", "evidence", "attempts", "breaker", "note")


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def request_status(events: list[StoredEvent]) -> dict[str, str]:
    """Each approval request's status as its events leave it."""
    out: dict[str, str] = {}
    for e in events:
        rid = str(e.data.get("request_id", ""))
        if e.type == "approval.requested":
            out[rid] = "pending"
        elif e.type == "approval.decided":
            rejected = e.data.get("decision") in ("reject", "superseded")
            out[rid] = "rejected" if rejected else "approved"
        elif e.type == "approval.closed":
            out[rid] = "closed"
    return out


async def rebuild(store: Store, task_id: str, *, fix: bool = False) -> dict[str, Any]:
    """Fold the log of `task_id` and compare it with the stored projections; with `fix`,
    replace the stored ledger by the folded one. Returns the report (`ledger` and `task`
    differences, and whether anything was fixed)."""
    task = await store.get_task(task_id)
    rec = await store.get_ledger(task_id)
    stored = rec.to_ledger()
    ledger_fold, task_fold = LedgerFold.start(rec.skeleton), TaskFold()
    log = await store.read_events(task_id)
    for e in log:
        ledger_fold.apply(e)
        task_fold.apply(e)
    stored_requests = {a.request_id: a.status for a in await store.get_approvals(task_id)}
    logged_requests = request_status(log)
    request_diffs = [
        {
            "request_id": rid,
            "stored": stored_requests.get(rid),
            "from_log": logged_requests.get(rid),
        }
        for rid in sorted(set(stored_requests) | set(logged_requests))
        if stored_requests.get(rid) != logged_requests.get(rid)
    ]
    folded = ledger_fold.ledger()
    ledger_diffs = [
        {
            "item": d.id,
            "field": f,
            "stored": _plain(getattr(s, f)),
            "from_log": _plain(getattr(folded.item(d.id), f)),
        }
        for d, s in stored.items()
        if folded.has_item(d.id)
        for f in _FIELDS
        if getattr(s, f) != getattr(folded.item(d.id), f)
    ]
    task_diffs = [
        {"field": name, "stored": have, "from_log": want}
        for name, have, want in (
            ("status", task.status, task_fold.status),
            ("stop_reason", task.stop_reason, task_fold.stop_reason),
            ("version", task.version, task_fold.version),
        )
        if have != want
    ]
    fixed = False
    if fix and ledger_diffs:
        states = tuple(folded.item(d.id) for d, _ in stored.items())
        new = L.Ledger(stored.skeleton, states, stored.version + 1)
        await store.commit(
            task_id,
            None,
            [
                ev.LedgerUpdated(
                    version=new.version, diff=L.diff(stored, new).to_list(), cause="rebuild"
                )
            ],
            ledger=LedgerWrite.of(new, stored.version),
        )
        fixed = True
    return {
        "task_id": task_id,
        "consistent": not ledger_diffs and not task_diffs and not request_diffs,
        "ledger": ledger_diffs,
        "task": task_diffs,
        "approvals": request_diffs,
        "fixed": fixed,
    }
