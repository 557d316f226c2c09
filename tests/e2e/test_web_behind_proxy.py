"""The dashboard behind a reverse proxy, used by a team: allowed host names, trusted
proxy headers, and named tokens whose name is the `by` of every decision, journaled
(through the JSON API and the page forms, in-process and with a real server process)."""

from __future__ import annotations

import http.client
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the dashboard needs the web extra")

from fastapi.testclient import TestClient

from tests.e2e.test_web_api import BASE, TOKEN, _drive, _pending, _run, waiting
from tests.support.cli import assert_clean_error, cli_env, popen_tether, tether_many
from tether.web import create_app
from tether.web.security import COOKIE, Access

__all__ = ["waiting"]  # the fixture, shared with test_web_api

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef00"
NAMED = {"alice": ALICE, "bob": BOB}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def decided_by(client: TestClient, tid: str) -> list[tuple[str, str]]:
    """`(event type, by)` of every event that journals who took a decision."""
    events = client.get(f"/api/tasks/{tid}/events").json()
    return [(e["type"], e["data"]["by"]) for e in events if "by" in e["data"]]


@pytest.fixture
def team(waiting: tuple[str, str, Path]) -> Iterator[TestClient]:
    app = create_app(waiting[0], token=None, named=NAMED)
    with TestClient(app, base_url=BASE) as c:
        yield c


def test_api_decisions_are_taken_in_the_token_holder_s_name(
    waiting: tuple[str, str, Path], team: TestClient
) -> None:
    url, tid, ws = waiting
    (req,) = _pending(team, tid)
    approve = f"/api/tasks/{tid}/approvals/{req['request_id']}/approve"
    # No shared token when each person has one; another's name is not taken.
    assert team.post(approve, json={}, headers=bearer(TOKEN)).status_code == 403
    r = team.post(approve, json={"by": "alice"}, headers=bearer(BOB))
    assert r.status_code == 403 and "signed in as 'bob'" in r.json()["detail"]
    assert len(_pending(team, tid)) == 1
    r = team.post(approve, json={}, headers=bearer(ALICE))
    assert r.status_code == 200 and r.json()["status"] == "approved", r.text
    assert [a["decided_by"] for a in team.get(f"/api/tasks/{tid}/approvals").json()] == ["alice"]

    _run(_drive(url, ws, tid))  # on to i3, blocked: a decision
    r = team.post(
        f"/api/tasks/{tid}/items/i3/waive", json={"reason": "no file", "by": "bob"},
        headers={"X-Tether-Token": BOB},
    )  # fmt: skip
    assert r.status_code == 200, r.text
    r = team.post(f"/api/tasks/{tid}/tell", json={"text": "thanks"}, headers=bearer(ALICE))
    assert r.status_code == 200, r.text
    assert decided_by(team, tid) == [
        ("approval.decided", "alice"),
        ("item.waived", "bob"),
        ("user.message", "alice"),
    ]


def test_page_forms_decide_in_the_signed_in_person_s_name(
    waiting: tuple[str, str, Path], team: TestClient
) -> None:
    _, tid, _ = waiting
    (req,) = _pending(team, tid)
    r = team.get(f"/tasks/{tid}?token={BOB}", follow_redirects=False)
    assert r.status_code == 303 and COOKIE in r.headers["set-cookie"]
    assert "signed in as bob" in team.get(f"/tasks/{tid}").text
    form = f"/tasks/{tid}/approvals/{req['request_id']}"
    # Each person's forms carry a CSRF token of their own: alice's is no good for bob.
    r = team.post(form, data={"decision": "approve", "csrf": Access.csrf_of(ALICE)})
    assert r.status_code == 403 and "CSRF" in r.text
    r = team.post(
        form, data={"decision": "reject", "reason": "not now", "csrf": Access.csrf_of(BOB)},
        follow_redirects=False,
    )  # fmt: skip
    assert r.status_code == 303, r.text
    r = team.post(
        f"/tasks/{tid}/cancel", data={"csrf": Access.csrf_of(BOB)}, follow_redirects=False
    )
    assert r.status_code == 303, r.text
    assert decided_by(team, tid) == [("approval.decided", "bob"), ("task.cancel_requested", "bob")]


def test_host_names_and_proxy_headers(waiting: tuple[str, str, Path]) -> None:
    url = waiting[0]
    app = create_app(url, token=TOKEN, hosts=["dash.example.com", "*.corp.example"])
    with TestClient(app, base_url=BASE) as c:
        for host, code in [
            ("dash.example.com", 200),
            ("a.corp.example", 200),
            ("corp.example.evil", 403),
            ("other.example", 403),
        ]:
            # Pages and the API check the host (a probe's /healthz answers under any).
            r = c.get("/api/tasks", headers={"Host": host})
            assert (r.status_code == 403) == (code == 403), (host, r.text)
            assert c.get("/healthz", headers={"Host": host}).status_code == 200
        assert "--allowed-host" in c.get("/", headers={"Host": "other.example"}).text
    with TestClient(create_app(url, token=TOKEN, hosts=["*"]), base_url=BASE) as c:
        assert c.get("/healthz", headers={"Host": "anything.example"}).status_code == 200
    # Proxy headers from a client that is not a trusted proxy are ignored.
    untrusted = create_app(url, token=TOKEN, forwarded_allow_ips="10.1.2.3")
    with TestClient(untrusted, base_url=BASE) as c:
        r = c.get(
            f"/?token={TOKEN}", headers={"X-Forwarded-Proto": "https"}, follow_redirects=False
        )
        assert (
            r.headers["location"].startswith("http://")
            and "secure" not in r.headers["set-cookie"].lower()
        )


def _request(port: int, method: str, path: str, headers: dict[str, str]) -> Any:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, path, body=b"{}" if method == "POST" else None, headers=headers)
    resp = conn.getresponse()
    body = resp.read().decode()
    conn.close()
    return resp.status, dict(resp.getheaders()), body


def test_a_served_dashboard_behind_a_proxy_with_named_tokens(
    waiting: tuple[str, str, Path], tmp_path: Path
) -> None:
    url, tid, _ = waiting
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# the team\nalice:{ALICE}\nbob: {BOB}  # on call\n", "utf-8")
    server = popen_tether(
        "serve", "--port", "0", "--db", url, "--tokens-file", tokens,
        "--allowed-host", "tether.example.com", "--forwarded-allow-ips", "127.0.0.1",
        cwd=tmp_path, env=cli_env(TETHER_TOKEN=TOKEN),
    )  # fmt: skip
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert "?token=YOURS" in line and ALICE not in line and TOKEN not in line, line
        found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert found, line
        port = int(found.group(1))
        proxied = {"Host": "tether.example.com", "X-Forwarded-Proto": "https",
                   "X-Forwarded-For": "203.0.113.7"}  # fmt: skip
        status, _, body = _request(port, "GET", "/", {"Host": "internal.example"})
        assert status == 403 and "unknown host" in body
        # Signing in through the TLS proxy: back to https, and a cookie only for https.
        status, headers, _ = _request(port, "GET", f"/?token={ALICE}", proxied)
        assert status == 303 and headers["location"] == "https://tether.example.com/"
        assert "secure" in headers["set-cookie"].lower()
        (req,) = [a for a in _api_approvals(port, tid, proxied) if a["status"] == "pending"]
        approve = f"/api/tasks/{tid}/approvals/{req['request_id']}/approve"
        json_headers = {**proxied, "Content-Type": "application/json"}
        status, _, body = _request(port, "POST", approve, {**json_headers, **bearer(TOKEN)})
        assert status == 403, body  # TETHER_TOKEN is not used beside named tokens
        status, _, body = _request(port, "POST", approve, {**json_headers, **bearer(ALICE)})
        assert status == 200, body
        assert [a["decided_by"] for a in _api_approvals(port, tid, proxied)] == ["alice"]
    finally:
        server.terminate()
        _, err = server.communicate(timeout=30)
    assert "TETHER_TOKEN is not used" in err
    assert ALICE not in err and BOB not in err


def _api_approvals(port: int, tid: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    import json

    status, _, body = _request(port, "GET", f"/api/tasks/{tid}/approvals", headers)
    assert status == 200, body
    return list(json.loads(body))


def test_bad_tokens_files_and_host_names_are_refused_without_showing_a_token(
    waiting: tuple[str, str, Path], tmp_path: Path
) -> None:
    url = waiting[0]
    secret = "s3cr3t"
    files = {
        "short": f"alice:{secret}\n",
        "nocolon": "alice\n",
        "twice": f"alice:{ALICE}\nalice:{BOB}\n",
        "shared": f"alice:{ALICE}\nbob:{ALICE}\n",
        "empty": "# nobody\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text, "utf-8")
    serve = ("serve", "--port", "0", "--db", url)
    calls: list[tuple[tuple[str | Path, ...], Path]] = [
        ((*serve, "--tokens-file", tmp_path / name), tmp_path) for name in files
    ]
    calls += [
        ((*serve, "--tokens-file", tmp_path / "missing"), tmp_path),
        ((*serve, "--allowed-host", "https://dash.example.com/"), tmp_path),
    ]
    procs = tether_many(calls, env=cli_env())
    needles = [
        ("line 1", "at least 16"),
        ("line 1", "name:token"),
        ("line 2", "has a token already"),
        ("line 2", "token of another name"),
        ("names no token",),
        ("cannot read it",),
        ("not a host name",),
    ]
    for proc, expected in zip(procs, needles, strict=True):
        msg = assert_clean_error(proc, 2, *expected)
        assert secret not in msg and ALICE not in msg and BOB not in msg
    env = cli_env(TETHER_TOKENS=f"alice:{ALICE},bob", TETHER_ALLOWED_HOSTS="a b")
    (bad_env,) = tether_many([(serve, tmp_path)], env=env)
    assert_clean_error(bad_env, 2, "TETHER_ALLOWED_HOSTS", "not a host name")
    (bad_env,) = tether_many([(serve, tmp_path)], env={**env, "TETHER_ALLOWED_HOSTS": "x.io"})
    msg = assert_clean_error(bad_env, 2, "TETHER_TOKENS, entry 2")
    assert ALICE not in msg
