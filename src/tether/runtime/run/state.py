"""The durable run state of a task: counters, spend, and the runtime's bookkeeping;
and what a run knows of its task (`RunView`).

`RunState` is what the engine keeps between rounds and across restarts, beside the
ledger: how far the task got (rounds, turns), what it spent (tokens, money, wall time,
per purpose and per milestone), where its context starts (system prompt and snapshot
blobs), the round in flight, and what the judge's audits remember (evidence credited
to each item, what each open item's rounds did, failures seen, a judge's proposals).
It is stored as JSON in the task row's `usage` column, written with every commit
under the fencing token, but for `seen` (what each open item's rounds did, a thousand
marks an item at most): the SQL stores keep those marks in rows of their own, and a
run's commit sends only how they changed (`marks_write`). `from_dict`
reads rows written by older versions (missing keys take their defaults, unknown keys
are kept), and `to_dict` writes the same key names, so readers of `usage` see one
format.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from pathlib import Path

    from tether import ledger as L
    from tether.clock import Clock
    from tether.models.base import Usage
    from tether.spec import TaskSpec
    from tether.store.base import MarksWrite, TaskRecord

#: Bumped when a field changes meaning; `from_dict` reads every older version.
STATE_VERSION: Final = 2


@dataclass
class Spend:
    """Calls, tokens and money of one purpose (act, judge, compact, review)."""

    calls: int = 0
    input: int = 0
    output: int = 0
    cached: int = 0
    cost_usd: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "calls": self.calls,
            "input": self.input,
            "output": self.output,
            "cached": self.cached,
            "cost_usd": self.cost_usd,
        }

    @classmethod
    def from_dict(cls, d: Any) -> Spend:
        """Inverse of `to_dict` (tolerant)."""
        d = d if isinstance(d, dict) else {}
        return cls(
            calls=int(d.get("calls", 0)),
            input=int(d.get("input", 0)),
            output=int(d.get("output", 0)),
            cached=int(d.get("cached", 0)),
            cost_usd=float(d.get("cost_usd", 0.0)),
        )


@dataclass
class RunState:
    """Everything the runtime remembers about a task besides its ledger and journal."""

    # progress
    rounds: int = 0
    turns: int = 0
    last_seq: int = 0
    # spend
    model_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0
    wall_seconds: float = 0.0
    last_call_at: float = 0.0
    by_purpose: dict[str, Spend] = field(default_factory=dict)
    #: Per milestone: tokens, cost_usd, wall_seconds.
    milestone_usage: dict[str, dict[str, float]] = field(default_factory=dict)
    milestone_rounds: dict[str, int] = field(default_factory=dict)
    # the context: epoch blobs and the last compaction snapshot
    system_blob: str | None = None
    system_version: int = 0
    system_at: float = 0.0
    tools_blob: str | None = None
    epoch_blob: str | None = None
    ctx_blob: str | None = None
    ctx_after_seq: int = 0
    compactions: int = 0
    token_ratio: float | None = None
    # the round in flight: its decision is committed, its results are not
    inflight: dict[str, Any] | None = None
    # a round whose results are committed but not yet judged (an LLM judge's call)
    unjudged: dict[str, Any] | None = None
    # the audits' memory
    focus_log: list[list[Any]] = field(default_factory=list)
    credited: dict[str, list[str]] = field(default_factory=dict)
    proposals: dict[str, dict[str, str]] = field(default_factory=dict)
    failure_keys: dict[str, int] = field(default_factory=dict)
    #: Per open item: fingerprints of what its rounds did (`progress.moves`), and how
    #: many rounds it had; dropped when the item is no longer open.
    seen: dict[str, list[str]] = field(default_factory=dict)
    item_rounds: dict[str, int] = field(default_factory=dict)
    #: Per open item: its rounds as the focus in all, not started again by a round that
    #: finished another item (as `item_rounds` is) but given back `facts.SIDE_ROUNDS`
    #: by it, for `facts.MEASURED_CAPS`.
    item_focus_total: dict[str, int] = field(default_factory=dict)
    evidence_count: int = 0
    #: Cited ops of reconciling tools the service confirmed at a recovery (asked once
    #: while cited, see `deliverables.recheck_ops`); only ops done items cite.
    rechecked: list[str] = field(default_factory=list)
    #: Files done items' rules accepted, as the task's own tools (not tether's:
    #: `progress.own_work`) left them: path -> [sha256, size, round] (`recovery.rewrites`).
    rewritten: dict[str, list[Any]] | None = None
    malformed_calls: int = 0
    validation_failures: int = 0
    completion_failures: int = 0
    completion_failed_round: int | None = None
    #: A person's sign-off (`review: human`): `{"ledger_version": ..., "by": ...}`.
    signed_off: dict[str, Any] | None = None
    #: Restarts after a crash in a row, and the round count at the last one: a task
    #: that crashes again before finishing a round is in a crash loop.
    crash_streak: int = 0
    crash_rounds_mark: int = -1
    budget_marks: list[str] = field(default_factory=list)
    #: Keys written by a newer tether, kept as they were.
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        #: `seen` as the store holds it, item -> (its list, its length), at the load or the
        #: last `marks_write`; None: not known (the next commit writes `seen` whole).
        self._marks_base: dict[str, tuple[list[str], int]] | None = None
        #: Accepted files' size and modification time at this run's last look
        #: (`recovery.rewrites.note`): not stored, a new run looks again.
        self.file_stats: dict[str, tuple[int, int]] = {}

    # -- derived ------------------------------------------------------------------------

    @property
    def tokens(self) -> int:
        """Input plus output tokens of every call."""
        return self.input_tokens + self.output_tokens

    def spend(self, purpose: str) -> Spend:
        """The spend of one purpose (created on first use)."""
        return self.by_purpose.setdefault(purpose, Spend())

    def count_call(self, purpose: str, usage: Usage, cost: float, milestone: str | None) -> None:
        """Count one model call: the run's totals, its purpose's spend and its
        milestone's share (the actor's rounds and the status probe alike)."""
        self.model_calls += 1
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.cached_tokens += usage.cached_input_tokens
        self.cost_usd += cost
        self.count_for_milestone(
            milestone, tokens=usage.input_tokens + usage.output_tokens, cost_usd=cost
        )
        spend = self.spend(purpose)
        spend.calls += 1
        spend.input += usage.input_tokens
        spend.output += usage.output_tokens
        spend.cached += usage.cached_input_tokens
        spend.cost_usd += cost

    def focus_of(self, round_no: int) -> str | None:
        """The focus item of a round, from the focus log (one entry where it changed)."""
        found: str | None = None
        for start, item in self.focus_log:
            if int(start) > round_no:
                break
            found = item
        return found

    def count_for_milestone(self, milestone: str | None, **amounts: float) -> None:
        """Add to a milestone's share of the spend."""
        if milestone is None:
            return
        m = self.milestone_usage.setdefault(milestone, {})
        for key, amount in amounts.items():
            m[key] = m.get(key, 0) + amount

    # -- storage ------------------------------------------------------------------------

    def marks_write(self) -> MarksWrite | None:
        """How `seen` changed since the load or the last call, for the commit that
        stores it with `to_dict` (`TaskPatch.marks`): from then on it counts as stored.
        None when that is not known (`marks_unsure`): the commit writes `seen` whole.

        An item's list is replaced when it changes, never changed in place
        (`progress.remember` makes a new one): the list last sent is what the store
        holds, so it is kept as it is (a thousand marks are not copied per commit), and
        a list that is the one last sent, of the same length, is not compared. A list
        changed in place anyway (its length moved) is written whole."""
        base = self._marks_base
        if base is None:
            self._marks_base = {k: (v, len(v)) for k, v in self.seen.items()}
            return None
        seen = self.seen
        if len(base) == len(seen):
            # Most commits change no list (a round's first; its second changes one): told
            # before anything is built for a change.
            for item, marks in seen.items():
                held = base.get(item)
                if held is None or held[0] is not marks or held[1] != len(marks):
                    break
            else:
                return _no_marks_change()
        from tether.store.base import MarksWrite

        before: dict[str, list[str]] = {}
        after: dict[str, list[str]] = {}
        rewritten: list[str] = []
        for item, marks in self.seen.items():
            held = base.get(item)
            if held is None or held[0] is not marks or held[1] != len(marks):
                after[item] = marks
                if held is not None:
                    if held[0] is marks:
                        rewritten.append(item)  # what it held before is not known
                    else:
                        before[item] = held[0]
                base[item] = (marks, len(marks))
        for item in [k for k in base if k not in self.seen]:
            before[item] = base.pop(item)[0]
        change = MarksWrite.between(before, after)
        if rewritten:
            change = MarksWrite(
                {**change.items, **{k: (None, tuple(self.seen[k])) for k in rewritten}}
            )
        return change

    def marks_unsure(self) -> None:
        """A commit that carried a `marks_write` may not have happened (it failed): the
        next one writes `seen` whole."""
        self._marks_base = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON stored in the task row's `usage` column (written with every commit,
        so it is built cheaply: containers are shared, not copied — the store serializes
        or copies what it keeps)."""
        # The instance's fields in one copy of its `__dict__` (in field order, as a loop
        # over them wrote them), then what is not stored taken out.
        out: dict[str, Any] = {**self.extra, **self.__dict__} if self.extra else dict(self.__dict__)
        for name in _NOT_STORED:
            del out[name]
        for name in _OPTIONAL:
            if out[name] is None:
                del out[name]
        out["by_purpose"] = {k: v.to_dict() for k, v in self.by_purpose.items()}
        out["state_version"] = STATE_VERSION
        return out

    @classmethod
    def from_dict(cls, data: Any) -> RunState:
        """Read a stored `usage` document of any version (missing keys: defaults)."""
        d = dict(data) if isinstance(data, dict) else {}
        d.pop("state_version", None)
        known = {f.name for f in fields(cls)} - {"extra"}
        state = cls(extra={k: v for k, v in d.items() if k not in known})
        for name in known & set(d):
            value = d[name]
            if name == "by_purpose":
                value = {k: Spend.from_dict(v) for k, v in (value or {}).items()}
            setattr(state, name, _coerce(getattr(cls(), name), value))
        state._marks_base = {k: (v, len(v)) for k, v in state.seen.items()}
        return state


#: What `to_dict` takes out of a copy of the instance's `__dict__`: `extra` (merged
#: first), `by_purpose` (converted, and written after the other fields) and the private
#: attributes.
_NOT_STORED: Final = ("extra", "by_purpose", "_marks_base", "file_stats")
#: The fields that may be None (not stored then): those whose default is None.
_OPTIONAL: Final = tuple(
    f.name for f in fields(RunState) if f.default is None and f.name not in _NOT_STORED
)


#: `MarksWrite` of no change (`_no_marks_change`), made at its first use: one for every
#: commit that changes no marks; its `items` cannot be changed.
_NO_MARKS_CHANGE: list[MarksWrite] = []


def _no_marks_change() -> MarksWrite:
    if not _NO_MARKS_CHANGE:
        from tether.store.base import MarksWrite

        _NO_MARKS_CHANGE.append(MarksWrite(MappingProxyType({})))
    return _NO_MARKS_CHANGE[0]


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _coerce(default: Any, value: Any) -> Any:
    """A stored value in the type of the field's default (old rows stored ints as
    floats now and then); a value of the wrong shape falls back to the default."""
    if value is None:
        return default if not isinstance(default, dict | list) else type(default)()
    if isinstance(default, bool):
        return bool(value)
    if isinstance(default, int) and not isinstance(value, dict | list):
        try:
            return int(value)
        except (TypeError, ValueError):
            return default
    if isinstance(default, float) and not isinstance(value, dict | list):
        try:
            return float(value)
        except (TypeError, ValueError):
            return default
    if isinstance(default, dict) and not isinstance(value, dict):
        return {}
    if isinstance(default, list) and not isinstance(value, list):
        return []
    return _copy(value)


class RunView:
    """What a run knows of its task (`ports.TaskView`): the task row, the contract, the
    ledger and the run's state, as loaded at the run's start and kept by its commits.
    `task`, `spec` and `ledger` are set by the run's `load`; the journal keeps `ledger`
    and `state` as its commits move them."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.task: TaskRecord
        self._spec: TaskSpec | None = None
        self.ledger: L.Ledger
        self.state = RunState()
        self.workspace: Path | None = None

    @property
    def spec(self) -> TaskSpec:
        """The contract; reading it before the run has loaded the task is a bug."""
        if self._spec is None:
            raise RuntimeError("the run has not loaded its task yet")
        return self._spec

    @spec.setter
    def spec(self, value: TaskSpec) -> None:
        self._spec = value

    @property
    def loaded(self) -> bool:
        """True once the task was read (its contract is known)."""
        return self._spec is not None
