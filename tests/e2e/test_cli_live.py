"""Live output: `tether watch` follows a task a worker runs elsewhere, the worker prints
a line per round, `timeline --full` shows whole events, and `tether worker
--metrics-port` serves Prometheus metrics."""

from __future__ import annotations

import signal
import socket
import time
import urllib.request
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
    # The whole response reference, which the one-line summary leaves out.
    assert called["data"]["response_blob"] in full.stdout
    assert called["data"]["response_blob"] not in short.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_worker_serves_prometheus_metrics(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    task_id = _submit(tmp_path, 1)
    port = _free_port()
    worker = popen_tether(
        "worker", "--model", DONE, "--poll", "0.1", "--metrics-port", str(port), cwd=tmp_path
    )
    try:
        deadline = time.monotonic() + 60
        families: dict[str, object] = {}
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                time.sleep(0.1)  # not listening yet
                continue
            families = {f.name: f for f in text_string_to_metric_families(text)}
            tasks = {s.labels["status"]: s.value for s in families["tether_tasks"].samples}  # type: ignore[attr-defined]
            if tasks.get("satisfied") == 1:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"task {task_id} never showed as satisfied in /metrics")
        assert {"tether_rounds", "tether_model_calls", "tether_tokens"} <= set(families)
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=5)
        except urllib.error.HTTPError as exc:
            assert exc.code == 404
        else:
            raise AssertionError("/other should be 404")
    finally:
        worker.send_signal(signal.SIGINT)
        try:
            _, err = worker.communicate(timeout=60)
        except Exception:
            worker.kill()
            worker.communicate()
            raise
    assert worker.returncode == 0, err
    assert f"metrics at http://127.0.0.1:{port}/metrics" in err
    assert "Traceback" not in err
