"""Live output: `tether watch` follows a task a worker runs elsewhere, the worker prints
a line per round, and `timeline --full` shows whole events (a worker's `/metrics`:
`test_operations.py`)."""

from __future__ import annotations

from pathlib import Path

from tests.support.cli import (
    DONE,
    assert_ok,
    json_out,
    popen_tether,
    tether,
    write_spec,
)


def _submit(tmp_path: Path, n_items: int = 2) -> str:
    write_spec(tmp_path / "spec.yaml", n_items)
    (tmp_path / "ws").mkdir()
    proc = tether("submit", "spec.yaml", "--workspace", "ws", cwd=tmp_path)
    assert_ok(proc)
    return proc.stdout.strip().split()[-1]


def test_watch_follows_a_task_a_worker_runs_until_it_ends(tmp_path: Path) -> None:
    task_id = _submit(tmp_path)
    watcher = popen_tether("watch", task_id, "--poll", "0.1", cwd=tmp_path)
    try:
        worker = tether("worker", "--once", "--model", DONE, cwd=tmp_path, timeout=120)
        assert_ok(worker)
        out, err = watcher.communicate(timeout=60)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate()
    assert watcher.returncode == 0, err
    assert f"task {task_id} ended: satisfied" in out
    assert "round.committed" in out and "judge.verdict" in out
    # Every event once, in order: the watcher printed exactly the log.
    events = json_out(tether("events", task_id, "--json", cwd=tmp_path))
    seqs = [int(line.split()[0]) for line in out.splitlines() if line[:6].strip().isdigit()]
    assert seqs == [e["seq"] for e in events]
    # The worker said what each round did, task by task.
    rounds = [line for line in worker.stderr.splitlines() if f"task {task_id} round " in line]
    assert len(rounds) >= 2 and "2/2 done" in rounds[-1], worker.stderr
    quiet = tether("worker", "--once", "--quiet", "--model", DONE, cwd=tmp_path)
    assert_ok(quiet)
    assert " round " not in quiet.stderr


def test_watch_of_a_finished_task_prints_it_and_ends(tmp_path: Path) -> None:
    write_spec(tmp_path / "spec.yaml", 1)
    (tmp_path / "ws").mkdir()
    run = json_out(tether("run", "spec.yaml", "--workspace", "ws", "--model", DONE, "--json",
                          cwd=tmp_path))  # fmt: skip
    watched = tether("watch", run["task_id"], cwd=tmp_path, timeout=60)
    assert_ok(watched)
    assert f"ended: {run['status']}" in watched.stdout
    missing = tether("watch", "t-nope", cwd=tmp_path)
    assert missing.returncode != 0 and "Traceback" not in missing.stderr


def test_timeline_full_shows_each_event_whole(tmp_path: Path) -> None:
    write_spec(tmp_path / "spec.yaml", 1)
    (tmp_path / "ws").mkdir()
    run = json_out(tether("run", "spec.yaml", "--workspace", "ws", "--model", DONE, "--json",
                          cwd=tmp_path))  # fmt: skip
    short = tether("timeline", run["task_id"], cwd=tmp_path)
    full = tether("timeline", run["task_id"], "--full", cwd=tmp_path)
    assert_ok(short)
    assert_ok(full)
    events = json_out(tether("events", run["task_id"], "--json", cwd=tmp_path))
    assert len(short.stdout.splitlines()) == len(events)
    assert len(full.stdout.splitlines()) > 3 * len(events)
    called = next(e for e in events if e["type"] == "model.called")
    # The call's id and its request's reference, which the one-line summary leaves out.
    assert called["data"]["call_id"] in full.stdout
    assert called["data"]["call_id"] not in short.stdout
    assert called["data"]["request"]["epoch"] in full.stdout
