"""Stops that end on purpose, notices without a worker, and an environment checked
before anything is written — through the `tether` command, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import (
    DONE,
    assert_clean_error,
    assert_ok,
    cli_env,
    describe,
    json_out,
    tether,
    write_spec,
)
from tests.support.notices import webhook_receiver

ASKS = "scripted:tests.e2e.people_policies:asks_first"
SECRET_TOOLS = [{"name": "write_file", "secrets": ["TICKETS_TOKEN"]}]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def env(request: pytest.FixtureRequest) -> dict[str, str]:
    """The default SQLite file in the test's folder, or a fresh PostgreSQL schema."""
    if request.param == "postgres":
        return cli_env(TETHER_DB=request.getfixturevalue("pg_url"))
    return cli_env()


@pytest.fixture
def hook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A webhook receiver on 127.0.0.1 that records every notice."""
    with webhook_receiver() as found:
        yield found


def _ws(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    return ws


def _events(tid: str, tmp_path: Path, env: dict[str, str], kind: str) -> list[dict[str, Any]]:
    doc = json_out(tether("events", tid, "--type", kind, "--json", cwd=tmp_path, env=env))
    return [e["data"] for e in doc]


def test_a_used_up_budget_fails_the_run_when_the_contract_says_so(
    tmp_path: Path, env: dict[str, str]
) -> None:
    spec = write_spec(tmp_path / "spec.yaml", 3, budget={"rounds": 1}, on_budget_exhausted="fail")
    proc = tether(
        "run", spec, "--model", DONE, "--workspace", _ws(tmp_path), "--json", cwd=tmp_path, env=env
    )
    assert proc.returncode == 1, describe(proc)
    doc = json.loads(proc.stdout)
    assert (doc["status"], doc["stop_reason"]) == ("failed", "budget_exhausted")


def test_a_foreground_wait_is_announced_once_by_the_run(
    tmp_path: Path, env: dict[str, str], hook: tuple[str, list[dict[str, Any]]]
) -> None:
    url, got = hook
    told = {**env, "TETHER_WEBHOOK_URL": url}
    spec = write_spec(tmp_path / "spec.yaml", 1)
    doc = json_out(
        tether(
            "run", spec, "--model", ASKS, "--workspace", _ws(tmp_path), "--json",
            cwd=tmp_path, env=told,
        )
    )  # fmt: skip
    tid = str(doc["task_id"])
    assert doc["status"] == "waiting"
    assert [(n["body"]["task_id"], n["body"]["kind"]) for n in got] == [(tid, "need_help")]
    assert_ok(tether("worker", "--once", "--model", ASKS, cwd=tmp_path, env=told))
    assert len(got) == 1  # the worker's sweep does not send it again
    sent = _events(tid, tmp_path, env, "notice.sent")
    assert [(e["kind"], e["channel"]) for e in sent] == [("need_help", "webhook")]


def test_without_a_webhook_the_terminal_is_the_channel(tmp_path: Path, env: dict[str, str]) -> None:
    spec = write_spec(tmp_path / "spec.yaml", 1)
    proc = tether("run", spec, "--model", ASKS, "--workspace", _ws(tmp_path), cwd=tmp_path, env=env)
    assert_ok(proc)
    assert "need_help" not in proc.stderr  # shown as the status, not logged again
    tid = json_out(tether("list", "--json", cwd=tmp_path, env=env))[0]["task_id"]
    sent = _events(tid, tmp_path, env, "notice.sent")
    assert [(e["kind"], e["channel"]) for e in sent] == [("need_help", "terminal")]


@pytest.mark.parametrize("verb", ["run", "submit"])
def test_a_missing_secret_is_refused_before_anything_is_written(
    tmp_path: Path, env: dict[str, str], verb: str
) -> None:
    spec = write_spec(tmp_path / "spec.yaml", 1, tools=SECRET_TOOLS)
    args = ["--model", DONE] if verb == "run" else []
    proc = tether(verb, spec, *args, "--workspace", _ws(tmp_path), cwd=tmp_path, env=env)
    assert_clean_error(proc, 2, "environment is not ready", "TICKETS_TOKEN", "tool write_file")
    if "TETHER_DB" in env:  # a fresh schema: not even tether's tables were made
        listed = tether("list", "--json", cwd=tmp_path, env=env)
        assert_clean_error(listed, 2, "holds no tether tables yet")
    else:
        assert not (tmp_path / ".tether").exists()  # not even a database file
    ready = {**env, "TICKETS_TOKEN": "tk-0123456789"}
    proc = tether(verb, spec, *args, "--workspace", _ws(tmp_path), cwd=tmp_path, env=ready)
    assert_ok(proc)
    assert "tk-0123456789" not in proc.stdout + proc.stderr


def test_a_worker_without_the_secret_holds_the_task_back(
    tmp_path: Path, env: dict[str, str]
) -> None:
    spec = write_spec(tmp_path / "spec.yaml", 1, tools=SECRET_TOOLS)
    submitted = tether(
        "submit", spec, "--skip-env-check", "--workspace", _ws(tmp_path), cwd=tmp_path, env=env
    )
    assert_ok(submitted)
    tid = submitted.stdout.strip()
    worker = tether("worker", "--once", "--model", DONE, cwd=tmp_path, env=env)
    assert_ok(worker)
    assert "left to another worker" in worker.stderr and "TICKETS_TOKEN" in worker.stderr, describe(
        worker
    )
    assert json_out(tether("status", tid, "--json", cwd=tmp_path, env=env))["status"] == "queued"
    before = len(json_out(tether("events", tid, "--json", cwd=tmp_path, env=env)))
    resumed = tether("resume", tid, "--model", DONE, cwd=tmp_path, env=env)
    assert_clean_error(resumed, 2, "environment is not ready", "TICKETS_TOKEN")
    assert len(json_out(tether("events", tid, "--json", cwd=tmp_path, env=env))) == before
    ready = {**env, "TICKETS_TOKEN": "tk-0123456789"}
    assert_ok(tether("worker", "--once", "--model", DONE, cwd=tmp_path, env=ready))
    assert json_out(tether("status", tid, "--json", cwd=tmp_path, env=env))["status"] == "satisfied"


def test_abandon_keeps_the_reason_and_the_code(tmp_path: Path, env: dict[str, str]) -> None:
    spec = write_spec(tmp_path / "spec.yaml", 1)
    tid = tether("submit", spec, "--workspace", _ws(tmp_path), cwd=tmp_path, env=env).stdout.strip()
    bad = tether("abandon", tid, "--reason", "x", "--code", "delivered", cwd=tmp_path, env=env)
    assert_clean_error(bad, 2, "not a reason to abandon", "non_convergent")
    done = tether(
        "abandon", tid, "--reason", "the client dropped it", "--code", "non_convergent",
        "--by", "ana", cwd=tmp_path, env=env,
    )  # fmt: skip
    assert_ok(done)
    assert "non_convergent" in done.stdout and "the client dropped it" in done.stdout
    doc = json_out(tether("status", tid, "--json", cwd=tmp_path, env=env))
    assert (doc["status"], doc["stop_reason"]) == ("abandoned", "non_convergent")
    last = _events(tid, tmp_path, env, "task.status")[-1]
    assert last["reason"] == "abandoned by ana: the client dropped it"
