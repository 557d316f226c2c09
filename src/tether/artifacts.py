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
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from tether import errors
from tether import events as ev
from tether import ledger as L
from tether.spec import TaskSpec
from tether.store.base import ArtifactRecord, Store

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


def reopen_citing(
    ledger: L.Ledger, artifact_ids: Collection[str], reason: str
) -> tuple[L.Ledger, list[str]]:
    """The ledger with every done item whose evidence cites one of `artifact_ids` back
    to pending (its note says why); returns it and the reopened ids."""
    refs = {artifact_ref(i) for i in artifact_ids}
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
) -> Invalidation:
    """Everything that depends on `roots` (`{ref: reason}`), transitively, made invalid,
    and the items it proved reopened. Pure."""
    records: list[ArtifactRecord] = []
    events: list[ev.Event] = []
    reopened: list[str] = []
    seen: set[str] = set()
    before = ledger
    for root, reason in roots.items():
        hit = [a for a in dependents(artifacts, [root]) if a.artifact_id not in seen]
        if not hit:
            continue
        seen.update(a.artifact_id for a in hit)
        records += invalidated(hit, reason, version=version)
        ledger, items = reopen_citing(
            ledger, [a.artifact_id for a in hit], f"{reason}; its evidence is invalid"
        )
        reopened += items
        events.append(
            ev.ArtifactsInvalidated(
                artifacts=[a.artifact_id for a in hit], reason=reason, roots=[root], items=items
            )
        )
    if reopened:
        # The full diff, so the ledger can be folded back from the log.
        changes = L.diff(before, ledger).to_list()
        events.append(ev.LedgerUpdated(version=ledger.version, diff=changes, cause="invalidation"))
    return Invalidation(records, ledger, reopened, events)


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
    return plan_invalidation(arts, ledger, roots, version=version)


def source_changes(spec: Mapping[str, Any], assignments: Sequence[str]) -> dict[str, Any]:
    """The partial spec for `tether edit --source ID=VERSION` (also `ID=VERSION@LOCATION`
    to move it): the contract's `sources` list with those versions changed. A bad
    assignment or an unknown source id raises `UserError`."""
    sources = [dict(s) for s in spec.get("sources", [])]
    by_id = {str(s.get("id")): s for s in sources}
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
    return {
        "sources": sources,
        "artifacts": {
            "current": sum(1 for a in arts if a.valid),
            "invalid": [
                {"artifact_id": d["artifact_id"], "kind": d["kind"], "reason": d["invalid_reason"]}
                for d in invalid[-50:]
            ],
            "invalid_count": len(invalid),
        },
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
