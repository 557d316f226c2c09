"""Accepted files the task's own tools rewrote: what they left, so that it is not taken
for a change from outside.

A `done_when: {kind: file}` rule accepts a file with its hash; any later change breaks
the item before delivery (`deliverables`), unless it is growth or the task's own
`write_file` of the whole file. A task also changes files with tools of its own: a
formatter run over the code, a script that rebuilds the changelog from fragments, an
MCP server's file tool. After a round in which such a tool (anything with an effect but
tether's file writers) succeeded, the files done items' rules accepted are hashed as
they are now (`note`, kept in `RunState.rewritten` with the round). Before delivery a
changed file holds when it is what the task's tools left (or that, grown) and still
holds the text its rule asked for; a change made after that round, by anyone else, is
still a change. What a round's own tools did cannot be told from a change made outside
at the same moment: the hash is taken once the round's calls are done.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from tether import artifacts as A

if TYPE_CHECKING:
    from tether import ledger as L
    from tether.runtime.run.ports import JudgeHost

#: The built-in tools that write workspace files: their writes are checked op by op
#: (`deliverables`), not here.
FILE_WRITERS: Final = ("write_file", "append_file")
#: At most this many files are remembered (the most recent win).
MAX_FILES: Final = 256


class Call(Protocol):
    """What `own_work` looks at in one call of a round (`judge.facts.OpSummary`)."""

    @property
    def tool(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def effect(self) -> str: ...


def own_work(ops: Sequence[Call]) -> bool:
    """Whether a round ran a tool of the task's own that may have changed files: a
    succeeded call with an effect, not of tether's file writers."""
    return any(
        o.status == "succeeded" and o.effect != "read" and o.tool not in FILE_WRITERS for o in ops
    )


def accepted_files(ledger: L.Ledger) -> set[str]:
    """The artifact ids done items cite (those of file rules among them)."""
    return {
        ref.partition(":")[2]
        for _, s in ledger.items()
        if s.status == "done"
        for ref in s.evidence
        if ref.startswith("artifact:")
    }


async def note(run: JudgeHost, round_no: int, ops: Sequence[Call]) -> None:
    """After a round whose own tools may have changed files (`own_work`): the files that
    done items' rules accepted, as they are now, in `RunState.rewritten`."""
    workspace = run.view.workspace
    if workspace is None or not own_work(ops):
        return
    ids = accepted_files(run.view.ledger)
    if not ids:
        return
    arts = await run.store.get_artifacts(run.journal.task_id, artifact_ids=ids)
    state = run.view.state
    kept = dict(state.rewritten or {})
    for art in arts:
        path = art.meta.get(A.DELIVERABLE_KEY)
        if not isinstance(path, str) or A.ROUND_KEY not in art.meta:
            continue
        data = read(workspace, path)
        if data is not None:
            kept.pop(path, None)  # re-inserted last: the most recent are kept
            kept[path] = [hashlib.sha256(data).hexdigest(), len(data), round_no]
    if kept:
        state.rewritten = dict(list(kept.items())[-MAX_FILES:])


def read(workspace: Path, path: str) -> bytes | None:
    """A workspace file's content, or None (gone, not a file, outside the workspace)."""
    try:
        root = workspace.resolve()
        target = (root / path).resolve()
        if not target.is_relative_to(root) or not target.is_file():
            return None
        return target.read_bytes()
    except (OSError, ValueError):
        return None


def holds(data: bytes, meta: Mapping[str, Any], rewritten: Mapping[str, Any]) -> bool:
    """Whether a changed file an artifact accepted (`meta`) is what the task's own tools
    left of it after it was accepted (or that, grown since) and still holds its rule's
    text."""
    path = meta.get(A.DELIVERABLE_KEY)
    left = rewritten.get(path) if isinstance(path, str) else None
    accepted = meta.get(A.ROUND_KEY)
    if not isinstance(left, Collection) or len(left) != 3 or not isinstance(accepted, int):
        return False
    sha, size, round_no = left
    if not (isinstance(round_no, int) and round_no > accepted and isinstance(size, int)):
        return False
    if size > len(data) or hashlib.sha256(data[:size]).hexdigest() != sha:
        return False
    return str(meta.get(A.CONTAINS_KEY) or "").encode("utf-8") in data
