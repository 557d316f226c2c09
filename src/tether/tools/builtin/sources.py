"""Built-in tools for sources and the artifacts made from them.

- `read_source(source, offset, limit)` reads a source the contract declares (and no
  other) and records the version it saw: with `pin: snapshot` the bytes are stored once,
  content-addressed, and every later read of that version (after a crash too) returns
  the same bytes; with `pin: fingerprint` a version fingerprint is recorded (a file's
  hash, size and mtime; a URL's ETag, Last-Modified and content hash), and a re-read
  that finds it changed invalidates what depended on the earlier read. `document` and
  `dataset` sources are files; `url` sources are fetched with an HTTP GET, `api` sources
  with a GET or a POST of the contract's JSON `body`, asking for JSON; both with a
  timeout and a size cap, their credentials masked in whatever is stored or shown.
- `record_evidence(source_artifact, excerpt, location)` stores an excerpt of a snapshot
  with its location; it depends on the snapshot and its version. The excerpt must quote
  the read (whole words, not blank): a snapshot's stored bytes, or for a read pinned by
  fingerprint the source read again, which must still be the version that read saw.
- `record_claim(text, evidence)` stores a claim citing valid evidence artifacts.
- `write_report_section(title, text, claims)` stores a report section citing claims.
- `search_artifacts(query, kinds, limit, include_invalid)` finds this task's stored
  artifacts (large tool outputs, evidence, claims, compaction summaries, source
  snapshots) by relevance to a few words, so what was trimmed from the context can be
  found again; each hit names the id to cite (`artifact:<id>` as an item's evidence, an
  evidence id in `record_claim`) and an excerpt; invalidated ones only when asked for.
- `write_report(path, title, sections, open_questions)` writes the report file into the
  workspace from the cited sections (each with the claims it cites) and its open
  questions, and stores a `report` artifact that depends on the sections and records
  the file's content hash: a changed source invalidates it with its sections, and a
  deleted or altered file reopens its item on the next verification.

A citation must resolve to a valid artifact of the right kind of this task. An artifact's
id derives from the op id, its store write is fenced by the run's token: a call re-sent
after a crash writes the same artifact again, a worker that lost its lease nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import stat
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Protocol

from pydantic import Field

from tether import artifacts as A
from tether import errors
from tether import events as ev
from tether.artifacts import deliverable_meta
from tether.redact import MASK, redact
from tether.spec import Source
from tether.store.base import ArtifactRecord, OpRecord, Store, blob_hash
from tether.tools import files
from tether.tools.builtin.pinned import guard, unreadable
from tether.tools.builtin.pinned import version_key as _key
from tether.tools.registry import Tool, ToolContext, tool

#: The names of the tools this module makes.
SOURCE_TOOLS = (
    "read_source",
    "record_evidence",
    "record_claim",
    "write_report_section",
    "search_artifacts",
    "write_report",
)
_MAX_TEXT = 20_000
#: The largest source a snapshot copies into the store (and the largest response a
#: url or api source may give).
MAX_SNAPSHOT_BYTES = 32 << 20
#: How long fetching a url or api source may wait for a read (seconds); connecting
#: waits at most `HTTP_CONNECT_TIMEOUT` of it.
HTTP_TIMEOUT = 30.0
HTTP_CONNECT_TIMEOUT = 10.0


async def _sources(store: Store, task_id: str) -> list[Source]:
    task = await store.get_task(task_id)
    return [Source.model_validate(s) for s in task.spec.get("sources", [])]


async def _store(
    store: Store,
    ctx: ToolContext,
    arts: Sequence[ArtifactRecord],
    blobs: Sequence[bytes],
    more: Sequence[ev.Event] = (),
    *,
    ops: Sequence[OpRecord] = (),
) -> None:
    """Write artifacts (and ops sent to history) under the run's fencing token (a stale
    worker writes nothing)."""
    events: list[ev.Event] = [A.stored_event(a) for a in arts if a.valid]
    await store.commit(
        ctx.task_id, ctx.fencing_token, [*more, *events], artifacts=arts, blobs=blobs, ops=ops
    )


def _record(
    ctx: ToolContext,
    suffix: str,
    kind: str,
    name: str,
    data: bytes,
    deps: Sequence[str],
    meta: dict[str, Any],
) -> ArtifactRecord:
    return ArtifactRecord(
        artifact_id=f"{ctx.op_id}.{suffix}",
        task_id=ctx.task_id,
        kind=kind,
        name=name,
        blob_hash=blob_hash(data),
        size=len(data),
        source=ctx.op_id,
        task_version=ctx.task_version,
        deps=tuple(deps),
        meta=meta,
    )


async def _keep(store: Store, ctx: ToolContext, new: ArtifactRecord, data: bytes) -> ArtifactRecord:
    """`new`, or the artifact this very op stored under its id before (a call re-sent
    after a crash), stored with its blob under the run's fencing token."""
    found = await store.get_artifacts(ctx.task_id, artifact_ids={new.artifact_id})
    art = found[0] if found else new
    await _store(store, ctx, [art], [data])
    return art


async def _keep_citing(
    store: Store,
    ctx: ToolContext,
    what: tuple[str, str, str],
    data: bytes,
    cited: Sequence[str],
    meta: dict[str, Any],
) -> ArtifactRecord:
    """`_keep` of a new artifact (`what`: its id's suffix, its kind, its name) that
    depends on each artifact it cites (a claim, a report section, the report)."""
    suffix, kind, name = what
    deps = [A.artifact_ref(i) for i in cited]
    return await _keep(store, ctx, _record(ctx, suffix, kind, name, data, deps, meta), data)


async def _existing(store: Store, ctx: ToolContext, suffix: str) -> ArtifactRecord | None:
    """The artifact this very op wrote before (a call re-sent after a crash)."""
    found = await store.get_artifacts(ctx.task_id, artifact_ids={f"{ctx.op_id}.{suffix}"})
    return found[0] if found else None


def _location(src: Source, workspace: Path | None) -> Path:
    path = Path(src.location)
    if not path.is_absolute():
        if workspace is None:
            raise errors.ToolFailed(
                f"read_source: source {src.id} is relative, and there is no workspace"
            )
        path = workspace / path
    return path


def _slice(text: str, offset: int, limit: int) -> str:
    part = text[offset : offset + limit]
    rest = max(0, len(text) - offset - len(part))
    return part + (f"\n[{rest} more characters after offset {offset + len(part)}]" if rest else "")


#: Query parameters whose value is a credential (`?api_key=...`, `&token=...`).
_SECRET_PARAM = re.compile(
    r"([?&;][^=&#\s]*(?:key|token|secret|passw|credential|signature|sig|auth)[^=&#\s]*=)"
    r"[^&#\s]+",
    re.I,
)


def shown_url(url: str) -> str:
    """A source URL as tether journals and prints it: userinfo, known secrets and
    credential-looking query parameters masked."""
    return _SECRET_PARAM.sub(rf"\1{MASK}", redact(url))


@dataclass(frozen=True)
class _Fetched:
    """What one read of a source found: its bytes and its version fingerprint (`key`
    is what two reads of the same content share)."""

    data: bytes
    fingerprint: dict[str, Any]

    @property
    def key(self) -> str:
        return _key(self.fingerprint)


def _read_file(src: Source, workspace: Path | None, cap: int | None) -> _Fetched:
    path = _location(src, workspace)
    st = path.stat()
    if not stat.S_ISREG(st.st_mode):
        # A device (/dev/zero), a FIFO or a socket reports no size and never ends.
        raise errors.ToolFailed(f"read_source: source {src.id} is not a regular file")
    if cap is not None and st.st_size > cap:
        raise errors.ToolFailed(
            f"read_source: source {src.id} is larger than {cap >> 20} MiB; a snapshot would "
            "copy it into the store (the contract can pin it by fingerprint instead)"
        )
    data = path.read_bytes()
    fp = {
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
    }
    return _Fetched(data, fp)


async def _fetch_http(src: Source) -> _Fetched:
    """GET (or, for an api source with `method: POST`, POST its `body` as JSON) the
    source's URL: bounded in time (`HTTP_TIMEOUT`) and size (`MAX_SNAPSHOT_BYTES`), the
    response streamed so a huge one is cut off, not buffered. Errors name the URL with
    its credentials masked."""
    # httpx2 (a core dependency, the SDKs' client) is imported here: only a url or api
    # source needs it, and `tether --help` or `status` should not pay for it.
    import httpx2

    url = shown_url(src.location)
    headers = {"Accept": "application/json"} if src.kind == "api" else {}
    cap = MAX_SNAPSHOT_BYTES
    timeout = httpx2.Timeout(HTTP_TIMEOUT, connect=min(HTTP_CONNECT_TIMEOUT, HTTP_TIMEOUT))
    try:
        async with (
            httpx2.AsyncClient(timeout=timeout, follow_redirects=True) as client,
            client.stream(
                src.method,
                src.location,
                headers=headers,
                json=src.body if src.method == "POST" else None,
            ) as resp,
        ):
            if resp.status_code >= 400:
                raise errors.ToolFailed(
                    f"read_source: source {src.id} ({url}) answered HTTP {resp.status_code}"
                )
            length = resp.headers.get("content-length", "")
            if length.isdigit() and int(length) > cap:
                raise errors.ToolFailed(
                    f"read_source: source {src.id} ({url}) is larger than {cap >> 20} MiB"
                )
            chunks: list[bytes] = []
            size = 0
            async for chunk in resp.aiter_bytes():
                size += len(chunk)
                if size > cap:
                    raise errors.ToolFailed(
                        f"read_source: source {src.id} ({url}) is larger than {cap >> 20} MiB"
                    )
                chunks.append(chunk)
            etag = resp.headers.get("etag")
            modified = resp.headers.get("last-modified")
    except httpx2.TimeoutException:
        raise errors.ToolFailed(
            f"read_source: source {src.id} ({url}) did not answer within {HTTP_TIMEOUT:g} s"
        ) from None
    except httpx2.HTTPError as exc:
        raise errors.ToolFailed(
            f"read_source: cannot fetch source {src.id} ({url}): {shown_url(str(exc))}"
        ) from None
    data = b"".join(chunks)
    fp: dict[str, Any] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    fp.update({k: v for k, v in (("etag", etag), ("last_modified", modified)) if v})
    return _Fetched(data, fp)


async def fetch_source(src: Source, workspace: Path | None, *, cap: int | None) -> _Fetched:
    """Read a source's current bytes and fingerprint (files in a thread)."""
    if src.kind in ("url", "api"):
        return await _fetch_http(src)
    return await asyncio.to_thread(_read_file, src, workspace, cap)


def _origin(src: Source) -> dict[str, Any]:
    """What an artifact's meta says of where a read came from (a URL masked)."""
    if src.kind in ("url", "api"):
        return {"url": shown_url(src.location), "method": src.method}
    return {}


class _Reader:
    """One `read_source` call."""

    def __init__(self, store: Store, ctx: ToolContext, src: Source) -> None:
        self.store, self.ctx, self.src = store, ctx, src
        self.ref = A.source_ref(src.id, src.version)

    async def reads(self) -> list[ArtifactRecord]:
        """Valid earlier reads of this source at this version."""
        return [
            a
            for a in await self.store.get_artifacts(self.ctx.task_id)
            if a.valid and a.kind == "source_snapshot" and self.ref in a.deps
        ]

    async def snapshot(self) -> tuple[ArtifactRecord, str, str]:
        earlier = await self.reads()
        if earlier:
            art = earlier[0]
            return art, (await self.store.get_blob(art.blob_hash)).decode("utf-8", "replace"), ""
        got = await fetch_source(self.src, self.ctx.workspace, cap=MAX_SNAPSHOT_BYTES)
        await guard(self.store, self.ctx.task_id, self.src, got.data)  # no second bytes
        meta = {
            "source": self.src.id,
            "version": self.src.version,
            "pin": "snapshot",
            **_origin(self.src),
            **{k: v for k, v in got.fingerprint.items() if k in ("etag", "last_modified")},
        }
        new = _record(self.ctx, "snap", "source_snapshot", self.src.id, got.data, [self.ref], meta)
        art = await _keep(self.store, self.ctx, new, got.data)
        return art, got.data.decode("utf-8", "replace"), ""

    async def fingerprint(self) -> tuple[ArtifactRecord, str, str]:
        got = await fetch_source(self.src, self.ctx.workspace, cap=None)
        fp = got.fingerprint
        text = got.data.decode("utf-8", "replace")
        earlier = await self.reads()
        same = [a for a in earlier if _key(a.meta) == got.key]
        if same:
            return same[0], text, ""
        changed = [a for a in earlier if _key(a.meta) != got.key]
        notice = ""
        stale: list[ArtifactRecord] = []
        stale_ops: list[OpRecord] = []
        more: list[ev.Event] = []
        if changed:
            what = f"ETag now {fp['etag']}" if fp.get("etag") else f"sha256 now {fp['sha256'][:12]}"
            reason = f"source {self.src.id} {self.src.version} changed on re-read ({what})"
            arts = await self.store.get_artifacts(self.ctx.task_id)
            # The earlier reads of this source saw the old content: their results go to
            # history, and whatever was made from them is invalid too.
            done = await self.store.get_ops(
                self.ctx.task_id, statuses={"succeeded"}, tools={A.READ_SOURCE}
            )
            reads = [o for o in A.reads_of(done, self.src.id) if o.op_id != self.ctx.op_id]
            roots = [A.artifact_ref(a.artifact_id) for a in changed]
            hit = changed + [
                a
                for a in A.dependents(arts, [*roots, *(A.op_ref(o.op_id) for o in reads)])
                if a not in changed
            ]
            stale = A.invalidated(hit, reason, version=self.ctx.task_version)
            stale_ops = A.superseded(reads, reason, self.ctx.task_version)
            more.append(
                ev.ArtifactsInvalidated(
                    artifacts=[a.artifact_id for a in hit],
                    reason=reason,
                    roots=roots,
                    ops=[o.op_id for o in reads],
                )
            )
            notice = f"NOTE: {reason}; invalidated: {', '.join(a.artifact_id for a in hit)}\n"
        blob = json.dumps(fp, sort_keys=True).encode()
        meta = {
            "source": self.src.id,
            "version": self.src.version,
            "pin": "fingerprint",
            **_origin(self.src),
            **fp,
        }
        art = await _existing(self.store, self.ctx, "fp") or _record(
            self.ctx, "fp", "source_snapshot", self.src.id, blob, [self.ref], meta
        )
        await _store(self.store, self.ctx, [*stale, art], [blob], more, ops=stale_ops)
        return art, text, notice


class ArtifactReads(Protocol):
    """The one store read `stale_reads` makes (the judges hand theirs, not the store)."""

    async def get_artifacts(
        self, task_id: str, *, artifact_ids: Collection[str] | None = None
    ) -> list[ArtifactRecord]:
        """A task's artifacts, oldest first."""
        ...


async def _lookup(store: ArtifactReads, task_id: str, ids: Sequence[str]) -> list[ArtifactRecord]:
    """The stored artifacts of this task among the cited `ids`. An id no artifact can
    have (one with a NUL, which PostgreSQL's text cannot hold) is simply not found,
    rather than failing the store's query as if the store were down."""
    wanted = {i for i in ids if "\x00" not in i}
    return await store.get_artifacts(task_id, artifact_ids=wanted) if wanted else []


def _quoted(excerpt: str, body: str) -> bool:
    """Whether `excerpt` quotes `body`: its words in order (whitespace aside), not cut
    out of a longer word or number at either end ("costs 3" does not quote "costs 35
    euros"), and not blank."""
    want = " ".join(excerpt.split())
    text = " ".join(body.split())
    if not want:
        return False
    start = text.find(want)
    while start >= 0:
        end = start + len(want)
        cut_left = want[0].isalnum() and start > 0 and text[start - 1].isalnum()
        cut_right = want[-1].isalnum() and end < len(text) and text[end].isalnum()
        if not (cut_left or cut_right):
            return True
        start = text.find(want, start + 1)
    return False


#: An artifact (or op) id in brackets, as a report cites: `[t6b0e1234abcd.r3.c0.claim]`.
_BRACKETED_ID = re.compile(r"\[(t[0-9a-f]{6,}\.[^\[\]\s]+)\]")
#: How a `read_source` answer names the snapshot artifact of the version it read.
_CITE_SNAPSHOT = "cite snapshot artifact "
_CITED_SNAPSHOT = re.compile(re.escape(_CITE_SNAPSHOT) + r"(\S+)")


def snapshot_read_by(op: OpRecord) -> str | None:
    """The snapshot artifact a succeeded `read_source` op read (its answer names it), or
    None for any other op. A read proves something only while that artifact is valid:
    a re-read that found the source changed invalidates it, in the same round too
    (before the earlier read's op is in the journal to be sent to history)."""
    if op.tool != A.READ_SOURCE or op.status != "succeeded":
        return None
    found = _CITED_SNAPSHOT.search(str((op.result or {}).get("content", ""))[:2000])
    return found.group(1) if found else None


async def stale_reads(
    store: ArtifactReads,
    task_id: str,
    ops: Sequence[OpRecord],
    staged: Sequence[ArtifactRecord] = (),
) -> set[str]:
    """The ids of the `read_source` ops among `ops` whose snapshot is no longer valid
    (`staged`: artifacts of this round not yet stored)."""
    read = {o.op_id: snap for o in ops if (snap := snapshot_read_by(o)) is not None}
    if not read:
        return set()
    known = {a.artifact_id: a for a in staged}
    missing = set(read.values()) - set(known)
    if missing:
        known.update((a.artifact_id, a) for a in await _lookup(store, task_id, list(missing)))
    return {op for op, snap in read.items() if snap not in known or not known[snap].valid}


async def _cited(
    store: ArtifactReads, task_id: str, ids: Sequence[str], kind: str, what: str
) -> list[ArtifactRecord]:
    """The artifacts the tool `what` cites, each a valid one of `kind`; a dangling
    citation fails."""
    by_id = {a.artifact_id: a for a in await _lookup(store, task_id, ids)}
    bad = [i for i in ids if i not in by_id or not by_id[i].valid or by_id[i].kind != kind]
    if bad:
        raise errors.ToolFailed(
            f"{what}: {', '.join(bad)} {'is' if len(bad) == 1 else 'are'} not a valid {kind} "
            "artifact of this task (invalidated, unknown, or of another kind); cite current ones"
        )
    return [by_id[i] for i in ids]


async def _read_body(store: Store, ctx: ToolContext, snap: ArtifactRecord) -> str:
    """The text an excerpt must be quoted from: a snapshot's stored bytes; for a read
    pinned by fingerprint (nothing stored but the fingerprint), the source read again,
    which must still be the version that read saw (else the read is stale: the model
    reads it again, which invalidates what was built on the old one)."""
    if snap.meta.get("pin") == "snapshot":
        return (await store.get_blob(snap.blob_hash)).decode("utf-8", "replace")
    sid, version = snap.meta.get("source"), snap.meta.get("version")
    src = next(
        (s for s in await _sources(store, ctx.task_id) if s.id == sid and s.version == version),
        None,
    )
    if src is None:
        raise errors.ToolFailed(
            f"record_evidence: source {sid} {version} of {snap.artifact_id} is no longer "
            "a source of this task"
        )
    try:
        got = await fetch_source(src, ctx.workspace, cap=None)
    except OSError as exc:
        raise errors.ToolFailed(
            f"record_evidence: cannot read source {src.id} again ({exc.strerror or exc})"
        ) from None
    if got.key != _key(snap.meta):
        raise errors.ToolFailed(
            f"record_evidence: source {src.id} {src.version} changed since "
            f'{snap.artifact_id} read it; read it again (read_source(source="{src.id}")) '
            "and quote the new read"
        )
    return got.data.decode("utf-8", "replace")


#: One open question of a report.
Question = Annotated[str, Field(max_length=2000)]


def _quotes_only(cited: Sequence[ArtifactRecord]) -> None:
    """A claim rests on quotes of sources: the rule judge's evidence (a file that
    exists, a command that passed) is evidence of an item, not of a claim."""
    unquoted = [a.artifact_id for a in cited if not any(A.source_of(d) for d in a.deps)]
    if unquoted:
        raise errors.ToolFailed(
            f"record_claim: {', '.join(unquoted)} quote no source; cite the evidence "
            "artifacts record_evidence made"
        )


def _no_loose_citations(text: str, claims: Sequence[str]) -> None:
    """The report cites in brackets (`Cites: [id]`): an id in brackets in a section's
    text that the section does not cite would read as a citation nothing backs."""
    loose = sorted(set(_BRACKETED_ID.findall(text)) - set(claims))
    if loose:
        raise errors.ToolFailed(
            f"write_report_section: the text cites {', '.join(loose[:5])} in brackets, "
            "which are not among the claims this section cites; cite them in `claims` "
            "(valid claim artifacts) or leave them out"
        )


def source_tools(store_getter: Callable[[], Store]) -> list[Tool]:
    """`read_source`, `record_evidence`, `record_claim` and `write_report_section`."""

    @tool(
        name="read_source",
        effect="read",
        volatile=False,
        description=(
            "Read a source the contract declares (a file, a URL or an API), by id: at most "
            "`limit` characters from `offset`. The answer names the snapshot artifact to "
            "cite in record_evidence."
        ),
    )
    async def read_source(
        ctx: ToolContext,
        source: str,
        offset: Annotated[int, Field(ge=0)] = 0,
        limit: Annotated[int, Field(ge=1, le=_MAX_TEXT)] = 4000,
    ) -> str:
        store = store_getter()
        declared = await _sources(store, ctx.task_id)
        src = next((s for s in declared if s.id == source), None)
        if src is None:
            allowed = ", ".join(s.id for s in declared) or "none"
            raise errors.ToolFailed(
                f"read_source: {source!r} is not a source of this task (allowed: {allowed})"
            )
        reader = _Reader(store, ctx, src)
        try:
            art, text, notice = await (
                reader.snapshot() if src.pin == "snapshot" else reader.fingerprint()
            )
        except OSError as exc:
            raise errors.ToolFailed(unreadable(src, exc)) from None
        head = (
            f"{notice}source {src.id} version {src.version} ({src.kind}, {src.pin}); "
            f"{_CITE_SNAPSHOT}{art.artifact_id}\n"
        )
        return head + _slice(text, offset, limit)

    @tool(
        name="record_evidence",
        effect="write",
        idempotent=True,
        description=(
            "Record an excerpt of a source you read (quoted exactly from the snapshot "
            "artifact read_source named) with where it is; returns the evidence artifact id."
        ),
    )
    async def record_evidence(
        ctx: ToolContext,
        source_artifact: str,
        excerpt: Annotated[str, Field(min_length=1, max_length=_MAX_TEXT)],
        location: Annotated[str, Field(max_length=500)] = "",
    ) -> str:
        store = store_getter()
        cited = [source_artifact]
        snap = (await _cited(store, ctx.task_id, cited, "source_snapshot", "record_evidence"))[0]
        body = await _read_body(store, ctx, snap)
        if not _quoted(excerpt, body):
            raise errors.ToolFailed(
                f"record_evidence: the excerpt is not in {snap.artifact_id} (source "
                f"{snap.meta.get('source')} {snap.meta.get('version')}); quote it exactly, "
                "whole words"
            )
        src, version = str(snap.meta.get("source")), str(snap.meta.get("version"))
        doc = {"excerpt": excerpt, "location": location, "source": src, "version": version}
        data = json.dumps(doc, ensure_ascii=False, sort_keys=True).encode()
        deps = [A.artifact_ref(snap.artifact_id), A.source_ref(src, version)]
        meta = {"source": src, "version": version, "location": location}
        new = _record(ctx, "ev", "evidence", src, data, deps, meta)
        art = await _keep(store, ctx, new, data)
        return f"evidence artifact {art.artifact_id} (source {src} {version})"

    @tool(
        name="record_claim",
        effect="write",
        idempotent=True,
        description="Record a claim citing evidence artifact ids; returns the claim artifact id.",
    )
    async def record_claim(
        ctx: ToolContext,
        text: Annotated[str, Field(min_length=1, max_length=_MAX_TEXT)],
        evidence: Annotated[list[str], Field(min_length=1, max_length=50)],
        topic: Annotated[str, Field(min_length=1, max_length=200)] = "claim",
    ) -> str:
        store = store_getter()
        cited = await _cited(store, ctx.task_id, evidence, "evidence", "record_claim")
        _quotes_only(cited)
        data = json.dumps(
            {"claim": text, "evidence": evidence, "topic": topic}, ensure_ascii=False
        ).encode()
        sources = sorted({f"{a.meta.get('source')}@{a.meta.get('version')}" for a in cited})
        art = await _keep_citing(
            store, ctx, ("claim", "claim", topic), data, evidence, {"sources": sources}
        )
        return f"claim artifact {art.artifact_id} (cites {', '.join(evidence)})"

    @tool(
        name="write_report_section",
        effect="write",
        idempotent=True,
        description="Write a report section citing claim artifact ids; returns its artifact id.",
    )
    async def write_report_section(
        ctx: ToolContext,
        title: Annotated[str, Field(min_length=1, max_length=200)],
        text: Annotated[str, Field(min_length=1, max_length=_MAX_TEXT)],
        claims: Annotated[list[str], Field(min_length=1, max_length=100)],
    ) -> str:
        store = store_getter()
        await _cited(store, ctx.task_id, claims, "claim", "write_report_section")
        _no_loose_citations(f"{title}\n{text}", claims)
        data = json.dumps(
            {"title": title, "text": text, "claims": claims}, ensure_ascii=False
        ).encode()
        art = await _keep_citing(store, ctx, ("section", "report_section", title), data, claims, {})
        return f"report section artifact {art.artifact_id} ({title})"

    @tool(
        name="search_artifacts",
        effect="read",
        volatile=False,
        description=(
            "Search this task's stored artifacts (large tool outputs, evidence, claims, "
            "summaries of earlier rounds, source snapshots) for a few words, best matches "
            "first: finds again what is no longer in your context. Each hit gives the id "
            "to cite (artifact:<id> as an item's evidence; an evidence id in "
            "record_claim) and an excerpt; read_artifact reads more of it."
        ),
    )
    async def search_artifacts(
        ctx: ToolContext,
        query: Annotated[str, Field(min_length=1, max_length=500)],
        kinds: Annotated[list[str] | None, Field(max_length=len(A.KINDS) + 10)] = None,
        limit: Annotated[int, Field(ge=1, le=20)] = 5,
        include_invalid: bool = False,
    ) -> str:
        store = store_getter()
        # A kind with a NUL names nothing (and would fail PostgreSQL's query as if the
        # store were down): it matches no artifact, like any other unknown kind.
        wanted = {k for k in kinds if "\x00" not in k} if kinds else None
        hits = (
            await store.search_artifacts(
                ctx.task_id, query, kinds=wanted, limit=limit, include_invalid=include_invalid
            )
            if wanted is None or wanted
            else []
        )
        if not hits:
            scope = f" of kind {', '.join(kinds)}" if kinds else ""
            return f"no stored artifact{scope} matches {query!r}"
        lines = [f"{len(hits)} artifact{'s' if len(hits) > 1 else ''} match {query!r}:"]
        for n, hit in enumerate(hits, 1):
            lines.append(f"{n}. {_hit_line(hit.artifact)}")
            lines.append("   " + " ".join(hit.excerpt.split())[:400])
        return "\n".join(lines)

    @tool(
        name="write_report",
        effect="write",
        idempotent=True,
        description=(
            "Write the report file (Markdown) from report section artifact ids, in order, "
            "with its open questions; returns the report artifact id."
        ),
    )
    async def write_report(
        ctx: ToolContext,
        path: Annotated[
            str, Field(max_length=1000, description="path relative to the workspace folder")
        ],
        title: Annotated[str, Field(min_length=1, max_length=200)],
        sections: Annotated[list[str], Field(min_length=1, max_length=100)],
        open_questions: Annotated[list[Question], Field(max_length=100)] = [],  # noqa: B006
    ) -> str:
        store = store_getter()
        cited = await _cited(store, ctx.task_id, sections, "report_section", "write_report")
        text = await _render_report(store, title, cited, open_questions)
        if ctx.workspace is None:
            raise errors.ToolFailed("write_report: this task has no workspace folder")
        ws = files.Workspace(ctx.workspace, ctx.private_files)
        await ctx.ensure_owner()  # a worker paused past its lease writes nothing
        try:
            written = ws.write_file(path, text)
        except OSError as exc:
            raise errors.ToolFailed(f"write_report failed: {exc.strerror or exc}") from None
        data = text.encode("utf-8")
        meta = {**deliverable_meta(path, data), "open_questions": len(open_questions)}
        art = await _keep_citing(store, ctx, ("report", "report", path), data, sections, meta)
        # The workspace's own words first: "created ..." marks the file as the task's
        # (a later write_report or write_file over it is no overwrite).
        return (
            f"{written}; report artifact {art.artifact_id} ({len(sections)} sections, "
            f"{len(open_questions)} open questions)"
        )

    return [
        read_source,
        record_evidence,
        record_claim,
        write_report_section,
        search_artifacts,
        write_report,
    ]


def _hit_line(art: ArtifactRecord) -> str:
    """How a search hit is named to the model: its ref, kind, name, what it came from
    and, for an invalidated one, that it is history and why."""
    origin = ""
    if art.meta.get("source") and art.meta.get("version"):
        origin = f", source {art.meta['source']} {art.meta['version']}"
    head = f"artifact:{art.artifact_id} ({art.kind} {art.name!r}{origin})"
    if not art.valid:
        mark = art.meta.get(A.INVALIDATED)
        why = mark.get("reason") if isinstance(mark, dict) else None
        return f"{head} INVALID, history only, do not cite" + (f": {why}" if why else "")
    if art.kind == "summary":
        return f"{head}; a summary of earlier rounds: it says where to look, it proves nothing"
    if art.kind == "evidence":
        ref = art.artifact_id
        return f"{head}; cite it as artifact:{ref}, or {ref} in record_claim"
    return f"{head}; cite it as artifact:{art.artifact_id}"


#: A level 1 or 2 heading line of Markdown (ATX `# x`, `## x`; or a setext underline).
_TOP_HEADING = re.compile(r"^ {0,3}#{1,2}(?=[ \t]|$)", re.M)
_SETEXT = re.compile(r"^( {0,3})(=+|-+)[ \t]*$", re.M)


def _nested(text: str) -> str:
    """A section's text with its headings below the report's own (level 3 at most), so
    a section cannot open a section or an "Open questions" of its own."""
    return _SETEXT.sub(r"\1\\\2", _TOP_HEADING.sub("###", text))


async def _render_report(
    store: Store, title: str, sections: Sequence[ArtifactRecord], questions: Sequence[str]
) -> str:
    """The report's Markdown: each section with the claims it cites (ids in brackets,
    so every citation can be traced to its evidence), then the open questions."""
    lines = [f"# {' '.join(title.split())}", ""]
    for sec in sections:
        doc = json.loads(await store.get_blob(sec.blob_hash))
        # A title is one line: it cannot open headings (a fake "Open questions") of its own.
        heading = " ".join(str(doc.get("title", sec.name)).split())
        lines += [f"## {heading}", "", _nested(str(doc.get("text", ""))), ""]
        claims = [str(c) for c in doc.get("claims", [])]
        lines += ["Cites: " + ", ".join(f"[{c}]" for c in claims), ""]
    lines += ["## Open questions", ""]
    lines += [f"- {q}" for q in questions] if questions else ["- none"]
    return "\n".join(lines) + "\n"
