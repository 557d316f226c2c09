"""The dashboard's server without a browser: the JSON API mirrors the CLI, every write
needs the token (and, from a form, the CSRF token and this origin), bad input is a 4xx
that changes nothing, pages render, `/metrics` parses as Prometheus text."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the dashboard needs the web extra")

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tether.cli.views import task_rows
from tether.models.scripted import ScriptedModel
from tether.report import build_report, status_at
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.tasks import create_task, status_dict
from tether.spec import parse_spec
from tether.store import open_store
from tether.web import create_app
from tether.web.security import COOKIE, Access

from . import web_policies

TOKEN = "test-token-0123456789"
BASE = "http://127.0.0.1"


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _drive(url: str, ws: Path, task_id: str | None = None) -> str:
    """Create the task (unless given) and run it until it stops."""
    store = await open_store(url)
    try:
        if task_id is None:
            task = await create_task(store, parse_spec(web_policies.spec(1)), workspace=ws)
            task_id = task.task_id
        engine = Engine(store, ModelSet(actor=ScriptedModel(policy=web_policies.act)), lease_ttl=30)
        await engine.run(task_id)
        return task_id
    finally:
        await store.close()


async def _read(url: str, fn: Any) -> Any:
    store = await open_store(url)
    try:
        return await fn(store)
    finally:
        await store.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def waiting(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str, Path]:
    """A task waiting for approval of i2's overwrite: (db url, task id, workspace)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    web_policies.prepare(ws)
    if request.param == "postgres":
        url = request.getfixturevalue("pg_url")
    else:
        url = f"sqlite:///{tmp_path}/t.db"
    tid = _run(_drive(url, ws))
    doc = _run(_read(url, lambda s: status_dict(s, tid)))
    assert doc["status"] == "waiting" and doc["waiting"]["kind"] == "approval", doc
    return url, tid, ws


@pytest.fixture
def client(waiting: tuple[str, str, Path]) -> Iterator[TestClient]:
    with TestClient(create_app(waiting[0], token=TOKEN), base_url=BASE) as c:
        yield c


def _pending(client: TestClient, tid: str) -> list[dict[str, Any]]:
    return [a for a in client.get(f"/api/tasks/{tid}/approvals").json() if a["status"] == "pending"]


def test_api_reads_mirror_the_cli(waiting: tuple[str, str, Path], client: TestClient) -> None:
    url, tid, _ = waiting
    listed = client.get("/api/tasks").json()
    assert listed == task_rows(_run(_read(url, lambda s: s.list_tasks())), 0.0)
    assert client.get("/api/tasks", params={"status": "satisfied"}).json() == []
    assert client.get(f"/api/tasks/{tid}").json() == _run(_read(url, lambda s: status_dict(s, tid)))
    assert client.get(f"/api/tasks/{tid}", params={"at": 5}).json() == _run(
        _read(url, lambda s: status_at(s, tid, 5))
    )
    events = client.get(f"/api/tasks/{tid}/events", params={"after": 2, "limit": 3}).json()
    assert [e["seq"] for e in events] == [3, 4, 5]
    calls = client.get(f"/api/tasks/{tid}/calls").json()
    assert calls and calls[0]["purpose"] == "act"
    one = client.get(f"/api/tasks/{tid}/calls/{calls[0]['call_id']}").json()
    assert "GOAL LEDGER" in one["request"]["system"] + json.dumps(one["request"]["messages"])
    report = client.get(f"/api/tasks/{tid}/report").json()
    expected = _run(_read(url, lambda s: build_report(s, tid)))
    assert report["totals"] == expected["totals"]
    schema = client.get("/api/openapi.json").json()
    for path in (
        "/api/tasks",
        "/api/tasks/{task_id}",
        "/api/tasks/{task_id}/events",
        "/api/tasks/{task_id}/approvals/{request_id}/approve",
        "/api/tasks/{task_id}/items/{item_id}/waive",
        "/api/tasks/{task_id}/tell",
        "/api/tasks/{task_id}/cancel",
    ):
        assert path in schema["paths"], path
    assert not any(p.startswith("/tasks") for p in schema["paths"])


def test_writes_need_the_token_and_bad_input_changes_nothing(
    waiting: tuple[str, str, Path], client: TestClient
) -> None:
    url, tid, ws = waiting
    (req,) = _pending(client, tid)
    rid = req["request_id"]
    before = client.get(f"/api/tasks/{tid}").json()
    refused = [
        client.post(f"/api/tasks/{tid}/approvals/{rid}/approve", json={}),
        client.post(
            f"/api/tasks/{tid}/approvals/{rid}/approve",
            json={},
            headers={"Authorization": "Bearer wrong"},
        ),
        client.post(f"/api/tasks/{tid}/cancel"),
        client.post(f"/api/tasks/{tid}/tell", json={"text": "hi"}, headers={"X-Tether-Token": "x"}),
    ]
    for r in refused:
        assert r.status_code == 403, r.text
        assert "token" in r.json()["detail"]
    auth = {"Authorization": f"Bearer {TOKEN}"}
    bad = {
        f"/api/tasks/{tid}/approvals/nope/approve": ({}, 400, "no approval request 'nope'"),
        f"/api/tasks/{tid}/approvals/{rid}/reject": ({"modify": {}}, 400, "modify"),
        f"/api/tasks/{tid}/items/zz/retry": ({}, 400, "zz"),
        f"/api/tasks/{tid}/items/i3/waive": ({"reason": ""}, 400, "reason"),
        f"/api/tasks/{tid}/tell": ({"text": "   "}, 400, "empty"),
        "/api/tasks/t-none/cancel": ({}, 404, "t-none"),
    }
    for path, (body, code, needle) in bad.items():
        r = client.post(path, json=body, headers=auth)
        assert r.status_code == code, (path, r.text)
        assert needle in json.dumps(r.json()["detail"]), (path, r.text)
    after = client.get(f"/api/tasks/{tid}").json()
    assert after == before
    # With the token: approved, and the task is queued again.
    r = client.post(f"/api/tasks/{tid}/approvals/{rid}/approve", json={"by": "carol"}, headers=auth)
    assert r.status_code == 200 and r.json()["status"] == "approved"
    assert client.get(f"/api/tasks/{tid}").json()["status"] == "queued"
    # The run goes on to i3, which is blocked: a decision; waiving it delivers the task.
    _run(_drive(url, ws, tid))
    doc = client.get(f"/api/tasks/{tid}").json()
    assert doc["status"] == "waiting" and doc["waiting"]["kind"] == "decision"
    r = client.post(f"/api/tasks/{tid}/items/i3/waive", json={"reason": "no file"}, headers=auth)
    assert r.status_code == 200, r.text
    _run(_drive(url, ws, tid))
    doc = client.get(f"/api/tasks/{tid}").json()
    assert (doc["status"], doc["stop_reason"]) == ("satisfied", "delivered_with_waivers")


def test_forms_need_cookie_csrf_and_this_origin(
    waiting: tuple[str, str, Path], client: TestClient
) -> None:
    _, tid, _ = waiting
    (req,) = _pending(client, tid)
    path = f"/tasks/{tid}/approvals/{req['request_id']}"
    csrf = Access(TOKEN).csrf
    # Signing in: a wrong token is refused, the right one becomes a strict cookie.
    assert client.get("/?token=nope").status_code == 403
    r = client.get(f"/tasks/{tid}?token={TOKEN}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"{BASE}/tasks/{tid}"
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    client.cookies.clear()
    cases = [
        ({}, {"decision": "approve", "csrf": csrf}, "needs the server&#39;s token"),
        ({COOKIE: TOKEN}, {"decision": "approve"}, "CSRF"),
        ({COOKIE: TOKEN}, {"decision": "approve", "csrf": "x" * 32}, "CSRF"),
    ]
    for cookies, form, needle in cases:
        client.cookies.clear()
        client.cookies.update(cookies)
        r = client.post(path, data=form, follow_redirects=False)
        assert r.status_code == 403 and needle in r.text, r.text
    client.cookies.update({COOKIE: TOKEN})
    r = client.post(
        path,
        data={"decision": "approve", "csrf": csrf},
        headers={"Origin": "http://evil.example"},
        follow_redirects=False,
    )
    assert r.status_code == 403 and "another site" in r.text
    r = client.post(
        path, data={"decision": "approve", "csrf": csrf, "modify": "[1]"}, follow_redirects=False
    )
    assert r.status_code == 400 and "JSON object" in r.text
    assert len(_pending(client, tid)) == 1
    r = client.post(
        path,
        data={"decision": "approve", "csrf": csrf},
        headers={"Origin": BASE},
        follow_redirects=False,
    )
    assert r.status_code == 303 and r.headers["location"] == f"/tasks/{tid}"
    assert _pending(client, tid) == []
    # A host name the server does not know is refused before anything else.
    r = client.get("/", headers={"Host": "attacker.example"})
    assert r.status_code == 403 and "unknown host" in r.text


def test_pages_render_what_the_task_holds(
    waiting: tuple[str, str, Path], client: TestClient
) -> None:
    _, tid, _ = waiting
    index = client.get("/")
    assert index.status_code == 200 and f'data-task="{tid}"' in index.text
    assert "read-only" in index.text
    assert client.get("/?status=bogus").status_code == 400
    page = client.get(f"/tasks/{tid}").text
    for item in ("p1", "i2", "i3", "i4"):
        assert f'data-item="{item}"' in page
    assert 'sse-connect="/tasks/' in page and "<form" not in page  # not signed in
    client.cookies.update({COOKIE: TOKEN})
    page = client.get(f"/tasks/{tid}").text
    assert f'value="{Access(TOKEN).csrf}"' in page and 'value="approve"' in page
    evidence = page.split('class="evidence" href="', 1)[1].split('"', 1)[0]
    shown = client.get(evidence)
    assert shown.status_code == 200 and "p1" in shown.text
    assert client.get(f"/tasks/{tid}/evidence/op:nope").status_code == 400
    calls = client.get(f"/tasks/{tid}/partials/calls").text
    assert f'href="/tasks/{tid}/calls/{tid}.act.1"' in calls
    call = client.get(f"/tasks/{tid}/calls/1")
    assert call.status_code == 200 and "System prompt" in call.text and "Writing p1." in call.text
    report = client.get(f"/tasks/{tid}/report").text
    assert report.count("<svg") == 3
    assert client.get("/tasks/t-none").status_code == 404
    assert client.get("/static/htmx-2.0.11.min.js").status_code == 200


def url_of(waiting: tuple[str, str, Path]) -> str:
    return waiting[0]


def test_metrics_parse_as_prometheus_text(
    waiting: tuple[str, str, Path], client: TestClient
) -> None:
    _, tid, _ = waiting
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    doc = client.get(f"/api/tasks/{tid}").json()
    used = doc["budget"]["used"]

    def value(name: str, **labels: str) -> float:
        """A sample by name (a counter's with or without `_total`) and labels."""
        samples = {
            (smp.name, tuple(sorted(smp.labels.items()))): smp.value
            for f in families.values()
            for smp in f.samples
        }
        for n in (name, f"{name}_total"):
            if (n, tuple(sorted(labels.items()))) in samples:
                return float(samples[(n, tuple(sorted(labels.items())))])
        raise AssertionError(f"{name} {labels} missing")

    assert value("tether_tasks", status="waiting") == 1
    assert value("tether_tasks", status="satisfied") == 0
    assert value("tether_tasks_waiting", kind="approval") == 1
    assert value("tether_oldest_queued_seconds") == 0
    assert value("tether_rounds") == used["rounds"] > 0
    assert value("tether_model_calls") == used["model_calls"]
    assert value("tether_tokens", kind="input") == used["input_tokens"]
    assert value("tether_tokens", kind="cached") == used["cached_tokens"]
    assert value("tether_cost_usd") == pytest.approx(used["money_usd"])
    assert families["tether_breaker_open"].samples == []
    # The dashboard exports the database's figures, never a process's own.
    assert not [name for name in families if name.startswith("tether_worker_")]

    # An approval queues the task again: it counts as queued.
    (req,) = _pending(client, tid)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    client.post(f"/api/tasks/{tid}/approvals/{req['request_id']}/approve", json={}, headers=auth)
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    assert value("tether_tasks", status="queued") == 1
    assert families["tether_tasks_waiting"].samples == []


def test_health_and_readiness(waiting: tuple[str, str, Path], client: TestClient) -> None:
    from tether.store import SCHEMA_VERSION

    assert client.get("/healthz").text == "ok"
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "schema": SCHEMA_VERSION,
                            "schema_needed": SCHEMA_VERSION}  # fmt: skip
    # A probe asks by address: answered under any host name, unlike the pages.
    other = {"Host": "10.1.2.3:8765"}
    assert client.get("/readyz", headers=other).status_code == 200
    assert client.get("/healthz", headers=other).status_code == 200
    assert client.get("/api/tasks", headers=other).status_code == 403


def test_not_ready_on_a_database_of_another_schema(tmp_path: Path) -> None:
    from tether.store import SCHEMA_VERSION
    from tether.store.memory import MemoryStore

    class Older(MemoryStore):
        async def schema_version(self) -> int:
            return SCHEMA_VERSION - 1

    with TestClient(create_app(None, token=TOKEN, store=Older()), base_url=BASE) as c:
        r = c.get("/readyz")
        assert c.get("/healthz").status_code == 200  # alive all the same
    assert r.status_code == 503
    assert r.json()["status"] == "unavailable"
    assert f"schema {SCHEMA_VERSION - 1}, this tether needs {SCHEMA_VERSION}" in r.json()["reason"]


def test_serve_bad_input_is_one_paragraph_and_exit_2(
    waiting: tuple[str, str, Path], tmp_path: Path
) -> None:
    import socket

    from tests.support.cli import assert_clean_error, tether

    url, _, _ = waiting
    missing = tether("serve", "--db", f"sqlite:///{tmp_path}/nope.db", "--port", "0", cwd=tmp_path)
    assert_clean_error(missing, 2, "no tether database")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = str(busy.getsockname()[1])
        taken = tether("serve", "--db", url, "--port", port, cwd=tmp_path)
    assert_clean_error(taken, 2, f"cannot listen on 127.0.0.1:{port}")


def test_stream_sends_each_event_once_from_where_the_reader_is(
    waiting: tuple[str, str, Path], tmp_path: Path
) -> None:
    import http.client

    from tests.support.cli import cli_env, popen_tether

    url, tid, _ = waiting
    last = _run(_read(url, lambda s: s.get_task(tid))).last_seq
    server = popen_tether(
        "serve", "--port", "0", "--db", url, cwd=tmp_path, env=cli_env(TETHER_TOKEN=TOKEN)
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        host, port = line.split("http://", 1)[1].split("/", 1)[0].rsplit(":", 1)

        def first_ids(path: str, headers: dict[str, str]) -> list[str]:
            # The socket listens before the address is printed: no wait for readiness.
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            assert resp.status == 200 and resp.getheader("content-type", "").startswith(
                "text/event-stream"
            )
            ids, kinds = [], []
            while "state" not in kinds:
                text = resp.readline().decode().strip()
                if text.startswith("id:"):
                    ids.append(text[3:].strip())
                elif text.startswith("event:"):
                    kinds.append(text[6:].strip())
            conn.close()
            return ids

        stream = f"/tasks/{tid}/stream"
        assert first_ids(f"{stream}?after={last - 1}", {}) == [str(last), str(last)]
        resumed = first_ids(f"{stream}?after=0", {"Last-Event-ID": str(last - 2)})
        assert resumed == [str(last - 1), str(last), str(last)]
    finally:
        server.terminate()
        server.communicate(timeout=30)


def test_a_server_on_every_interface_answers_to_this_machine_s_names() -> None:
    import socket

    from tether.web.server import names_of

    assert names_of("10.1.2.3") == ["10.1.2.3"]
    everywhere = names_of("0.0.0.0")
    assert socket.gethostname() in everywhere and "0.0.0.0" in everywhere


def test_verify_through_the_api_reopens_a_deleted_deliverable(
    waiting: tuple[str, str, Path], client: TestClient
) -> None:
    _, tid, ws = waiting
    assert client.post(f"/api/tasks/{tid}/verify").status_code == 403
    auth = {"Authorization": f"Bearer {TOKEN}"}
    r = client.post(f"/api/tasks/{tid}/verify", headers=auth)
    assert r.status_code == 200 and r.json()["outcome"] == "holds", r.text
    assert client.post("/api/tasks/t-none/verify", headers=auth).status_code == 404
    (ws / "out" / "p1.txt").unlink()  # p1 is done on this file
    r = client.post(f"/api/tasks/{tid}/verify", json={"by": "dana"}, headers=auth)
    doc = r.json()
    assert r.status_code == 200 and doc["outcome"] == "reopened", r.text
    assert doc["reopened"] == ["p1"] and "out/p1.txt is missing" in doc["broken"][0]["reason"]
    items = {
        i["id"]: i["status"] for i in client.get(f"/api/tasks/{tid}").json()["ledger"]["items"]
    }
    assert items["p1"] == "pending"
