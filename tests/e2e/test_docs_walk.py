"""A new user walking README.md and docs/ as written, and making the usual mistakes on
the way: each finding as a test, the real `tether` command in a subprocess, in a pipe,
at 80 columns, without colour.

What the walk found that other tests do not already cover (tests/e2e/test_new_user_path.py,
test_readme.py, test_cli_hostile.py, test_cli_narrow.py, test_cli_bad_input.py and
tests/docs/ hold the rest). A finding not fixed yet is marked `xfail(strict=True)` with
the file and function it comes from: it fails today as described, and the mark must go
when the fix lands.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cli import (
    DONE,
    assert_clean_error,
    assert_ok,
    cli_env,
    describe,
    json_out,
    tether,
    tether_command,
    wait_for_file,
    write_spec,
)

NARROW = cli_env(COLUMNS="80")
DOCS = Path(__file__).resolve().parents[2] / "docs"


def _only_task(folder: Path) -> str:
    tasks = json_out(tether("list", "--json", cwd=folder, env=NARROW))
    assert len(tasks) == 1, tasks
    return str(tasks[0]["task_id"])


@pytest.fixture(scope="module")
def five_items(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A delivered task of five items (i1..i5), in a folder of its own."""
    folder = tmp_path_factory.mktemp("five")
    write_spec(folder / "spec.yaml", 5)
    assert_ok(tether("run", "spec.yaml", "--model", DONE, cwd=folder, env=NARROW))
    return folder, _only_task(folder)


def _reads(source: str, times: int) -> list[dict[str, Any]]:
    """A scripted model's answers: `read_source(source)`, `times` times."""
    call = {"name": "read_source", "arguments": {"source": source}}
    return [{"text": "reading", "tool_calls": [call]} for _ in range(times)]


def _source_task(folder: Path, location: str, reads: int) -> None:
    """A task that reads source B (at `location`) `reads` times, run in `folder`."""
    (folder / "b-2.0.md").write_text("# B 2.0\nB 2.0 costs 35 euros a month.\n", "utf-8")
    spec = {
        "objective": "Read B",
        "sources": [{"id": "B", "kind": "document", "version": "2.0", "location": location}],
        "items": [
            {"id": "read", "title": "B is read", "done_when": {"kind": "op", "tool": "read_source"}}
        ],
        "tools": ["read_source"],
        "models": {"judge": "rules"},
    }
    (folder / "s.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), "utf-8")
    (folder / "a.yaml").write_text(yaml.safe_dump(_reads("B", reads)), "utf-8")
    tether("run", "s.yaml", "--model", "scripted:a.yaml", cwd=folder, env=NARROW)


# --- status --after ITEM (docs/operations.md, the `status` row: "--after ITEM the page
# after that item")


def test_status_after_an_item_the_task_does_not_have_is_refused(
    five_items: tuple[Path, str],
) -> None:
    folder, tid = five_items
    proc = tether("status", tid, "--after", "i9", "--limit", "2", cwd=folder, env=NARROW)
    assert_clean_error(proc, 2, "i9", "i1")


def test_status_after_the_last_item_says_it_is_the_end(five_items: tuple[Path, str]) -> None:
    folder, tid = five_items
    proc = tether("status", tid, "--after", "i5", "--limit", "2", cwd=folder, env=NARROW)
    assert_ok(proc)
    assert "items 6-5" not in proc.stdout, describe(proc)
    assert re.search(r"no (more )?items? after i5|i5 is the last item", proc.stdout), describe(proc)


def test_status_pages_forward_as_documented(five_items: tuple[Path, str]) -> None:
    """What works: the page and the next-page command it prints."""
    folder, tid = five_items
    first = tether("status", tid, "--after", "i1", "--limit", "2", cwd=folder, env=NARROW)
    assert_ok(first)
    assert f"items 2-3 of 5; next page: tether status {tid} --after i3" in first.stdout


# --- sources (README "Sources, evidence and change", docs/sources.md)


def test_status_names_the_task_in_the_invalid_artifacts_hint(tmp_path: Path) -> None:
    _source_task(tmp_path, "b-2.0.md", 1)
    tid = _only_task(tmp_path)
    (tmp_path / "b-3.0.md").write_text("# B 3.0\nB 3.0 costs 38 euros a month.\n", "utf-8")
    assert_ok(tether("edit", tid, "--source", "B=3.0@b-3.0.md", cwd=tmp_path, env=NARROW))
    proc = tether("status", tid, cwd=tmp_path, env=NARROW)
    assert_ok(proc)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("sources:"))
    assert "invalid" in line, describe(proc)
    assert "TASK" not in line and f"tether artifacts {tid} --invalid" in line, line


def test_a_misspelt_source_location_is_named_where_the_user_reads_why(tmp_path: Path) -> None:
    _source_task(tmp_path, "b-20.md", 4)
    tid = _only_task(tmp_path)
    proc = tether("status", tid, cwd=tmp_path, env=NARROW)
    assert_ok(proc)
    assert "cannot read source B" in proc.stdout, describe(proc)
    assert "b-20.md" in proc.stdout, describe(proc)


# --- edit --file (README "People in the loop": "--file changes.yaml, a partial contract")


def test_edit_says_which_items_it_dropped(tmp_path: Path) -> None:
    write_spec(tmp_path / "spec.yaml", 3)
    assert_ok(tether("run", "spec.yaml", "--model", DONE, cwd=tmp_path, env=NARROW))
    tid = _only_task(tmp_path)
    (tmp_path / "changes.yaml").write_text(
        "items:\n  - {id: extra, title: One more file}\n", "utf-8"
    )
    proc = tether("edit", tid, "--file", "changes.yaml", cwd=tmp_path, env=NARROW)
    assert_ok(proc)
    after = json_out(tether("status", tid, "--json", cwd=tmp_path, env=NARROW))
    assert [i["id"] for i in after["ledger"]["items"]] == ["extra"]  # what it did
    out = proc.stdout + proc.stderr
    assert "i1" in out and "i3" in out, describe(proc)  # ...and it says so


# --- a script of answers in place of the model (docs/writing-tools.md, "Effects and
# approvals": `scripted:FILE`, a YAML list of responses with `text` and `tool_calls`)

_WRITES = (
    "objective: Write a.txt\n"
    "items: [{id: a, title: a.txt, done_when: {kind: op, tool: write_file}}]\n"
    "tools: [write_file]\n"
    "models: {judge: rules}\n"
)


@pytest.mark.parametrize(
    ("script", "key"),
    [
        ("- txt: writing\n", "txt"),
        (
            "- text: writing\n  tool_call: [{name: write_file, arguments: {path: a.txt}}]\n",
            "tool_call",
        ),
        ("- text: writing\n  tool_calls: [{nme: write_file, arguments: {path: a.txt}}]\n", "nme"),
        (
            "- text: writing\n  tool_calls: [{name: write_file, argument: {path: a.txt}}]\n",
            "argument",
        ),
    ],
    ids=["txt", "tool_call", "nme", "argument"],
)
def test_a_misspelt_key_in_a_scripted_answers_file_is_refused_at_start(
    tmp_path: Path, script: str, key: str
) -> None:
    (tmp_path / "spec.yaml").write_text(_WRITES, "utf-8")
    (tmp_path / "answers.yaml").write_text(script, "utf-8")
    proc = tether("run", "spec.yaml", "--model", "scripted:answers.yaml", cwd=tmp_path, env=NARROW)
    msg = assert_clean_error(proc, 2, "answers.yaml", key)
    assert "KeyError" not in msg
    assert not (tmp_path / ".tether").exists(), "a task was written"


# --- prices (docs/operations.md, "Prices": "the file TETHER_PRICES names (YAML or JSON)")


def test_a_malformed_prices_file_is_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "prices.yaml").write_text("qwen3-8b: {input: 1.25, output: 10.0\n", "utf-8")
    (tmp_path / "spec.yaml").write_text(
        "objective: x\nitems: [{id: a, title: A}]\nbudget: {money_usd: 2}\n", "utf-8"
    )
    env = cli_env(COLUMNS="80", TETHER_PRICES="prices.yaml")
    proc = tether("run", "spec.yaml", "--model", DONE, cwd=tmp_path, env=env)
    msg = assert_clean_error(proc, 2, "TETHER_PRICES", "prices.yaml", "line 2")
    assert len(msg.splitlines()) == 1, msg
    assert "<unicode string>" not in msg, msg


def test_a_prices_file_with_a_misspelt_field_names_it(tmp_path: Path) -> None:
    """What works: a price's misspelt field is named, before anything is written."""
    (tmp_path / "prices.yaml").write_text("qwen3-8b: {inptu: 1.25, output: 10.0}\n", "utf-8")
    (tmp_path / "spec.yaml").write_text(
        "objective: x\nitems: [{id: a, title: A}]\nbudget: {money_usd: 2}\n", "utf-8"
    )
    env = cli_env(COLUMNS="80", TETHER_PRICES="prices.yaml")
    proc = tether("run", "spec.yaml", "--model", DONE, cwd=tmp_path, env=env)
    assert_clean_error(proc, 2, "TETHER_PRICES", "inptu")
    assert not (tmp_path / ".tether").exists()


# --- databases (docs/operations.md, "Databases" and "Exit codes": 2 is bad input, "database
# URL (also one the server refuses ...)", 4 is infrastructure unavailable)


@pytest.mark.parametrize("query", ["scheme=agents", "sslmode=bogus"])
def test_a_bad_postgres_url_parameter_is_bad_input(tmp_path: Path, query: str) -> None:
    pytest.importorskip("psycopg")
    url = f"postgresql://postgres@127.0.0.1:9/test?{query}"  # nothing listens on port 9
    proc = tether("list", "--db", url, cwd=tmp_path, env=NARROW)
    assert_clean_error(proc, 2, query.split("=")[0])


def test_a_bad_sqlite_url_parameter_is_bad_input(tmp_path: Path) -> None:
    """What works: the SQLite side of the same mistake."""
    proc = tether("list", "--db", "sqlite:///t.db?synchronus=normal", cwd=tmp_path, env=NARROW)
    assert_clean_error(proc, 2, "synchronus", "synchronous")


# --- worker and serve options (docs/operations.md, the `worker` and `serve` rows)


def test_metrics_host_without_a_metrics_port_is_refused(tmp_path: Path) -> None:
    proc = tether("worker", "--once", "--metrics-host", "0.0.0.0", cwd=tmp_path, env=NARROW)
    assert_clean_error(proc, 2, "--metrics-host", "--metrics-port")


def test_cluster_metrics_without_a_metrics_port_is_refused(tmp_path: Path) -> None:
    """What works: the sibling option is refused."""
    proc = tether("worker", "--once", "--cluster-metrics", cwd=tmp_path, env=NARROW)
    assert_clean_error(proc, 2, "--cluster-metrics", "--metrics-port")


def test_a_misspelt_trusted_proxy_address_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    assert_ok(tether("migrate", cwd=tmp_path, env=NARROW))  # a database to serve
    args = ("serve", "--port", "0", "--forwarded-allow-ips", "127.0.0.l")
    try:
        proc = tether(*args, cwd=tmp_path, env=NARROW, timeout=10)
    except subprocess.TimeoutExpired:
        pytest.fail("tether serve started with --forwarded-allow-ips 127.0.0.l")
    assert_clean_error(proc, 2, "127.0.0.l")


def test_a_zero_model_timeout_in_the_environment_says_above_0(tmp_path: Path) -> None:
    write_spec(tmp_path / "spec.yaml", 1)
    env = cli_env(COLUMNS="80", TETHER_MODEL_TIMEOUT="0")
    proc = tether("run", "spec.yaml", "--model", DONE, cwd=tmp_path, env=env)
    assert_clean_error(proc, 2, "TETHER_MODEL_TIMEOUT", "above 0")


# --- a workspace that moved (README: "the workspace is the one folder the file tools
# reach"; docs/operations.md "Workspaces and host tags": a worker runs a task "only where
# the folder is and its marker holds that id ... the task is never failed for it")


def _delivered_then_moved(tmp_path: Path) -> tuple[Path, str]:
    """A task of three items, all done, waiting for sign-off then approved (so it is
    queued), whose folder (workspace and database) was then renamed."""
    before = tmp_path / "job"
    before.mkdir()
    write_spec(before / "spec.yaml", 3, review="human")
    assert_ok(tether("run", "spec.yaml", "--model", DONE, cwd=before, env=NARROW))
    tid = _only_task(before)
    after = tmp_path / "job-renamed"
    before.rename(after)
    return after, tid


def test_resume_refuses_a_task_whose_workspace_is_gone(tmp_path: Path) -> None:
    folder, tid = _delivered_then_moved(tmp_path)
    assert_ok(tether("approve", tid, cwd=folder, env=NARROW))  # signed off: queued
    proc = tether("resume", tid, cwd=folder, env=NARROW)
    recreated = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "job").rglob("*"))
    assert recreated == [], f"resume wrote into the old path: {recreated}\n{describe(proc)}"
    assert_clean_error(proc, 2, str(tmp_path / "job"))


def test_verify_says_the_workspace_is_gone_instead_of_reopening_everything(
    tmp_path: Path,
) -> None:
    folder, tid = _delivered_then_moved(tmp_path)
    proc = tether("verify", tid, cwd=folder, env=NARROW)
    after = json_out(tether("status", tid, "--json", cwd=folder, env=NARROW))
    assert after["ledger"]["progress"]["done"] == 3, (after["ledger"]["progress"], describe(proc))
    assert_clean_error(proc, 2, str(tmp_path / "job"))


# --- Ctrl-C (docs/operations.md, "Running and resuming": "The first Ctrl-C stops after the
# current step (the task goes back to `queued`; exit code 130) ... either way the command
# says how to go on: `tether resume TASK` continues")

#: Ctrl-C as a terminal delivers it, even when the test process inherited SIGINT ignored.
DEFAULT_SIGINT = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execvp(sys.argv[1], sys.argv[1:])",
]


#: A `sitecustomize` that holds `tether run` right after it created the task (in
#: `views.task_created`, before the line is printed and before the run takes Ctrl-C
#: over), after marking the file `$HOLD_MARK`, until the file `$HOLD_RELEASE` exists: a
#: Ctrl-C sent in between lands in that window (asyncio's runner cancels the run, which
#: ends at its next await).
HOLD_AFTER_CREATE = """\
import importlib.abc, importlib.machinery, os, sys, time


class Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        made = module.task_created

        def task_created(*args, **kwargs):
            open(os.environ["HOLD_MARK"], "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(os.environ["HOLD_RELEASE"]) and time.monotonic() < deadline:
                time.sleep(0.01)
            return made(*args, **kwargs)

        module.task_created = task_created


class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "tether.cli.views":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        spec.loader = Loader(spec.loader)
        return spec


sys.meta_path.insert(0, Finder())
"""


def test_ctrl_c_just_after_the_task_is_created_says_how_to_go_on(tmp_path: Path) -> None:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOLD_AFTER_CREATE, "utf-8")
    mark = tmp_path / "created"
    env = cli_env(
        COLUMNS="80",
        HOLD_MARK=str(mark),
        HOLD_RELEASE=str(tmp_path / "release"),
        PYTHONPATH=os.pathsep.join([str(hook), NARROW["PYTHONPATH"]]),
    )
    write_spec(tmp_path / "spec.yaml", 3)
    proc = subprocess.Popen(
        [*DEFAULT_SIGINT, *tether_command(), "run", "spec.yaml", "--model", DONE],
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
        (tmp_path / "release").touch()
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    tid = _only_task(tmp_path)  # the task exists (queued)
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert "Traceback" not in err, err
    assert f"tether resume {tid}" in out + err, f"no word of how to go on\n{out}\n{err}"


@pytest.mark.parametrize("token", ["abc", "a token with spaces in it"], ids=["short", "spaces"])
def test_a_weak_or_broken_shared_token_is_refused(tmp_path: Path, token: str) -> None:
    pytest.importorskip("fastapi")
    assert_ok(tether("migrate", cwd=tmp_path, env=NARROW))  # a database to serve
    env = cli_env(COLUMNS="80", TETHER_TOKEN=token)
    try:
        proc = tether("serve", "--port", "0", cwd=tmp_path, env=env, timeout=10)
    except subprocess.TimeoutExpired:
        pytest.fail(f"tether serve started with TETHER_TOKEN={token!r}")
    assert_clean_error(proc, 2, "TETHER_TOKEN")


# --- your own tools (docs/writing-tools.md, "Registering tools": TETHER_TOOLS; README,
# MCP servers: "A clash ... with a built-in or registered tool ... is an error naming
# both (exit 2); nothing is ever silently shadowed")

_SHADOW = '''import tether


@tether.tool(effect="write")
def write_file(path: str, content: str) -> str:
    """Not the built-in: writes nothing."""
    return "shadow wrote nothing"


TOOLS = [write_file]
'''


def test_a_tether_tools_module_cannot_silently_replace_a_built_in(tmp_path: Path) -> None:
    (tmp_path / "shadow.py").write_text(_SHADOW, "utf-8")
    (tmp_path / "spec.yaml").write_text(_WRITES, "utf-8")
    (tmp_path / "answers.yaml").write_text(
        "- text: writing\n  tool_calls: [{name: write_file, arguments: {path: a.txt, "
        "content: hi}}]\n",
        "utf-8",
    )
    env = cli_env(COLUMNS="80", TETHER_TOOLS="shadow:TOOLS")
    proc = tether("run", "spec.yaml", "--model", "scripted:answers.yaml", cwd=tmp_path, env=env)
    assert_clean_error(proc, 2, "write_file", "shadow")


# --- notices (docs/operations.md, "Webhook signatures": "a whsec_ value that is not
# base64 is refused at start")


def test_a_bad_webhook_secret_names_its_variable(tmp_path: Path) -> None:
    write_spec(tmp_path / "spec.yaml", 1)
    env = cli_env(
        COLUMNS="80",
        TETHER_WEBHOOK_URL="http://127.0.0.1:9/hook",
        TETHER_WEBHOOK_SECRET="whsec_!!!",
    )
    proc = tether("run", "spec.yaml", "--model", DONE, cwd=tmp_path, env=env)
    assert_clean_error(proc, 2, "TETHER_WEBHOOK_SECRET")
    assert not (tmp_path / ".tether").exists()


# --- the commands a message prints (README: "Each wait ends with the exact command that
# answers it")


def test_tell_on_a_cancelled_task_does_not_point_at_a_dead_end(tmp_path: Path) -> None:
    write_spec(tmp_path / "spec.yaml", 1, review="human")  # it stops waiting for sign-off
    assert_ok(tether("run", "spec.yaml", "--model", DONE, cwd=tmp_path, env=NARROW))
    tid = _only_task(tmp_path)
    assert_ok(tether("cancel", tid, cwd=tmp_path, env=NARROW))
    msg = assert_clean_error(tether("tell", tid, "one more thing", cwd=tmp_path, env=NARROW), 2)
    if "instead: " not in msg:
        return  # it names no command: nothing to follow
    printed = shlex.split(" ".join(msg.split()).split("instead: ")[-1])
    assert printed[0] == "tether", msg
    followed = tether(*printed[1:], cwd=tmp_path, env=NARROW)
    assert "nothing to edit" not in followed.stderr, f"{msg}\n{describe(followed)}"


def test_approve_on_a_task_waiting_for_a_decision_names_the_decision(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text(
        "objective: Read a file that is not there\n"
        "items: [{id: a, title: A, done_when: {kind: file, path: a.txt}}]\n"
        "tools: [read_file]\n"
        "models: {judge: rules}\n",
        "utf-8",
    )
    (tmp_path / "answers.yaml").write_text(
        yaml.safe_dump(
            [{"text": "reading", "tool_calls": [{"name": "read_file", "arguments": {"path": "x"}}]}]
            * 6
        ),
        "utf-8",
    )
    assert_ok(
        tether("run", "spec.yaml", "--model", "scripted:answers.yaml", cwd=tmp_path, env=NARROW)
    )
    tid = _only_task(tmp_path)
    doc = json_out(tether("status", tid, "--json", cwd=tmp_path, env=NARROW))
    assert doc["status"] == "waiting" and doc["waiting"]["kind"] == "decision", doc["waiting"]
    msg = assert_clean_error(tether("approve", tid, cwd=tmp_path, env=NARROW), 2)
    assert f"tether waive {tid} a" in msg, msg


# --- report -o (docs/operations.md, "Looking back": `tether report TASK --format html -o
# report.html`)


@pytest.mark.parametrize("name", ["report.html", "report.json"])
def test_report_to_a_file_writes_what_its_name_says(
    five_items: tuple[Path, str], name: str
) -> None:
    folder, tid = five_items
    proc = tether("report", tid, "-o", name, cwd=folder, env=NARROW)
    written = (folder / name).read_text("utf-8") if (folder / name).exists() else ""
    (folder / name).unlink(missing_ok=True)
    if proc.returncode == 2:
        return  # refused the mismatch: fine too
    assert_ok(proc)
    assert not written.startswith("# Report"), f"Markdown in {name}:\n{written[:200]}"


# --- `tether --version` (README: "`tether --version` says which tether you have")


def test_tether_version_as_a_command_points_at_the_option(tmp_path: Path) -> None:
    proc = tether("version", cwd=tmp_path, env=NARROW)
    assert proc.returncode == 2, describe(proc)
    assert "--version" in proc.stderr and "verify" not in proc.stderr, describe(proc)


# --- recurring tasks (docs/operations.md, "Recurring tasks": `every` or `cron`)


def test_a_schedule_with_neither_every_nor_cron_says_it_needs_one(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text(
        "objective: x\nitems: [{id: a, title: A}]\nschedule: {count: 3}\n", "utf-8"
    )
    msg = assert_clean_error(tether("submit", "spec.yaml", cwd=tmp_path, env=NARROW), 2)
    assert "not both" not in msg, msg
