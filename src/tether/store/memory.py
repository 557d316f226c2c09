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
import json
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
from tether.store.base import ApprovalRecord, ArtifactRecord, OpRecord, StoredEvent, TaskRecord

T = TypeVar("T")


#: Values a JSON round trip returns unchanged (bool is an int; NaN and infinities
#: are floats json writes and reads back as such).
_ATOMS: frozenset[type] = frozenset({str, int, float, bool, type(None)})
#: The keywords of `commit` besides its events.
_PARTS: frozenset[str] = b.CommitParts.__optional_keys__


class _NotPlain(Exception):
    """A value the quick copy does not handle (a tuple, a non-string key, an object)."""


def _clone(value: Any) -> Any:
    kind = type(value)
    if kind is dict:
        # Copied whole (in C), then its containers replaced by copies: most of the run
        # state's values are atoms, passed over.
        out = value.copy()
        for k, v in value.items():
            if type(k) is not str:
                raise _NotPlain
            kind = type(v)
            if kind in _ATOMS:
                continue
            if kind is dict:
                # An empty one, as most of the run state's are: no call for it.
                out[k] = _clone(v) if v else {}
            elif kind is list:
                out[k] = (list(v) if _ATOMS.issuperset(map(type, v)) else _clone(v)) if v else []
            else:
                raise _NotPlain
        return out
    if kind is list:
        if _ATOMS.issuperset(map(type, value)):  # a list of strings: copied in C
            return list(value)
        return [v if type(v) in _ATOMS else _clone(v) for v in value]
    if kind in _ATOMS:
        return value
    raise _NotPlain


def _copy(obj: Any) -> Any:
    # What a database would hand back: callers never share our objects. Plain JSON
    # data (dicts with string keys, lists, atoms) is copied as is, several times faster
    # than a JSON round trip (the run's state is ~20 KB and is written every commit);
    # anything else takes the round trip, which converts or refuses it as before.
    try:
        return _clone(obj)
    except (_NotPlain, RecursionError):
        return json.loads(json.dumps(obj))


def _stored_op(old: OpRecord | None, op: OpRecord, now: float) -> OpRecord:
    """`rules.merge_op` of `op` over `old` (None: its first write), with the caller's
    containers copied: only the JSON fields are containers, the rest is immutable (a
    deepcopy of the whole record costs more than the round's commit). The merged record
    is a new one nobody holds yet: its fields taken from `op` are copied into it, rather
    than into a copy of `op` made first (which the merge of a later write threw away)."""
    new = rules.merge_op(old, op, now)  # a new record (`rules.replaced`), always
    values = new.__dict__
    # A later write keeps the stored args (a copy already) and takes its outcome.
    for name in _OP_JSON if old is None else _OP_OUTCOME_JSON:
        value = values[name]
        if value is not None:
            values[name] = _copy(value)
    return new


#: The fields of an op record that hold JSON containers, and those a later write of the
#: op takes from it (`rules.OP_OUTCOME`).
_OP_JSON = ("args", "result", "error")
_OP_OUTCOME_JSON = tuple(name for name in _OP_JSON if name in rules.OP_OUTCOME)


def _copy_usage(usage: Any, marks: b.MarksWrite | None, held: Any) -> Any:
    """The run state a commit stores (`_copy` of `usage`), its progress marks
    (`usage["seen"]`, up to a thousand per item) taken as the SQL stores take them: the
    items `marks` does not name keep the lists stored (`held`, never changed in place),
    the others drop their oldest marks and get the new ones, copied. Where that does not
    give a list of the given length (or `marks` is None), the given list is copied."""
    seen = usage.get("seen") if type(usage) is dict else None
    kept = held.get("seen") if type(held) is dict else None
    if marks is None or type(seen) is not dict or type(kept) is not dict:
        return _copy(usage)
    changed = marks.items
    out_seen: dict[str, Any] = {}
    for item, given in seen.items():
        old = kept.get(item)
        if type(item) is not str:
            return _copy(usage)  # the JSON round trip converts the key
        if type(given) is list and type(old) is list:
            change = changed.get(item)
            if change is None:
                if len(old) == len(given):
                    out_seen[item] = old
                    continue
            else:
                cut, added = change
                if cut is not None and len(old) - cut + len(added) == len(given):
                    out_seen[item] = old[cut:] + _copy(list(added))
                    continue
        out_seen[item] = _copy(given)
    out = _copy({**usage, "seen": {}})
    out["seen"] = out_seen
    return out


#: An event committed but not yet read, its data not built: `MemoryStore._stored`'s
#: arguments (task id, seq, event, task version, fencing token, time).
_Later = tuple[str, int, ev.Event, int, int | None, float]

#: Per event class: its fields that may hold a container (None: the class's events are
#: always encoded at once).
_OPEN_FIELDS: dict[type[ev.Event], tuple[str, ...] | None] = {}
#: What `_OPEN_FIELDS.get` gives for a class not seen yet.
_UNSEEN: Any = object()


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
    if issubclass(cls, ev.UnknownEvent) or not cls.TYPE or cls.model_config.get("extra") == "allow":
        return None  # `ev.encode` refuses it, or it may carry fields of any type
    return tuple(name for name, f in cls.model_fields.items() if not _atomic(f.annotation))


def _later(event: ev.Event) -> bool:
    """True when `event` can be encoded when first read rather than now: every field
    holds an immutable value (its container fields are None), so what it encodes to
    cannot change in between. A steady round's events are read by nobody (the run keeps
    its own state), and building each one's data and record is a good part of a commit.
    Events that hold a list or dict the caller could still change are encoded now, as
    stored data must be what was committed."""
    cls = type(event)
    try:
        names = _OPEN_FIELDS[cls]
    except KeyError:
        names = _OPEN_FIELDS[cls] = _open_fields(cls)
    if names is None:
        return False
    values = event.__dict__
    # A loop: `all` of a generator cost more than the tests (every event of a commit).
    for name in names:  # noqa: SIM110
        if values[name] is not None:
            return False
    return True


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
        """A commit's events numbered from `first`: each stored now, or kept to be
        encoded when first read (`_later`, written out for the classes it has seen: a
        call per event cost more than its test)."""
        out: list[StoredEvent | _Later] = []
        for seq, e in enumerate(events, first):
            names = _OPEN_FIELDS.get(type(e), _UNSEEN)
            if names is _UNSEEN:
                later = _later(e)
            elif names is None:
                later = False
            else:
                later = True
                values = e.__dict__
                for name in names:
                    if values[name] is not None:
                        later = False
                        break
            out.append(
                (task_id, seq, e, version, token, now)
                if later
                else cls._stored(task_id, seq, e, version, token, now)
            )
        return out

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
                e if isinstance(e, StoredEvent) else self._stored(*e) for e in unread
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
