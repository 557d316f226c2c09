"""What the rule judge knows of the op journal, kept up to date from what changed.

An `op` rule looks for a succeeded op of its tool whose arguments (as sent) match, and
the undone-evidence check asks whether the ops done items cite still hold. Reading every
succeeded op of the rules' tools each round (and every cited op) makes a long task
quadratic. Instead a run keeps, per rule (tool and arguments), the matching succeeded
ops in journal order: read once per turn, then updated from the events committed since
the last look (an op named by an `op.*`, `approval.*` or `artifacts.invalidated` event
may have changed: it is read again by id). A round reads the events of the rounds since
the last judging, not the task's history.

Nothing here is stored: the index is derived from the store (ops, approvals, events),
so a crash, a resume or `tether rebuild` finds the same; a new turn builds it afresh.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import weakref
from collections.abc import Container, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from tether.runtime.judge.rules.own import ARTIFACT_EVENTS, CHANGE_EVENTS, OwnCommits, Seen
from tether.runtime.ops.journal import history_only
from tether.spec import OpRule, TaskSpec
from tether.store.base import ArtifactRecord, OpRecord, StoredEvent
from tether.tools.builtin.files import modified_args
from tether.tools.builtin.sources import snapshot_read_by

if TYPE_CHECKING:
    from tether.runtime.run.ports import JudgeStore

_Key = tuple[str, str]

#: Ops read per page when a run first builds its index.
LOAD_PAGE: Final = 500


def args_match(want: Mapping[str, Any], have: Mapping[str, Any]) -> bool:
    """Whether an op's arguments hold every argument a rule names, with its value."""
    return all(k in have and have[k] == v for k, v in want.items())


async def changes(
    store: JudgeStore,
    task_id: str,
    span: tuple[int, int],
    types: tuple[str, ...],
    own: OwnCommits | None,
) -> tuple[Sequence[Seen | StoredEvent], Mapping[str, OpRecord | None]]:
    """The events of `types` numbered after `span[0]` (`span[1]`: the run's last) and
    the ops the run wrote by them as stored (None: ask the store). Up to the run's last,
    from its own commits when they are all there is (`own`); else, or after it, read."""
    if own is None or (got := own.window(*span)) is None:
        return await store.read_events(task_id, after=span[0], types=types), {}
    later = await own.later(store, task_id, span[1], types)
    # An op named after the run's last commit may have changed since: read, as before.
    return [*(e for e in got.events if e.type in types), *later], {} if later else got.ops


def _key(rule: OpRule) -> _Key:
    return rule.tool, json.dumps(rule.args, sort_keys=True, default=str)


class ToolRules:
    """One tool's rules (key to arguments), found for an op by one of their arguments.

    Checking every rule of the tool against every op made building a run's index
    O(ops x rules): 400,000 comparisons for 8,000 ops of a tool with 50 rules (~0.3 s at
    each resume of a long task), a billion for a checklist of 10,000. Each rule is filed
    under one of its arguments (name and value); an op is checked against the rules filed
    under its own arguments only, and those with no argument that can be filed (none, or
    only lists and mappings) - then `args_match` decides, as before."""

    def __init__(self) -> None:
        self.rules: dict[_Key, Mapping[str, Any]] = {}
        self._by_arg: dict[tuple[str, Any], list[_Key]] = {}
        self._always: list[_Key] = []

    def add(self, key: _Key, args: Mapping[str, Any]) -> None:
        """File the rule `key` with its arguments (a rule already filed is kept)."""
        if key in self.rules:
            return
        self.rules[key] = args
        # A hashable value is found by the op's equal value: dict lookup is by hash and
        # ==, the comparison `args_match` makes (1, 1.0 and True alike).
        arg = next(((k, v) for k, v in sorted(args.items()) if _hashable(v)), None)
        if arg is None:
            self._always.append(key)
        else:
            self._by_arg.setdefault(arg, []).append(key)

    def matching(self, args: Mapping[str, Any]) -> list[_Key]:
        """The keys of the rules whose every argument `args` holds with its value."""
        found = list(self._always)
        for k, v in args.items():
            if _hashable(v):
                found.extend(self._by_arg.get((k, v), ()))
        return [key for key in found if args_match(self.rules[key], args)]


def _hashable(value: Any) -> bool:
    return isinstance(value, str | int | float | bool) or value is None


class OpIndex:
    """Per run and contract: the succeeded ops each `op` rule matches, in journal order
    (round, call index, then the order first seen), and which cited ops were last found
    to hold."""

    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec
        #: Each op rule's key, by item; each tool's rules.
        self.rule_of: dict[str, _Key] = {}
        self.by_tool: dict[str, ToolRules] = {}
        for item in spec.items:
            rule = item.done_when
            if isinstance(rule, OpRule):
                key = _key(rule)
                self.rule_of[item.id] = key
                self.by_tool.setdefault(rule.tool, ToolRules()).add(key, rule.args)
        self.lists: dict[_Key, list[tuple[int, int, int, str]]] = {}
        #: The keys whose list holds an op (kept with `lists`).
        self.hit: set[_Key] = set()
        self.ops: dict[str, OpRecord] = {}
        self.order: dict[str, int] = {}
        self.modified: dict[str, dict[str, Any]] = {}
        #: Event cursor: every change after it is still to be read (None: not loaded).
        self.cursor: int | None = None
        #: The run's last sequence number at the last look: while the run has committed
        #: nothing since, the look is not repeated (a judge pass asks once per rule).
        self.looked_at: int | None = None
        #: Cited op ids found current at the last check, unchanged since.
        self.holding: set[str] = set()
        #: `read_source` ops found not stale, while no artifact was invalidated since.
        self.fresh_reads: set[str] = set()

    # -- keeping up --------------------------------------------------------------------

    async def sync(
        self, store: JudgeStore, task_id: str, last_seq: int, own: OwnCommits | None = None
    ) -> None:
        """Load the index (first use) or apply the changes committed since the last
        look. `last_seq`: a sequence number already committed (the run's last); `own`:
        the run's own commits (`own.OwnCommits`), which spare the reads when nobody else
        committed since."""
        if last_seq != self.looked_at:
            # Else the run committed nothing since the last look: a change committed by
            # another process meanwhile (a person's approval) is read at the run's next
            # commit, as if it had come a moment later (that commit's numbers skip it).
            self.looked_at = last_seq
            await self._catch_up(store, task_id, last_seq, own)

    async def _catch_up(
        self, store: JudgeStore, task_id: str, last_seq: int, own: OwnCommits | None
    ) -> None:
        if self.cursor is None:
            self.cursor = last_seq
            if self.by_tool:
                self.modified = modified_args(
                    await store.get_approvals(task_id, statuses={"approved"})
                )
                await self._load(store, task_id)
            return
        span = (self.cursor, last_seq)
        events, written = await changes(store, task_id, span, CHANGE_EVENTS, own)
        self.cursor = max([self.cursor, last_seq, *(e.seq for e in events)])
        ids: set[str] = set()
        approvals = False
        for e in events:
            d = e.data
            ids.update(v for k in ("op_id", "by") if isinstance(v := d.get(k), str))
            for k in ("ops", "compensate"):
                if isinstance(many := d.get(k), list):
                    ids.update(str(v) for v in many)
            if e.type.startswith("approval."):
                approvals = True
                rid = str(d.get("request_id", ""))
                if rid.endswith(".approval"):
                    ids.add(rid.removesuffix(".approval"))
            if e.type == "artifacts.invalidated":
                # A read proves something only while its snapshot is valid.
                self.fresh_reads.clear()
                self.holding.clear()
        ids = {i for i in ids if "\x00" not in i}
        # A cited op the run rewrote itself still holds if its record as stored now does
        # (what `current_ops` would find reading it again); any other named op is read.
        self.holding -= {i for i in ids if not _holds(written.get(i))}
        if not self.by_tool:
            return
        if approvals:
            self.modified = modified_args(await store.get_approvals(task_id, statuses={"approved"}))
        if ids:
            ask = {i for i in ids if written.get(i) is None}
            known = (written[i] for i in ids - ask)
            got = [o for o in known if o and o.status == "succeeded" and o.tool in self.by_tool]
            if ask:
                got += await store.get_ops(
                    task_id, statuses={"succeeded"}, op_ids=ask, tools=set(self.by_tool)
                )
            got.sort(key=lambda o: (o.round, o.call_index, o.op_id))
            for op_id in ids:
                self._drop(op_id)
            for op in got:
                self._put(op)

    async def _load(self, store: JudgeStore, task_id: str) -> None:
        """Every succeeded op of the rules' tools, a page at a time: a task of days has
        hundreds of thousands, and only the few its rules match are kept."""
        after: tuple[int, int, str] | None = None
        while True:
            page = await store.get_ops(
                task_id, {"succeeded"}, tools=set(self.by_tool), after=after, limit=LOAD_PAGE
            )
            for op in page:
                self._put(op)
            if len(page) < LOAD_PAGE:
                return
            after = (page[-1].round, page[-1].call_index, page[-1].op_id)

    def _put(self, op: OpRecord) -> None:
        if op.op_id in self.modified:
            op = dataclasses.replace(op, args=self.modified[op.op_id])
        self._drop(op.op_id)
        rules = self.by_tool.get(op.tool)
        keys = rules.matching(op.args) if rules is not None else []
        if not keys:
            return
        order = self.order.setdefault(op.op_id, len(self.order))
        self.ops[op.op_id] = op
        for k in keys:
            bisect.insort(self.lists.setdefault(k, []), (op.round, op.call_index, order, op.op_id))
            self.hit.add(k)

    def _drop(self, op_id: str) -> None:
        old = self.ops.pop(op_id, None)
        if old is None:
            return
        entry = (old.round, old.call_index, self.order[op_id], op_id)
        rules = self.by_tool.get(old.tool)
        for k in rules.matching(old.args) if rules is not None else ():
            found = self.lists.get(k, [])
            at = bisect.bisect_left(found, entry)
            if at < len(found) and found[at] == entry:
                del found[at]
                if not found:
                    self.hit.discard(k)

    # -- reading -----------------------------------------------------------------------

    def has_ops(self, item_id: str) -> bool:
        """Whether an item's `op` rule matches a stored succeeded op (`newest_first`)."""
        return self.rule_of.get(item_id) in self.hit

    def candidates(self, fresh: Container[_Key]) -> Candidates:
        """The items whose `op` rule matches a stored succeeded op or a key in `fresh`
        (the rules this round's ops match), as a container: made in constant time."""
        return Candidates(self.rule_of, self.hit, fresh)

    def newest_first(self, item_id: str) -> Iterator[OpRecord]:
        """The stored succeeded ops an item's `op` rule matches, newest first."""
        key = self.rule_of.get(item_id)
        for *_, op_id in reversed(self.lists.get(key, []) if key else []):
            yield self.ops[op_id]


class Candidates:
    """`OpIndex.candidates`: an item is in it when its op rule's key is in either set."""

    __slots__ = ("_fresh", "_hit", "_rule_of")

    def __init__(
        self, rule_of: Mapping[str, _Key], hit: Container[_Key], fresh: Container[_Key]
    ) -> None:
        self._rule_of, self._hit, self._fresh = rule_of, hit, fresh

    def __contains__(self, item_id: object) -> bool:
        key = self._rule_of.get(item_id) if isinstance(item_id, str) else None
        return key is not None and (key in self._hit or key in self._fresh)


def _holds(op: OpRecord | None) -> bool:
    """Whether an op's stored record proves what it did (a read of a source: asked
    again, its snapshot may have changed)."""
    return (
        op is not None
        and op.status == "succeeded"
        and not history_only(op)
        and snapshot_read_by(op) is None
    )


_INDEXES: weakref.WeakKeyDictionary[Any, OpIndex] = weakref.WeakKeyDictionary()


def index_of(run: Any, spec: TaskSpec) -> OpIndex:
    """The index of a run (one per run object and contract: an edit starts a new one)."""
    idx = _INDEXES.get(run)
    if idx is None or idx.spec is not spec:
        idx = _INDEXES[run] = OpIndex(spec)
    return idx


class ArtifactIndex:
    """Per run: the task's valid artifacts in the store's order (created, then id),
    read once per turn and then updated from the events committed since the last look
    (see `OpIndex`)."""

    def __init__(self) -> None:
        self.cursor: int | None = None
        self.summaries = 0
        self.by_id: dict[str, ArtifactRecord] = {}
        self.order: list[tuple[float, str]] = []

    async def sync(
        self,
        store: JudgeStore,
        task_id: str,
        last_seq: int,
        compactions: int,
        own: OwnCommits | None = None,
    ) -> None:
        """Load (first use) or apply what changed since the last look. `compactions`:
        how many compactions the run made (each stored one summary artifact); `own`:
        the run's own commits (see `OpIndex.sync`)."""
        if self.cursor is None:
            self.cursor, self.summaries = last_seq, compactions
            for art in await store.get_artifacts(task_id):
                self._put(art)
            return
        span = (self.cursor, last_seq)
        events, _ = await changes(store, task_id, span, ARTIFACT_EVENTS, own)
        self.cursor = max([self.cursor, last_seq, *(e.seq for e in events)])
        ids: set[str] = set()
        for e in events:
            if isinstance(one := e.data.get("artifact_id"), str):
                ids.add(one)
            if isinstance(many := e.data.get("artifacts"), list):
                ids.update(str(a) for a in many)
        ids.update(f"{task_id}.summary{k}" for k in range(self.summaries + 1, compactions + 1))
        self.summaries = max(self.summaries, compactions)
        ids = {i for i in ids if "\x00" not in i}
        if not ids:
            return
        for art_id in ids:
            self._drop(art_id)
        for art in await store.get_artifacts(task_id, artifact_ids=ids):
            self._put(art)

    def _put(self, art: ArtifactRecord) -> None:
        self._drop(art.artifact_id)
        if art.valid:
            self.by_id[art.artifact_id] = art
            bisect.insort(self.order, (art.created_at, art.artifact_id))

    def _drop(self, art_id: str) -> None:
        old = self.by_id.pop(art_id, None)
        if old is not None:
            self.order.remove((old.created_at, art_id))

    def valid(self) -> list[ArtifactRecord]:
        """The valid artifacts, oldest first."""
        return [self.by_id[i] for _, i in self.order]


_ARTIFACTS: weakref.WeakKeyDictionary[Any, ArtifactIndex] = weakref.WeakKeyDictionary()


def artifacts_of(run: Any) -> ArtifactIndex:
    """The artifact index of a run (one per run object)."""
    idx = _ARTIFACTS.get(run)
    if idx is None:
        idx = _ARTIFACTS[run] = ArtifactIndex()
    return idx
