"""The last sequence number of each task's commits through one store object (`Latest`).

A run's judge keeps up with the log from the run's own commits (`judge.rules.own`) and
must still see a commit a tool of the round made itself (a source snapshot, a claim):
such a commit goes through the same store object. Asked whether anything was committed
for the task since the run's last number, this answers without a read of the log.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from tether.store.base import CommitResult

#: Tasks remembered; past it, those with no commit under way are forgotten (a task
#: forgotten is answered None: the reader reads the log, as without this).
KEEP: Final = 4096
#: The number of a task one of whose commits failed: it may have been stored all the
#: same (a lost connection, a cancelled wait), its number unknown. Above any number,
#: it is kept as the highest, and the reader reads until the task is forgotten.
UNKNOWN: Final = sys.maxsize


class Latest:
    """Per task, the last number a commit through this store object reached, and how
    many of its commits are under way (their numbers are not known yet)."""

    __slots__ = ("_busy", "_seqs")

    def __init__(self) -> None:
        self._seqs: dict[str, int] = {}
        self._busy: dict[str, int] = {}

    def get(self, task_id: str) -> int | None:
        """The task's last number by a commit through this store object; None when not
        known, or while one of its commits is under way."""
        return None if task_id in self._busy else self._seqs.get(task_id)

    def note(self, task_id: str, last_seq: int) -> None:
        """A commit of the task reached `last_seq` (kept as the highest seen: two
        commits under way at once may be told in either order)."""
        seqs = self._seqs
        if seqs.get(task_id, 0) < last_seq:
            if len(seqs) >= KEEP and task_id not in seqs:
                # A task with a commit under way keeps its number: its commit may be
                # told after a later one, and must not then be taken for the last.
                self._seqs = seqs = {t: s for t, s in seqs.items() if t in self._busy}
            seqs[task_id] = last_seq

    def committing(self, task_id: str) -> _Committing:
        """`with latest.committing(task_id) as done: return done(await commit(...))`."""
        return _Committing(self, task_id)


class _Committing:
    __slots__ = ("latest", "task_id")

    def __init__(self, latest: Latest, task_id: str) -> None:
        self.latest = latest
        self.task_id = task_id

    def __enter__(self) -> _Committing:
        busy = self.latest._busy
        busy[self.task_id] = busy.get(self.task_id, 0) + 1
        return self

    def __call__(self, res: CommitResult) -> CommitResult:
        """Note the commit's result; returns it."""
        self.latest.note(self.task_id, res.last_seq)
        return res

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        latest = self.latest
        if kind is not None:
            latest._seqs[self.task_id] = UNKNOWN
        busy = latest._busy
        n = busy[self.task_id] - 1
        if n:
            busy[self.task_id] = n
        else:
            del busy[self.task_id]
