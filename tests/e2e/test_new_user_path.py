"""What a careful new user found on the documented path, each as a test: the real
`tether` command in a subprocess, in a pipe, at 80 columns, without colour.

A finding not fixed yet is marked `xfail(strict=True)` with the reason: it fails today
as described, and the mark must go when the fix lands (a strict xfail that passes turns
the suite red).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
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
    popen_tether,
    tether,
    tether_command,
    wait_for_file,
    write_spec,
)

NARROW = cli_env(COLUMNS="80")


def test_status_names_who_holds_the_lease_of_a_task_left_running(tmp_path: Path) -> None:
    """docs/operations.md: `status` shows "... lease, what it waits for". A task whose
    process died mid-round stays `running`; before the fix the human view said only
    `running`, nothing about who held it or until when (only `--json` had it)."""
    write_spec(tmp_path / "spec.yaml", 2)
    crashed = tether(
        "run",
        "spec.yaml",
        "--model",
        DONE,
        cwd=tmp_path,
        env=cli_env(COLUMNS="80", TETHER_FAILPOINTS="after_op_dispatch=1"),
    )
    assert crashed.returncode == 137, crashed.stderr
    (task,) = json_out(tether("list", "--json", cwd=tmp_path, env=NARROW))
    doc = json_out(tether("status", task["task_id"], "--json", cwd=tmp_path, env=NARROW))
    assert doc["status"] == "running" and doc["lease"]["owner"], doc["lease"]

    proc = tether("status", task["task_id"], cwd=tmp_path, env=NARROW)
    assert_ok(proc)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("lease:")), None)
    assert line is not None, proc.stdout
    assert doc["lease"]["owner"] in line, line
    assert re.search(r"until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", line), line
    assert len(line) <= 80, line

    # A task nobody holds shows no lease line.
    assert_ok(tether("resume", task["task_id"], cwd=tmp_path, env=NARROW))
    done = tether("status", task["task_id"], cwd=tmp_path, env=NARROW)
    assert_ok(done)
    assert "lease:" not in done.stdout, done.stdout


SPEC = """\
objective: Replace the draft in notes.md
items:
  - {id: notes, title: notes.md is final, done_when: {kind: file, path: notes.md, contains: final}}
tools: [write_file]
models: {judge: rules}
"""

ANSWERS = """\
- text: rewriting notes.md
  tool_calls: [{name: write_file, arguments: {path: notes.md, content: "final\\n"}}]
"""


def test_a_redirected_approval_does_not_make_the_users_file_the_tasks(tmp_path: Path) -> None:
    """docs/writing-tools.md's approval example, with the human redirecting the write
    (`approve --modify` to another path). notes.md was the user's before the task: any
    later overwrite of it must still wait for a human."""
    (tmp_path / "notes.md").write_text("draft\n")
    (tmp_path / "spec.yaml").write_text(SPEC)
    (tmp_path / "answers.yaml").write_text(ANSWERS)
    first = json_out(
        tether("run", "spec.yaml", "--model", "scripted:answers.yaml", "--json", cwd=tmp_path)
    )
    task = first["task_id"]
    assert first["status"] == "waiting", first["waiting"]
    assert_ok(
        tether(
            "approve",
            task,
            f"{task}.r1.c0.approval",
            "--modify",
            json.dumps({"path": "other.md", "content": "final, reviewed\n"}),
            cwd=tmp_path,
            env=NARROW,
        )
    )
    after = json_out(tether("resume", task, "--json", cwd=tmp_path))
    assert (tmp_path / "other.md").read_text() == "final, reviewed\n"
    # The scripted model asks to write notes.md again: that is an overwrite of the
    # user's file, so it waits; the file keeps the user's text.
    assert (tmp_path / "notes.md").read_text() == "draft\n"
    assert after["status"] == "waiting", after["status"]


def test_the_demo_journals_no_failed_model_call(tmp_path: Path) -> None:
    """The tour's demo is the first thing a user sees; its report lists 'failures 11
    (model_error)', 'TypeError: list indices must be integers or slices, not str'."""
    proc = tether("demo", "--dir", tmp_path / "demo", cwd=tmp_path, env=NARROW, timeout=180)
    assert_ok(proc)
    db = f"sqlite:///{tmp_path / 'demo' / '.tether' / 'tether.db'}"
    (task,) = json_out(tether("list", "--json", "--db", db, cwd=tmp_path))
    failed = json_out(
        tether(
            "events", task["task_id"], "--type", "model.failed", "--json", "--db", db, cwd=tmp_path
        )
    )
    assert failed == [], [e["data"]["error"] for e in failed]


READ_THE_DB = """\
- text: look
  tool_calls: [{name: read_file, arguments: {path: "%s"}}]
- text: write
  tool_calls: [{name: write_file, arguments: {path: "x.txt", content: "x"}}]
"""

X_SPEC = """\
objective: Write x.txt
items:
  - {id: x, title: x.txt exists, done_when: {kind: file, path: x.txt}}
tools: [read_file, write_file]
models: {judge: rules}
"""


@pytest.mark.parametrize("command", ["run", "submit"])
def test_a_workspace_inside_the_state_folder_is_refused(tmp_path: Path, command: str) -> None:
    """The file tools keep out of a `.tether/` folder inside the workspace; before the fix
    `--workspace .tether` made the database folder itself the workspace, and the model
    read (and could write next to) every task's journal."""
    (tmp_path / "spec.yaml").write_text(X_SPEC)
    (tmp_path / "ans.yaml").write_text(READ_THE_DB % "tether.db")
    assert_ok(tether("submit", "spec.yaml", cwd=tmp_path, env=NARROW))  # the database exists
    before = json_out(tether("list", "--json", cwd=tmp_path, env=NARROW))
    args = (
        ["run", "spec.yaml", "--model", "scripted:ans.yaml"]
        if command == "run"
        else [command, "spec.yaml"]
    )
    proc = tether(*args, "--workspace", ".tether", cwd=tmp_path, env=NARROW)
    assert_clean_error(proc, 2, "workspace .tether", ".tether/ folder")
    assert json_out(tether("list", "--json", cwd=tmp_path, env=NARROW)) == before


def test_the_model_cannot_read_a_database_kept_in_the_workspace(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text(X_SPEC)
    (tmp_path / "ans.yaml").write_text(READ_THE_DB % "state.db")
    db = "sqlite:///state.db"
    doc = json_out(
        tether(
            "run", "spec.yaml", "--model", "scripted:ans.yaml", "--db", db, "--json", cwd=tmp_path
        )
    )
    results = json_out(
        tether("events", doc["task_id"], "--type", "op.result", "--json", "--db", db, cwd=tmp_path)
    )
    read = results[0]["data"]
    assert read["tool"] == "read_file"
    assert read["status"] != "succeeded", read["summary"][:80]


def _continue_with(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """The command after "continue with: " in what `proc` printed, split as a shell would."""
    assert_ok(proc)
    text = " ".join(proc.stdout.split())
    assert "continue with: " in text, describe(proc)
    return shlex.split(text.split("continue with: ")[-1])


def test_every_continue_hint_keeps_the_db_it_was_given(tmp_path: Path) -> None:
    """With `--db` on the command line (the database is not in the current folder), the
    "continue with: tether resume T" of approve, reject, retry, waive, edit and tell
    failed as printed: it left `--db` out, and `tether resume T` found no database."""
    work, here = tmp_path / "work", tmp_path / "here"
    (work / "out").mkdir(parents=True)
    here.mkdir()
    write_spec(work / "spec.yaml", 2)
    # Both files existed before the task: each write waits for a human.
    for n in (1, 2):
        (work / "out" / f"i{n}.txt").write_text("old\n")
    db = f"sqlite:///{tmp_path / 'db' / 'tether.db'}"
    (tmp_path / "db").mkdir()
    spec = str(work / "spec.yaml")
    first = json_out(
        tether("run", spec, "--model", DONE, "--workspace", work, "--db", db, "--json", cwd=here)
    )
    task = first["task_id"]

    def hint_runs(*decision: str, run: bool = True) -> dict[str, Any]:
        printed = _continue_with(tether(*decision, "--db", db, cwd=here, env=NARROW))
        assert printed[:3] == ["tether", "resume", task] and printed[3:] == ["--db", db]
        return json_out(tether(*printed[1:], "--json", cwd=here, env=NARROW)) if run else {}

    doc = hint_runs("approve", task, f"{task}.r1.c0.approval")
    assert doc["status"] == "waiting", doc["waiting"]
    request = doc["waiting"]["reason"].split("tether reject ")[-1].split()[-1]
    doc = hint_runs("reject", task, request, "--reason", "not this one")
    assert doc["status"] == "waiting", doc["waiting"]
    open_item = next(i["id"] for i in doc["ledger"]["items"] if i["status"] != "done")
    hint_runs("edit", task, "--set", "limits.max_rounds=50", run=False)  # queued
    hint_runs("tell", task, "keep going")
    done = hint_runs("waive", task, open_item, "--reason", "not needed")
    assert done["status"] == "satisfied", done["status"]
    # retry prints its hint too (on a task still open).
    again = json_out(
        tether("run", spec, "--model", DONE, "--workspace", work, "--db", db, "--json", cwd=here)
    )
    blocked = next(i["id"] for i in again["ledger"]["items"] if i["status"] != "done")
    printed = _continue_with(
        tether("retry", again["task_id"], blocked, "--db", db, cwd=here, env=NARROW)
    )
    assert printed[3:] == ["--db", db], printed


def test_tell_on_an_ended_task_ends_with_the_command_that_reopens_it(tmp_path: Path) -> None:
    """It said "edit it to give it a new goal instead", without the command."""
    write_spec(tmp_path / "spec.yaml", 1)
    task = json_out(tether("run", "spec.yaml", "--model", DONE, "--json", cwd=tmp_path))["task_id"]
    msg = assert_clean_error(tether("tell", task, "more", cwd=tmp_path, env=NARROW), 2)
    printed = shlex.split(" ".join(msg.split()).split("instead: ")[-1])
    assert printed[:3] == ["tether", "edit", task] and "--objective" in printed, msg
    edited = tether(*printed[1:], cwd=tmp_path, env=NARROW)
    assert_ok(edited)
    assert "version 2 (queued)" in edited.stdout, edited.stdout


#: `tether` with matplotlib unimportable, as on a bare install (the dev venv has it).
WITHOUT_MATPLOTLIB = (
    "import sys; sys.modules['matplotlib'] = None; sys.argv[0] = 'tether'; "
    "from tether.cli import main; main()"
)


@pytest.mark.parametrize("to_file", [True, False])
def test_an_html_report_without_charts_says_which_extra_draws_them(
    tmp_path: Path, to_file: bool
) -> None:
    """The tour's `tether report T --format html -o report.html` ("with charts") on a
    bare install printed "report written to report.html" only; the note about the
    missing extra was inside the HTML."""
    write_spec(tmp_path / "spec.yaml", 1)
    task = json_out(tether("run", "spec.yaml", "--model", DONE, "--json", cwd=tmp_path))["task_id"]
    out = ["-o", "report.html"] if to_file else []
    proc = subprocess.run(
        [sys.executable, "-c", WITHOUT_MATPLOTLIB, "report", task, "--format", "html", *out],
        cwd=tmp_path,
        env=NARROW,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert_ok(proc)
    assert proc.stderr.strip() == (
        "tether: the report's charts need the report extra (matplotlib is not installed): "
        "pip install 'tether[report]'"
    ), describe(proc)
    html = (tmp_path / "report.html").read_text() if to_file else proc.stdout
    assert "charts need the report extra" in html
    # With matplotlib (the dev venv has it) nothing is said.
    with_charts = tether("report", task, "--format", "html", *out, cwd=tmp_path, env=NARROW)
    assert_ok(with_charts)
    assert with_charts.stderr == "", with_charts.stderr


def test_a_worker_spells_the_outcome_as_status_does(tmp_path: Path) -> None:
    """It printed "task T: satisfied delivered" (and "waiting " with a trailing blank)."""
    write_spec(tmp_path / "spec.yaml", 1)
    task = tether("submit", "spec.yaml", cwd=tmp_path, env=NARROW).stdout.strip()
    proc = tether("worker", "--once", "--model", DONE, cwd=tmp_path, env=NARROW)
    assert_ok(proc)
    assert f"task {task}: satisfied (delivered)\n" in proc.stderr, describe(proc)


def test_approve_refuses_result_without_done(tmp_path: Path) -> None:
    """`--result` ("With --done: what the service returned") alone was accepted and
    dropped: the request was approved as if it had not been given."""
    write_spec(tmp_path / "spec.yaml", 1)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "i1.txt").write_text("old\n")
    doc = json_out(tether("run", "spec.yaml", "--model", DONE, "--json", cwd=tmp_path))
    request = f"{doc['task_id']}.r1.c0.approval"
    proc = tether(
        "approve", doc["task_id"], request, "--result", '{"id": 1}', cwd=tmp_path, env=NARROW
    )
    assert_clean_error(proc, 2, "--result goes with --done")
    (asked,) = json_out(tether("approvals", doc["task_id"], "--json", cwd=tmp_path))
    assert asked["status"] == "pending", asked


def test_a_waits_commands_keep_the_db_they_were_shown_with(tmp_path: Path) -> None:
    """`run --db URL` and `status T --db URL` ended with "tether approve T REQ or tether
    reject T REQ": run as printed from that folder, it found no database."""
    work, here = tmp_path / "work", tmp_path / "here"
    (work / "out").mkdir(parents=True)
    here.mkdir()
    write_spec(work / "spec.yaml", 1)
    (work / "out" / "i1.txt").write_text("old\n")
    db = f"sqlite:///{tmp_path / 'the db' / 'tether.db'}"  # a blank: quoted in the hint
    (tmp_path / "the db").mkdir()
    ran = tether(
        "run", work / "spec.yaml", "--model", DONE, "--workspace", work, "--db", db, cwd=here
    )
    assert_ok(ran)
    (task,) = json_out(tether("list", "--json", "--db", db, cwd=here))
    shown = tether("status", task["task_id"], "--db", db, cwd=here, env=NARROW)
    for proc in (ran, shown):
        waiting = " ".join(proc.stdout.split()).split("waiting: ")[1]
        approve = shlex.split(waiting[waiting.index("tether approve") :].split(" or ")[0])
        assert approve[:4] == ["tether", "approve", "--db", db], approve
    # The JSON document is data: the runtime's text, unchanged.
    doc = json_out(tether("status", task["task_id"], "--db", db, "--json", cwd=here))
    assert "--db" not in doc["waiting"]["reason"], doc["waiting"]
    approved = tether(*approve[1:], cwd=here, env=NARROW)
    assert_ok(approved)
    assert "approved" in approved.stdout


def test_watch_on_a_waiting_task_says_what_answers_it(tmp_path: Path) -> None:
    """`tether watch T` (the tour's "follow it live") on a task that waits for a human
    printed the timeline and then nothing, for ever: nothing moves until someone
    answers. It now says, once, what the task waits for and the command that answers."""
    import threading

    write_spec(tmp_path / "spec.yaml", 1)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "i1.txt").write_text("old\n")
    task = json_out(tether("run", "spec.yaml", "--model", DONE, "--json", cwd=tmp_path))["task_id"]
    proc = popen_tether("watch", task, "--poll", "0.1", cwd=tmp_path, env=NARROW)
    guard = threading.Timer(60, proc.kill)  # the test never hangs: watch does not end
    guard.start()
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("waiting: "):
                break
        text = " ".join("".join(lines).split())
        assert "waiting: " in text, "".join(lines)
        assert f"tether approve {task} {task}.r1.c0.approval" in text, text
        assert text.endswith("still watching"), text
    finally:
        guard.cancel()
        proc.kill()
        proc.communicate()  # reaps it and closes its pipes


def test_ctrl_c_in_the_demo_exits_130_and_says_how_to_go_on(tmp_path: Path) -> None:
    """README: "130 interrupted". Ctrl-C in the middle of `tether demo` exited 1 and
    printed the demo's "what happened" summary as if it had ended, its result line
    reading `queued (None)`, with no word of how to go on."""
    folder = tmp_path / "demo"
    proc = popen_tether(
        "demo",
        "--dir",
        folder,
        "--model",
        "scripted:tests.e2e.policies:slow_demo_policy",
        cwd=tmp_path,
        env=NARROW,
    )
    try:
        wait_for_file(folder / "records" / "doc-02.json", proc)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, f"exit {proc.returncode}\n{out}\n{err}"
    assert "Traceback" not in err, err
    assert "None" not in out and "what happened" not in out, out
    db = f"sqlite:///{folder / '.tether' / 'tether.db'}"
    (task,) = json_out(tether("list", "--json", "--db", db, cwd=tmp_path))
    assert task["status"] == "queued", task
    hint = f"interrupted; continue with: tether resume {task['task_id']} --db {db}"
    assert hint in " ".join(out.split()), out


def test_empty_lists_say_so_instead_of_a_bare_header(tmp_path: Path) -> None:
    """`tether list` on a new database, `approvals` of a task that asked for none and
    `show` of a task whose model never answered printed a table header and nothing
    under it, which reads as a broken table; `--json` stays `[]`."""
    db = f"sqlite:///{tmp_path / 'tether.db'}"
    assert_ok(tether("migrate", "--db", db, cwd=tmp_path, env=NARROW))
    listed = tether("list", "--db", db, cwd=tmp_path, env=NARROW)
    assert_ok(listed)
    assert (
        listed.stdout.strip() == "no tasks yet: start one with `tether run SPEC` (or `tether demo`)"
    )

    write_spec(tmp_path / "spec.yaml", 1)
    # Queued, never run: no model call, no approval request.
    assert_ok(tether("submit", "spec.yaml", "--db", db, cwd=tmp_path))
    (task,) = json_out(tether("list", "--json", "--db", db, cwd=tmp_path))
    tid = task["task_id"]
    shown, approvals = (
        tether(command, tid, "--db", db, cwd=tmp_path, env=NARROW)
        for command in ("show", "approvals")
    )
    assert_ok(shown)
    assert shown.stdout.strip() == f"task {tid} has made no model call yet"
    assert_ok(approvals)
    assert approvals.stdout.strip() == f"task {tid} has no approval requests"
    for command in ("show", "approvals"):
        assert json_out(tether(command, tid, "--json", "--db", db, cwd=tmp_path)) == []


#: Runs the command after it with SIGINT's default action, as a terminal's shell does.
DEFAULT_SIGINT = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execvp(sys.argv[1], sys.argv[1:])",
]


#: A `sitecustomize` that holds the CLI's import of its views for a minute, after
#: marking the file `$HOLD_MARK`: a Ctrl-C then lands while the command line loads.
HOLD_IMPORT = """\
import os, sys, time

class Hold:
    def find_spec(self, name, path=None, target=None):
        if name == "tether.cli.views":
            open(os.environ["HOLD_MARK"], "w").close()
            time.sleep(60)
        return None

sys.meta_path.insert(0, Hold())
"""


@pytest.mark.parametrize("command", [("list",), ("demo", "--dir", "demo")])
def test_ctrl_c_while_the_command_loads_exits_130_without_a_traceback(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """The first few hundred milliseconds of every command are imports; a Ctrl-C there
    (an impatient `tether demo`) printed a KeyboardInterrupt traceback from whichever
    module was loading, and exited -2."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOLD_IMPORT)
    mark = tmp_path / "loading"
    env = cli_env(
        COLUMNS="80",
        HOLD_MARK=str(mark),
        PYTHONPATH=os.pathsep.join([str(hook), NARROW["PYTHONPATH"]]),
    )
    # Ctrl-C as a terminal delivers it: a test process may have inherited SIGINT
    # ignored (a background CI job), and an ignored SIGINT is kept across exec.
    proc = subprocess.Popen(
        [*DEFAULT_SIGINT, *tether_command(), *command],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        wait_for_file(mark, proc)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, f"exit {proc.returncode}\n{out}\n{err}"
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert not (tmp_path / "demo").exists() and not (tmp_path / ".tether").exists()
