"""HTTP 409 on a call with effects: on the op's first attempt no earlier request carried
its key, so the conflict is with what was there before ("already exists") and the call
did nothing: the model is told and the task goes on. On a retry of the same op (the
first attempt met a 503) the 409 may be the first attempt's own doing: in doubt, a
person decides (the tool has no `reconcile`)."""

from __future__ import annotations

from pathlib import Path

import tether
from tests.support.loop import events_of
from tether import approvals
from tether.models.base import ModelRequest, ModelResponse
from tether.store.memory import MemoryStore
from tether.tools.builtin.files import default_registry


class HTTPStatusError(Exception):
    """An HTTP client's error (the `status_code` tether reads)."""

    def __init__(self, status_code: int, text: str) -> None:
        super().__init__(text)
        self.status_code = status_code


def _spec() -> tether.TaskSpec:
    return tether.parse_spec(
        {
            "objective": "upload the report",
            "items": [
                {"id": "up", "title": "upload", "done_when": {"kind": "op", "tool": "upload"}}
            ],
            "tools": [{"name": "upload", "approval": False}, "write_file"],
            "models": {"judge": "rules"},
        }
    )


async def _run(
    tmp_path: Path, answers: list[int]
) -> tuple[MemoryStore, str, tether.RunResult, list[str]]:
    """Run the task; `upload` answers each status of `answers` in turn (200: done)."""
    store = await MemoryStore.open()
    keys: list[str] = []

    @tether.tool(effect="write", idempotent=False, retry=tether.RetryPolicy(base_delay=0.01))
    def upload(name: str, ctx: tether.ToolContext) -> str:
        """Upload a file to the destination."""
        keys.append(ctx.op_id)
        status = answers[min(len(keys), len(answers)) - 1]
        if status == 200:
            return f"{name} stored"
        raise HTTPStatusError(
            status, f"{status}: {name} already exists" if status == 409 else f"{status}"
        )

    def actor(request: ModelRequest) -> ModelResponse:
        said = [m.content for m in request.messages if m.role == "tool"]
        if not said:
            return ModelResponse("uploading", (tether.tool_call("upload", name="report.md"),))
        if any("already exists" in s for s in said) and not any("stored" in s for s in said):
            return ModelResponse("it is there already; uploading under a new name",
                                 (tether.tool_call("upload", name="report-2.md"),))  # fmt: skip
        return ModelResponse("done")

    tid = (await tether.create_task(store, _spec(), workspace=tmp_path)).task_id
    registry = default_registry(lambda: store)
    registry.add(upload)
    engine = tether.Engine(
        store, tether.ModelSet(tether.ScriptedModel(policy=actor)), registry=registry
    )
    return store, tid, await engine.run(tid), keys


async def test_a_409_on_the_first_attempt_goes_back_to_the_model(tmp_path: Path) -> None:
    store, tid, result, keys = await _run(tmp_path, [409, 200])
    assert result.status == "satisfied", result
    assert len(set(keys)) == 2  # a second op (the new name), the first never resent
    assert await approvals.pending(store, tid) == []
    failed = [e for e in await events_of(store, tid, "op.result") if e.get("status") == "failed"]
    assert failed and failed[0]["error_class"] == "deterministic"


async def test_a_409_on_a_retry_of_the_same_op_is_in_doubt(tmp_path: Path) -> None:
    store, tid, result, keys = await _run(tmp_path, [503, 409, 200])
    assert result.status == "waiting", result
    assert len(keys) == 2 and len(set(keys)) == 1  # the same op, sent twice, then held
    (asked,) = await approvals.pending(store, tid)
    assert asked.request["kind"] == "op_in_doubt"
