"""Rebuilding projections from the event log: `tether rebuild TASK [--fix]`.

The task row and the ledger are projections of the events written in the same
transaction. A damaged projection (a bad restore, a hand edit of the database) must never
strand a task: `rebuild` folds the log again (`tether.report.timetravel`) and reports
every difference from the stored projections; with `fix`, the ledger is replaced by the
folded one in a commit that journals what changed (a `ledger.updated` event with cause
`rebuild`, so the log still folds to what is stored).
What the audits remember of each open item (`RunState.seen`: the progress marks of
its rounds, carried by each round's `judge.verdict`) is folded and compared too, and
`fix` writes it back. Differences in the task row (status, stop reason, version) and in
the status of its approval requests (pending, approved, rejected, closed:
`approval.requested`, `.decided`, `.closed`) are reported; the task's status changes only
through its lifecycle and a request's only by a decision or a close, so those are left
to a human.
"""

from __future__ import annotations

from typing import Any

from tether import events as ev
from tether import ledger as L
from tether.report.timetravel import LedgerFold, TaskFold
from tether.runtime.round import progress as P
from tether.runtime.run.state import RunState
from tether.store.base import LedgerWrite, Store, StoredEvent, TaskPatch

_FIELDS = ("status", "evidence", "attempts", "breaker", "note")


class SeenFold:
    """What the audits remember of each open item (`RunState.seen`) while the log is
    read: each round's verdict adds its marks to its focus item, then every item no
    longer open in the ledger the verdict left is forgotten (`verdicts._remember`)."""

    def __init__(self, ledger: LedgerFold) -> None:
        self.ledger = ledger
        self.seen: dict[str, list[str]] = {}
        #: A log written before verdicts carried their marks cannot be folded.
        self.legacy = False
        self._prune = False

    def apply(self, e: StoredEvent) -> None:
        """Fold one event in (after `LedgerFold.apply` of the same event)."""
        if self._prune and e.type != "ledger.updated":
            self._forget()  # the verdict changed no item: its ledger is the one before
        if e.type == "judge.verdict":
            marks = e.data.get("marks")
            if marks is None:
                self.legacy = self.legacy or "rules" in e.data.get("judges", [])
                return
            item = e.data.get("item")
            if item is not None:
                self.seen[str(item)] = P.remember(self.seen.get(str(item), []), marks)
            self._prune = True
        elif e.type == "ledger.updated" and self._prune:
            self._forget()

    def _forget(self) -> None:
        self._prune = False
        known = {d.id for d in self.ledger.skeleton.items}
        for item in list(self.seen):
            state = self.ledger.states.get(item, {})
            if item not in known or state.get("status") not in L.OPEN_STATUSES:
                del self.seen[item]

    def done(self) -> dict[str, list[str]]:
        """The memory at the end of the log."""
        if self._prune:
            self._forget()
        return self.seen


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
    seen_fold = SeenFold(ledger_fold)
    log = await store.read_events(task_id)
    for e in log:
        ledger_fold.apply(e)
        task_fold.apply(e)
        seen_fold.apply(e)
    state = RunState.from_dict(task.usage)
    folded_seen = seen_fold.done()
    state_diffs = (
        []
        if seen_fold.legacy
        else [
            {"field": "seen", "item": item, "stored": state.seen.get(item), "from_log": want}
            for item in sorted(set(state.seen) | set(folded_seen))
            if state.seen.get(item) != (want := folded_seen.get(item))
        ]
    )
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
    if fix and (ledger_diffs or state_diffs):
        states = tuple(folded.item(d.id) for d, _ in stored.items())
        new = L.Ledger(stored.skeleton, states, stored.version + 1)
        events: list[ev.Event] = []
        if ledger_diffs:
            events.append(
                ev.LedgerUpdated(
                    version=new.version, diff=L.diff(stored, new).to_list(), cause="rebuild"
                )
            )
        patch = None
        if state_diffs:
            state.seen = folded_seen
            patch = TaskPatch(usage=state.to_dict())
            events.append(
                ev.RecoveryStep(step="rebuild", details={"seen": [d["item"] for d in state_diffs]})
            )
        await store.commit(
            task_id,
            None,
            events,
            ledger=LedgerWrite.of(new, stored.version) if ledger_diffs else None,
            task=patch,
        )
        fixed = True
    return {
        "task_id": task_id,
        "consistent": not (ledger_diffs or task_diffs or request_diffs or state_diffs),
        "ledger": ledger_diffs,
        "task": task_diffs,
        "state": state_diffs,
        "approvals": request_diffs,
        "fixed": fixed,
    }
