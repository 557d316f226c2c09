"""`--model-timeout` and `--model-retries` on `tether run`, `resume` and `worker`.

Behind the OpenAI-compatible adapter sits a server that never answers (`SilentServer` of
`test_model_hang`). The spec and the environment both allow 300 s per request; the flag
says 1 s and no retry, and it wins: each command gives up on the provider in seconds and
journals a timed-out model call. Bad values are refused (exit 2) before anything runs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chaos.test_model_hang import SilentServer, model_of
from tests.support.cli import (
    assert_ok,
    cli_env,
    describe,
    json_out,
    snapshot,
    tether,
    tether_many,
    write_spec,
)

pytestmark = pytest.mark.slow

FLAGS = ("--model-timeout", "1", "--model-retries", "0")
#: The spec and the environment say 300 s: only the flag makes the commands quick.
ENV = {"TETHER_MODEL_TIMEOUT": "300", "TETHER_MODEL_RETRIES": "3"}


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    try:
        yield server
    finally:
        server.close()


def slow_spec(folder: Path) -> Path:
    spec = write_spec(folder / "spec.yaml", 1)
    doc = yaml.safe_load(spec.read_text())
    doc["models"].update(timeout=300, max_retries=3)
    spec.write_text(yaml.safe_dump(doc))
    (folder / "ws").mkdir(exist_ok=True)
    return spec


def timed_out_calls(folder: Path, task_id: str) -> list[dict[str, Any]]:
    events = json_out(tether("events", task_id, "--json", cwd=folder, env=cli_env()))
    return [
        e for e in events if e["type"] == "model.failed" and "timed out" in str(e["data"]).lower()
    ]


def only_task(folder: Path) -> str:
    (task,) = json_out(tether("list", "--json", cwd=folder, env=cli_env()))
    return str(task["task_id"])


def test_run_and_resume_take_the_flag_over_spec_and_environment(
    tmp_path: Path, silent: SilentServer
) -> None:
    spec = slow_spec(tmp_path)
    env = cli_env(**ENV)
    start = time.monotonic()
    run = tether(
        "run", spec, "--workspace", tmp_path / "ws", "--model", model_of(silent), *FLAGS,
        cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip
    assert "Traceback" not in run.stderr, describe(run)
    assert time.monotonic() - start < 60, describe(run)
    task_id = only_task(tmp_path)
    first = len(timed_out_calls(tmp_path, task_id))
    assert first >= 1, describe(run)
    if json_out(tether("status", task_id, "--json", cwd=tmp_path, env=env))["status"] in (
        "satisfied",
        "failed",
        "abandoned",
    ):
        pytest.fail(f"the run ended the task: nothing left to resume\n{describe(run)}")
    start = time.monotonic()
    resumed = tether(
        "resume", task_id, "--model", model_of(silent), *FLAGS,
        cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip
    assert "Traceback" not in resumed.stderr, describe(resumed)
    assert time.monotonic() - start < 60, describe(resumed)
    assert len(timed_out_calls(tmp_path, task_id)) > first, describe(resumed)


def test_worker_takes_the_flag(tmp_path: Path, silent: SilentServer) -> None:
    spec = slow_spec(tmp_path)
    env = cli_env(**ENV)
    assert_ok(tether("submit", spec, "--workspace", tmp_path / "ws", cwd=tmp_path, env=env))
    start = time.monotonic()
    worker = tether(
        "worker", "--once", "--model", model_of(silent), *FLAGS, cwd=tmp_path, env=env,
        timeout=120,
    )  # fmt: skip
    assert "Traceback" not in worker.stderr, describe(worker)
    assert time.monotonic() - start < 60, describe(worker)
    assert timed_out_calls(tmp_path, only_task(tmp_path)), describe(worker)


def test_bad_values_are_refused_before_anything_runs(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "spec.yaml", 1)
    before = snapshot(tmp_path)
    run = ("run", spec, "--model", "scripted:tests.e2e.policies:done_policy")
    calls: list[tuple[tuple[str | Path, ...], Path]] = [
        ((*run, "--model-timeout", "0"), tmp_path),
        ((*run, "--model-timeout", "nan"), tmp_path),
        ((*run, "--model-timeout", "1e9"), tmp_path),
        ((*run, "--model-retries", "11"), tmp_path),
        (("worker", "--once", "--model-timeout", "inf"), tmp_path),
        (("worker", "--once", "--model-retries", "-1"), tmp_path),
        (("resume", "t1", "--model-timeout", "-1"), tmp_path),
        (("resume", "t1", "--model-retries", "1.5"), tmp_path),
    ]
    for (args, _), proc in zip(calls, tether_many(calls, env=cli_env()), strict=True):
        assert proc.returncode == 2, describe(proc)
        assert "Traceback" not in proc.stderr
        # Known options with a bad value, not unknown ones.
        assert "Invalid value" in proc.stderr and str(args[-2]) in proc.stderr, describe(proc)
    assert snapshot(tmp_path) == before
