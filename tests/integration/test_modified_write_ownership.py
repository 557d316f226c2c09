"""Which files are the task's own is decided by the writes actually sent.

A human may approve a write with other arguments (`approve --modify`): the journal keeps
the call as the model asked it, but the file it made is the one it was sent to write.
Before the fix the model's request decided: a write redirected from the user's
`notes.md` to `other.md` made `notes.md` count as the task's, and the next write to it
went through with no approval.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.loop import ledger_of, run_task
from tether import approvals
from tether.models.scripted import tool_call
from tether.spec import parse_spec
from tether.store.memory import MemoryStore
from tether.tools.builtin.files import default_registry
from tether.tools.registry import ToolContext, tool

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


@tool(name="notify", effect="write")
def notify(ctx: ToolContext, channel: str) -> str:
    """A user's tool with effects (the contract makes it wait for approval)."""
    return f"told {channel}"


async def test_an_op_rule_is_proved_by_the_arguments_sent_not_those_asked(
    tmp_path: Path,
) -> None:
    """`done_when: {kind: op, tool: notify, args: {channel: ops}}`: a call the human
    redirected to `test` does not prove it, in a later round either (before the fix the
    rules judge read the journal's arguments, the model's request, from the second round
    on)."""
    spec = parse_spec(
        {
            "objective": "tell ops",
            "items": [
                {
                    "id": "i1",
                    "title": "ops told",
                    "done_when": {"kind": "op", "tool": "notify", "args": {"channel": "ops"}},
                }
            ],
            "tools": [{"name": "notify", "approval": True}, "list_files"],
            "models": {"judge": "rules"},
            "limits": {"no_progress_rounds": 50, "max_rounds": 12},
        }
    )
    store = await MemoryStore.open()
    registry = default_registry(lambda: store)
    registry.add(notify)
    model = ov.scripted(
        [tool_call("notify", channel="ops")],
        [tool_call("list_files", path=".")],
        [tool_call("list_files", path=".")],
    )
    tid, result = await run_task(store, spec, tmp_path, model, registry=registry)
    assert ov.asks_approval(result)
    (req,) = await approvals.pending(store, tid)
    await approvals.decide(store, tid, req.request_id, "approve", modified_args={"channel": "test"})

    _, result = await run_task(store, spec, tmp_path, model, task_id=tid, registry=registry)

    assert await ov.tool_results(store, tid) == [
        ("notify", "succeeded"),
        ("list_files", "succeeded"),
        ("list_files", "succeeded"),
    ]
    item = (await ledger_of(store, tid)).item("i1")
    assert item.status != "done", item


async def test_a_deliverable_written_by_a_modified_call_is_checked_where_it_was_written(
    tmp_path: Path,
) -> None:
    """The check before delivery looks for the file the call was sent to write, with the
    content it was sent (before the fix: the model's path and content, so a redirected
    write counted as a deliverable changed since it was accepted)."""
    (tmp_path / "report.md").write_text("the user's report\n")
    spec = parse_spec(
        {
            "objective": "write a report",
            "items": [
                {"id": "i1", "title": "written", "done_when": {"kind": "op", "tool": "write_file"}}
            ],
            "tools": ["write_file"],
            "models": {"judge": "rules"},
            "limits": {"no_progress_rounds": 50, "max_rounds": 12},
        }
    )
    store = await MemoryStore.open()
    model = ov.scripted([ov.write("report.md", "new report")])
    tid, result = await run_task(store, spec, tmp_path, model)
    assert ov.asks_approval(result)
    (req,) = await approvals.pending(store, tid)
    await approvals.decide(
        store, tid, req.request_id, "approve", modified_args={"path": "draft.md", "content": "d"}
    )

    _, result = await run_task(store, spec, tmp_path, model, task_id=tid)

    assert (tmp_path / "draft.md").read_text() == "d"
    assert (tmp_path / "report.md").read_text() == "the user's report\n"
    assert result.status == "satisfied", (result.status, result.waiting, result.stop_reason)
