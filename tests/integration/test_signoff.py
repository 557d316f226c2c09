"""A person signs off before delivery (`review: human`), through the Python API on SQLite
and PostgreSQL: the task waits after the completion check with the execution report;
`approve` delivers; `reject` with a hint reopens an item, the model's next request holds
the hint, and the task waits again when the work is complete; a reviewer model first,
then the person; and the retrospective report counts failures by milestone."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.support.loop import by_purpose, events_of, honest_actor, ledger_of, run_task, spec_of
from tether import errors, signoff
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.report import build_report
from tether.report.execution import build_execution, render_text
from tether.report.render import render
from tether.spec import TaskSpec
from tether.store import Store

HINT = "i2 must say 'checked' at its end"


#: The durable stores (the conftest's `store` on these backends): SQLite, PostgreSQL.
pytestmark = pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)


def _acceptance() -> list[dict[str, Any]]:
    return [
        {"id": "files", "description": "both files", "check": {"command": "test -f out/i2.txt"}}
    ]


class Actor:
    """Writes each Next item's file; after a rejected sign-off, writes i2 as the hint
    asks. Keeps every request it got."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    def __call__(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        hinted = any(HINT in m.content for m in request.messages if m.role == "user")
        resp = honest_actor(request)
        if hinted and resp.tool_calls:
            path = resp.tool_calls[0].arguments["path"]
            return ModelResponse("redo", (tool_call("write_file", path=path, content="checked"),))
        return resp


async def _waiting(
    store: Store, tmp_path: Path, actor: Actor | None = None
) -> tuple[TaskSpec, ScriptedModel, str]:
    """A `review: human` task run until it waits for sign-off: its spec, model and id."""
    spec = spec_of(2, review="human", acceptance=_acceptance())
    model = ScriptedModel(policy=actor or Actor())
    tid, result = await run_task(store, spec, tmp_path, model)
    assert result.status == "waiting"
    return spec, model, tid


async def test_review_human_waits_with_the_report_and_approve_delivers(
    store: Store, tmp_path: Path
) -> None:
    spec, model, tid = await _waiting(store, tmp_path)
    task = await store.get_task(tid)
    assert task.waiting is not None and task.waiting["signoff"] is True
    report = task.waiting["report"]
    assert [(i["id"], i["status"]) for i in report["items"]] == [("i1", "done"), ("i2", "done")]
    assert all(i["evidence"] for i in report["items"])
    assert [s["item"] for s in report["steps"]["by_item"]] == ["i1", "i2"]
    assert report["steps"]["by_item"][0]["tools"] == {"write_file": 1}
    assert report["acceptance"] == [
        {"id": "files", "passed": True, "detail": "exit 0", "checked": True}
    ]
    assert report["cost"]["tokens"] > 0 and report["waivers"] == []
    asked = await events_of(store, tid, "decision.requested")
    assert len(asked) == 1 and asked[0]["report"] == report
    # Nothing delivers it but a person.
    _, again = await run_task(store, spec, tmp_path, model, task_id=tid)
    assert again.status == "waiting"

    await signoff.approve(store, tid, by="ana")
    _, done = await run_task(store, spec, tmp_path, model, task_id=tid)
    assert (done.status, done.stop_reason) == ("satisfied", "delivered")
    decided = await events_of(store, tid, "signoff.decided")
    assert [(d["decision"], d["by"]) for d in decided] == [("approve", "ana")]
    status = await events_of(store, tid, "task.status")
    assert status[-1]["reason"] == "signed off by ana"


async def test_reject_reopens_the_item_the_model_hears_the_hint_and_it_waits_again(
    store: Store, tmp_path: Path
) -> None:
    actor = Actor()
    spec, model, tid = await _waiting(store, tmp_path, actor)
    before = len(actor.requests)

    with pytest.raises(errors.UserError, match="name the items to redo"):
        await signoff.reject(store, tid, hint="not good enough", by="ana")
    # The hint names i2: it goes back to work (no --reopen needed).
    await signoff.reject(store, tid, hint=HINT, by="ana")
    ledger = await ledger_of(store, tid)
    assert [s.status for _, s in ledger.items()] == ["done", "pending"]

    _, result = await run_task(store, spec, tmp_path, model, task_id=tid)
    assert result.status == "waiting"
    assert (await store.get_task(tid)).waiting["signoff"] is True  # type: ignore[index]
    nxt = actor.requests[before]
    assert any(HINT in m.content for m in nxt.messages if m.role == "user")
    assert (tmp_path / "out" / "i2.txt").read_text() == "checked"
    doc = await build_execution(store, tid)
    assert doc["deviations"]["reopened"] == [{"item": "i2", "by": "signoff"}]
    decided = await events_of(store, tid, "signoff.decided")
    assert decided[0]["reopen"] == ["i2"] and decided[0]["hint"] == HINT

    await signoff.approve(store, tid, by="ana")
    _, done = await run_task(store, spec, tmp_path, model, task_id=tid)
    assert done.status == "satisfied"


async def test_the_reviewer_model_first_then_the_person(store: Store, tmp_path: Path) -> None:
    reviews = iter(
        ['{"passed": false, "gaps": ["i2 is thin"], "reopen": ["i2"]}', '{"passed": true}']
    )
    spec = spec_of(2, review={"model": True, "then": "human"}, acceptance=_acceptance())
    model = ScriptedModel(
        policy=by_purpose(act=honest_actor, judge=lambda r: "{}", review=lambda r: next(reviews))
    )
    tid, result = await run_task(store, spec, tmp_path, model, review=model)
    assert result.status == "waiting"
    checks = await events_of(store, tid, "completion.checked")
    assert [c["passed"] for c in checks] == [False, True]
    report = (await store.get_task(tid)).waiting["report"]  # type: ignore[index]
    assert report["deviations"]["reopened"] == [{"item": "i2", "by": "review"}]
    await signoff.approve(store, tid)
    _, done = await run_task(store, spec, tmp_path, model, review=model, task_id=tid)
    assert done.status == "satisfied"


async def test_approve_refuses_a_task_that_does_not_wait_for_sign_off(
    store: Store, tmp_path: Path
) -> None:
    spec = spec_of(1)
    tid, result = await run_task(store, spec, tmp_path, ScriptedModel(policy=honest_actor))
    assert result.status == "satisfied"
    with pytest.raises(errors.UserError):
        await signoff.approve(store, tid)
    # A task waiting for something else: the answer names its verb and the requests.
    asks = ScriptedModel(policy=lambda _: ModelResponse("NEED_HELP: which folder?"))
    waiting, result = await run_task(store, spec, tmp_path / "w", asks)
    assert result.status == "waiting"
    with pytest.raises(errors.UserError, match=f"tether approve {waiting} REQUEST"):
        await signoff.approve(store, waiting)
    with pytest.raises(errors.UserError, match=f"tether reject {waiting} REQUEST") as info:
        await signoff.reject(store, waiting, hint="not yet")
    assert f"tether approvals {waiting}" in str(info.value)


async def test_failures_by_milestone_and_the_execution_report_text(
    store: Store, tmp_path: Path
) -> None:
    """Two failing calls in milestone `read`, one in `write`: the report says so."""
    spec = spec_of(
        3,
        milestones=[{"id": "read", "title": "Read"}, {"id": "write", "title": "Write"}],
        items=[
            {
                "id": f"i{k}",
                "title": f"write out/i{k}.txt",
                "milestone": "read" if k < 3 else "write",
                "done_when": {"kind": "file", "path": f"out/i{k}.txt"},
            }
            for k in (1, 2, 3)
        ],
    )
    failed: set[str] = set()

    def actor(request: ModelRequest) -> ModelResponse:
        resp = honest_actor(request)
        nxt = resp.tool_calls[0].arguments["path"] if resp.tool_calls else None
        if nxt and nxt not in failed:  # each item's first call reads a missing file
            failed.add(nxt)
            return ModelResponse("look", (tool_call("read_file", path="missing.txt"),))
        return resp

    tid, result = await run_task(store, spec, tmp_path, ScriptedModel(policy=actor))
    assert result.status == "satisfied"
    doc = await build_report(store, tid)
    assert doc["failures"]["by_milestone"] == {"read": 2, "write": 1}
    md = render(doc, "md")
    assert "Failures by milestone" in md and re.search(r"\|\s*read\s*\|\s*2\s*\|", md)
    text = render_text(await build_execution(store, tid), 80)
    assert "i1 [read]: done" in text and "read_file x1, write_file x1" in text
    assert max(len(line) for line in text.splitlines()) <= 80


async def test_the_dashboard_shows_the_execution_report_of_a_sign_off(
    store: Store, tmp_path: Path
) -> None:
    pytest.importorskip("fastapi", reason="the web extra is not installed")
    from fastapi.testclient import TestClient

    from tether.web import create_app
    from tether.web.security import COOKIE

    _, _, tid = await _waiting(store, tmp_path)
    app = create_app(None, token="test-token-0123456789", store=store)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        client.cookies.update({COOKIE: "test-token-0123456789"})
        page = client.get(f"/tasks/{tid}/partials/state").text
    assert "Waiting for sign-off: the execution report" in page
    assert page.count('class="signoff-item"') == 2
    assert "acceptance files: passed" in page
    assert f"tether approve {tid}" in page


async def test_a_run_with_a_rejected_then_approved_sign_off_replays_clean(
    store: Store, tmp_path: Path
) -> None:
    from tether.report.replay import replay_task

    spec, model, tid = await _waiting(store, tmp_path)
    await signoff.reject(store, tid, hint=HINT, by="ana")
    await run_task(store, spec, tmp_path, model, task_id=tid)
    await signoff.approve(store, tid, by="ana")
    _, done = await run_task(store, spec, tmp_path, model, task_id=tid)
    assert done.status == "satisfied"
    result = await replay_task(store, tid)
    assert result.divergence is None, result.divergence
    assert result.stopped_at is None
