"""Artifacts that depend on each other and on source versions, and exact invalidation.

An artifact (`tether.store.base.ArtifactRecord`) has a kind (see `KINDS`) and `deps`:
refs of what it was made from, `artifact:<id>` or `source:<id>@<version>`. A source
snapshot depends on its source version, evidence on the snapshot it quotes, a claim on
its evidence, a report section on its claims. When a source version changes, exactly
the artifacts that depend on the old version, directly or through other artifacts,
become invalid (evidence, then claims, then sections, then the report); nothing else is
touched. Invalid artifacts stay in the store as history (`valid` false, the reason in
their meta) and are never current again; the items whose evidence cited one return to
pending with the reason.

The results of rounds made from the old version go to history with them: each
succeeded `read_source` op of a changed source (its result is the old version's text)
is marked `superseded_by` the new task version, as a late result of an older goal is
(`runtime.ops.superseded_by`), so no judge counts it and no item can cite it again;
whatever was made from such an op (`op:<id>` dependents, a large output's artifact) is
invalidated, and an item whose evidence cites one reopens. `history` lists both.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final

from tether import errors
from tether import ledger as L
from tether.store.base import ArtifactRecord, OpRecord, Store

if TYPE_CHECKING:  # `tether status` reads artifacts without the contract or event models
    from tether import events as ev
    from tether.spec import TaskSpec

#: The kinds of artifacts tether knows (a user's tool may add others).
KINDS: Final[tuple[str, ...]] = (
    "source_snapshot",
    "evidence",
    "claim",
    "report_section",
    "report",
    "tool_output",
    "summary",
)
#: Meta key holding why and when an artifact became invalid.
INVALIDATED: Final = "invalidated"
#: The tool whose results are reads of a source (their args name it: `source`).
READ_SOURCE: Final = "read_source"
#: Op result keys marking a result made from an old source version (history).
SUPERSEDED_BY: Final = "superseded_by"
STALE: Final = "stale"


def source_ref(source_id: str, version: str) -> str:
    """The dependency ref of a source at a version: `source:<id>@<version>`."""
    return f"source:{source_id}@{version}"


def artifact_ref(artifact_id: str) -> str:
    """The dependency (and evidence) ref of an artifact: `artifact:<id>`."""
    return f"artifact:{artifact_id}"


def dependents(artifacts: Iterable[ArtifactRecord], roots: Collection[str]) -> list[ArtifactRecord]:
    """The valid artifacts that depend on any of `roots` (refs), directly or through
    other artifacts, in store order. Iterative, so a long chain cannot overflow."""
    arts = [a for a in artifacts if a.valid]
    users: dict[str, list[ArtifactRecord]] = {}
    for a in arts:
        for dep in a.deps:
            users.setdefault(dep, []).append(a)
    hit: dict[str, ArtifactRecord] = {}
    todo = list(roots)
    while todo:
        ref = todo.pop()
        for a in users.get(ref, ()):
            if a.artifact_id not in hit:
                hit[a.artifact_id] = a
                todo.append(artifact_ref(a.artifact_id))
    return [a for a in arts if a.artifact_id in hit]


def invalidated(
    records: Sequence[ArtifactRecord], reason: str, *, version: int | None = None
) -> list[ArtifactRecord]:
    """The records as written when they become invalid (history, never current)."""
    mark = {"reason": reason, **({"task_version": version} if version is not None else {})}
    return [replace(a, valid=False, meta={**a.meta, INVALIDATED: mark}) for a in records]


def op_ref(op_id: str) -> str:
    """The dependency (and evidence) ref of an op: `op:<id>`."""
    return f"op:{op_id}"


def source_of(ref: str) -> str | None:
    """The source id of a `source:<id>@<version>` ref (None for another ref)."""
    if not ref.startswith("source:"):
        return None
    return ref[len("source:") :].partition("@")[0]


def is_history(op: OpRecord) -> bool:
    """True if the op's result was sent to history (an older goal or source version)."""
    return isinstance((op.result or {}).get(SUPERSEDED_BY), int)


def reads_of(ops: Iterable[OpRecord], source_id: str) -> list[OpRecord]:
    """The current (not history) succeeded `read_source` ops that read `source_id`."""
    return [
        o
        for o in ops
        if o.tool == READ_SOURCE
        and o.status == "succeeded"
        and o.args.get("source") == source_id
        and not is_history(o)
    ]


def superseded(ops: Sequence[OpRecord], reason: str, version: int) -> list[OpRecord]:
    """The op records as written when their results go to history: the result kept
    (the conversation still shows it) and marked `superseded_by` with the reason."""
    return [
        replace(o, result={**(o.result or {}), SUPERSEDED_BY: version, STALE: reason}) for o in ops
    ]


def reopen_citing(
    ledger: L.Ledger, artifact_ids: Collection[str], reason: str, *, op_ids: Collection[str] = ()
) -> tuple[L.Ledger, list[str]]:
    """The ledger with every done item whose evidence cites one of `artifact_ids` (or
    of `op_ids`) back to pending (its note says why); returns it and the reopened ids."""
    refs = {artifact_ref(i) for i in artifact_ids} | {op_ref(i) for i in op_ids}
    reopened = []
    for d, s in ledger.items():
        if s.status == "done" and refs.intersection(s.evidence):
            ledger = L.reopen(ledger, d.id, reason).ledger
            reopened.append(d.id)
    return ledger, reopened


@dataclass(frozen=True)
class Invalidation:
    """What a source change invalidates: the records to write, the reopened ledger and
    the events that say so (empty when nothing depended on the old versions)."""

    records: list[ArtifactRecord]
    ledger: L.Ledger
    reopened: list[str]
    events: list[ev.Event]
    #: Ops whose results read an old version, as written when they go to history.
    ops: list[OpRecord] = field(default_factory=list)


def changed_sources(old: TaskSpec, new: TaskSpec) -> dict[str, str]:
    """`{source ref of the old version: why}` for each declared source whose version or
    location changed, or that the new contract dropped."""
    after = {s.id: s for s in new.sources}
    out: dict[str, str] = {}
    for s in old.sources:
        now = after.get(s.id)
        ref = source_ref(s.id, s.version)
        if now is None:
            out[ref] = f"source {s.id} was removed from the contract"
        elif now.version != s.version:
            out[ref] = f"source {s.id} changed from version {s.version} to {now.version}"
        elif now.location != s.location:
            out[ref] = f"source {s.id} moved from {s.location} to {now.location}"
    return out


def plan_invalidation(
    artifacts: Sequence[ArtifactRecord],
    ledger: L.Ledger,
    roots: Mapping[str, str],
    *,
    version: int | None = None,
    ops: Sequence[OpRecord] = (),
) -> Invalidation:
    """Everything that depends on `roots` (`{ref: reason}`), transitively, made invalid,
    the reads of a changed source among `ops` sent to history (with what was made from
    them), and the items any of it proved reopened. Pure."""
    from tether import events as ev

    records: list[ArtifactRecord] = []
    stale_ops: list[OpRecord] = []
    events: list[ev.Event] = []
    reopened: list[str] = []
    seen: set[str] = set()
    seen_ops: set[str] = set()
    before = ledger
    for root, reason in roots.items():
        sid = source_of(root)
        reads = [o for o in reads_of(ops, sid) if o.op_id not in seen_ops] if sid else []
        seen_ops.update(o.op_id for o in reads)
        refs = [root, *(op_ref(o.op_id) for o in reads)]
        hit = [a for a in dependents(artifacts, refs) if a.artifact_id not in seen]
        if not hit and not reads:
            continue
        seen.update(a.artifact_id for a in hit)
        records += invalidated(hit, reason, version=version)
        if version is not None:
            stale_ops += superseded(reads, reason, version)
        ledger, items = reopen_citing(
            ledger,
            [a.artifact_id for a in hit],
            f"{reason}; its evidence is invalid",
            op_ids=[o.op_id for o in reads],
        )
        reopened += items
        events.append(
            ev.ArtifactsInvalidated(
                artifacts=[a.artifact_id for a in hit],
                reason=reason,
                roots=[root],
                items=items,
                ops=[o.op_id for o in reads],
            )
        )
    if reopened:
        # The full diff, so the ledger can be folded back from the log.
        changes = L.diff(before, ledger).to_list()
        events.append(ev.LedgerUpdated(version=ledger.version, diff=changes, cause="invalidation"))
    return Invalidation(records, ledger, reopened, events, stale_ops)


async def invalidate_for_edit(
    store: Store,
    task_id: str,
    old: TaskSpec,
    new: TaskSpec,
    ledger: L.Ledger,
    *,
    version: int,
) -> Invalidation:
    """What an edit of the contract's sources invalidates (for `tether edit`)."""
    roots = changed_sources(old, new)
    if not roots:
        return Invalidation([], ledger, [], [])
    arts = await store.get_artifacts(task_id)
    reads = await store.get_ops(task_id, statuses={"succeeded"}, tools={READ_SOURCE})
    return plan_invalidation(arts, ledger, roots, version=version, ops=reads)


def source_changes(spec: Mapping[str, Any], assignments: Sequence[str]) -> dict[str, Any]:
    """The partial spec for `tether edit --source ID=VERSION` (also `ID=VERSION@LOCATION`
    to move it): the contract's `sources` list with those versions changed. A bad
    assignment or an unknown source id raises `UserError`."""
    sources = [dict(s) for s in spec.get("sources", [])]
    by_id = {str(s.get("id")): s for s in sources}
    seen: set[str] = set()
    for entry in assignments:
        sid, sep, rest = entry.partition("=")
        version, at, location = rest.partition("@")
        if not sep or not sid.strip() or not version.strip():
            raise errors.UserError(f"--source {entry!r}: expected ID=VERSION, e.g. --source B=3.0")
        if sid.strip() not in by_id:
            known = ", ".join(by_id) or "none declared"
            raise errors.UserError(
                f"--source {entry!r}: no source {sid.strip()!r} (sources: {known})"
            )
        if sid.strip() in seen:  # which one was meant? the last would win silently
            raise errors.UserError(f"--source {entry!r}: source {sid.strip()!r} is given twice")
        seen.add(sid.strip())
        by_id[sid.strip()]["version"] = version.strip()
        if at:
            by_id[sid.strip()]["location"] = location.strip()
    return {"sources": sources}


# --- reading the graph ---------------------------------------------------------------------


async def status_view(store: Store, task_id: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """What `tether status` shows of sources: each declared source with its version and
    pin, and (when the contract declares sources) the invalidated artifacts."""
    sources = [
        {k: s.get(k) for k in ("id", "kind", "version", "location", "pin")}
        for s in spec.get("sources", [])
    ]
    if not sources:
        return {"sources": []}
    arts = await store.get_artifacts(task_id)
    invalid = [describe(a) for a in arts if not a.valid]
    reads = await store.get_ops(task_id, statuses={"succeeded"}, tools={READ_SOURCE})
    stale = [describe_op(o) for o in reads if is_history(o)]
    return {
        "sources": sources,
        "artifacts": {
            "current": sum(1 for a in arts if a.valid),
            "invalid": [
                {"artifact_id": d["artifact_id"], "kind": d["kind"], "reason": d["invalid_reason"]}
                for d in invalid[-50:]
            ],
            "invalid_count": len(invalid),
            "stale_reads": stale[-50:],
            "stale_read_count": len(stale),
        },
    }


async def history(store: Store, task_id: str) -> dict[str, list[dict[str, Any]]]:
    """What a task keeps as history, never current: its invalidated artifacts and the
    source reads whose results were sent to history (described, oldest first)."""
    arts = await store.get_artifacts(task_id)
    reads = await store.get_ops(task_id, statuses={"succeeded"}, tools={READ_SOURCE})
    return {
        "artifacts": [describe(a) for a in arts if not a.valid],
        "ops": [describe_op(o) for o in reads if is_history(o)],
    }


def describe_op(op: OpRecord) -> dict[str, Any]:
    """A source read sent to history, JSON-ready."""
    res = op.result or {}
    return {
        "op_id": op.op_id,
        "tool": op.tool,
        "source": op.args.get("source"),
        "round": op.round,
        "task_version": op.task_version,
        "superseded_by": res.get(SUPERSEDED_BY),
        "reason": res.get(STALE),
    }


def describe(art: ArtifactRecord) -> dict[str, Any]:
    """One artifact, JSON-ready, as `tether artifacts` shows it."""
    mark = art.meta.get(INVALIDATED)
    return {
        "artifact_id": art.artifact_id,
        "kind": art.kind,
        "name": art.name,
        "valid": art.valid,
        "deps": list(art.deps),
        "size": art.size,
        "source": art.source,
        "task_version": art.task_version,
        "invalid_reason": mark.get("reason") if isinstance(mark, dict) else None,
        "created_at": art.created_at,
    }


def tree(artifacts: Sequence[ArtifactRecord]) -> list[dict[str, Any]]:
    """The dependency graph as a forest: each root (an artifact depending on no other
    artifact of the list) with the artifacts made from it below. An artifact made from
    several appears under each of them."""
    by_id = {a.artifact_id: a for a in artifacts}
    children: dict[str, list[str]] = {}
    roots = []
    for a in artifacts:
        parents = [d.partition(":")[2] for d in a.deps if d.startswith("artifact:")]
        parents = [p for p in parents if p in by_id]
        for p in parents:
            children.setdefault(p, []).append(a.artifact_id)
        if not parents:
            roots.append(a.artifact_id)

    def node(ident: str, path: frozenset[str]) -> dict[str, Any]:
        kids = [k for k in children.get(ident, []) if k not in path]
        return {
            **describe(by_id[ident]),
            "children": [node(k, path | {k}) for k in kids] if len(path) < 50 else [],
        }

    return [node(r, frozenset({r})) for r in roots]


#: Meta keys of an evidence artifact that stands for a workspace file: its path, the
#: accepted content's hash and size, the text its rule asked for, the round it was
#: accepted in (see `runtime.recovery.deliverables`).
DELIVERABLE_KEY: Final = "deliverable"
SHA256_KEY: Final = "sha256"
SIZE_KEY: Final = "file_size"
CONTAINS_KEY: Final = "contains"
ROUND_KEY: Final = "round"
#: A tool output's call (its op's `args_hash`): an artifact rule counts one call's
#: outputs once, whatever they said (a page stamped with the time it was made).
CALL_KEY: Final = "call"
#: The sha256 of the file before the task started, for a `fresh` rule's file that was
#: there: the deliverable put back to it is broken, however it got there.
BEFORE_KEY: Final = "sha256_before_task"


def deliverable_meta(
    path: str, data: bytes, contains: str | None = None, before: str | None = None
) -> dict[str, Any]:
    """The meta of an evidence artifact that accepts workspace file `path` with `data`
    (`contains`: the text the accepting rule asked for; `before`: the file's sha256
    before the task, which a `fresh` rule refuses)."""
    meta: dict[str, Any] = {
        DELIVERABLE_KEY: path,
        SHA256_KEY: hashlib.sha256(data).hexdigest(),
        SIZE_KEY: len(data),
    }
    if contains is not None:
        meta[CONTAINS_KEY] = contains
    if before is not None:
        meta[BEFORE_KEY] = before
    return meta


def stored_event(art: ArtifactRecord, *, source: str | None = None) -> ev.ArtifactStored:
    """The `artifact.stored` event that goes with an artifact record; `source` when the
    event names another (an op's output: the op)."""
    from tether import events as ev

    return ev.ArtifactStored(
        artifact_id=art.artifact_id,
        kind=art.kind,
        name=art.name,
        blob=art.blob_hash,
        size=art.size,
        source=art.source if source is None else source,
    )
