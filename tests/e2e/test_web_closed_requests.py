"""The dashboard's server on requests that closed and bodies it cannot read: a body
error is a 400 with a message naming the problem (never FastAPI's raw 422); a body
left out where every field has a default is `{}`; after the task ends its requests
show closed with the reason and no action, and every decision about them (or the
ended task) is a 409 naming what settled it, changing nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the dashboard needs the web extra")

from fastapi.testclient import TestClient

from tether.web.security import COOKIE, Access

from .test_web_api import TOKEN, _pending, client, waiting  # noqa: F401 - fixtures

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_body_errors_are_400_with_a_clear_message(
    waiting: tuple[str, str, Path],  # noqa: F811 - the fixture
    client: TestClient,  # noqa: F811 - the fixture
) -> None:
    _, tid, _ = waiting
    (req,) = _pending(client, tid)
    approve = f"/api/tasks/{tid}/approvals/{req['request_id']}/approve"
    before = client.get(f"/api/tasks/{tid}").json()
    json_headers = {**AUTH, "Content-Type": "application/json"}
    cases = [
        (approve, {"content": b"{not json", "headers": json_headers}, "not valid JSON"),
        (approve, {"json": [1, 2]}, "must be a JSON object"),
        (approve, {"json": {"modify": "everything"}}, "modify:"),
        (approve, {"json": {"bogus": 1}}, "no field 'bogus'"),
        (f"/api/tasks/{tid}/abandon", {}, "has no body"),
        (f"/api/tasks/{tid}/abandon", {"json": {}}, "reason is missing"),
        (f"/api/tasks/{tid}/items/i3/waive", {"json": {"reason": 5}}, "reason:"),
        (f"/api/tasks/{tid}/tell", {"json": {"text": "x" * 9000}}, "text:"),
    ]
    for path, kwargs, needle in cases:
        kwargs.setdefault("headers", AUTH)
        r = client.post(path, **kwargs)
        assert r.status_code == 400, (path, kwargs, r.text)
        detail = r.json()["detail"]
        assert isinstance(detail, str) and detail.startswith("bad request: "), detail
        assert needle in detail, (needle, detail)
    assert client.get(f"/api/tasks/{tid}").json() == before
    # Approve's fields all have defaults: no body at all approves, as `web`.
    r = client.post(approve, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json() == {"request_id": req["request_id"], "status": "approved"}
    (decided,) = client.get(f"/api/tasks/{tid}/approvals").json()
    assert decided["decided_by"] == "web"


def test_after_abandon_the_request_is_closed_and_every_decision_is_409(
    waiting: tuple[str, str, Path],  # noqa: F811 - the fixture
    client: TestClient,  # noqa: F811 - the fixture
) -> None:
    _, tid, _ = waiting
    (req,) = _pending(client, tid)
    rid = req["request_id"]
    r = client.post(
        f"/api/tasks/{tid}/abandon", json={"reason": "not needed", "by": "ana"}, headers=AUTH
    )
    assert r.status_code == 200 and r.json()["status"] == "abandoned", r.text
    (closed,) = client.get(f"/api/tasks/{tid}/approvals").json()
    assert closed["status"] == "closed"
    assert closed["decision"]["reason"] == "task abandoned: abandoned by ana: not needed"
    before = client.get(f"/api/tasks/{tid}").json()
    refused = {
        f"/api/tasks/{tid}/approvals/{rid}/approve": ({}, f"{rid} was closed: task abandoned"),
        f"/api/tasks/{tid}/approvals/{rid}/reject": ({"reason": "x"}, "closed: task abandoned"),
        f"/api/tasks/{tid}/items/i3/waive": ({"reason": "x"}, "abandoned"),
        f"/api/tasks/{tid}/items/i3/retry": ({}, "abandoned"),
        f"/api/tasks/{tid}/abandon": ({"reason": "again"}, "abandoned"),
        f"/api/tasks/{tid}/tell": ({"text": "hello"}, "abandoned"),
    }
    for path, (body, needle) in refused.items():
        r = client.post(path, json=body, headers=AUTH)
        assert r.status_code == 409, (path, r.text)
        assert needle in r.json()["detail"], (path, r.text)
    assert client.get(f"/api/tasks/{tid}").json() == before
    assert _pending(client, tid) == []
    # The page, signed in: the request shows closed with why, and nothing to press.
    client.cookies.update({COOKIE: TOKEN})
    page = client.get(f"/tasks/{tid}").text
    assert 'value="approve"' not in page and 'value="reject"' not in page
    assert 'value="waive"' not in page and "/abandon" not in page
    assert f'class="closed-request" data-request="{rid}"' in page
    assert "closed: task abandoned: abandoned by ana: not needed" in page
    # A form posted from a page loaded before the abandon: a 409 page, nothing changes.
    r = client.post(
        f"/tasks/{tid}/approvals/{rid}",
        data={"decision": "approve", "csrf": Access(TOKEN).csrf},
        follow_redirects=False,
    )
    assert r.status_code == 409 and "closed" in r.text
    assert client.get(f"/api/tasks/{tid}").json() == before
    events = client.get(f"/api/tasks/{tid}/events", params={"type": "approval.closed"}).json()
    assert [json.dumps(e["data"]["request_id"]) for e in events] == [json.dumps(rid)]
