"""The task's stored records, read (`ports.Records`): what the parts of a round may read
of the store — this task's rows only, and nothing that writes."""

from __future__ import annotations

from collections.abc import Collection

from tether.runtime.round import history
from tether.runtime.round.context import Entry
from tether.store.base import ArtifactRecord, OpRecord, Store, StoredEvent, TaskRecord


class TaskRecords:
    """Reads of one task's records."""

    def __init__(self, store: Store, task_id: str) -> None:
        self._store = store
        self.task_id = task_id

    async def task(self) -> TaskRecord:
        """The task row."""
        return await self._store.get_task(self.task_id)

    async def ops(
        self, statuses: Collection[str] | None = None, *, op_ids: Collection[str] | None = None
    ) -> list[OpRecord]:
        """The task's op records (by status, by id)."""
        return await self._store.get_ops(self.task_id, statuses, op_ids=op_ids)

    async def artifacts(
        self, *, artifact_ids: Collection[str] | None = None
    ) -> list[ArtifactRecord]:
        """The task's artifacts (by id)."""
        return await self._store.get_artifacts(self.task_id, artifact_ids=artifact_ids)

    async def blob(self, ref: str) -> bytes:
        """A blob (`KeyError` when missing)."""
        return await self._store.get_blob(ref)

    async def events(self, types: Collection[str]) -> list[StoredEvent]:
        """The task's events of these types."""
        return await self._store.read_events(self.task_id, types=types)

    async def entries(
        self, *, snapshot: str | None, after_seq: int, skip_round: int
    ) -> list[Entry]:
        """The context's history entries (`history.load_entries`)."""
        return await history.load_entries(
            self._store, self.task_id, snapshot=snapshot, after_seq=after_seq, skip_round=skip_round
        )


__all__ = ["TaskRecords"]
