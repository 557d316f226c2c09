"""The decision cycle on durable stores: a claiming actor blocks every item, the task
waits for a decision that survives reopening the database, a retry's hint reaches the
model in a new process-like handle, a waiver delivers with waivers. Once on SQLite
(with the CLI verbs `retry`, `waive`, `abandon`, `status`), once on PostgreSQL (skipped
only when `TETHER_TEST_PG_URL` is unset).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tether
from tests.support.adversarial import (
    act_requests,
    all_text,
    assert_honest,
    assert_status_agrees,
    change,
    contract,
    payload,
    plain_items,
    refs,
    say,
    statuses,
    verdict,
    write,
)
from tests.support.cli import assert_clean_error, json_out
from tests.support.cli import tether as cli
from tests.support.loop import events_of, run_task
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel
from tether.runtime.tasks import create_task

HINT = "the release note goes to out/publish.txt and must say SHIPPED"


def spec() -> tether.TaskSpec:
    return contract(plain_items("draft", "publish"))


def claimer(_: ModelRequest) -> ModelResponse:
    return say("Both items are complete; nothing left to do.")


def hinted(request: ModelRequest) -> ModelResponse:
    if "must say SHIPPED" in all_text(request):
        return say("following the hint", write("publish", "SHIPPED\n"))
    return say("Both items are complete; nothing left to do.")


def judge(request: ModelRequest) -> str:
    focus = payload(request)["focus_item"]
    writes = refs(request, tool="write_file")
    if writes:
        return verdict([change(focus, "done", writes)], "continue")
    return verdict([change(i, "done") for i in ("draft", "publish")], "satisfied", "agent says so")


def no_act(_: ModelRequest) -> ModelResponse:
    raise AssertionError("nothing is open; the model must not be asked to act")


async def decision_cycle(url: str, workspace: Path) -> str:
    """Block both items, retry one with a hint, finish it; returns the task id, left
    waiting for a decision on `draft`. Every step on a fresh store handle."""
    store = await tether.open_store(url)
    try:
        task = await create_task(store, spec(), workspace=workspace)
        tid = task.task_id
        _, result = await run_task(
            store,
            spec(),
            workspace,
            ScriptedModel(policy=claimer),
            judge=ScriptedModel(policy=judge),
            task_id=tid,
        )
        assert result.status == "waiting"
    finally:
        await store.close()

    store = await tether.open_store(url)
    try:
        task = await store.get_task(tid)
        assert task.status == "waiting" and task.waiting is not None
        assert task.waiting["kind"] == "decision"
        assert [b["id"] for b in task.waiting["partial"]["blocked"]] == ["draft", "publish"]
        assert len(await events_of(store, tid, "decision.requested")) == 1
        await assert_honest(store, tid, spec())
        await tether.retry_item(store, tid, "publish", hint=HINT, by="ops")
    finally:
        await store.close()

    store = await tether.open_store(url)
    try:
        actor = ScriptedModel(policy=hinted)
        _, result = await run_task(
            store, spec(), workspace, actor, judge=ScriptedModel(policy=judge), task_id=tid
        )
        assert any(HINT in m.content for m in act_requests(actor)[0].messages)
        assert await statuses(store, tid) == {"draft": "blocked", "publish": "done"}
        assert result.status == "waiting" and result.waiting is not None
        assert result.waiting["kind"] == "decision"
        await assert_honest(store, tid, spec())
        await assert_status_agrees(store, tid)
    finally:
        await store.close()
    return tid


async def finish(url: str, workspace: Path, tid: str) -> None:
    store = await tether.open_store(url)
    try:
        _, result = await run_task(
            store, spec(), workspace, ScriptedModel(policy=no_act), task_id=tid
        )
        assert (result.status, result.stop_reason) == ("satisfied", "delivered_with_waivers")
        assert await statuses(store, tid) == {"draft": "waived", "publish": "done"}
        await assert_honest(store, tid, spec())
        doc = await assert_status_agrees(store, tid)
        assert [w["id"] for w in doc["waivers"]] == ["draft"]
    finally:
        await store.close()


async def test_sqlite_decision_cycle_with_the_cli_verbs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    ws = tmp_path / "ws"
    ws.mkdir()
    tid = await decision_cycle(url, ws)

    # The CLI refuses a waiver without a reason, then takes one.
    bad = cli("waive", tid, "draft", "--db", url, cwd=tmp_path)
    assert_clean_error(bad, 2, "reason")
    ok = cli(
        "waive",
        tid,
        "draft",
        "--reason",
        "drafted by hand",
        "--by",
        "cli-user",
        "--db",
        url,
        cwd=tmp_path,
    )
    assert ok.returncode == 0, ok.stderr
    doc = json_out(cli("status", tid, "--json", "--db", url, cwd=tmp_path))
    assert doc["status"] == "queued"
    assert [(w["id"], w["status"]) for w in doc["waivers"]] == [("draft", "waived")]
    assert "drafted by hand" in doc["waivers"][0]["reason"]
    await finish(url, ws, tid)
    done = json_out(cli("status", tid, "--json", "--db", url, cwd=tmp_path))
    assert (done["status"], done["stop_reason"]) == ("satisfied", "delivered_with_waivers")


async def test_sqlite_cli_retry_and_abandon(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    ws = tmp_path / "ws"
    ws.mkdir()
    store = await tether.open_store(url)
    try:
        tid, result = await run_task(store, spec(), ws, ScriptedModel(policy=claimer))
        assert result.status == "waiting"
    finally:
        await store.close()
    retried = cli("retry", tid, "publish", "--hint", HINT, "--db", url, cwd=tmp_path)
    assert retried.returncode == 0, retried.stderr
    unknown = cli("retry", tid, "nope", "--db", url, cwd=tmp_path)
    assert_clean_error(unknown, 2, "nope")
    store = await tether.open_store(url)
    try:
        assert await statuses(store, tid) == {"draft": "blocked", "publish": "pending"}
        messages = await events_of(store, tid, "user.message")
        assert any(HINT in m["text"] for m in messages)
    finally:
        await store.close()
    gone = cli("abandon", tid, "--reason", "no longer needed", "--db", url, cwd=tmp_path)
    assert gone.returncode == 0, gone.stderr
    doc = json_out(cli("status", tid, "--json", "--db", url, cwd=tmp_path))
    assert (doc["status"], doc["stop_reason"]) == ("abandoned", "abandoned_by_user")
    again = cli("waive", tid, "draft", "--reason", "late", "--db", url, cwd=tmp_path)
    assert_clean_error(again, 2, "abandoned")


@pytest.mark.postgres
async def test_postgres_decision_cycle(pg_url: str, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    tid = await decision_cycle(pg_url, ws)
    store = await tether.open_store(pg_url)
    try:
        await tether.waive_item(store, tid, "draft", reason="drafted by hand", by="pg-user")
    finally:
        await store.close()
    await finish(pg_url, ws, tid)
    store = await tether.open_store(pg_url)
    try:
        waived = await events_of(store, tid, "item.waived")
        assert [(w["item"], w["by"]) for w in waived] == [("draft", "pg-user")]
        doc = await tether.status_dict(store, tid)
        assert json.loads(json.dumps(doc)) == doc  # JSON-ready, as `status --json` prints it
    finally:
        await store.close()
