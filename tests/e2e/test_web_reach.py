"""Pausing from the dashboard's server, on SQLite and PostgreSQL: the API's pause and
resume (token needed, bad input changes nothing), the task page's pause and resume
buttons, and "running (owner gone)" in the API's documents and on the page."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the dashboard needs the web extra")

from fastapi.testclient import TestClient

from tests.support.loop import honest_actor, spec_of
from tether import lifecycle
from tether.models.scripted import ScriptedModel
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.tasks import create_task
from tether.store import open_store
from tether.store.base import TaskPatch
from tether.web import create_app
from tether.web.security import COOKIE, Access

TOKEN = "test-token-0123456789"
BASE = "http://127.0.0.1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def _queued(url: str, ws: Path) -> str:
    """A task that ran one round and is queued again."""
    store = await open_store(url)
    try:
        task = await create_task(store, spec_of(3), workspace=ws)
        engine = Engine(
            store,
            ModelSet(actor=ScriptedModel(policy=honest_actor)),
            lease_ttl=30,
            max_rounds_this_run=1,
        )
        assert (await engine.run(task.task_id)).status == "queued"
        return task.task_id
    finally:
        await store.close()


async def _orphan(url: str, tid: str) -> None:
    """Leave the task `running` under the lease of a process of this machine that is gone."""
    proc = await asyncio.create_subprocess_exec("true")
    await proc.wait()
    store = await open_store(url)
    try:
        lease = await store.claim(f"{socket.gethostname()}:{proc.pid}", 3600, task_id=tid)
        assert lease is not None
        change, patch = lifecycle.transition(await store.get_task(tid), "running", "start")
        await store.commit(tid, lease.token, [change], task=TaskPatch(**patch))
    finally:
        await store.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def queued(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """(db url, task id) of a queued task."""
    ws = tmp_path / "ws"
    ws.mkdir()
    if request.param == "postgres":
        url = str(request.getfixturevalue("pg_url"))
    else:
        url = f"sqlite:///{tmp_path}/t.db"
    return url, asyncio.run(_queued(url, ws))


@pytest.fixture
def client(queued: tuple[str, str]) -> Iterator[TestClient]:
    with TestClient(create_app(queued[0], token=TOKEN), base_url=BASE) as c:
        yield c


def _status(client: TestClient, tid: str) -> dict[str, Any]:
    return dict(client.get(f"/api/tasks/{tid}").json())


def test_api_pause_and_resume(queued: tuple[str, str], client: TestClient) -> None:
    _, tid = queued
    assert client.post(f"/api/tasks/{tid}/pause").status_code == 403  # no token
    r = client.post(f"/api/tasks/{tid}/pause", json={"reason": "x" * 9000}, headers=AUTH)
    assert r.status_code == 400
    assert _status(client, tid)["status"] == "queued"  # refused: nothing changed
    r = client.post(f"/api/tasks/{tid}/pause", json={"by": "ana", "reason": "lunch"}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert (r.json()["outcome"], r.json()["status"]) == ("paused", "paused")
    assert client.post(f"/api/tasks/{tid}/pause", headers=AUTH).json()["outcome"] == (
        "already_paused"
    )
    r = client.post(f"/api/tasks/{tid}/resume", json={"by": "ana"}, headers=AUTH)
    assert r.status_code == 200 and r.json()["status"] == "queued"
    r = client.post(f"/api/tasks/{tid}/resume", headers=AUTH)
    assert r.status_code == 400 and "not paused" in r.json()["detail"]
    assert client.post("/api/tasks/t-none/pause", headers=AUTH).status_code == 404
    schema = client.get("/api/openapi.json").json()
    assert {"/api/tasks/{task_id}/pause", "/api/tasks/{task_id}/resume"} <= set(schema["paths"])


def test_page_buttons_and_owner_gone(queued: tuple[str, str], client: TestClient) -> None:
    url, tid = queued
    csrf = Access(TOKEN).csrf
    client.cookies.update({COOKIE: TOKEN})
    page = client.get(f"/tasks/{tid}").text
    assert f'action="/tasks/{tid}/pause"' in page
    r = client.post(
        f"/tasks/{tid}/pause", data={"csrf": csrf}, headers={"Origin": BASE}, follow_redirects=False
    )
    assert r.status_code == 303
    page = client.get(f"/tasks/{tid}").text
    assert _status(client, tid)["status"] == "paused"
    assert f'action="/tasks/{tid}/resume"' in page
    r = client.post(
        f"/tasks/{tid}/resume",
        data={"csrf": csrf},
        headers={"Origin": BASE},
        follow_redirects=False,
    )
    assert r.status_code == 303 and _status(client, tid)["status"] == "queued"

    asyncio.run(_orphan(url, tid))
    doc = _status(client, tid)
    assert doc["status"] == "running" and "is gone" in doc["owner_gone"]
    (row,) = [t for t in client.get("/api/tasks").json() if t["task_id"] == tid]
    assert "is gone" in row["owner_gone"]
    assert "running (owner gone)" in client.get(f"/tasks/{tid}").text
    assert "running (owner gone)" in client.get("/partials/tasks").text
    r = client.post(f"/api/tasks/{tid}/pause", headers=AUTH)
    assert r.json()["outcome"] == "paused"  # taken from the gone owner, paused at once
