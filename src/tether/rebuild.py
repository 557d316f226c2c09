"""Rebuilding projections from the event log: `tether rebuild TASK [--fix]`.

The task row and the ledger are projections of the events written in the same
transaction. A damaged projection (a bad restore, a hand edit of the database) must never
strand a task: `rebuild` folds the log again (`tether.report.timetravel`) and reports
every difference from the stored projections; with `fix`, the ledger is replaced by the
folded one in a commit that journals what changed (a `ledger.updated` event with cause
`rebuild`, so the log still folds to what is stored).
Differences in the task row (status, stop reason, version) are reported; the task's
status changes only through its lifecycle, so those are left to a human.
"""

from __future__ import annotations

from typing import Any

from tether import events as ev
from tether import ledger as L
from tether.report.timetravel import LedgerFold, TaskFold
from tether.store.base import LedgerWrite, Store

_FIELDS = ("status", "evidence", "attempts", "breaker", "note")


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


async def rebuild(store: Store, task_id: str, *, fix: bool = False) -> dict[str, Any]:
    """Fold the log of `task_id` and compare it with the stored projections; with `fix`,
    replace the stored ledger by the folded one. Returns the report (`ledger` and `task`
    differences, and whether anything was fixed)."""
    task = await store.get_task(task_id)
    rec = await store.get_ledger(task_id)
    stored = rec.to_ledger()
    ledger_fold, task_fold = LedgerFold.start(rec.skeleton), TaskFold()
    for e in await store.read_events(task_id):
        ledger_fold.apply(e)
        task_fold.apply(e)
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
        "consistent": not ledger_diffs and not task_diffs,
        "ledger": ledger_diffs,
        "task": task_diffs,
        "fixed": fixed,
    }
