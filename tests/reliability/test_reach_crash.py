"""Crashes where reaching a running task writes, on SQLite and PostgreSQL: a real
`tether run` (or `tether pause`) dies at the fail point, and nothing is lost — an edit
requested mid-run is applied exactly once, a pause requested mid-run is honoured, a
takeover cut off before its commit is taken again."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.support.cli import DONE, assert_ok, cli_env, finish, gated_run, json_out, tether

pytestmark = pytest.mark.slow

N_ITEMS = 3


def _mid_turn(
    folder: Path, db: str, failpoints: str | None = None
) -> tuple[subprocess.Popen[str], str]:
    """`tether run` (with `failpoints`) held in its second model call."""
    env = cli_env(TETHER_FAILPOINTS=failpoints) if failpoints else None
    return gated_run(folder, db, N_ITEMS, env=env)


def _ended(proc: subprocess.Popen[str], code: int) -> str:
    _, err = finish(proc)
    assert proc.returncode == code, err[-2000:]
    return err


def _events(folder: Path, db: str, tid: str, type_: str) -> list[dict[str, Any]]:
    evs = json_out(tether("events", tid, "--json", "--db", db, cwd=folder))
    return [e for e in evs if e["type"] == type_]


def _resume(folder: Path, db: str, tid: str) -> dict[str, Any]:
    return dict(json_out(tether("resume", tid, "--model", DONE, "--json", "--db", db, cwd=folder)))


@pytest.mark.parametrize("point", ["before_edit_apply", "after_edit_apply"])
def test_a_crash_applying_an_edit_loses_nothing(tmp_path: Path, cli_db: str, point: str) -> None:
    db = cli_db
    proc, tid = _mid_turn(tmp_path, db, failpoints=point)
    assert_ok(tether("edit", tid, "--set", "limits.max_rounds=30", "--db", db, cwd=tmp_path))
    (tmp_path / "release").touch()
    assert f"fail point {point} reached" in _ended(proc, 137)
    final = _resume(tmp_path, db, tid)
    assert (final["status"], final["version"]) == ("satisfied", 2)
    assert final["limits"]["max_rounds"] == 30
    (requested,) = _events(tmp_path, db, tid, "task.edit_requested")
    edited = _events(tmp_path, db, tid, "task.edited")
    assert [e["data"]["request"] for e in edited] == [requested["seq"]]  # once


def test_a_crash_before_honouring_a_pause_keeps_it(tmp_path: Path, cli_db: str) -> None:
    db = cli_db
    proc, tid = _mid_turn(tmp_path, db, failpoints="before_pause_apply")
    assert_ok(tether("pause", tid, "--db", db, cwd=tmp_path))
    (tmp_path / "release").touch()
    _ended(proc, 137)
    assert _resume(tmp_path, db, tid)["status"] == "paused"  # the request stood
    assert _resume(tmp_path, db, tid)["status"] == "satisfied"
    moves = [e["data"]["dst"] for e in _events(tmp_path, db, tid, "task.status")]
    assert moves.count("paused") == 1


def test_a_crash_after_journaling_a_pause_request_keeps_it(tmp_path: Path, cli_db: str) -> None:
    db = cli_db
    proc, tid = _mid_turn(tmp_path, db)
    env = cli_env(TETHER_FAILPOINTS="after_pause_request")
    res = tether("pause", tid, "--db", db, cwd=tmp_path, env=env)
    assert res.returncode == 137, res.stderr
    (tmp_path / "release").touch()
    _ended(proc, 0)
    doc = json_out(tether("status", tid, "--json", "--db", db, cwd=tmp_path))
    assert doc["status"] == "paused"


def test_a_takeover_cut_off_before_its_commit_is_taken_again(tmp_path: Path, cli_db: str) -> None:
    db = cli_db
    proc, tid = _mid_turn(tmp_path, db)
    proc.kill()
    proc.communicate(timeout=60)
    env = cli_env(TETHER_FAILPOINTS="before_takeover_commit")
    res = tether("pause", tid, "--db", db, cwd=tmp_path, env=env)
    assert res.returncode == 137, res.stderr
    # The cut-off takeover holds the lease under its own (gone) process: gone again.
    doc = json_out(tether("status", tid, "--json", "--db", db, cwd=tmp_path))
    assert doc["status"] == "running" and doc["owner_gone"]
    assert_ok(tether("pause", tid, "--db", db, cwd=tmp_path))
    doc = json_out(tether("status", tid, "--json", "--db", db, cwd=tmp_path))
    assert doc["status"] == "paused" and doc["lease"]["owner"] is None
    assert _resume(tmp_path, db, tid)["status"] == "satisfied"
