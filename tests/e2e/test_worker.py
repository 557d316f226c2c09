"""Queue tasks with `tether submit` and let `tether worker --once` run them."""

from __future__ import annotations

import json
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.support.cli import cli_env, tether_command

POLICY = "scripted:tests.support.loop:honest_actor"
ROOT = Path(__file__).resolve().parents[2]


def _tether(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*tether_command(), *args],
        cwd=cwd,
        env=cli_env(PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_submit_then_worker_runs_every_queued_task(tmp_path: Path) -> None:
    spec = {
        "objective": "write a file",
        "items": [{"id": "a", "title": "write out/a.txt",
                   "done_when": {"kind": "file", "path": "out/a.txt"}}],
        "tools": ["write_file"],
        "models": {"judge": "rules"},
    }  # fmt: skip
    ids = []
    for n in range(3):
        ws = tmp_path / f"ws{n}"
        ws.mkdir()
        (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
        res = _tether(
            "submit", str(tmp_path / "spec.yaml"), "--workspace", str(ws), "--json", cwd=tmp_path
        )
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        assert doc["status"] == "queued"
        ids.append(doc["task_id"])
    listed = json.loads(_tether("list", "--json", cwd=tmp_path).stdout)
    assert {t["task_id"] for t in listed} == set(ids) and {t["status"] for t in listed} == {
        "queued"
    }

    res = _tether("worker", "--once", "--model", POLICY, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "worker ran 3 task(s)" in res.stderr
    for n, tid in enumerate(ids):
        status = json.loads(_tether("status", tid, "--json", cwd=tmp_path).stdout)
        assert status["status"] == "satisfied" and status["lease"]["owner"] is None
        assert (tmp_path / f"ws{n}" / "out" / "a.txt").read_text() == "a"


def test_submit_refuses_a_bad_spec_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text("objective: x\nitems: [{id: a}]\n")
    res = _tether("submit", "spec.yaml", cwd=tmp_path)
    assert res.returncode == 2
    assert "items.0.title" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / ".tether").exists()


def _queue(tmp_path: Path, name: str, tools: list[str], *extra: str) -> str:
    spec = {
        "objective": "write a file",
        "items": [{"id": "a", "title": "write out/a.txt",
                   "done_when": {"kind": "file", "path": "out/a.txt"}}],
        "tools": tools,
        "models": {"judge": "rules"},
    }  # fmt: skip
    ws = tmp_path / name
    ws.mkdir()
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    res = _tether("submit", f"{name}.yaml", "--workspace", str(ws), *extra, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_worker_stops_on_sigterm_between_tasks(tmp_path: Path) -> None:
    """A long-running worker runs what is queued, then waits; SIGTERM ends it cleanly."""
    tid = _queue(tmp_path, "ws", ["write_file"])
    proc = subprocess.Popen(
        [*tether_command(), "worker", "--model", POLICY, "--poll", "0.1"],
        cwd=tmp_path,
        env=cli_env(PYTHONPATH=str(ROOT)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        seen = ""
        # The worker reports each run on stderr: wait for this task's line.
        while f"task {tid}: satisfied" not in seen:
            ready, _, _ = select.select([proc.stderr], [], [], deadline - time.monotonic())
            line = proc.stderr.readline() if ready else ""
            if not line:
                pytest.fail(f"no report from the worker (exit {proc.poll()}):\n{seen}")
            seen += line
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, seen + err
    assert "worker ran 1 task(s)" in err


def test_worker_reports_a_task_it_cannot_run_and_goes_on(tmp_path: Path) -> None:
    """A task whose contract names a tool this worker lacks (the submitter had it in
    TETHER_TOOLS) is reported and left queued, untouched, for a worker that has the tool
    (not a failure of this one: the exit code is 0); the next task runs."""
    bad = _queue(tmp_path, "bad", ["write_file", "create_ticket"], "--skip-tool-check")
    good = _queue(tmp_path, "good", ["write_file"])
    res = _tether("worker", "--once", "--model", POLICY, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"task {bad}: left to another worker:" in res.stderr and "create_ticket" in res.stderr
    assert f"task {good}: satisfied" in res.stderr
    assert "worker ran 1 task(s)" in res.stderr and "Traceback" not in res.stderr
    docs = {t: json.loads(_tether("status", t, "--json", cwd=tmp_path).stdout) for t in (bad, good)}
    assert docs[bad]["status"] == "queued" and docs[bad]["lease"]["owner"] is None
    assert docs[good]["status"] == "satisfied"


def test_worker_says_at_start_which_database_it_takes_tasks_from(tmp_path: Path) -> None:
    """A worker with nothing to do used to print nothing until it stopped: started in
    the wrong folder, it polled a new empty database there in silence. It now says,
    first, which database it takes tasks from (a SQLite file by its absolute path, a
    URL's password masked); `--quiet` keeps it to how each task ended."""
    res = _tether("worker", "--once", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    db = tmp_path.resolve() / ".tether" / "tether.db"
    first = res.stderr.splitlines()[0]
    assert first.startswith("worker ") and first.endswith(
        f" takes tasks from sqlite:///{db} until none is left"
    ), res.stderr
    quiet = _tether("worker", "--once", "--quiet", cwd=tmp_path)
    assert quiet.returncode == 0, quiet.stderr
    assert "takes tasks from" not in quiet.stderr and "worker ran 0 task(s)" in quiet.stderr
