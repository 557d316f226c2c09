"""The human loop through the real CLI, with no flag repeated: a task started with
`tether run spec.yaml --model M` remembers M, and every command the CLI prints as the
next step (`approve`, `edit --set limits.max_rounds=...`, `tell`, `resume`) is run here
exactly as printed, on SQLite and on PostgreSQL.

Each test reads the hint from what a person sees (`status`, or the output of the
command before), splits it as a shell would, and runs it.
"""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import web_policies
from tests.e2e.people_policies import QUESTION
from tests.support.cli import (
    DONE,
    assert_ok,
    cli_env,
    describe,
    json_out,
    popen_tether,
    tether,
    write_spec,
)

STUBBORN = "scripted:tests.e2e.decision_policies:stubborn"
ASKS = "scripted:tests.e2e.people_policies:asks_first"
GATED = "scripted:tests.e2e.policies:gated_policy"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def env(request: pytest.FixtureRequest) -> dict[str, str]:
    """The CLI's environment: the default SQLite file in the test's folder, or a fresh
    PostgreSQL schema through TETHER_DB (set once, as a user would)."""
    if request.param == "postgres":
        return cli_env(TETHER_DB=request.getfixturevalue("pg_url"))
    return cli_env()


def _hint(text: str, verb: str) -> list[str]:
    """The last `tether VERB ...` command in `text` (up to the end of its line, or to
    the next ` or `, `; ` or `, tether`), split as a shell would split it."""
    found = [
        hit
        for line in text.splitlines()
        for hit in re.findall(rf"(tether {verb} (?:(?! or |; |, tether ).)+)", line)
    ]
    assert found, f"no `tether {verb}` hint in:\n{text}"
    words = shlex.split(found[-1].rstrip(".,) "))
    assert words[0] == "tether"
    return words[1:]


def _run_hint(
    text: str, verb: str, cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    proc = tether(*_hint(text, verb), cwd=cwd, env=env)
    assert_ok(proc)
    return proc


def _start(tmp_path: Path, env: dict[str, str], model: str, **spec: Any) -> tuple[str, Path]:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    path = write_spec(tmp_path / "spec.yaml", spec.pop("n_items", 2), **spec)
    doc = json_out(
        tether("run", path, "--model", model, "--workspace", ws, "--json", cwd=tmp_path, env=env)
    )
    return str(doc["task_id"]), ws


def _status(tid: str, cwd: Path, env: dict[str, str]) -> str:
    shown = tether("status", tid, cwd=cwd, env=env)
    assert_ok(shown)
    return shown.stdout


def _finish_with_printed_resume(
    text: str, tid: str, cwd: Path, env: dict[str, str]
) -> dict[str, Any]:
    """Run the printed `tether resume T` (with nothing added), then read the status."""
    argv = _hint(text, "resume")
    assert argv == ["resume", tid], argv  # no flag to repeat
    _run_hint(text, "resume", cwd, env)
    return dict(json_out(tether("status", tid, "--json", cwd=cwd, env=env)))


def test_approve_then_resume_as_printed(tmp_path: Path, env: dict[str, str]) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    web_policies.prepare(ws)  # out/i2.txt exists: writing it waits for approval
    tid, _ = _start(tmp_path, env, DONE)
    shown = _status(tid, tmp_path, env)
    approve = _hint(shown, "approve")
    assert approve[:2] == ["approve", tid] and approve[2].startswith(f"{tid}.")  # id in full
    approved = _run_hint(shown, "approve", tmp_path, env)
    done = _finish_with_printed_resume(approved.stdout, tid, tmp_path, env)
    assert done["status"] == "satisfied", done
    launch = done["launch"]
    assert launch["models"]["actor"] == DONE and launch["actor_from"] == "--model"
    assert launch["workspace"] == str(ws.resolve())


def test_a_worker_runs_it_with_the_model_it_was_started_with(
    tmp_path: Path, env: dict[str, str]
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    web_policies.prepare(ws)
    tid, _ = _start(tmp_path, env, DONE)
    _run_hint(_status(tid, tmp_path, env), "approve", tmp_path, env)
    ran = tether("worker", "--once", "--quiet", cwd=tmp_path, env=env)
    assert_ok(ran)
    assert f"task {tid}: satisfied" in ran.stderr, describe(ran)


@pytest.mark.parametrize("decide", ["retry", "waive"])
def test_retry_or_waive_then_resume_as_printed(
    tmp_path: Path, env: dict[str, str], decide: str
) -> None:
    tid, _ = _start(tmp_path, env, STUBBORN, n_items=3, limits={"no_progress_rounds": 2})
    # The decision wait names the blocked item: its commands run as printed.
    shown = _status(tid, tmp_path, env)
    assert _hint(shown, decide)[:3] == [decide, tid, "i2"]
    decided = _run_hint(shown, decide, tmp_path, env)
    done = _finish_with_printed_resume(decided.stdout, tid, tmp_path, env)
    assert done["status"] == "satisfied", done


def test_max_rounds_wait_names_the_edit_then_resume(tmp_path: Path, env: dict[str, str]) -> None:
    tid, _ = _start(tmp_path, env, DONE, n_items=3, limits={"max_rounds": 1})
    shown = _status(tid, tmp_path, env)
    assert _hint(shown, "edit") == ["edit", tid, "--set", "limits.max_rounds=2"]
    edited = _run_hint(shown, "edit", tmp_path, env)
    again = _finish_with_printed_resume(edited.stdout, tid, tmp_path, env)
    # Raised to 2 with 3 items: it waits at the new limit, with the next raise named.
    assert again["status"] == "waiting", again
    shown = _status(tid, tmp_path, env)
    assert _hint(shown, "edit") == ["edit", tid, "--set", "limits.max_rounds=4"]
    edited = _run_hint(shown, "edit", tmp_path, env)
    done = _finish_with_printed_resume(edited.stdout, tid, tmp_path, env)
    assert done["status"] == "satisfied", done


def test_need_help_tell_then_resume_as_printed(tmp_path: Path, env: dict[str, str]) -> None:
    tid, ws = _start(tmp_path, env, ASKS, n_items=1)
    shown = _status(tid, tmp_path, env)
    assert QUESTION in " ".join(shown.split())
    told = _run_hint(shown, "tell", tmp_path, env)
    done = _finish_with_printed_resume(told.stdout, tid, tmp_path, env)
    assert done["status"] == "satisfied", done
    assert (ws / "out" / "i1.txt").read_text() != ""


def test_ctrl_c_then_resume_as_printed(tmp_path: Path, env: dict[str, str]) -> None:
    ws = tmp_path / "ws"  # the gated policy looks at out/ and release in its folder
    ws.mkdir()
    spec = write_spec(tmp_path / "spec.yaml", 3)
    proc = popen_tether("run", spec, "--model", GATED, cwd=ws, env=env)
    try:
        deadline = time.monotonic() + 60
        while not (ws / "out" / "i1.txt").exists():  # the first round is done
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the first round never wrote its file"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)  # the gated second call waits: cancelled at once
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, (out, err)
    (ws / "release").touch()  # the gated policy answers from now on
    tid = _hint(out, "resume")[1]
    done = _finish_with_printed_resume(out, tid, ws, env)
    assert done["status"] == "satisfied", done


def test_resume_flags_still_override_the_remembered_model(tmp_path: Path) -> None:
    tid, _ = _start(tmp_path, cli_env(), STUBBORN, n_items=3, limits={"no_progress_rounds": 2})
    # Told to use another model, resume uses it: the done policy writes i2 at once.
    assert_ok(tether("retry", tid, "i2", cwd=tmp_path))
    done = json_out(tether("resume", tid, "--model", DONE, "--json", cwd=tmp_path))
    assert done["status"] == "satisfied", done
    refused = tether("resume", tid, "--model", "nope", cwd=tmp_path)
    assert refused.returncode == 2


def test_a_model_url_with_a_password_is_not_remembered(tmp_path: Path) -> None:
    from tether.runtime import launch
    from tether.spec import parse_spec

    spec = parse_spec(
        {"name": "s", "objective": "o", "items": [{"id": "a", "title": "A"}]}, source="test"
    )
    rec = launch.record(spec, model="openai-compatible:http://u:secret@127.0.0.1:9/v1#m")
    assert rec["models"]["actor"] is None and "secret" not in repr(rec)
    rec = launch.record(spec, model="openai:gpt-4.1-mini", env={"OPENAI_API_KEY": "sk-x"})
    assert rec["key_env"] == ["OPENAI_API_KEY"] and "sk-x" not in repr(rec)


@pytest.mark.parametrize("goes_on", ["resume", "worker"])
def test_tether_tools_are_remembered_by_resume_and_worker(
    tmp_path: Path, env: dict[str, str], goes_on: str
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    web_policies.prepare(ws)  # i2's overwrite waits for approval
    shouter = "scripted:tests.e2e.loop_policies:shouts_then_writes"
    spec = write_spec(tmp_path / "spec.yaml", 3, tools=["write_file", "shout"])
    started = tether(
        "run", spec, "--model", shouter, "--workspace", ws, "--json",
        cwd=tmp_path, env={**env, "TETHER_TOOLS": "tests.e2e.loop_policies:TOOLS"},
    )  # fmt: skip
    tid = str(json_out(started)["task_id"])
    # From here on no TETHER_TOOLS: the task remembers its tool module.
    shown = _status(tid, tmp_path, env)
    approved = _run_hint(shown, "approve", tmp_path, env)
    argv = _hint(approved.stdout, "resume") if goes_on == "resume" else ["worker", "--once"]
    proc = tether(*argv, cwd=tmp_path, env=env)
    assert_ok(proc)
    doc = json_out(tether("status", tid, "--json", cwd=tmp_path, env=env))
    assert doc["status"] == "satisfied", doc
    assert doc["launch"]["tools"] == ["tests.e2e.loop_policies:TOOLS"]


def test_the_demo_task_resumes_with_the_offline_model(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    doc = json_out(tether("demo", "--dir", folder, "--json", cwd=tmp_path, timeout=300))
    tid = str(doc["status"]["task_id"])
    assert doc["status"]["launch"]["models"]["actor"] == "scripted:tether.demo:policy"
    # In the demo's folder (its database is there), reopen it and go on as printed.
    edited = tether("edit", tid, "--set", "limits.max_rounds=500", cwd=folder)
    assert_ok(edited)
    done = _finish_with_printed_resume(edited.stdout, tid, folder, cli_env())
    assert done["status"] == "satisfied", done


def test_a_used_up_budget_names_the_edit_that_raises_it(tmp_path: Path) -> None:
    env = cli_env()
    tid, _ = _start(tmp_path, env, DONE, n_items=3, budget={"rounds": 1})
    shown = _status(tid, tmp_path, env)
    assert _hint(shown, "edit") == ["edit", tid, "--set", "budget.rounds=2"]
    edited = _run_hint(shown, "edit", tmp_path, env)
    again = _finish_with_printed_resume(edited.stdout, tid, tmp_path, env)
    # One more round ran with the remembered model, then the raised cap stops it again.
    assert again["status"] == "suspended", again
    assert again["budget"]["used"]["rounds"] == 2
    assert _hint(_status(tid, tmp_path, env), "edit")[-1] == "budget.rounds=4"
