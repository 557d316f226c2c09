"""The commit rules, written once for every store.

Pure values and functions, no I/O. The memory store and the SQL stores all decide with
these, so they cannot drift apart:

- **fencing**: a commit, renewal or release with a token other than the task's current
  one is refused with `StaleLease` (a commit with token `None` is out of band and needs
  no lease; a renewal also needs a lease owner);
- **lifecycle**: a status change must be a transition `lifecycle` allows;
- **task version**: it never goes back;
- **ledger version**: a ledger write is refused unless the stored version is the one
  the writer read (`LedgerWrite.expected_version`);
- **the task patch**: which columns a commit sets, and to what;
- **event sequence**: a commit's events take the next numbers after `last_seq`, gapless;
- **upserts**: an op's identity (tool, args, round...) is fixed at its first write and
  later writes change only its outcome; an artifact's validity and meta may change; an
  approval's decision may change. Repeated ids within one commit are merged in order;
- **requests**: a request is decided once. A pending one may be approved, rejected or
  closed; an approved one may only be closed (its call never sent); a rejected or closed
  one never changes again (`check_request_write`), checked against the stored request in
  the commit's transaction, so a late decision loses to the close that came first;
- **closing with the task**: a commit that moves a task to a terminal status closes, in
  its own transaction, every request of the task still open (pending, or approved with
  its op still waiting to be sent), each journaled as `approval.closed` after the
  commit's own events (`closing`).

A store that checks inside its database (PostgreSQL checks in the commit statement
itself) translates `CommitCondition` into SQL conditions and, when the database refuses,
asks the condition for the error (`CommitCondition.refusal`), so the words are the same too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from tether import errors, lifecycle
from tether._frozen_init import direct_init
from tether.store._event_fields import FIELDS
from tether.store.base import (
    UNSET,
    ApprovalRecord,
    ArtifactRecord,
    Commit,
    LedgerWrite,
    OpRecord,
    TaskPatch,
    TaskRecord,
    blob_hash,
)

if TYPE_CHECKING:  # the event models load where a commit builds or reads them
    from tether import events as ev

R = TypeVar("R")

#: Task columns holding JSON documents, and booleans (stores encode them their way).
JSON_COLUMNS = frozenset({"spec", "waiting", "usage"})
BOOL_COLUMNS = frozenset({"cancel_requested"})

#: What a later write of an op may change (with `updated_at`); the rest is its identity.
OP_OUTCOME: tuple[str, ...] = ("status", "attempts", "next_attempt_at", "result", "error")
#: What a later write of an artifact may change.
ARTIFACT_MUTABLE: tuple[str, ...] = ("valid", "meta")
#: What a later write of an approval may change (its request and creation time stay).
APPROVAL_MUTABLE: tuple[str, ...] = ("status", "decision", "decided_by", "decided_at")


@direct_init
@dataclass(frozen=True)
class TaskState:
    """The columns of a stored task the rules look at."""

    status: str
    version: int
    fencing_token: int
    last_seq: int
    cancel_requested: bool = False


@functools.lru_cache(maxsize=256)
def allowed_sources(dst: str, stop_reason: str | None) -> frozenset[str]:
    """Every status from which `lifecycle` allows moving to `dst` with `stop_reason`."""
    out = set()
    for src in lifecycle.STATUSES:
        try:
            lifecycle.check_transition(src, dst, stop_reason)
        except errors.IllegalTransition:
            continue
        out.add(src)
    return frozenset(out)


@direct_init
@dataclass(frozen=True)
class CommitCondition:
    """What must hold of the stored task (and ledger) for a commit to apply."""

    task_id: str
    #: The caller's fencing token; None is an out-of-band commit (no lease needed).
    token: int | None = None
    #: The target status and its stop reason, if the commit changes the status.
    status: str | None = None
    stop_reason: str | None = None
    #: The new task version, if the commit sets one (it must not go back).
    version: int | None = None
    #: The ledger version the writer read, if the commit writes the ledger.
    ledger_expected: int | None = None

    @classmethod
    def of(
        cls,
        task_id: str,
        token: int | None,
        task: TaskPatch | None = None,
        ledger: LedgerWrite | None = None,
    ) -> CommitCondition:
        """The condition of a commit."""
        return cls(
            task_id=task_id,
            token=token,
            status=task.status if task is not None else None,
            stop_reason=task.stop_reason if task is not None else None,
            version=task.version if task is not None else None,
            ledger_expected=ledger.expected_version if ledger is not None else None,
        )

    @property
    def sources(self) -> frozenset[str] | None:
        """The statuses the task may be in for the status change (None: no change)."""
        if self.status is None:
            return None
        return allowed_sources(self.status, self.stop_reason)

    def check_task(self, cur: TaskState) -> None:
        """Raise `StaleLease`, `IllegalTransition` or `ConcurrentUpdate` (in this order)
        unless the commit may apply to a task in state `cur`."""
        if self.token is not None and self.token != cur.fencing_token:
            raise errors.StaleLease(self.task_id, self.token, cur.fencing_token)
        if self.status is not None:
            lifecycle.check_transition(
                cur.status, self.status, self.stop_reason, task_id=self.task_id
            )
        if self.version is not None and self.version < cur.version:
            raise errors.ConcurrentUpdate(
                f"task {self.task_id}: version cannot go back from {cur.version} to {self.version}"
            )

    def check_ledger(self, found: int | None) -> None:
        """`ConcurrentUpdate` unless the stored ledger version is the expected one."""
        if self.ledger_expected is not None and found != self.ledger_expected:
            raise errors.ConcurrentUpdate(
                f"task {self.task_id}: ledger version is {found}, expected {self.ledger_expected}"
            )

    def refusal(self, cur: TaskState, ledger_version: int | None) -> Exception:
        """The error for a commit the database refused, judged on what it found."""
        try:
            self.check_task(cur)
            self.check_ledger(ledger_version)
        except (errors.StaleLease, errors.IllegalTransition, errors.ConcurrentUpdate) as exc:
            return exc
        # The ledger moved between the row lock and the read of its version.
        return errors.ConcurrentUpdate(
            f"task {self.task_id}: the ledger changed concurrently"
            f" (expected version {self.ledger_expected})"
        )


#: The `TaskPatch` fields (besides `status`, which brings `stop_reason`) by the value
#: that leaves the column as it is.
_PATCH_UNCHANGED: dict[str, Any] = {
    "version": None,
    "current_milestone": UNSET,
    "waiting": UNSET,
    "usage": None,
    "cancel_requested": None,
    "wake_at": UNSET,
    "spec": None,
}


def task_changes(patch: TaskPatch | None, token: int | None, now: float) -> dict[str, Any]:
    """Task column -> new value for a commit (Python values; the store encodes JSON and
    booleans). Always `updated_at`; `heartbeat_at` only when the lease holder commits.
    `last_seq` is not included: see `seq_range`."""
    changes: dict[str, Any] = {"updated_at": now}
    if patch is not None:
        if patch.status is not None:
            changes["status"] = patch.status
            changes["stop_reason"] = patch.stop_reason
        for name, unchanged in _PATCH_UNCHANGED.items():
            value = getattr(patch, name)
            if value is not unchanged:
                changes[name] = value
    if token is not None:
        changes["heartbeat_at"] = now
    return changes


def events_version(patch: TaskPatch | None, current: int) -> int:
    """The task version a commit's events carry: the new one if the commit sets it."""
    if patch is not None and patch.version is not None:
        return patch.version
    return current


def seq_range(last_seq: int, count: int) -> tuple[int, int]:
    """`(first, last)` sequence numbers of `count` new events (`last < first` if none)."""
    return last_seq + 1, last_seq + count


@direct_init
@dataclass(frozen=True)
class CommitPlan:
    """A checked commit: its events' numbers and version, and the task's new columns."""

    first_seq: int
    last_seq: int
    events_version: int
    changes: dict[str, Any]


def plan_commit(
    cond: CommitCondition,
    cur: TaskState,
    patch: TaskPatch | None,
    n_events: int,
    now: float,
) -> CommitPlan:
    """Check the task rules against `cur` (raising as `CommitCondition.check_task`) and
    compute what the commit writes. The ledger rule is checked by the caller."""
    cond.check_task(cur)
    changes = task_changes(patch, cond.token, now)
    # `seq_range` and `events_version`, written out: every commit plans (a call costs
    # more than either computation).
    first, last = cur.last_seq + 1, cur.last_seq + n_events
    if n_events:
        changes["last_seq"] = last
    version = patch.version if patch is not None and patch.version is not None else cur.version
    return CommitPlan(first, last, version, changes)


# --- upserts ------------------------------------------------------------------------------

Rec = TypeVar("Rec", OpRecord, ArtifactRecord, ApprovalRecord, TaskRecord, TaskPatch)


def replaced(rec: Rec, **changes: Any) -> Rec:
    """`dataclasses.replace` for the store's records, several times faster (a commit
    makes a handful): they are frozen dataclasses with no `__post_init__`, no `InitVar`
    and no field left out of `__init__`, so a copy of the instance's fields with the
    changes is the record `__init__` would make (`TaskPatch` too: `journal.task_patch`).
    An unknown field is a `TypeError`."""
    new = object.__new__(type(rec))
    values = new.__dict__
    values.update(rec.__dict__)
    if not changes.keys() <= values.keys():
        raise TypeError(f"{type(rec).__name__} has no field {sorted(changes.keys() - values)}")
    values.update(changes)
    return new


def merge_op(old: OpRecord | None, new: OpRecord, now: float) -> OpRecord:
    """The op stored after writing `new` over `old` (None: first write)."""
    if old is None:
        return replaced(new, created_at=now, updated_at=now)
    d = new.__dict__
    return replaced(old, updated_at=now, **{f: d[f] for f in OP_OUTCOME})


def op_result_stored(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """An op's `result` as stored: a `summary` that is the start of the `content` (a
    tool's output, whose first 200 characters are its summary) is kept as its length
    only, so the output is not stored twice; `op_result_read` puts it back. (SQLite
    writes it so; PostgreSQL writes the result whole. Measured there, schema 10, 1 KB
    outputs: an op's row is written three times (intended, dispatched, result), and the
    first two versions are pruned only when a read finds the page nearly full; with the
    shorter final row the pages ended with the last result not fitting and holding 4 ops
    each, with the whole one 5: 2,048 -> 1,638 bytes of heap per op.)"""
    if result is None:
        return None
    summary, content = result.get("summary"), result.get("content")
    if isinstance(summary, str) and isinstance(content, str) and content.startswith(summary):
        return {**result, "summary": len(summary)}
    return result


def op_result_read(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """An op's `result` as written, from its stored form (`op_result_stored`); a result
    stored whole (rows written before the summary was shortened) is read as it is."""
    if result is None:
        return None
    summary, content = result.get("summary"), result.get("content")
    if type(summary) is int and isinstance(content, str):
        return {**result, "summary": content[:summary]}
    return result


def merge_artifact(old: ArtifactRecord | None, new: ArtifactRecord, now: float) -> ArtifactRecord:
    """The artifact stored after writing `new` over `old` (None: first write)."""
    if old is None:
        return replaced(new, created_at=now)
    return replaced(old, **{f: getattr(new, f) for f in ARTIFACT_MUTABLE})


def merge_approval(old: ApprovalRecord | None, new: ApprovalRecord, now: float) -> ApprovalRecord:
    """The approval stored after writing `new` over `old` (None: first write)."""
    if old is None:
        return replaced(new, created_at=new.created_at or now)
    return replaced(old, **{f: getattr(new, f) for f in APPROVAL_MUTABLE})


#: The status of a request closed with what it decided about (see `closing`).
CLOSED = "closed"


def check_request_write(task_id: str, old: ApprovalRecord | None, new: ApprovalRecord) -> None:
    """`ConcurrentUpdate` unless `new` may be written over the stored `old` (None: a new
    request): pending may become anything, approved only closed, the rest never change
    (writing the very same record again is no change)."""
    if old is None or old.status == "pending":
        return
    if old.status == "approved" and new.status == CLOSED:
        return
    if (old.status, old.decision, old.decided_by) == (new.status, new.decision, new.decided_by):
        return
    why = ""
    if old.status == CLOSED:
        why = f": {(old.decision or {}).get('reason') or 'closed'}"
    elif old.decided_by:
        why = f" by {old.decided_by}"
    raise errors.ConcurrentUpdate(
        f"task {task_id}: request {old.request_id} was already {old.status}{why}"
    )


def check_request_writes(
    task_id: str, stored: Mapping[str, ApprovalRecord], writes: Sequence[ApprovalRecord]
) -> None:
    """`check_request_write` for each of a commit's request writes, in order."""
    seen = dict(stored)
    for new in writes:
        check_request_write(task_id, seen.get(new.request_id), new)
        seen[new.request_id] = new


def closes_requests(patch: TaskPatch | None) -> bool:
    """True if a commit with this patch ends the task, so its open requests close."""
    return patch is not None and patch.status is not None and lifecycle.is_terminal(patch.status)


def open_requests(
    requests: Sequence[ApprovalRecord], op_status: Mapping[str, str]
) -> list[ApprovalRecord]:
    """The requests still open, oldest first: pending ones, and an approved one while
    its op still waits to be sent (`op_status`: op id -> status) and no later request
    was made about that op (an earlier approval was acted on already)."""
    ordered = sorted(requests, key=lambda a: (a.created_at, a.request_id))
    latest = {a.op_id: a.request_id for a in ordered if a.op_id}
    return [
        a
        for a in ordered
        if a.status == "pending"
        or (
            a.status == "approved"
            and a.op_id is not None
            and latest.get(a.op_id) == a.request_id
            and op_status.get(a.op_id) == "awaiting_approval"
        )
    ]


def close_request(appr: ApprovalRecord, reason: str, by: str, now: float) -> ApprovalRecord:
    """The request closed (`reason`: what closed it); an approval it had stays readable
    under `decision.previous`."""
    decision: dict[str, Any] = {"decision": CLOSED, "reason": reason}
    if appr.status != "pending":
        decision["previous"] = {
            "status": appr.status,
            "decision": appr.decision,
            "decided_by": appr.decided_by,
        }
    return replaced(appr, status=CLOSED, decision=decision, decided_by=by, decided_at=now)


def close_event(appr: ApprovalRecord, reason: str, by: str) -> ev.ApprovalClosed:
    """The journal entry of closing `appr`."""
    from tether import events as ev

    return ev.ApprovalClosed(
        request_id=appr.request_id, reason=reason, by=by, op_id=appr.op_id, previous=appr.status
    )


def end_reason(patch: TaskPatch, events: Sequence[ev.Event]) -> str:
    """Why a commit ending the task closes its requests: the task's new status, with the
    reason its status event gives."""
    from tether import events as ev

    said = ""
    for e in events:
        if isinstance(e, ev.TaskStatusChanged) and e.dst == patch.status:
            said = e.reason
    return f"task {patch.status}" + (f": {said}" if said else "")


def closing(
    patch: TaskPatch | None,
    events: Sequence[ev.Event],
    open_requests: Sequence[ApprovalRecord],
    writes: Sequence[ApprovalRecord],
    now: float,
) -> tuple[list[ev.ApprovalClosed], list[ApprovalRecord]]:
    """The events and records that close `open_requests` (see the function of that
    name) when the commit ends the task; requests the commit writes itself are left to
    it. Nothing unless `closes_requests(patch)`."""
    if patch is None or not closes_requests(patch):
        return [], []
    reason = end_reason(patch, events)
    written = {a.request_id for a in writes}
    todo = [a for a in open_requests if a.request_id not in written]
    return (
        [close_event(a, reason, "tether") for a in todo],
        [close_request(a, reason, "tether", now) for a in todo],
    )


def settle_requests(
    task_id: str,
    patch: TaskPatch | None,
    events: Sequence[ev.Event],
    writes: Sequence[ApprovalRecord],
    stored: Sequence[ApprovalRecord],
    op_status: Mapping[str, str],
    now: float,
) -> tuple[list[ev.Event], list[ApprovalRecord]]:
    """A commit's events and request writes once the request rules are applied against
    the task's stored requests (`op_status`: the status of their ops, at least of those
    approved): `ConcurrentUpdate` for a write a stored request forbids; the closing of
    the open requests appended when the commit ends the task."""
    check_request_writes(task_id, {a.request_id: a for a in stored}, writes)
    closed_events, closed = closing(patch, events, open_requests(stored, op_status), writes, now)
    return [*events, *closed_events], [*writes, *closed]


def nothing(*filters: Collection[Any] | None) -> bool:
    """True if a filter is given and empty, so that no row can match."""
    return any(f is not None and not f for f in filters)


def record_writes(c: Commit, now: float) -> Iterator[tuple[str, list[Any]]]:
    """`(table, records)` for each record table a commit writes (`RECORD_TABLES`), its
    records of one id merged into one by the"""
    if c.ops:
        yield "ops", collapse(c.ops, lambda o: o.op_id, merge_op, now)
    if c.artifacts:
        yield (
            "artifacts",
            collapse(c.artifacts, lambda a: a.artifact_id, merge_artifact, now),
        )
    if c.approvals:
        yield (
            "approvals",
            collapse(c.approvals, lambda a: a.request_id, merge_approval, now),
        )


def collapse(
    records: Sequence[R],
    key: Callable[[R], Hashable],
    merge: Callable[[R | None, R, float], R],
    now: float,
) -> list[R]:
    """One record per id, as writing `records` one after the other would leave them
    (for stores that write a commit's records in one statement)."""
    out: dict[Hashable, R] = {}
    for rec in records:
        k = key(rec)
        out[k] = merge(out.get(k), rec, now)
    return list(out.values())


def unique_blobs(blobs: Sequence[bytes]) -> dict[str, bytes]:
    """Content address -> bytes, each blob once."""
    out: dict[str, bytes] = {}
    for data in blobs:
        out.setdefault(blob_hash(data), bytes(data))
    return out


# --- leases -------------------------------------------------------------------------------


def check_lease(task_id: str, token: int, current: int, owner: str | None, *, renew: bool) -> None:
    """`StaleLease` unless `token` is the current one (and, to renew, someone holds it)."""
    if token != current or (renew and owner is None):
        raise errors.StaleLease(task_id, token, current)


def lease_held_sql(renew: bool) -> str:
    """`check_lease` as an SQL condition on the task row (`:tok` the token)."""
    return "fencing_token = :tok AND lease_owner IS NOT NULL" if renew else "fencing_token = :tok"


def lease_free(owner: str | None, expiry: float | None, now: float) -> bool:
    """True if nobody holds a live lease (the SQL stores say it as `LEASE_FREE_SQL`)."""
    return owner is None or expiry is None or expiry <= now


CLAIMABLE_STATUSES: tuple[str, ...] = ("queued", "running", "stalled")


def claimable(status: str, wake_at: float | None, cancel_requested: bool, now: float) -> bool:
    """True if a worker asking for any task may take this one (see `CLAIMABLE_SQL`)."""
    if cancel_requested:
        return False
    return status in CLAIMABLE_STATUSES or (
        status == "waiting" and wake_at is not None and wake_at <= now
    )


#: `lease_free` and `claimable` in SQL (`:now` the store's clock, `:f` false).
LEASE_FREE_SQL = "(lease_owner IS NULL OR lease_expiry IS NULL OR lease_expiry <= :now)"
CLAIMABLE_SQL = (
    "(status IN ("
    + ", ".join(f"'{s}'" for s in CLAIMABLE_STATUSES)
    + ") OR (status = 'waiting' AND wake_at IS NOT NULL AND wake_at <= :now))"
    " AND cancel_requested = :f"
)


# --- stored events ------------------------------------------------------------------------


def compact(type_name: str, data: dict[str, Any]) -> dict[str, Any]:
    """An event's data (`ev.encode`) as a store may write it: each field holding its plain
    default (None, 0, "", [], ...: of the same JSON type) left out, so a round's events
    do not store their empty fields; `expand` puts them back. The fields come from
    `_event_fields.FIELDS` (a reader decodes rows without the event models)."""
    plain = _PLAIN.get(type_name)
    if plain is None:
        return data
    out = dict(data)
    for name, default, kind in plain:
        value = out.get(name, _ABSENT)
        if type(value) is kind and value == default:
            del out[name]
    return out


#: A field `compact` finds absent (of no default's type).
_ABSENT = object()
#: Per event type `FIELDS` has fields of: `(field, default, type of default)` for each
#: field with a plain default, in field order (`compact` runs for every event written).
_PLAIN = {
    name: tuple((f[0], f[1], type(f[1])) for f in fields if len(f) == 2)
    for name, fields in FIELDS.items()
    if fields is not None
}


def expand(type_name: str, data: dict[str, Any]) -> dict[str, Any]:
    """An event's stored data with the fields `compact` left out back at their
    defaults, in field order (then any field this tether does not know): the data
    `ev.encode` gave. Data stored whole (before `compact`, or by an older tether) reads
    the same, a field it lacks filled in as decoding would."""
    fields = FIELDS.get(type_name)
    if fields is None:
        return data
    out: dict[str, Any] = {}
    for field in fields:
        name = field[0]
        if name in data:
            out[name] = data[name]
        elif len(field) == 2:
            default = field[1]
            out[name] = type(default)() if isinstance(default, list | dict) else default
    if any(k not in out for k in data):  # fields of a newer tether, kept
        out.update((k, v) for k, v in data.items() if k not in out)
    return out
