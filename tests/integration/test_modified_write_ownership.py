"""Which files are the task's own is decided by the writes actually sent.

A human may approve a write with other arguments (`approve --modify`): the journal keeps
the call as the model asked it, but the file it made is the one it was sent to write.
Before the fix the model's request decided: a write redirected from the user's
`notes.md` to `other.md` made `notes.md` count as the task's, and the next write to it
went through with no approval.
"""

from __future__ import annotations

from pathlib import Path

from tether import approvals
from tether.store.memory import MemoryStore

from . import test_overwrite_approval as ov


async def test_a_write_redirected_by_modify_does_not_make_the_asked_file_the_tasks(
    tmp_path: Path,
) -> None:
    notes = tmp_path / "notes.md"
    notes.write_text("the user's draft\n")
    store = await MemoryStore.open()
    model = ov.scripted([ov.write("notes.md", "mine now")], [ov.write("notes.md", "again")])
    tid, result = await ov.run(store, tmp_path, model)
    assert ov.asks_approval(result)
    (req,) = await approvals.pending(store, tid)
    await approvals.decide(
        store,
        tid,
        req.request_id,
        "approve",
        modified_args={"path": "other.md", "content": "reviewed\n"},
    )

    _, result = await ov.run(store, tmp_path, model, task_id=tid)

    assert (tmp_path / "other.md").read_text() == "reviewed\n"
    # The second write to notes.md is an overwrite of the user's file: it waits.
    assert ov.asks_approval(result), result.waiting
    (again,) = await approvals.pending(store, tid)
    assert again.request["effect"] == "overwrite"
    assert again.request["impact"] == "overwrites notes.md, which existed before the task started"
    assert notes.read_text() == "the user's draft\n"


async def test_the_file_a_modified_write_created_is_the_tasks(tmp_path: Path) -> None:
    """The other side: the file the approved call did create is the task's own, so the
    model may rewrite it without asking again."""
    (tmp_path / "notes.md").write_text("the user's draft\n")
    store = await MemoryStore.open()
    model = ov.scripted([ov.write("notes.md", "mine")], [ov.write("copy.md", "second pass")])
    tid, result = await ov.run(store, tmp_path, model)
    assert ov.asks_approval(result)
    (req,) = await approvals.pending(store, tid)
    await approvals.decide(
        store, tid, req.request_id, "approve", modified_args={"path": "copy.md", "content": "a"}
    )

    _, result = await ov.run(store, tmp_path, model, task_id=tid)

    assert ov.finished(result), result.waiting
    assert (tmp_path / "copy.md").read_text() == "second pass"
    assert (tmp_path / "notes.md").read_text() == "the user's draft\n"
    assert await ov.tool_results(store, tid) == [
        ("write_file", "succeeded"),
        ("write_file", "succeeded"),
    ]
