"""A person signs off from the dashboard, on SQLite and PostgreSQL: the task page of a
task that waits for sign-off (`review: human`) has an approve and a reject form, and the
JSON API has the same two actions; each calls `tether.signoff` in the signed-in
person's name, and bad input (an unknown item, a task that does not wait) is a clear
4xx that writes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the dashboard needs the web extra")

from fastapi.testclient import TestClient

from tests.support.loop import spec_of
from tether.models.scripted import ScriptedModel
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.tasks import create_task
from tether.store import open_store
from tether.web import create_app
from tether.web.security import COOKIE, Access

from . import signoff_policies

ANA = "ana-token-0123456789abcdef00"
BASE = "http://127.0.0.1"


async def _waiting_task(url: str, ws: Path) -> str:
    """A `review: human` task of two items, run until it waits for sign-off."""
    store = await open_store(url)
    try:
        task = await create_task(store, spec_of(2, review="human"), workspace=ws)
        engine = Engine(
            store, ModelSet(actor=ScriptedModel(policy=signoff_policies.writer)), lease_ttl=30
        )
        await engine.run(task.task_id)
        return task.task_id
    finally:
        await store.close()


@pytest.fixture
def waiting(db_url: str, tmp_path: Path) -> tuple[str, str]:
    """(db url on SQLite or PostgreSQL, id of a task waiting for sign-off)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    return db_url, asyncio.run(_waiting_task(db_url, ws))


@pytest.fixture
def client(waiting: tuple[str, str]) -> Iterator[TestClient]:
    with TestClient(create_app(waiting[0], token=None, named={"ana": ANA}), base_url=BASE) as c:
        c.cookies.update({COOKIE: ANA})
        yield c


def _status(client: TestClient, tid: str) -> dict[str, Any]:
    doc: dict[str, Any] = client.get(f"/api/tasks/{tid}").json()
    return doc


def _decided(client: TestClient, tid: str) -> list[dict[str, Any]]:
    events = client.get(f"/api/tasks/{tid}/events", params={"type": "signoff.decided"}).json()
    return [e["data"] for e in events]


def _form(client: TestClient, path: str, **fields: str) -> Any:
    return client.post(path, data={"csrf": Access.csrf_of(ANA), **fields}, follow_redirects=False)


def test_approve_from_the_task_page_in_the_signed_in_name(
    waiting: tuple[str, str], client: TestClient
) -> None:
    _, tid = waiting
    page = client.get(f"/tasks/{tid}").text
    assert f'action="/tasks/{tid}/signoff/approve"' in page and "Approve (sign off)" in page
    assert f'action="/tasks/{tid}/signoff/reject"' in page and 'name="reopen"' in page
    # Without the CSRF token nothing is decided.
    r = client.post(f"/tasks/{tid}/signoff/approve", data={}, follow_redirects=False)
    assert r.status_code == 403 and "CSRF" in r.text
    assert _decided(client, tid) == []

    r = _form(client, f"/tasks/{tid}/signoff/approve")
    assert r.status_code == 303 and r.headers["location"] == f"/tasks/{tid}"
    assert [(d["decision"], d["by"]) for d in _decided(client, tid)] == [("approve", "ana")]
    assert _status(client, tid)["status"] == "queued"
    # No longer waiting: the forms are gone, and a second approval is a clear error.
    assert "Approve (sign off)" not in client.get(f"/tasks/{tid}").text
    r = _form(client, f"/tasks/{tid}/signoff/approve")
    assert r.status_code in (400, 409) and "does not wait for a sign-off" in r.text
    assert len(_decided(client, tid)) == 1


def test_reject_from_the_task_page_reopens_the_named_items(
    waiting: tuple[str, str], client: TestClient
) -> None:
    _, tid = waiting
    before = _status(client, tid)
    r = _form(client, f"/tasks/{tid}/signoff/reject", hint="redo it", reopen="i2, nope")
    assert r.status_code == 400 and "no item &#39;nope&#39;" in r.text, r.text
    r = _form(client, f"/tasks/{tid}/signoff/reject", hint="  ", reopen="i2")
    assert r.status_code == 400 and "needs a hint" in r.text, r.text
    assert _status(client, tid) == before and _decided(client, tid) == []

    r = _form(client, f"/tasks/{tid}/signoff/reject", hint="say checked", reopen=" i1 i2,")
    assert r.status_code == 303, r.text
    (decided,) = _decided(client, tid)
    assert (decided["decision"], decided["by"], decided["reopen"]) == (
        "reject",
        "ana",
        ["i1", "i2"],
    )
    doc = _status(client, tid)
    assert doc["status"] == "queued"
    assert {i["id"]: i["status"] for i in doc["ledger"]["items"]} == {
        "i1": "pending",
        "i2": "pending",
    }


def test_the_api_approves_and_rejects_a_sign_off(
    waiting: tuple[str, str], client: TestClient
) -> None:
    _, tid = waiting
    auth = {"Authorization": f"Bearer {ANA}"}
    before = _status(client, tid)
    bad = [
        ({"hint": "redo", "reopen": ["zz"]}, 400, "no item 'zz'"),
        ({"hint": "redo", "reopen": "i1"}, 400, "reopen"),
        ({"hint": "redo", "reopen": ["i1"], "by": "bob"}, 403, "signed in as 'ana'"),
    ]
    for body, code, needle in bad:
        r = client.post(f"/api/tasks/{tid}/signoff/reject", json=body, headers=auth)
        assert r.status_code == code and needle in str(r.json()["detail"]), (body, r.text)
    assert client.post(f"/api/tasks/{tid}/signoff/approve").status_code == 403
    assert _status(client, tid) == before and _decided(client, tid) == []

    r = client.post(
        f"/api/tasks/{tid}/signoff/reject",
        json={"hint": "i2 again", "reopen": ["i2"]},
        headers=auth,
    )
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "queued"
    assert {i["id"]: i["status"] for i in r.json()["ledger"]["items"]}["i2"] == "pending"
    # Not waiting for sign-off now: approving is a clear error that writes nothing.
    r = client.post(f"/api/tasks/{tid}/signoff/approve", headers=auth)
    assert r.status_code in (400, 409) and "does not wait for a sign-off" in r.json()["detail"]
    assert [(d["decision"], d["by"]) for d in _decided(client, tid)] == [("reject", "ana")]
    schema = client.get("/api/openapi.json").json()["paths"]
    assert "/api/tasks/{task_id}/signoff/approve" in schema
    assert "/api/tasks/{task_id}/signoff/reject" in schema
