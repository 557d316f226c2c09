"""The store protocol: a narrow set of named operations over events and projections.

The store knows nothing of models or tools. It keeps:

- **tasks**: the task projection (status, stop reason, version, current milestone, the
  spec snapshot, heartbeat, lease owner and expiry, fencing token, last event seq); the
  SQL stores keep the spec (the contract, megabytes for a long checklist) in a row of
  its own, written at creation and by a contract edit only, so that a commit rewrites
  just the task's small columns;
- **events**: the append-only log, `(task_id, seq)` unique and gapless per task;
- **ledgers**: skeleton and state with their own version (the SQL stores keep each
  item's state in a row of its own, written only when it changes);
- **progress marks**: what the run state holds of each open item's rounds
  (`usage["seen"]`, item -> marks, oldest first); the SQL stores keep them out of the
  task row, one row per mark, written as a delta by the commit that changes them
  (`MarksWrite`), so the row a commit rewrites does not grow with the task's rounds;
- **blobs**: content-addressed payloads (full prompts, tool outputs);
- **ops**, **artifacts**, **approvals**: projections later parts fill;
- **the artifact search index**: the text of each artifact (its blob, when textual),
  written in the transaction that writes the artifact, for `search_artifacts`;
- **shared state**: small JSON documents by key, read and rewritten atomically by
  `update_shared` and shared by every worker of the database (other parts keep their
  breakers and concurrency slots there; the store does not know what they mean).

`commit` is the only write path for a running task: one transaction appends events and
updates projections, guarded by the fencing token the caller got from `claim`.
"""

from __future__ import annotations

import hashlib
import itertools
import operator
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    NotRequired,
    Protocol,
    TypeAlias,
    TypedDict,
    TypeVar,
    Unpack,
    runtime_checkable,
)

from tether._frozen_init import direct_init
from tether.ledger import Ledger

if TYPE_CHECKING:  # the event models load where events are built or decoded, not to read
    from tether import events as ev
    from tether.clock import Clock

T = TypeVar("T")

#: `fn(document or None, now) -> (new document or None, value)` for `update_shared`.
SharedUpdate = Callable[[dict[str, Any] | None, float], tuple[dict[str, Any] | None, T]]

#: A commit's events (`Store.commit`).
Events: TypeAlias = "Sequence[ev.Event]"

#: Highest schema version this tether understands (one per migration file).
SCHEMA_VERSION = 12


def blob_hash(data: bytes) -> str:
    """Content address of a blob: `sha256:<hex>`."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


@dataclass(frozen=True)
class TaskRecord:
    """The task projection as stored."""

    task_id: str
    name: str
    status: str
    stop_reason: str | None
    version: int
    current_milestone: str | None
    spec: dict[str, Any]
    workspace: str | None
    waiting: dict[str, Any] | None
    usage: dict[str, Any]
    cancel_requested: bool
    wake_at: float | None
    created_at: float
    updated_at: float
    heartbeat_at: float | None
    lease_owner: str | None
    lease_expiry: float | None
    fencing_token: int
    last_seq: int


@dataclass(frozen=True)
class StoredEvent:
    """One event as stored, with its envelope."""

    task_id: str
    seq: int
    type: str
    schema_version: int
    data: dict[str, Any]
    task_version: int
    fencing_token: int | None
    at: float

    def typed(self) -> ev.Event:
        """Decode into its typed event (or `UnknownEvent`)."""
        from tether import events as ev

        return ev.decode(self.type, self.data)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "task_id": self.task_id,
            "seq": self.seq,
            "type": self.type,
            "schema_version": self.schema_version,
            "data": self.data,
            "task_version": self.task_version,
            "fencing_token": self.fencing_token,
            "at": self.at,
        }


@dataclass(frozen=True)
class LedgerRecord:
    """The stored ledger."""

    task_id: str
    skeleton: dict[str, Any]
    state: dict[str, Any]
    version: int
    updated_at: float

    def to_ledger(self) -> Ledger:
        """The domain object."""
        return Ledger.from_parts(self.skeleton, self.state, self.version)


@dataclass(frozen=True)
class Lease:
    """Ownership of a task: valid until `expires_at`, proven by `token`."""

    task_id: str
    worker_id: str
    token: int
    expires_at: float


@dataclass(frozen=True)
class TaskPatch:
    """Changes to the task projection; fields left `UNSET` stay as they are."""

    status: str | None = None
    stop_reason: str | None = None
    version: int | None = None
    current_milestone: Any = UNSET
    waiting: Any = UNSET
    usage: dict[str, Any] | None = None
    cancel_requested: bool | None = None
    wake_at: Any = UNSET
    spec: dict[str, Any] | None = None
    #: With `usage`: how its `seen` differs from the stored one (see `MarksWrite`);
    #: None writes `usage["seen"]` whole (what a writer that did not load it sends).
    marks: MarksWrite | None = None


@dataclass(frozen=True)
class MarksWrite:
    """The change a commit makes to a task's progress marks (`usage["seen"]`: item ->
    marks, oldest first), as the writer that loaded them knows it: per item changed, how
    many of its oldest marks go (`None`: all of them, the item forgotten or rewritten)
    and the marks appended after them. The SQL stores write it as rows added and
    removed (the task row no longer carries the marks); the memory store applies it to
    the lists it holds (an item it does not name keeps its stored list), copying only
    the new marks, and copies an item's given list where that would not give its length."""

    items: Mapping[str, tuple[int | None, tuple[str, ...]]] = field(default_factory=dict)

    @classmethod
    def between(
        cls, before: Mapping[str, Sequence[str]], after: Mapping[str, Sequence[str]]
    ) -> MarksWrite:
        """The change from `before` to `after` (item -> marks). An item's marks usually
        only grow at the end and lose their oldest (`progress.remember`): that is sent
        as a trim and the new marks; any other change rewrites the item."""
        items: dict[str, tuple[int | None, tuple[str, ...]]] = {}
        for item in before:
            if item not in after:
                items[item] = (None, ())
        for item, new in after.items():
            old = before.get(item, ())
            if new is old or (len(new) == len(old) and _same(new, old)):
                continue
            items[item] = _grown(old, new)
        return cls(items)


def _same(a: Sequence[str], b: Sequence[str]) -> bool:
    """Whether two mark sequences hold the same marks: compared as they are when of one
    type (a run's lists are, up to 1,000 marks an item: no copies per commit), else as
    tuples."""
    if type(a) is type(b):
        return a == b
    return tuple(a) == tuple(b)


def _grown(old: Sequence[str], new: Sequence[str]) -> tuple[int | None, tuple[str, ...]]:
    """`(trimmed, added)` when `new` is a tail of `old` followed by new marks (the
    last old mark is found from the end: a round adds a few), else `(None, new)`."""
    if not old:
        return 0, tuple(new)
    last = old[-1]
    for p in range(len(new) - 1, -1, -1):
        if new[p] == last:
            kept = p + 1
            if kept <= len(old) and _same(new[:kept], old[len(old) - kept :]):
                return len(old) - kept, tuple(new[kept:])
            break
    return None, tuple(new)


@dataclass(frozen=True)
class LedgerWrite:
    """A new ledger state; refused unless the stored version is `expected_version`.

    `state` holds every item (item id -> state, in contract order), or, when
    `positions` is given, only the items whose state changed, each at the place in the
    contract `positions` gives (in the same order): a commit that moves one item of ten
    thousand sends one item. A write with a `skeleton` always holds every item."""

    state: dict[str, Any]
    version: int
    expected_version: int
    skeleton: dict[str, Any] | None = None
    positions: tuple[int, ...] | None = None

    @classmethod
    def of(
        cls,
        ledger: Ledger,
        expected_version: int,
        *,
        skeleton: bool = False,
        since: Ledger | None = None,
    ) -> LedgerWrite:
        """From a domain ledger. `since`: the ledger as stored (at `expected_version`);
        when it has the same skeleton, only the items that differ from it are sent."""
        if since is None or skeleton or since.skeleton is not ledger.skeleton:
            return cls(
                state=ledger.state_dict(),
                version=ledger.version,
                expected_version=expected_version,
                skeleton=ledger.skeleton.to_dict() if skeleton else None,
            )
        # Items are immutable and a transition keeps the unchanged ones: the objects
        # that differ are the candidates (compared in C, not item by item in Python).
        before, after = since.states, ledger.states
        moved = [
            n
            for n in itertools.compress(range(len(after)), map(operator.is_not, before, after))
            if before[n] != after[n]
        ]
        items = ledger.skeleton.items
        return cls(
            state={items[n].id: after[n].to_dict() for n in moved},
            version=ledger.version,
            expected_version=expected_version,
            positions=tuple(moved),
        )


@direct_init
@dataclass(frozen=True)
class OpRecord:
    """An op (one tool invocation with effects) in the journal."""

    op_id: str
    task_id: str
    round: int
    call_index: int
    tool: str
    args: dict[str, Any]
    args_hash: str
    effect: str
    status: str
    attempts: int = 0
    next_attempt_at: float | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    task_version: int = 1
    created_at: float = 0.0
    updated_at: float = 0.0


@dataclass(frozen=True)
class ArtifactRecord:
    """A stored, content-addressed product with its dependencies."""

    artifact_id: str
    task_id: str
    kind: str
    name: str
    blob_hash: str
    size: int
    source: str = ""
    task_version: int = 1
    deps: tuple[str, ...] = ()
    valid: bool = True
    meta: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0


@dataclass(frozen=True)
class ArtifactHit:
    """One artifact found by `Store.search_artifacts`: the artifact, its rank among the
    hits (higher is more relevant; comparable within one answer only) and an excerpt of
    its indexed text around the matched terms (matches marked `[...]`)."""

    artifact: ArtifactRecord
    score: float
    excerpt: str


@dataclass(frozen=True)
class ApprovalRecord:
    """A request for a human decision, and the decision once made."""

    request_id: str
    task_id: str
    status: str  # pending | approved | rejected
    request: dict[str, Any]
    op_id: str | None = None
    decision: dict[str, Any] | None = None
    decided_by: str | None = None
    created_at: float = 0.0
    decided_at: float | None = None


@direct_init
@dataclass(frozen=True)
class CommitResult:
    """Sequence numbers the commit's events received, and what the committer must know
    of the task row as it found it (a cancel request, the version): a worker learns of
    them with the commit it makes anyway, instead of reading the task every round."""

    first_seq: int
    last_seq: int
    cancel_requested: bool = False
    version: int | None = None


class NewTask(TypedDict):
    """What `Store.create_task` takes (by keyword)."""

    task_id: str
    name: str
    spec: Mapping[str, Any]
    ledger: Ledger
    #: The task's working folder, if any.
    workspace: NotRequired[str | None]
    #: Its first events (`task.created`...), numbered from 1.
    events: NotRequired[Sequence[ev.Event]]


class CommitParts(TypedDict, total=False):
    """What a `Store.commit` writes besides its events (by keyword; each may be left out)."""

    task: TaskPatch | None
    ledger: LedgerWrite | None
    ops: Sequence[OpRecord]
    artifacts: Sequence[ArtifactRecord]
    approvals: Sequence[ApprovalRecord]
    blobs: Sequence[bytes]


@dataclass(frozen=True)
class Commit:
    """One commit as the stores pass it on: `Store.commit`'s arguments, defaults filled."""

    task_id: str
    token: int | None
    events: Sequence[ev.Event]
    task: TaskPatch | None = None
    ledger: LedgerWrite | None = None
    ops: Sequence[OpRecord] = ()
    artifacts: Sequence[ArtifactRecord] = ()
    approvals: Sequence[ApprovalRecord] = ()
    blobs: Sequence[bytes] = ()


class ClaimOptions(TypedDict, total=False):
    """The keywords of `Store.claim` (see there)."""

    task_id: str | None
    force: bool
    from_token: int | None
    exclude: Collection[str]


class EventFilters(TypedDict, total=False):
    """The keywords of `Store.read_events`: at most `limit` events, only of `types`."""

    limit: int | None
    types: Collection[str] | None


class OpFilters(TypedDict, total=False):
    """The keywords of `Store.get_ops`: only these op ids, this round, these tools; a
    page: at most `limit` ops, those after the op `after` (its round, call index and
    id), in that order (a long task's history is read page by page)."""

    op_ids: Collection[str] | None
    round: int | None
    tools: Collection[str] | None
    after: tuple[int, int, str] | None
    limit: int | None


class SearchOptions(TypedDict, total=False):
    """The keywords of `Store.search_artifacts`: only of `kinds`, at most `limit` (10),
    invalid artifacts too if `include_invalid`."""

    kinds: Collection[str] | None
    limit: int
    include_invalid: bool


def refuse_unknown(given: Mapping[str, Any], keywords: Any) -> None:
    """`TypeError` for a keyword `given` that the TypedDict `keywords` does not declare,
    as a signature that spells its keywords out would raise."""
    unknown = set(given) - keywords.__required_keys__ - keywords.__optional_keys__
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")


class OpsStore(Protocol):
    """The store reads of the runtime's `ops` (every write goes through a `commit`)."""

    async def read_events(
        self, task_id: str, after: int = 0, **filters: Unpack[EventFilters]
    ) -> list[StoredEvent]:
        """Events with `seq > after`, in order (at most `limit`, only of `types`)."""
        ...

    async def get_ops(
        self, task_id: str, statuses: Collection[str] | None = None, **filters: Unpack[OpFilters]
    ) -> list[OpRecord]:
        """The op journal of a task, in (round, call_index) order, optionally filtered by
        status, op id, round or tool (each filter uses an index, so a long task's round
        never reads its whole journal; an empty filter matches nothing), or a page of it
        (`limit`, `after`: ordered by round, call index and op id)."""
        ...

    async def get_approvals(
        self, task_id: str, statuses: Collection[str] | None = None
    ) -> list[ApprovalRecord]:
        """A task's approval requests, oldest first."""
        ...


@runtime_checkable
class Store(OpsStore, Protocol):
    """The durable store. Implementations: SQLite, PostgreSQL, in-memory (each subclasses
    this protocol, so the docstrings here are theirs)."""

    url: str
    #: The store's time (leases, wake times, heartbeats): tests move it without waiting.
    clock: Clock

    async def create_task(self, **task: Unpack[NewTask]) -> TaskRecord:
        """Insert a queued task, its ledger and its first events in one transaction."""
        ...

    async def get_task(self, task_id: str) -> TaskRecord:
        """The task projection; `TaskNotFound` if absent."""
        ...

    async def list_tasks(
        self, statuses: Collection[str] | None = None, limit: int = 100
    ) -> list[TaskRecord]:
        """Tasks, newest first, optionally filtered by status."""
        ...

    async def get_ledger(self, task_id: str) -> LedgerRecord:
        """The stored ledger; `TaskNotFound` if absent."""
        ...

    async def commit(
        self, task_id: str, token: int | None, events: Events, **parts: Unpack[CommitParts]
    ) -> CommitResult:
        """Append events and update projections (`parts`) atomically.

        `token` is the fencing token from `claim`; a token other than the task's current
        one raises `StaleLease` and writes nothing. `None` is an out-of-band append (a
        human's decision, a cancel request) that does not need the lease.
        """
        ...

    async def claim(
        self, worker_id: str, ttl: float, **options: Unpack[ClaimOptions]
    ) -> Lease | None:
        """Take the lease on a claimable task (or on `task_id`); the token rises.

        `force` takes `task_id` even from a live lease, for an owner known to be dead;
        the risen fencing token refuses anything the old owner still tries to commit.
        `from_token` (with `force`) takes it only while its fencing token is still that
        one, the lease found dead, checked in the claim's own transaction: a worker
        that claimed the task in between keeps it. `exclude`: task ids a claim of any
        task passes over (a worker's tasks it cannot run).
        """
        ...

    async def live_leases(self, owner_prefix: str) -> list[Lease]:
        """The live leases, whose owner starts with `owner_prefix`, on tasks a claim
        would take but for that lease (a host's workers; see `runtime.worker`)."""
        ...

    async def renew(self, task_id: str, token: int, ttl: float) -> float:
        """Extend our lease; returns the new expiry. `StaleLease` if it is not ours."""
        ...

    async def release(self, task_id: str, token: int) -> None:
        """Give the lease up. `StaleLease` if it is not ours."""
        ...

    async def put_blob(self, data: bytes) -> str:
        """Store bytes under their content address (idempotent)."""
        ...

    async def get_blob(self, ref: str) -> bytes:
        """Bytes by content address; `KeyError` if absent."""
        ...

    async def get_artifacts(
        self, task_id: str, *, artifact_ids: Collection[str] | None = None
    ) -> list[ArtifactRecord]:
        """A task's artifacts, oldest first."""
        ...

    async def get_artifact(self, artifact_id: str) -> ArtifactRecord:
        """One artifact; `KeyError` if absent."""
        ...

    async def search_artifacts(
        self, task_id: str, query: str, **options: Unpack[SearchOptions]
    ) -> list[ArtifactHit]:
        """A task's artifacts ranked by the relevance of their text to `query` (words;
        any of them may match, more and rarer matches rank higher), at most `limit`,
        only of `kinds` if given, valid ones only unless `include_invalid`. The query is
        taken as plain words whatever it holds (no search syntax is interpreted)."""
        ...

    async def update_shared(self, key: str, fn: SharedUpdate[T]) -> T:
        """Read-modify-write the shared document `key` in one transaction; fn's value.

        The document (None if absent) is read with its row locked, `fn(document, now)`
        (now from the store's clock) computes the new document (None deletes it), which
        is written before the lock is released; concurrent updaters of the same key, in
        this process or any other, run one after the other. `fn` runs synchronously,
        possibly in a store thread, and may run inside the database's transaction: it
        must be a quick pure function (no I/O, no awaiting). If it raises, nothing is
        written and the exception propagates.
        """
        ...

    async def get_shared(self, key: str) -> dict[str, Any] | None:
        """The shared document `key`, or None if absent."""
        ...

    async def schema_version(self) -> int:
        """The schema version of the open database."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...
