"""Operating tether, through the real command: a worker's `/metrics`, `/healthz` and
`/readyz` (on SQLite and PostgreSQL, without the web extra), the dashboard's, and the
logging options (`--log-level`, `TETHER_LOG_FORMAT=json`) with stdout kept clean."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import (
    DONE,
    assert_clean_error,
    assert_ok,
    cli_env,
    json_out,
    popen_tether,
    tether,
    write_spec,
)
from tether.store import SCHEMA_VERSION

pytest.importorskip("prometheus_client", reason="metrics need the metrics extra")
from prometheus_client.parser import text_string_to_metric_families

#: `tether ARGS` with the web stack unimportable, as if the web extra were not installed.
_NO_WEB = """
import sys
for name in ("fastapi", "starlette", "uvicorn", "sse_starlette", "jinja2"):
    sys.modules[name] = None
sys.argv = ["tether", *sys.argv[1:]]
from tether.cli import main
main()
"""
#: Generous bound for a worker to run two small tasks; reaching it is a failure.
LIMIT = 90.0


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path}/.tether/tether.db"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "worker"))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def _submit(tmp_path: Path, db: str, n: int) -> list[str]:
    write_spec(tmp_path / "spec.yaml", 2)
    ids = []
    for k in range(n):
        (tmp_path / f"ws{k}").mkdir()
        proc = tether("submit", "spec.yaml", "--workspace", f"ws{k}", "--db", db, cwd=tmp_path)
        assert_ok(proc)
        ids.append(proc.stdout.strip().split()[-1])
    return ids


def _scrape_until(base: str, done: Any) -> dict[Any, float]:
    """Scrape `base/metrics` until `done(samples)`; the samples."""
    deadline = time.monotonic() + LIMIT
    got: dict[Any, float] = {}
    while time.monotonic() < deadline:
        try:
            got = _samples(_get(f"{base}/metrics")[1])
        except OSError:
            got = {}  # not listening yet
        if got and done(got):
            return got
        time.sleep(0.1)
    raise AssertionError(f"the metrics never got there: {got}")


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    assert proc.returncode == 0, err
    return err


def test_a_worker_serves_its_metrics_health_and_json_logs(tmp_path: Path, db_url: str) -> None:
    ids = _submit(tmp_path, db_url, 2)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    args = ["--log-level", "info", "worker", "--db", db_url, "--model", DONE, "--poll", "0.1",
            "--metrics-port", str(port), "--cluster-metrics"]  # fmt: skip
    worker = subprocess.Popen(
        [sys.executable, "-c", _NO_WEB, *args],
        cwd=tmp_path,
        env=cli_env(TETHER_LOG_FORMAT="json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        got = _scrape_until(
            base,
            lambda s: s.get(("tether_worker_task_runs_total", (("status", "satisfied"),))) == 2,
        )
        health = _get(f"{base}/healthz")
        ready = _get(f"{base}/readyz")
        other = _get(f"{base}/other")
    finally:
        err = _stop(worker)
    used = [json_out(tether("status", t, "--json", "--db", db_url, cwd=tmp_path))["budget"]["used"]
            for t in ids]  # fmt: skip
    # The worker's own figures: what its runs recorded.
    assert got[("tether_worker_rounds_total", ())] == sum(u["rounds"] for u in used)
    assert got[("tether_worker_model_calls_total", (("purpose", "act"),))] == sum(
        u["model_calls"] for u in used
    )
    assert got[("tether_worker_tool_calls_total", (("tool", "write_file"),))] >= 4
    assert got[("tether_worker_claim_seconds_count", ())] >= 2
    assert got[("tether_worker_tasks_in_flight", ())] == 0
    # The database's, asked for with --cluster-metrics.
    assert got[("tether_tasks", (("status", "satisfied"),))] == 2
    assert got[("tether_tasks", (("status", "queued"),))] == 0
    assert health == (200, "ok\n")
    assert ready[0] == 200
    assert json.loads(ready[1]) == {"status": "ready", "schema": SCHEMA_VERSION,
                                    "schema_needed": SCHEMA_VERSION}  # fmt: skip
    assert other[0] == 404
    # Every line on stderr is a JSON record; the worker's start and its rounds are info.
    records = [json.loads(line) for line in err.splitlines()]
    assert any(
        r["level"] == "info" and r["logger"] == "tether.worker" and "started" in r["message"]
        for r in records
    ), err
    rounds = [r for r in records if r.get("event") == "round.ended"]
    assert {r["task_id"] for r in rounds} == set(ids)
    assert {r["level"] for r in records} <= {"info", "warning"}
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)


def test_a_workers_metrics_are_its_own_unless_asked(tmp_path: Path) -> None:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    (tmp_path / ".tether").mkdir()
    worker = popen_tether("--log-level", "debug", "worker", "--model", DONE, "--poll", "0.1",
                          "--metrics-port", str(port), cwd=tmp_path)  # fmt: skip
    try:
        # A claim was made: the worker's loop runs (and handles SIGINT).
        got = _scrape_until(base, lambda s: s.get(("tether_worker_claim_seconds_count", ())))
    finally:
        err = _stop(worker)
    assert not [name for name, _ in got if name.startswith("tether_tasks")]
    assert ("process_cpu_seconds_total", ()) in got  # the process's own, from the client
    # Debug lines show at --log-level debug (each scrape is one).
    assert " DEBUG tether.worker: " in err and "GET /metrics" in err, err
    quiet = tether("worker", "--once", "--model", DONE, cwd=tmp_path)
    assert_ok(quiet)
    assert "DEBUG" not in quiet.stderr and "INFO" not in quiet.stderr


def test_logs_never_reach_stdout(tmp_path: Path) -> None:
    write_spec(tmp_path / "spec.yaml", 1)
    (tmp_path / "ws").mkdir()
    env = cli_env(TETHER_LOG_LEVEL="debug", TETHER_LOG_FORMAT="json")
    run = tether("run", "spec.yaml", "--workspace", "ws", "--model", DONE, "--json",
                 cwd=tmp_path, env=env)  # fmt: skip
    doc = json_out(run)
    status = tether("status", doc["task_id"], "--json", cwd=tmp_path, env=env)
    assert json_out(status)["status"] == "satisfied"
    listed = tether("list", cwd=tmp_path, env=env)
    assert_ok(listed)
    assert doc["task_id"] in listed.stdout and "{" not in listed.stdout
    logged = [json.loads(line) for line in (run.stderr + status.stderr).splitlines()]
    assert any(r["level"] == "debug" for r in logged)


def test_a_bad_log_option_is_a_clear_error(tmp_path: Path) -> None:
    bad_level = tether("--log-level", "loud", "list", cwd=tmp_path)
    assert_clean_error(bad_level, 2, "not a log level", "debug, info, warning")
    bad_format = tether("list", cwd=tmp_path, env=cli_env(TETHER_LOG_FORMAT="xml"))
    assert_clean_error(bad_format, 2, "not a log format", "text, json")


def test_the_dashboard_answers_health_and_metrics(tmp_path: Path, db_url: str) -> None:
    ids = _submit(tmp_path, db_url, 1)
    server = popen_tether("serve", "--db", db_url, "--port", "0", cwd=tmp_path,
                          env=cli_env(TETHER_LOG_FORMAT="json"))  # fmt: skip
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        base = line.split(" on ", 1)[1].split("/?token=")[0]
        health = _get(f"{base}/healthz")
        ready = _get(f"{base}/readyz")
        got = _samples(_get(f"{base}/metrics")[1])
    finally:
        server.send_signal(signal.SIGINT)
        _, err = server.communicate(timeout=60)
    assert health == (200, "ok")
    assert ready[0] == 200 and json.loads(ready[1])["status"] == "ready"
    assert got[("tether_tasks", (("status", "queued"),))] == len(ids) == 1
    assert not [name for name, _ in got if name.startswith("tether_worker_")]
    for record in err.splitlines():
        json.loads(record)


def test_bad_metrics_options_are_clear_errors(tmp_path: Path) -> None:
    alone = tether("worker", "--once", "--cluster-metrics", cwd=tmp_path)
    assert_clean_error(alone, 2, "--cluster-metrics needs --metrics-port")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        taken = tether("worker", "--once", "--metrics-port", str(port), cwd=tmp_path)
    assert_clean_error(taken, 2, f"--metrics-port {port}: cannot listen")
    nowhere = tether("worker", "--once", "--metrics-port", "0", "--metrics-host",
                     "no-such-host.invalid", cwd=tmp_path)  # fmt: skip
    assert_clean_error(nowhere, 2, "--metrics-host no-such-host.invalid", "cannot listen")
