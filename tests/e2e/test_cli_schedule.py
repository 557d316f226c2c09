"""Recurring tasks through the CLI, as a user meets them: submit a contract with a
`schedule:`, see it in `schedule list` and `list`, a worker starts and runs the due
occurrence, `run` refuses a scheduled contract, `schedule cancel` stops it."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import yaml

from tests.support.cli import (
    DONE,
    assert_clean_error,
    assert_ok,
    cli_env,
    json_out,
    spec_dict,
    tether,
)


def write_scheduled(tmp_path: Path, **schedule: object) -> Path:
    path = tmp_path / "digest.yaml"
    path.write_text(yaml.safe_dump(spec_dict(2, name="digest", schedule=schedule)))
    (tmp_path / "ws").mkdir(exist_ok=True)
    return path


def test_a_schedule_is_submitted_listed_started_by_a_worker_and_cancelled(
    tmp_path: Path,
) -> None:
    # Started 90 minutes ago, hourly: occurrence 1 was missed, occurrence 2 is due.
    start = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=90)
    write_scheduled(tmp_path, every="1h", start=start.isoformat(), count=5)

    refused = tether("run", "digest.yaml", "--model", DONE, cwd=tmp_path)
    assert_clean_error(refused, 2, "has a schedule", "tether submit")

    sub = tether("submit", "digest.yaml", "--workspace", "ws", "--json", cwd=tmp_path)
    assert_ok(sub)
    doc = json_out(sub)
    sid = doc["schedule_id"]
    assert sid.startswith("s") and doc["state"] == "active" and doc["rule"] == "every 1h, 5 times"

    env = cli_env(COLUMNS="80")
    listed = tether("schedule", "list", cwd=tmp_path, env=env)
    assert_ok(listed)
    assert sid in listed.stdout and "every 1h" in listed.stdout
    assert max(len(line) for line in listed.stdout.splitlines()) <= 80

    worker = tether("worker", "--once", "--model", DONE, cwd=tmp_path, timeout=120)
    assert_ok(worker)
    task_id = f"{sid}-2"
    status = json_out(tether("status", task_id, "--json", cwd=tmp_path))
    assert status["status"] == "satisfied"
    assert status["name"] == "digest #2"
    assert status["workspace"] == str((tmp_path / "ws").resolve())

    (sched,) = json_out(tether("schedule", "list", "--json", cwd=tmp_path))
    assert sched["started"] == 1 and sched["skipped"] == 1 and sched["next_n"] == 3
    assert sched["last_task"] == task_id

    both = tether("list", cwd=tmp_path)
    assert_ok(both)
    assert task_id in both.stdout and sid in both.stdout and "every 1h" in both.stdout

    cancelled = tether("schedule", "cancel", sid, cwd=tmp_path)
    assert_ok(cancelled)
    assert "cancelled" in cancelled.stdout
    (after,) = json_out(tether("schedule", "list", "--json", cwd=tmp_path))
    assert after["state"] == "cancelled" and after["next_at"] is None


def test_bad_schedules_and_ids_get_clear_errors(tmp_path: Path) -> None:
    write_scheduled(tmp_path, cron="0 25 * * *")
    bad = tether("submit", "digest.yaml", cwd=tmp_path)
    assert_clean_error(bad, 2, "schedule", "cron")
    missing = tether("schedule", "cancel", "s-none", cwd=tmp_path)
    assert missing.returncode in (2, 3)
    assert "Traceback" not in missing.stderr
