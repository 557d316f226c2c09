"""The dashboard in a real browser: Playwright drives Debian's Chromium
(`/usr/bin/chromium`; no browser is downloaded) against `tether serve` while a
`tether worker` process runs the task.

Without `/usr/bin/chromium` these tests skip on a developer's machine with that reason;
in CI (`CI` set) they fail instead: `.ci/run` installs it. Everything waits on
conditions in the page or the database, never on time.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cli import REPO, assert_ok, cli_env, popen_tether, tether

from . import web_policies

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = REPO / "build" / "test-artifacts"
TOKEN = "browser-test-token-42"
#: Generous for a loaded machine: every wait ends as soon as its condition holds.
WAIT_MS = 90_000


def _browser_or_skip() -> Any:
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing in CI: .ci/run installs Debian's chromium")
        pytest.skip(
            f"{CHROMIUM} is not installed (apt-get install chromium): the browser tests "
            "drive Debian's Chromium and download no browser"
        )
    return pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright")


def _wait(what: str, check: Any, timeout: float = WAIT_MS / 1000) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _first_line(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise AssertionError("tether serve printed nothing")
    line = proc.stdout.readline()
    assert line, f"tether serve exited: {proc.stderr.read() if proc.stderr else ''}"
    return line.strip()


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status)
    except OSError:
        return 0


def _stop(proc: subprocess.Popen[str]) -> str:
    """End a process we started; its stderr."""
    if proc.poll() is None:
        proc.terminate()
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err or ""


@pytest.fixture
def site(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A database with one queued task, and `tether serve` on a free port."""
    ws = tmp_path / "ws"
    ws.mkdir()
    web_policies.prepare(ws)
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(web_policies.spec(6)))
    db = f"sqlite:///{tmp_path}/t.db"
    sub = tether("submit", spec_file, "--workspace", ws, "--db", db, "--json", cwd=tmp_path)
    assert_ok(sub)
    task_id = json.loads(sub.stdout)["task_id"]
    server = popen_tether(
        "serve", "--port", "0", "--db", db, cwd=tmp_path, env=cli_env(TETHER_TOKEN=TOKEN)
    )
    try:
        line = _first_line(server)
        assert line.startswith("tether dashboard on http://127.0.0.1:"), line
        link = line.split(" on ", 1)[1]
        base = link.split("/?token=", 1)[0]
        assert link.endswith(f"?token={TOKEN}")
        _wait("the server to answer", lambda: _get(f"{base}/healthz") == 200)
        yield {"base": base, "link": link, "db": db, "task": task_id, "dir": tmp_path}
    finally:
        _stop(server)


def _status(site: dict[str, Any]) -> dict[str, Any]:
    with urllib.request.urlopen(f"{site['base']}/api/tasks/{site['task']}", timeout=10) as r:
        doc: dict[str, Any] = json.loads(r.read())
        return doc


def test_watch_approve_and_waive_in_the_browser(site: dict[str, Any]) -> None:
    sync_api = _browser_or_skip()
    base, tid = site["base"], site["task"]
    worker: subprocess.Popen[str] | None = None
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.set_default_timeout(WAIT_MS)
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on(
                "response",
                lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None,
            )
            # Signing in with the printed link lands on the task list, then the task.
            page.goto(site["link"])
            assert page.url == f"{base}/"
            page.click(f"a[href='/tasks/{tid}']")
            page.wait_for_selector("#progress .bar[data-done='0']")
            page.evaluate("window.__sameDocument = true")

            worker = popen_tether(
                "worker", "--model", web_policies.SLOW, "--poll", "0.1", "--db", site["db"],
                cwd=site["dir"],
            )  # fmt: skip
            # Progress arrives over the live stream: the bar advances without a reload.
            # (`?.` in the predicates: a live swap replaces the elements, and a predicate
            # that throws while one is briefly absent fails the wait instead of retrying.)
            page.wait_for_function(
                "Number(document.querySelector('#progress .bar')?.dataset.done) >= 2"
            )
            assert page.evaluate("window.__sameDocument") is True
            page.wait_for_function("document.querySelectorAll('#timeline li').length > 20")
            # The overwrite of i2 waits for a person.
            page.wait_for_selector(".approval button[value='approve']")
            assert page.inner_text("#status") == "waiting"
            # A refresh of the state while a person types (as the stream would cause)
            # keeps the text and swaps cleanly.
            page.fill(".approval input[name='reason']", "not sure yet")
            page.evaluate(
                """() => {
                    window.__swapped = false;
                    const state = document.querySelector('#state');
                    state.addEventListener('htmx:afterSettle', () => { window.__swapped = true; },
                                           {once: true});
                    htmx.trigger(state, 'sse:state');
                }"""
            )
            page.wait_for_function("window.__swapped === true")
            assert page.input_value(".approval input[name='reason']") == "not sure yet"
            assert errors == [], errors
            assert _status(site)["waiting"]["kind"] == "approval"
            # A write without the token is refused and changes nothing.
            anonymous = browser.new_context()
            rid = page.get_attribute(".approval", "data-request")
            refused = anonymous.request.post(
                f"{base}/api/tasks/{tid}/approvals/{rid}/approve", data={}
            )
            assert refused.status == 403 and "token" in refused.json()["detail"]
            form = anonymous.request.post(
                f"{base}/tasks/{tid}/approvals/{rid}",
                form={"decision": "approve", "csrf": "forged"},
            )
            assert form.status == 403
            anonymous.close()
            assert _status(site)["waiting"]["kind"] == "approval"

            page.click(".approval button[value='approve']")
            # The task goes on: i2 is written, i3 is blocked, the task asks for a decision.
            page.wait_for_selector("tr[data-item='i2'][data-status='done']")
            page.wait_for_selector("tr[data-item='i3'][data-status='blocked']")
            # What a person types survives the live refreshes while the task goes on.
            row = page.locator("tr[data-item='i3']")
            row.locator("input[name='text']").fill("the file does not exist")
            page.wait_for_selector("tr[data-item='i4'][data-status='done']")
            page.wait_for_function("document.querySelector('#status')?.textContent === 'waiting'")
            assert row.locator("input[name='text']").input_value() == "the file does not exist"
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard-task.png"), full_page=True)

            row.locator("button[value='waive']").click()
            page.wait_for_function("document.querySelector('#status')?.textContent === 'satisfied'")
            page.wait_for_selector("tr[data-item='i3'][data-status='waived']")
            doc = _status(site)
            assert (doc["status"], doc["stop_reason"]) == ("satisfied", "delivered_with_waivers")
            assert "the file does not exist" in doc["waivers"][0]["reason"]
            # The stored prompt of a call and the report open from the task page.
            page.click("section.calls a >> nth=0")
            page.wait_for_selector("#response")
            assert "GOAL LEDGER" in page.inner_text("main")
            page.goto(f"{base}/tasks/{tid}/report")
            assert page.locator("svg").count() == 3
            assert errors == [], errors
        finally:
            browser.close()
            if worker is not None:
                _stop(worker)


def test_html_report_opens_offline_with_its_charts(site: dict[str, Any]) -> None:
    sync_api = _browser_or_skip()
    ws = site["dir"]
    ran = tether(
        "worker", "--once", "--model", "scripted:tests.e2e.web_policies:act", "--db", site["db"],
        cwd=ws,
    )  # fmt: skip
    assert_ok(ran)
    out = ws / "report.html"
    assert_ok(
        tether("report", site["task"], "--db", site["db"], "--format", "html", "-o", out, cwd=ws)
    )
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            ctx = browser.new_context(offline=True)
            page = ctx.new_page()
            errors: list[str] = []
            requests: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("request", lambda r: requests.append(r.url))
            page.goto(out.as_uri())
            charts = page.locator("figure.chart svg")
            assert charts.count() == 3
            for n in range(3):
                box = charts.nth(n).bounding_box()
                assert box is not None and box["width"] > 200 and box["height"] > 80
            assert page.locator("figure[data-chart='progress'] svg path").count() > 3
            assert "Where the budget went" in page.inner_text("body")
            assert errors == [] and requests == [out.as_uri()], (errors, requests)
        finally:
            browser.close()
