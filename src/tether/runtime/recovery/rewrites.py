"""Accepted files the task's own tools rewrote: what they left, so that it is not taken
for a change from outside.

A `done_when: {kind: file}` rule accepts a file with its hash; any later change breaks
the item before delivery (`deliverables`), unless it is growth or the task's own
`write_file` of the whole file. A task also changes files with tools of its own: a
formatter run over the code, a script that rebuilds the changelog from fragments, an
MCP server's file tool. After a round in which such a tool (anything with an effect that
is not one of tether's own tools: `progress.own_work`) succeeded, the files done items'
rules accepted are hashed as they are now (`note`, kept in `RunState.rewritten` with the
round). Before delivery a changed file holds when it is what the task's tools left (or
that, grown) and still holds the text its rule asked for; a change made after that
round, by anyone else, is still a change. What a round's own tools did cannot be told
from a change made outside before or during it: the hash is taken once the round's
calls are done.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from tether import artifacts as A
from tether._by_object import keep
from tether.runtime.round import progress as P

if TYPE_CHECKING:
    from tether.runtime.run.ports import JudgeHost
    from tether.spec import TaskSpec

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
    """Whether a round ran a tool of the task's own that may have changed files (a
    succeeded call with an effect, of a tool that is not tether's: `progress.own_work`)."""
    return any(P.own_work(o.tool, o.effect, o.status) for o in ops)


#: Per live contract, by object id: its items with a `file` rule and the rule's path.
_FILE_ITEMS: dict[int, tuple[tuple[str, str], ...]] = {}


def file_items(spec: TaskSpec) -> tuple[tuple[str, str], ...]:
    """The contract's items a `file` rule decides, with the rule's path (built once per
    contract object: a round with a tool of the task's own asks each time)."""
    hit = _FILE_ITEMS.get(id(spec))
    if hit is not None:
        return hit
    from tether.spec import FileRule

    found = tuple(
        (item.id, item.done_when.path)
        for item in spec.items
        if isinstance(item.done_when, FileRule)
    )
    return keep(_FILE_ITEMS, spec, found)


async def note(run: JudgeHost, round_no: int, ops: Sequence[Call]) -> None:
    """After a round whose own tools may have changed files (`own_work`): the files done
    items' rules accepted that are no longer what was accepted, as they are now, in
    `RunState.rewritten`. A file whose size and modification time are what this run saw
    at its last note is not read again; the accepted hashes are read (for the files that
    changed only) from the store."""
    workspace = run.view.workspace
    if workspace is None or not own_work(ops):
        return
    ledger = run.view.ledger
    state = run.view.state
    stats = state.file_stats
    moved: dict[str, list[str]] = {}  # path -> the done items its rule accepted it for
    for item, path in file_items(run.view.spec):
        if not ledger.has_item(item) or ledger.item(item).status != "done":
            continue
        try:
            st = os.stat(workspace / path)
        except (OSError, ValueError):
            continue  # gone: the check before delivery says so
        key = (st.st_mtime_ns, st.st_size)
        if stats.get(path) != key or path in moved:
            stats[path] = key
            moved.setdefault(path, []).append(item)
    if not moved:
        return
    ids = {
        ref.partition(":")[2]
        for items in moved.values()
        for item in items
        for ref in ledger.item(item).evidence
        if ref.startswith("artifact:")
    }
    arts = await run.store.get_artifacts(run.journal.task_id, artifact_ids=ids) if ids else []
    accepted = {
        (a.meta.get(A.DELIVERABLE_KEY), a.meta.get(A.SHA256_KEY))
        for a in arts
        if A.ROUND_KEY in a.meta
    }
    kept = dict(state.rewritten or {})
    for path in moved:
        data = read(workspace, path)
        if data is None:
            continue
        sha = hashlib.sha256(data).hexdigest()
        if (path, sha) in accepted or kept.get(path, [None])[0] == sha:
            continue  # what was accepted, or noted already
        kept.pop(path, None)  # re-inserted last: the most recent are kept
        kept[path] = [sha, len(data), round_no]
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
