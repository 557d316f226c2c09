"""Pinned re-reads: a pinned version's bytes never change.

A source read with `pin: snapshot` is stored once; its blob hash is the version's
recorded hash. When that content is lost from the store (a restore that missed blobs, a
hand edit), the source may be read again — but only the same bytes may stand for the
version. A re-read whose hash differs from the recorded one is never stored as that
version: it is a drift ("source X changed under version V"), for a person to settle by
pinning a new version (an edit) or abandoning the task. A read pinned by fingerprint
drifts the same way when the source's fingerprint (`version_key`) no longer matches.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tether import artifacts as A
from tether import errors
from tether.spec import Source
from tether.store.base import ArtifactRecord, blob_hash


def version_key(meta: Mapping[str, Any]) -> str:
    """The identity of a read version: the content hash, and the ETag when the server
    gave one (a changed ETag is a new version even if the bytes look the same)."""
    return f"{meta.get('etag') or ''}|{meta.get('sha256') or ''}"


@dataclass(frozen=True)
class Drift:
    """A pinned source no longer gives the bytes of its version."""

    source: str
    version: str
    #: The recorded hash (`sha256:<hex>` of a snapshot, the fingerprint's key).
    want: str
    #: What the source gives now (None: it could not be read).
    have: str | None
    #: The snapshot artifact whose version drifted.
    artifact_id: str

    @property
    def reason(self) -> str:
        """The words a person reads."""
        now = "cannot be read now" if self.have is None else f"now {_short(self.have)}"
        return (
            f"source {self.source} changed under version {self.version} "
            f"(recorded {_short(self.want)}, {now})"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "source": self.source,
            "version": self.version,
            "recorded": self.want,
            "now": self.have,
            "artifact_id": self.artifact_id,
            "reason": self.reason,
        }


def _short(value: str) -> str:
    kind, _, digest = value.rpartition(":")
    return f"{kind + ' ' if kind else ''}{digest[:12]}..." if len(digest) > 12 else value


class SnapshotReads(Protocol):
    """The one store read the guard makes."""

    async def get_artifacts(
        self, task_id: str, *, artifact_ids: Collection[str] | None = None
    ) -> list[ArtifactRecord]:
        """A task's artifacts, oldest first."""
        ...


def recorded(arts: Sequence[ArtifactRecord], src: Source) -> ArtifactRecord | None:
    """The first snapshot stored for `src` at its version (valid or not): its blob hash
    is the version's recorded hash."""
    ref = A.source_ref(src.id, src.version)
    return next(
        (
            a
            for a in arts
            if a.kind == "source_snapshot" and ref in a.deps and a.meta.get("pin") == "snapshot"
        ),
        None,
    )


def snapshot_drift(art: ArtifactRecord, src: Source, data: bytes | None) -> Drift | None:
    """The drift of a snapshot's version when the source now gives `data` (None: it
    could not be read), or None when the bytes are the recorded ones."""
    have = None if data is None else blob_hash(data)
    if have == art.blob_hash:
        return None
    return Drift(src.id, src.version, art.blob_hash, have, art.artifact_id)


def fingerprint_drift(
    art: ArtifactRecord, src: Source, now: Mapping[str, Any] | None
) -> Drift | None:
    """The drift of a read pinned by fingerprint when the source's fingerprint is `now`
    (None: it could not be read), or None when it is still the version read."""
    want = version_key(art.meta)
    have = None if now is None else version_key(now)
    if have == want:
        return None
    return Drift(src.id, src.version, want, have, art.artifact_id)


async def guard(store: SnapshotReads, task_id: str, src: Source, data: bytes) -> None:
    """Before a snapshot of `src` is stored: raise `ToolFailed` when its version was
    stored before with other bytes (the earlier content lost, the source changed
    since), so a pinned version never gets a second, different snapshot."""
    first = recorded(await store.get_artifacts(task_id), src)
    drift = None if first is None else snapshot_drift(first, src, data)
    if drift is not None:
        raise errors.ToolFailed(
            f"read_source: {drift.reason}; its stored bytes are lost and a pinned version's "
            "bytes never change: a person must pin a new version (tether edit "
            f"{task_id} --source {src.id}=VERSION@LOCATION) or abandon the task"
        )


def unreadable(src: Source, exc: OSError) -> str:
    """Why `read_source` cannot read a source: a file's names its location (a misspelt
    one is the usual cause) and, for a relative path, that it is read in the workspace."""
    why = exc.strerror or str(exc)
    if src.kind in ("url", "api"):
        return f"read_source: cannot read source {src.id} ({why})"
    where = "" if Path(src.location).is_absolute() else " in the workspace"
    return (
        f"read_source: cannot read source {src.id} at {src.location!r}{where} ({why}); "
        "check the source's location in the contract"
    )
