"""`tether report`, `tether show`, `tether status --at` and `tether timeline` on a task
run in process and read by the real command in a subprocess."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from tests.support.cli import assert_clean_error, assert_ok, tether_many
from tests.support.loop import next_item, run_task, spec_of
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.store import open_store


def _reader(request: ModelRequest) -> ModelResponse:
    """Reads a file of many lines, then writes the Next item's file."""
    nxt = next_item(request)
    if nxt is None:
        return ModelResponse("closed")
    return ModelResponse(
        f"reading then writing {nxt}",
        (
            tool_call("read_file", path="notes.txt"),
            tool_call("write_file", path=f"out/{nxt}.txt", content=nxt),
        ),
    )


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """A finished task in a SQLite file: (folder, db url, task id)."""
    root = tmp_path_factory.mktemp("report-cli")
    (root / "notes.txt").write_text("first line\nsecond line\n\x1b[31mred\nlast line\n")
    url = f"sqlite:///{root}/t.db"

    async def go() -> str:
        store = await open_store(url)
        try:
            model = ScriptedModel(policy=_reader, name="gpt-4.1-mini")
            tid, result = await run_task(store, spec_of(2), root, model)
            assert result.status == "satisfied"
            return tid
        finally:
            await store.close()

    return root, url, asyncio.run(go())


def test_timeline_keeps_one_line_per_event_with_multiline_tool_output(
    ran: tuple[Path, str, str],
) -> None:
    root, url, tid = ran
    events, timeline = tether_many(
        [(("events", tid, "--db", url, "--json"), root), (("timeline", tid, "--db", url), root)]
    )
    assert_ok(events)
    n = len(json.loads(events.stdout))
    multi = [
        e
        for e in json.loads(events.stdout)
        if e["type"] == "op.result" and "\n" in e["data"]["summary"]
    ]
    assert multi, "the read's output has several lines"
    assert_ok(timeline)
    lines = timeline.stdout.splitlines()
    assert len(lines) == n
    assert all(re.match(r"^\s*\d+ \d\d:\d\d:\d\d ", line) for line in lines)
    assert "\x1b" not in timeline.stdout and "first line\\nsecond line" in timeline.stdout


def test_status_at_show_and_report(ran: tuple[Path, str, str], tmp_path: Path) -> None:
    root, url, tid = ran
    html_file = tmp_path / "r.html"
    at3, at_text, calls, call, report_json, report_md, report_html = tether_many(
        [
            (("status", tid, "--db", url, "--at", "3", "--json"), root),
            (("status", tid, "--db", url, "--at", "8"), root),
            (("show", tid, "--db", url, "--json"), root),
            (("show", tid, "1", "--db", url), root),
            (("report", tid, "--db", url, "--format", "json"), root),
            (("report", tid, "--db", url), root),
            (("report", tid, "--db", url, "--format", "html", "-o", html_file), root),
        ]
    )
    for proc in (at3, at_text, calls, call, report_json, report_md, report_html):
        assert_ok(proc)
    doc = json.loads(at3.stdout)
    assert doc["at"]["seq"] == 3 and doc["status"] == "running"
    assert doc["ledger"]["progress"]["done"] == 0
    assert at_text.stdout.startswith("as of event 8 (")
    listed = json.loads(calls.stdout)
    assert listed[0]["call_id"] == f"{tid}.act.1" and listed[0]["purpose"] == "act"
    assert f"call {tid}.act.1" in call.stdout and "GOAL LEDGER" in call.stdout
    assert "→ read_file" in call.stdout and "reading then writing i1" in call.stdout
    rep = json.loads(report_json.stdout)
    assert rep["task"]["task_id"] == tid and rep["totals"]["cost_usd"] > 0
    assert report_md.stdout.startswith(f"# Report: files ({tid})")
    assert "report written to" in report_html.stdout
    page = html_file.read_text()
    assert page.startswith("<!doctype html>") and page.count("<svg") == 3


def test_bad_input_is_one_paragraph_and_exit_2(ran: tuple[Path, str, str], tmp_path: Path) -> None:
    root, url, tid = ran
    procs = tether_many(
        [
            (("status", tid, "--db", url, "--at", "100000"), root),
            (("status", tid, "--db", url, "--at", "0"), root),
            (("show", tid, "act.9999", "--db", url), root),
            (("report", tid, "--db", url, "--format", "pdf"), root),
            (("report", tid, "--db", url, "-o", tmp_path / "no" / "such" / "dir.md"), root),
            (("report", "t-unknown", "--db", url), root),
        ]
    )
    assert_clean_error(procs[0], 2, "there is no event 100000")
    assert_clean_error(procs[1], 2, "there is no event 0")
    assert_clean_error(procs[2], 2, "no model call 'act.9999'")
    assert_clean_error(procs[3], 2, "--format must be one of md, html, json")
    assert_clean_error(procs[4], 2, "cannot write")
    assert_clean_error(procs[5], 3, "t-unknown")
    assert not (tmp_path / "no").exists()
