"""Reaching a task through the CLI, on SQLite and PostgreSQL: `tether pause` of a real
`tether run` mid-turn (paused at its next round boundary, `resume` finishes it), and a
SIGKILLed `tether run` whose task `edit`, `cancel`, `pause` and `tell` act on without a
worker while `status` says its owner is gone."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.support.cli import DONE, assert_ok, finish, gated_run, json_out, tether

N_ITEMS = 4


def test_pause_mid_turn_then_resume(tmp_path: Path, cli_db: str) -> None:
    db = cli_db
    proc, tid = gated_run(tmp_path, db, N_ITEMS)
    paused = tether("pause", tid, "--reason", "lunch", "--db", db, cwd=tmp_path)
    (tmp_path / "release").touch()
    out, err = finish(proc)
    assert_ok(paused)
    assert "pause requested" in paused.stdout
    assert "Traceback" not in err
    # The run that was paused from elsewhere ends saying how to go on, as `status` does.
    for text in (out, tether("status", tid, "--db", db, cwd=tmp_path).stdout):
        hint = [ln for ln in text.splitlines() if ln.startswith("paused until resumed;")]
        assert hint and hint[0].startswith("paused until resumed; continue with: tether resume")
        assert tid in hint[0].split() and db in hint[0], text
    doc = json_out(tether("status", tid, "--json", "--db", db, cwd=tmp_path))
    assert doc["status"] == "paused" and doc["lease"]["owner"] is None
    done = [i["id"] for i in doc["ledger"]["items"] if i["status"] == "done"]
    assert 1 <= len(done) < N_ITEMS  # stopped at a round boundary, before the end
    final = json_out(tether("resume", tid, "--model", DONE, "--json", "--db", db, cwd=tmp_path))
    assert (final["status"], final["stop_reason"]) == ("satisfied", "delivered")


@pytest.mark.parametrize("verb", ["edit", "cancel", "pause", "tell"])
def test_a_killed_runs_task_is_reached_without_a_worker(
    tmp_path: Path, cli_db: str, verb: str
) -> None:
    db = cli_db
    proc, tid = gated_run(tmp_path, db, N_ITEMS)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    shown = tether("status", tid, "--db", db, cwd=tmp_path)
    assert_ok(shown)
    assert "running (owner gone)" in shown.stdout
    listed = tether("list", "--db", db, cwd=tmp_path)
    assert "running (owner gone)" in listed.stdout
    doc = json_out(tether("status", tid, "--json", "--db", db, cwd=tmp_path))
    assert doc["status"] == "running" and "is gone" in doc["owner_gone"]

    if verb == "edit":
        res = tether("edit", tid, "--set", "limits.max_rounds=30", "--db", db, cwd=tmp_path)
        want = ("queued", 2)
    elif verb == "cancel":
        res = tether("cancel", tid, "--db", db, cwd=tmp_path)
        want = ("cancelled", 1)
    elif verb == "pause":
        res = tether("pause", tid, "--db", db, cwd=tmp_path)
        want = ("paused", 1)
    else:
        res = tether("tell", tid, "use lowercase names", "--db", db, cwd=tmp_path)
        want = ("stalled", 1)
    assert_ok(res)
    doc = json_out(tether("status", tid, "--json", "--db", db, cwd=tmp_path))
    assert (doc["status"], doc["version"]) == want
    assert doc["owner_gone"] is None and doc["lease"]["owner"] is None
    events = json_out(tether("events", tid, "--json", "--db", db, cwd=tmp_path))
    taken = [e for e in events if e["type"] == "audit.warning"]
    assert [e["data"]["code"] for e in taken][-1:] == ["lease_taken_over"]
    if verb == "edit":  # and the work goes on from there
        final = json_out(tether("resume", tid, "--model", DONE, "--json", "--db", db, cwd=tmp_path))
        assert final["status"] == "satisfied"
