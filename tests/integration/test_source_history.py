"""The results of rounds made from an old source version go to history with the
artifacts: after `tether edit --source` (or a fingerprint found changed on re-read), the
reads of the old version are marked superseded, never count as evidence again, the item
they proved reopens, and `artifacts.history` (and the invalidation event) lists them.
On every store."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from tests.support.loop import events_of, ledger_of, run_task
from tether import artifacts as A
from tether.edits import edit_task
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.rebuild import rebuild
from tether.runtime.ops.runner import superseded_by
from tether.runtime.tasks import create_task
from tether.spec import parse_spec
from tether.store.base import OpRecord, Store
from tether.tools.builtin.sources import source_tools
from tether.tools.registry import ToolContext


def _spec() -> Any:
    return parse_spec(
        {
            "objective": "read A and B",
            "sources": [
                {"id": "A", "version": "1.0", "location": "a-1.0.md"},
                {"id": "B", "version": "2.0", "location": "b-2.0.md"},
            ],
            "items": [
                {
                    "id": f"read_{p.lower()}",
                    "title": f"read source {p}",
                    "done_when": {"kind": "op", "tool": "read_source", "args": {"source": p}},
                }
                for p in ("A", "B")
            ],
            "tools": ["read_source"],
        }
    )


def reader(reads: list[str]) -> Any:
    """Reads the source of the item the ledger names Next."""

    def policy(request: ModelRequest) -> ModelResponse:
        nxt = request.ledger["next"] if request.ledger else None
        if nxt is None:
            return ModelResponse("both read")
        source = nxt.removeprefix("read_").upper()
        reads.append(source)
        return ModelResponse("reading", (tool_call("read_source", source=source),))

    return policy


async def test_reads_of_the_old_version_go_to_history_and_their_item_reopens(
    store: Store, tmp_path: Path
) -> None:
    for name, text in (("a-1.0", "A is red."), ("b-2.0", "B costs 35."), ("b-3.0", "B costs 40.")):
        (tmp_path / f"{name}.md").write_text(text)
    reads: list[str] = []
    tid, first = await run_task(store, _spec(), tmp_path, ScriptedModel(policy=reader(reads)))
    assert first.status == "satisfied" and reads == ["A", "B"], first
    ops = {o.args["source"]: o for o in await store.get_ops(tid, tools={"read_source"})}
    led = await ledger_of(store, tid)
    assert led.item("read_b").evidence == (f"op:{ops['B'].op_id}",)

    task = await store.get_task(tid)
    await edit_task(store, tid, A.source_changes(task.spec, ["B=3.0@b-3.0.md"]))
    after = {o.op_id: o for o in await store.get_ops(tid, tools={"read_source"})}
    old_b = after[ops["B"].op_id]
    assert superseded_by(old_b) == 2 and "from version 2.0 to 3.0" in old_b.result[A.STALE]
    assert old_b.result["content"] == ops["B"].result["content"]  # kept, as history
    assert superseded_by(after[ops["A"].op_id]) is None  # A's read is current
    led = await ledger_of(store, tid)
    assert (led.item("read_a").status, led.item("read_b").status) == ("done", "pending")
    assert "invalid" in led.item("read_b").note
    inval = await events_of(store, tid, "artifacts.invalidated")
    assert inval[-1]["ops"] == [ops["B"].op_id] and inval[-1]["items"] == ["read_b"]
    hist = await A.history(store, tid)
    assert [(o["op_id"], o["source"], o["superseded_by"]) for o in hist["ops"]] == [
        (ops["B"].op_id, "B", 2)
    ]
    status = await A.status_view(store, tid, (await store.get_task(tid)).spec)
    assert status["artifacts"]["stale_read_count"] == 1

    reads.clear()
    _, second = await run_task(
        store, _spec(), tmp_path, ScriptedModel(policy=reader(reads)), task_id=tid
    )
    assert second.status == "satisfied", second
    assert reads == ["B"]  # A's read stays current, not redone
    led = await ledger_of(store, tid)
    (new_b,) = [
        o
        for o in await store.get_ops(tid, tools={"read_source"})
        if o.args["source"] == "B" and superseded_by(o) is None
    ]
    assert led.item("read_b").evidence == (f"op:{new_b.op_id}",)
    assert "B costs 40." in new_b.result["content"]
    assert (await rebuild(store, tid))["ledger"] == []


async def test_a_changed_fingerprint_sends_the_earlier_reads_to_history(
    store: Store, tmp_path: Path
) -> None:
    (tmp_path / "c.csv").write_text("x,y\n1,2\n")
    spec = parse_spec(
        {
            "objective": "o",
            "items": [{"id": "i", "title": "t"}],
            "sources": [{"id": "C", "version": "7", "location": "c.csv", "pin": "fingerprint"}],
        }
    )
    task = await create_task(store, spec, workspace=tmp_path)
    lease = await store.claim("w", 60, task_id=task.task_id)
    assert lease is not None
    tool = {t.name: t for t in source_tools(lambda: store)}["read_source"]

    async def read(n: int) -> str:
        ctx = ToolContext(
            op_id=f"{task.task_id}.r{n}.c0",
            task_id=task.task_id,
            task_version=1,
            fencing_token=lease.token,
            workspace=tmp_path,
            logger=logging.getLogger("test"),
        )
        text = str(await tool.fn({"source": "C"}, ctx))
        # Journal the call as the runtime does once it succeeded.
        op = OpRecord(
            ctx.op_id, task.task_id, n, 0, "read_source", {"source": "C"}, f"h{n}", "read",
            "succeeded", result={"content": text},
        )  # fmt: skip
        await store.commit(task.task_id, lease.token, [], ops=[op])
        return text

    await read(1)
    await read(2)
    (tmp_path / "c.csv").write_text("x,y\n1,3\n")
    assert "changed on re-read" in await read(3)
    ops = {o.round: o for o in await store.get_ops(task.task_id)}
    assert [superseded_by(ops[n]) for n in (1, 2, 3)] == [1, 1, None]
    assert "changed on re-read" in ops[1].result[A.STALE]
    inval = await events_of(store, task.task_id, "artifacts.invalidated")
    assert inval[0]["ops"] == [ops[1].op_id, ops[2].op_id]
