"""An in-memory store for fast unit tests; passes the same conformance suite.

Nothing survives the process. No operation awaits between its first read and its last
write, so each is atomic on the event loop (no lock needed: one that is never contended
cost every commit two coroutines), which gives the same all-or-nothing commits as a
database transaction. What a commit, renewal or
claim may do is decided by `tether.store._rules`, the same rules the SQL stores use.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from collections.abc import Collection
from types import UnionType
from typing import Any, TypeVar, Unpack

from tether import errors, lifecycle
from tether import events as ev
from tether.clock import Clock, SystemClock
from tether.store import _rules as rules
from tether.store import _search as search
from tether.store import base as b
from tether.store._latest import Latest
from tether.store._memory_copy import ATOMS as _ATOMS
from tether.store._memory_copy import NotPlain as _NotPlain
from tether.store._memory_copy import clone as _clone
from tether.store._memory_copy import copy_json as _copy
from tether.store._memory_copy import copy_usage as _copy_usage
from tether.store._memory_copy import stored_op as _stored_op
from tether.store.base import ApprovalRecord, ArtifactRecord, OpRecord, StoredEvent, TaskRecord

T = TypeVar("T")


#: The keywords of `commit` besides its events.
_PARTS: frozenset[str] = b.CommitParts.__optional_keys__


#: An event committed but not yet read, its data not built: `MemoryStore._stored`'s
#: arguments (task id, seq, event, task version, fencing token, time) and the store's
#: copies of the event's containers (None: it holds none), which it is encoded with.
_Later = tuple[str, int, ev.Event, int, int | None, float, dict[str, Any] | None]

#: Per event class: its fields that may hold a container (None: the class's events are
#: always encoded at once).
_OPEN_FIELDS: dict[type[ev.Event], tuple[str, ...] | None] = {}


def _atomic(annotation: Any) -> bool:
    """True for a field type whose values are immutable: str, int, float, bool, None,
    their literals and unions of these."""
    if annotation in _ATOMS:
        return True
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return all(type(a) in _ATOMS for a in args)
    if origin is typing.Union or origin is UnionType:
        return all(_atomic(a) for a in args)
    return False


def _open_fields(cls: type[ev.Event]) -> tuple[str, ...] | None:
    """`_OPEN_FIELDS[cls]`, worked out the first time."""
    try:
        return _OPEN_FIELDS[cls]
    except KeyError:
        pass
    names: tuple[str, ...] | None
    if issubclass(cls, ev.UnknownEvent) or not cls.TYPE or cls.model_config.get("extra") == "allow":
        names = None  # `ev.encode` refuses it, or it may carry fields of any type
    else:
        names = tuple(name for name, f in cls.model_fields.items() if not _atomic(f.annotation))
    _OPEN_FIELDS[cls] = names
    return names


class MemoryStore(b.Store):
    """A store that lives in a Python dict (the methods' documentation: `Store`)."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.url = "memory://"
        self.clock: Clock = clock or SystemClock()
        #: Each task's last number (the judge's `judge.rules.own.OwnCommits.later`).
        self.latest = Latest()
        self._tasks: dict[str, TaskRecord] = {}
        self._events: dict[str, list[StoredEvent]] = {}
        #: Per task, the events committed after those in `_events` (read_events moves
        #: them there), some not yet encoded (`_later`).
        self._unread: dict[str, list[StoredEvent | _Later]] = {}
        self._ledgers: dict[str, b.LedgerRecord] = {}
        self._blobs: dict[str, bytes] = {}
        self._ops: dict[str, OpRecord] = {}
        self._artifacts: dict[str, ArtifactRecord] = {}
        self._shared: dict[str, dict[str, Any]] = {}
        self._approvals: dict[str, ApprovalRecord] = {}
        #: The search index: each artifact's indexed text (`_search.indexed_text`).
        self._texts: dict[str, str] = {}

    @classmethod
    async def open(cls, clock: Clock | None = None) -> MemoryStore:
        """A new empty store."""
        return cls(clock)

    async def schema_version(self) -> int:
        """Always the current version."""
        return b.SCHEMA_VERSION

    def _task(self, task_id: str) -> TaskRecord:
        try:
            return self._tasks[task_id]
        except KeyError:
            raise errors.TaskNotFound(task_id) from None

    async def create_task(self, **new: Unpack[b.NewTask]) -> TaskRecord:
        b.refuse_unknown(new, b.NewTask)
        task_id, ledger, events = new["task_id"], new["ledger"], new.get("events", ())
        if task_id in self._tasks:
            raise errors.ConcurrentUpdate(f"task {task_id!r} already exists")
        now = self.clock.now()
        rec = TaskRecord(
            task_id=task_id,
            name=new["name"],
            status="queued",
            stop_reason=None,
            version=1,
            current_milestone=None,
            spec=_copy(dict(new["spec"])),
            workspace=new.get("workspace"),
            waiting=None,
            usage={},
            cancel_requested=False,
            wake_at=None,
            created_at=now,
            updated_at=now,
            heartbeat_at=None,
            lease_owner=None,
            lease_expiry=None,
            fencing_token=0,
            last_seq=len(events),
        )
        self._tasks[task_id] = rec
        self._ledgers[task_id] = b.LedgerRecord(
            task_id,
            _copy(ledger.skeleton.to_dict()),
            _copy(ledger.state_dict()),
            ledger.version,
            now,
        )
        self._events[task_id] = [
            self._stored(task_id, n + 1, e, 1, None, now) for n, e in enumerate(events)
        ]
        self._unread[task_id] = []
        return rec

    @staticmethod
    def _stored(
        task_id: str, seq: int, event: ev.Event, version: int, token: int | None, now: float
    ) -> StoredEvent:
        # `encode` hands over a fresh JSON-ready dict (pydantic's `mode="json"` dump):
        # nobody else holds it, so it is kept as is, not copied once more.
        type_name, schema, data = ev.encode(event)
        # The record made as `rules.replaced` makes one (a frozen dataclass's __init__
        # sets each field through object.__setattr__: half the cost of storing an event).
        rec = object.__new__(StoredEvent)
        rec.__dict__.update(
            task_id=task_id,
            seq=seq,
            type=type_name,
            schema_version=schema,
            data=data,
            task_version=version,
            fencing_token=token,
            at=now,
        )
        return rec

    @classmethod
    def _stored_all(
        cls,
        task_id: str,
        events: b.Events,
        first: int,
        version: int,
        token: int | None,
        now: float,
    ) -> list[StoredEvent | _Later]:
        """A commit's events numbered from `first`, each kept to be encoded when first
        read (`_Later`) where it can be. A steady round's events are read by nobody (the
        run keeps its own state), and building an event's data (pydantic's serializer)
        cost several times the copy of its few small containers. The event is frozen, so
        its other fields cannot change in between; its containers are the caller's, which
        it may change after the commit: stored data must be what was committed, so they
        are copied now (plain JSON data only: an event holding anything else, a tuple or
        an object, is encoded now, as are those of the classes `_open_fields` leaves
        out). Written out, not a call per event: the loop runs for every event."""
        out: list[StoredEvent | _Later] = []
        for seq, e in enumerate(events, first):
            try:
                names = _OPEN_FIELDS[type(e)]
            except KeyError:
                names = _open_fields(type(e))
            if names is not None:
                held: dict[str, Any] | None = None
                values = e.__dict__
                try:
                    for name in names:
                        value = values[name]
                        if value is not None:
                            if held is None:
                                held = {}
                            held[name] = _clone(value)
                except (_NotPlain, RecursionError):
                    pass
                else:
                    out.append((task_id, seq, e, version, token, now, held))
                    continue
            out.append(cls._stored(task_id, seq, e, version, token, now))
        return out

    @classmethod
    def _stored_later(cls, later: _Later) -> StoredEvent:
        """The record of an event kept by `_stored_all`: encoded from the event with the
        store's copies of its containers (on a copy of the event: the caller's is left
        as it is)."""
        task_id, seq, event, version, token, now, held = later
        if held is not None:
            event = copy.copy(event)
            event.__dict__.update(held)
        return cls._stored(task_id, seq, event, version, token, now)

    async def get_task(self, task_id: str) -> TaskRecord:
        return self._task(task_id)

    async def list_tasks(
        self, statuses: Collection[str] | None = None, limit: int = 100
    ) -> list[TaskRecord]:
        tasks = [t for t in self._tasks.values() if not statuses or t.status in statuses]
        tasks.sort(key=lambda t: (-t.created_at, t.task_id))
        return tasks[:limit]

    async def read_events(
        self, task_id: str, after: int = 0, **filters: Unpack[b.EventFilters]
    ) -> list[StoredEvent]:
        b.refuse_unknown(filters, b.EventFilters)
        limit, types = filters.get("limit"), filters.get("types")
        self._task(task_id)
        unread = self._unread[task_id]
        if unread:
            self._events[task_id].extend(
                e if isinstance(e, StoredEvent) else self._stored_later(e) for e in unread
            )
            unread.clear()
        out = [e for e in self._events[task_id] if e.seq > after and (not types or e.type in types)]
        return out[:limit] if limit is not None else out

    async def get_ledger(self, task_id: str) -> b.LedgerRecord:
        self._task(task_id)
        return self._ledgers[task_id]

    async def commit(
        self, task_id: str, token: int | None, events: b.Events, **parts: Unpack[b.CommitParts]
    ) -> b.CommitResult:
        # The parts read as they are (a `b.Commit` costs a tenth of this commit).
        if not _PARTS.issuperset(parts):
            b.refuse_unknown(parts, b.CommitParts)
        task, ledger = parts.get("task"), parts.get("ledger")
        ops, artifacts = parts.get("ops", ()), parts.get("artifacts", ())
        approvals, blobs = parts.get("approvals", ()), parts.get("blobs", ())
        rec = self._task(task_id)
        now = self.clock.now()
        cond = rules.CommitCondition.of(task_id, token, task, ledger)
        cur = rules.TaskState(
            rec.status, rec.version, rec.fencing_token, rec.last_seq, rec.cancel_requested
        )
        # `rules.closes_requests(task)`, written out: most commits change no status.
        ends = task is not None and task.status is not None and lifecycle.is_terminal(task.status)
        if approvals or ends:
            cond.check_task(cur)  # its refusal comes before a request's
            mine = [a for a in self._approvals.values() if a.task_id == task_id]
            status = {a.op_id: self._op_status(a.op_id) for a in mine if a.op_id}
            events, approvals = rules.settle_requests(
                task_id,
                task,
                events,
                approvals,
                mine,
                {k: v for k, v in status.items() if v},
                now,
            )
        plan = rules.plan_commit(cond, cur, task, len(events), now)
        new_ledger = None
        if ledger is not None:
            old_ledger = self._ledgers[task_id]
            cond.check_ledger(old_ledger.version)
            state = _copy(ledger.state)
            if ledger.positions is not None:  # the changed items only
                state = {**old_ledger.state, **state}
            new_ledger = b.LedgerRecord(
                task_id,
                _copy(ledger.skeleton) if ledger.skeleton is not None else old_ledger.skeleton,
                state,
                ledger.version,
                now,
            )
        first, version = plan.first_seq, plan.events_version
        stored = self._stored_all(task_id, events, first, version, token, now)
        changes = {
            k: (
                _copy_usage(v, task.marks if task else None, rec.usage)
                if k == "usage"
                else _copy(v)
                if k in rules.JSON_COLUMNS
                else v
            )
            for k, v in plan.changes.items()
        }
        # Everything validated: apply.
        self._unread[task_id].extend(stored)
        if new_ledger is not None:
            self._ledgers[task_id] = new_ledger
        for op in ops:
            self._ops[op.op_id] = _stored_op(self._ops.get(op.op_id), op, now)
        for art in artifacts:
            self._artifacts[art.artifact_id] = rules.merge_artifact(
                self._artifacts.get(art.artifact_id), copy.deepcopy(art), now
            )
        for ref, data in rules.unique_blobs(blobs).items():
            self._blobs.setdefault(ref, data)
        for art in artifacts:
            if art.artifact_id not in self._texts:
                body = search.indexed_text(art.name, self._blobs.get(art.blob_hash))
                if body:
                    self._texts[art.artifact_id] = body
        for appr in approvals:
            self._approvals[appr.request_id] = rules.merge_approval(
                self._approvals.get(appr.request_id), copy.deepcopy(appr), now
            )
        self._tasks[task_id] = rules.replaced(rec, **changes)
        self.latest.note(task_id, plan.last_seq)
        return b.CommitResult(plan.first_seq, plan.last_seq, rec.cancel_requested, rec.version)

    def _op_status(self, op_id: str) -> str | None:
        op = self._ops.get(op_id)
        return op.status if op is not None else None

    async def claim(
        self, worker_id: str, ttl: float, **options: Unpack[b.ClaimOptions]
    ) -> b.Lease | None:
        b.refuse_unknown(options, b.ClaimOptions)
        task_id, from_token = options.get("task_id"), options.get("from_token")
        force, exclude = options.get("force", False), options.get("exclude", ())
        now = self.clock.now()

        def free(t: TaskRecord) -> bool:
            return rules.lease_free(t.lease_owner, t.lease_expiry, now)

        if task_id is not None:
            rec = self._task(task_id)
            if (not force and not free(rec)) or lifecycle.is_terminal(rec.status):
                return None
            if force and from_token is not None and rec.fencing_token != from_token:
                return None
        else:
            cands = [
                t
                for t in self._tasks.values()
                if free(t)
                and rules.claimable(t.status, t.wake_at, t.cancel_requested, now)
                and t.task_id not in exclude
            ]
            if not cands:
                return None
            rec = min(cands, key=lambda t: (t.updated_at, t.task_id))
        token = rec.fencing_token + 1
        self._tasks[rec.task_id] = dataclasses.replace(
            rec,
            lease_owner=worker_id,
            lease_expiry=now + ttl,
            fencing_token=token,
            heartbeat_at=now,
        )
        return b.Lease(rec.task_id, worker_id, token, now + ttl)

    async def live_leases(self, owner_prefix: str) -> list[b.Lease]:
        now = self.clock.now()
        return [
            b.Lease(t.task_id, t.lease_owner, t.fencing_token, t.lease_expiry)
            for t in sorted(self._tasks.values(), key=lambda t: (t.updated_at, t.task_id))
            if t.lease_owner is not None
            and t.lease_owner.startswith(owner_prefix)
            and t.lease_expiry is not None
            and not rules.lease_free(t.lease_owner, t.lease_expiry, now)
            and rules.claimable(t.status, t.wake_at, t.cancel_requested, now)
        ]

    async def renew(self, task_id: str, token: int, ttl: float) -> float:
        rec = self._task(task_id)
        rules.check_lease(task_id, token, rec.fencing_token, rec.lease_owner, renew=True)
        now = self.clock.now()
        self._tasks[task_id] = dataclasses.replace(rec, lease_expiry=now + ttl, heartbeat_at=now)
        return now + ttl

    async def release(self, task_id: str, token: int) -> None:
        rec = self._task(task_id)
        rules.check_lease(task_id, token, rec.fencing_token, rec.lease_owner, renew=False)
        self._tasks[task_id] = dataclasses.replace(rec, lease_owner=None, lease_expiry=None)

    async def put_blob(self, data: bytes) -> str:
        ref = b.blob_hash(data)
        self._blobs.setdefault(ref, bytes(data))
        return ref

    async def get_blob(self, ref: str) -> bytes:
        return self._blobs[ref]

    async def get_ops(
        self, task_id: str, statuses: Collection[str] | None = None, **filters: Unpack[b.OpFilters]
    ) -> list[OpRecord]:
        b.refuse_unknown(filters, b.OpFilters)
        op_ids, tools, round = filters.get("op_ids"), filters.get("tools"), filters.get("round")
        if any(f is not None and not f for f in (statuses, op_ids, tools)):
            return []
        ops = [
            o
            for o in self._ops.values()
            if o.task_id == task_id
            and (statuses is None or o.status in statuses)
            and (op_ids is None or o.op_id in op_ids)
            and (round is None or o.round == round)
            and (tools is None or o.tool in tools)
        ]
        if filters.get("limit") or filters.get("after") is not None:
            ops.sort(key=lambda o: (o.round, o.call_index, o.op_id))
            after, limit = filters.get("after"), filters.get("limit")
            ops = [o for o in ops if after is None or (o.round, o.call_index, o.op_id) > after]
            return ops[:limit] if limit else ops
        ops.sort(key=lambda o: (o.round, o.call_index))
        return ops

    async def get_artifacts(
        self, task_id: str, *, artifact_ids: Collection[str] | None = None
    ) -> list[ArtifactRecord]:
        if artifact_ids is not None and not artifact_ids:
            return []
        arts = [
            a
            for a in self._artifacts.values()
            if a.task_id == task_id and (artifact_ids is None or a.artifact_id in artifact_ids)
        ]
        arts.sort(key=lambda a: (a.created_at, a.artifact_id))
        return arts

    async def search_artifacts(
        self, task_id: str, query: str, **options: Unpack[b.SearchOptions]
    ) -> list[b.ArtifactHit]:
        b.refuse_unknown(options, b.SearchOptions)
        words, kinds = search.terms(query), options.get("kinds")
        if not words or (kinds is not None and not kinds):
            return []
        include_invalid = options.get("include_invalid", False)
        hits = []
        for art in self._artifacts.values():
            text = self._texts.get(art.artifact_id)
            if art.task_id != task_id or text is None:
                continue
            if (kinds is not None and art.kind not in kinds) or not (art.valid or include_invalid):
                continue
            score = search.score(text, words)
            if score > 0:
                hits.append(b.ArtifactHit(art, score, search.excerpt(text, words)))
        hits.sort(key=lambda h: (-h.score, h.artifact.created_at, h.artifact.artifact_id))
        return hits[: search.bounded(options.get("limit", 10))]

    async def get_approvals(
        self, task_id: str, statuses: Collection[str] | None = None
    ) -> list[ApprovalRecord]:
        out = [a for a in self._approvals.values() if a.task_id == task_id]
        out.sort(key=lambda a: (a.created_at, a.request_id))
        return [a for a in out if statuses is None or a.status in statuses]

    async def get_artifact(self, artifact_id: str) -> ArtifactRecord:
        return self._artifacts[artifact_id]

    async def update_shared(self, key: str, fn: b.SharedUpdate[T]) -> T:
        old = self._shared.get(key)
        doc, value = fn(None if old is None else _copy(old), self.clock.now())
        if doc is None:
            self._shared.pop(key, None)
        else:
            self._shared[key] = _copy(doc)
        return value

    async def get_shared(self, key: str) -> dict[str, Any] | None:
        doc = self._shared.get(key)
        return None if doc is None else _copy(doc)

    async def close(self) -> None:
        """Nothing to release."""
