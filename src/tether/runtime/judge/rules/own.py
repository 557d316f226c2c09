"""What a run committed itself, kept for its judge's indexes (`index`): the events that
may change what they know, and the op records as the store holds them after each commit.

The indexes keep up with the store from the events committed since their last look. The
run knows most of those events already: it committed them. When every sequence number
since an index's cursor up to the run's last is one of the run's own commits (a commit
of someone else, a person's approval or edit, leaves a hole: the numbers are gapless
and shared), those events are the ones kept here and an op the run itself wrote by them
is the record it wrote. What came after the run's last commit is read (`later`: a
tool's own commit during the round, a source snapshot or a claim, is judged with the
round, as before), once for both indexes, and only when the run's store object
committed something for the task since (its `latest`, `store._latest`: a tool commits
through it). Another process's commit since is read at the next look, as after a look
`OpIndex.sync` skips: the run's next commit leaves a hole for it. A hole, or a commit
whose events the store added to (`approval.closed`), sends the index back to the
store, as before.

An op's stored record keeps the fields of its first write (its arguments, round,
tool) and takes the outcome of the latest (`store._rules.merge_op`): the record the
store holds is rebuilt from the op's intent (`op.intended`, committed with its first
write) and the latest write. An op first written before this run (a resumed round) is
read from the store.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final, NamedTuple, Protocol, cast, runtime_checkable

from tether import events as ev
from tether._by_object import keep
from tether.store._latest import Latest
from tether.store._rules import merge_op
from tether.store.base import CommitResult, OpRecord, StoredEvent

if TYPE_CHECKING:
    from tether.runtime.run.ports import JudgeStore

#: Events whose data may name an op whose record changed (keys `op_id`, `by`, `ops`,
#: `compensate`, or an approval's `request_id`), or that invalidate reads.
CHANGE_EVENTS: Final = (
    "op.intended",
    "op.dispatched",
    "op.result",
    "op.committed",
    "op.retry_scheduled",
    "op.reconciled",
    "op.exhausted",
    "op.compensated",
    "approval.requested",
    "approval.decided",
    "approval.closed",
    "artifacts.invalidated",
)

#: Events that name an artifact stored or invalidated, and compactions (whose summary
#: artifact, `<task>.summary<n>`, is stored without an `artifact.stored` event).
ARTIFACT_EVENTS: Final = ("artifact.stored", "artifacts.invalidated", "context.compacted")

#: The commits kept: a round makes two or three; the judge looks once per round.
KEEP: Final = 32
#: The first writes (an op's fields that later writes keep) remembered.
KEEP_OPS: Final = 256


@runtime_checkable
class KnowsLatest(Protocol):
    """A store that tells each task's last number by its commits (`store._latest`)."""

    latest: Latest


#: The keys of an event's data the indexes read: the ids of the ops, approval requests
#: and artifacts it names.
READ_KEYS: Final = ("op_id", "by", "ops", "compensate", "request_id", "artifact_id", "artifacts")


class Seen(NamedTuple):
    """An event of the run's own, as an index reads one (`StoredEvent`'s fields; of its
    data, only `READ_KEYS`: see `read_data`)."""

    seq: int
    type: str
    data: dict[str, Any]


@dataclasses.dataclass
class _Commit:
    first: int
    last: int
    #: False when the store added events of its own (their content is not known here).
    whole: bool
    #: (seq, event) of the kept types.
    events: list[tuple[int, ev.Event]]
    #: Op id -> the record as stored after this commit (None: its first write is not
    #: known here, the store must be asked; or not merged yet, see `writes`).
    ops: dict[str, OpRecord | None]
    #: Op id -> (its first write, this commit's write): the stored record, merged when
    #: an index first reads the commit (`records`). Most commits are never read (a run
    #: without `op` rules, or judged before its index is built): a merge per op written
    #: was most of what keeping them cost.
    writes: dict[str, tuple[_First, OpRecord]] = dataclasses.field(default_factory=dict)

    def records(self) -> dict[str, OpRecord | None]:
        """`ops`, each op the run knows the first write of merged as the store merges."""
        if self.writes:
            for op_id, (first, op) in self.writes.items():
                base = first.base()
                self.ops[op_id] = merge_op(base, op, base.updated_at)
            self.writes.clear()
        return self.ops


class _First:
    """An op's first write as the run made it; its fields that later writes keep
    (`base`: without an outcome) made when first needed."""

    __slots__ = ("_base", "op")

    def __init__(self, op: OpRecord) -> None:
        self.op = op
        self._base: OpRecord | None = None

    def base(self) -> OpRecord:
        """The first write without its outcome (what `merge_op` merges a write over)."""
        if self._base is None:
            self._base = dataclasses.replace(self.op, result=None, error=None)
        return self._base


class Window(NamedTuple):
    """The run's own commits between two sequence numbers."""

    events: list[Seen]
    #: The ops written in them, as stored after the last (None: ask the store).
    ops: dict[str, OpRecord | None]


class OwnCommits:
    """The run's recent commits (see the module docstring)."""

    def __init__(self, types: Iterable[str], *, active: bool = True) -> None:
        self.types = frozenset(types)
        #: False until an index asks for the run's commits (`own_commits`): most runs
        #: never build one (no `op` or `artifact` rule, no done item citing an op), and
        #: keeping every commit cost a round more than their judging. An index's first
        #: look reads the store (its cursor starts there), so nothing before it is needed.
        self.active = active
        self.commits: deque[_Commit] = deque(maxlen=KEEP)
        self.first_writes: OrderedDict[str, _First] = OrderedDict()
        #: (the number read after, what was read, the types of the indexes it served)
        self._later: tuple[int, list[StoredEvent], set[tuple[str, ...]]] | None = None

    def add(self, res: CommitResult, events: Sequence[ev.Event], ops: Sequence[OpRecord]) -> None:
        """A commit the store accepted: `events` and `ops` as written."""
        if not self.active:
            return
        intended = {e.op_id for e in events if isinstance(e, ev.OpIntended)} if ops else ()
        stored: dict[str, OpRecord | None] = {}
        writes: dict[str, tuple[_First, OpRecord]] = {}
        for op in ops:
            first = self.first_writes.get(op.op_id)
            if first is None and op.op_id in intended and op.op_id not in stored:
                first = self.first_writes[op.op_id] = _First(op)
                if len(self.first_writes) > KEEP_OPS:
                    self.first_writes.popitem(last=False)
            # The store's own merge (the outcome of the latest write over the first),
            # made when the commit is read (`_Commit.records`).
            stored[op.op_id] = None
            if first is not None:
                writes[op.op_id] = (first, op)
        if res.last_seq < res.first_seq and not stored:
            return  # no events, no ops: nothing an index reads changed
        types = self.types
        kept = [(res.first_seq + n, e) for n, e in enumerate(events) if e.TYPE in types]
        whole = res.last_seq - res.first_seq + 1 == len(events)
        self.commits.append(_Commit(res.first_seq, res.last_seq, whole, kept, stored, writes))

    async def later(
        self, store: JudgeStore, task_id: str, upto: int, types: Sequence[str]
    ) -> list[StoredEvent]:
        """The events of `types` committed after `upto` (the run's last number): a tool's
        own commit during the round (a source snapshot, a claim) or another process's
        since; none without a read when the store object committed nothing for the task
        since `upto`. One read serves each index once (both look in one judging); an
        index that asks again reads again, as it did before."""
        latest = _latest_of(store)
        if latest is not None and latest.get(task_id) == upto:
            # Nothing was committed through the run's store since its last commit (a
            # tool's own commit goes through it): nothing to read. Another process's
            # commit since is read at the next look, as after a look the run skips
            # (`OpIndex.sync`): the numbers of the run's next commit skip it (a hole).
            return []
        want = tuple(types)
        if self._later is None or self._later[0] != upto or want in self._later[2]:
            self._later = (
                upto,
                await store.read_events(task_id, after=upto, types=self.types),
                set(),
            )
        self._later[2].add(want)
        return [e for e in self._later[1] if e.type in want]

    def window(self, after: int, upto: int) -> Window | None:
        """The events numbered after `after` up to `upto` and the ops written by them,
        when every one of those numbers is a whole commit of the run's own; else None."""
        nxt = after + 1
        found = Window([], {})
        for c in self.commits:
            if c.last < c.first:  # ops written without events, between two numbers
                if c.first == nxt:
                    found.ops.update(c.records())
                continue
            if c.last < nxt:
                continue  # before the window
            if c.first > upto:
                break
            if c.first != nxt or not c.whole:
                return None
            found.events.extend(Seen(seq, e.TYPE, read_data(e)) for seq, e in c.events)
            found.ops.update(c.records())
            nxt = c.last + 1
        return found if nxt == upto + 1 else None


def read_data(event: ev.Event) -> dict[str, Any]:
    """`event.data()` cut to `READ_KEYS`, taken from the model's fields as they are: the
    kept types' such fields are strings, lists of strings or None, the same in the
    model as in its JSON payload (a test holds it). Serializing the whole payload (an
    intent's arguments, a result's summary) was most of what reading a commit cost."""
    fields = vars(event)
    return {k: fields[k] for k in READ_KEYS if k in fields}


#: Whether each live store object tells its tasks' last numbers (`KnowsLatest`): the
#: protocol check looks for each member (~10 microseconds), and was made once a round.
_KNOWS: dict[int, bool] = {}


def _latest_of(store: object) -> Latest | None:
    """The store object's `latest` if it keeps one (`KnowsLatest`), else None."""
    knows = _KNOWS.get(id(store))
    if knows is None:
        knows = keep(_KNOWS, store, isinstance(store, KnowsLatest))
    return cast(KnowsLatest, store).latest if knows else None


_OWN: weakref.WeakKeyDictionary[Any, OwnCommits] = weakref.WeakKeyDictionary()


def recording(run: Any) -> OwnCommits:
    """A new record of `run`'s own commits (`own_commits`): its journal tells it of each
    commit (`OwnCommits.add`), kept from the first time an index asks for them."""
    own = _OWN[run] = OwnCommits((*CHANGE_EVENTS, *ARTIFACT_EVENTS), active=False)
    return own


def own_commits(run: Any) -> OwnCommits | None:
    """What `run` committed through `recording`, if it does; its commits are kept from
    now on. Asked before an index's look, whose first reads the store: a window it asks
    for later starts at that look, and a commit the record holds no trace of is a hole
    (`OwnCommits.window` answers None: the store is read, as without a record)."""
    own = _OWN.get(run)
    if own is not None:
        own.active = True
    return own
