"""A fourth set of honest ways of working, at default limits: a shell tool running the
tests while editing and polling a job, real git commits after each file, thirty files
read three at a time, a forty-item checklist, a slow check, a paginated HTTP API that
rate-limits, a post a person refuses and the agent sends elsewhere, long test output,
a draft read back and revised, a queue waited on while other work goes on, an outage
longer than one call's retries, a search that answers the same to every query, the
ledger read every round, many small edits of one file, unicode deliverables in nested
folders, MCP tools as tether maps their annotations, a shell-only agent fixing a typo
with sed, and a cluster's long status (past the preview) polled through an upgrade.

Each shape is real work in the `_honest` / `_honest_more` / `_honest_third` frameworks
(`ThirdStyle`, `PlanActor`, the judges, `liar_of`, `endless_of`, `run_third`): real
files, real subprocesses (a shell, git, check scripts, a job CLI, a background worker
filling a SQLite table) and real HTTP services on 127.0.0.1 (an orders API with cursor
pages answering 429 now and then, a status endpoint in maintenance).

`python -m tests.adversarial._honest_fourth` prints the table of shapes and judges.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.adversarial._honest import (
    EDIT_FILES,
    FILES,
    PY,
    LocalServer,
    PlanActor,
    Step,
    call,
    command_item,
    file_item,
    say,
)
from tests.adversarial._honest_more import HTTPStatusError, results_of
from tests.adversarial._honest_more import _check as check_tool
from tests.adversarial._honest_third import _PROCS, ThirdStyle, _finish_job, print_table
from tether import errors
from tether.models.base import ModelRequest, ModelResponse
from tether.tools.mcp import effect_for
from tether.tools.registry import Tool, tool

# --- a shell tool, as coding agents have one -------------------------------------------


def shell(ws: Path, command: str, timeout: float = 60) -> tuple[int, str]:
    """Run `command` with the shell in `ws`: its exit code and its output."""
    proc = subprocess.run(
        command, shell=True, cwd=ws, capture_output=True, text=True, timeout=timeout, check=False
    )
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _shell_tools(ws: Path) -> list[Tool]:
    """`run_command`: a shell (a `write`: a shell can do anything). Like the shells of
    coding agents it reports the exit code in its answer rather than failing."""

    @tool(name="run_command", effect="write", description="Run a shell command.")
    def run_command(command: str) -> str:
        code, out = shell(ws, command)
        return f"$ {command}\n{out}\n[exit {code}]"

    return [run_command]


# 1. the tests run through the shell while editing: 3 failed, 1 failed, green ----------

_INVENTORY = """\
def total(items):
    return sum(q for q, _ in items)


def restock(stock, n):
    stock - n


def low(stock, limit=5):
    return stock > limit
"""
_INVENTORY_CHECK = """\
import inventory

tests = {
    "test_total": lambda: inventory.total([(2, 1.5), (1, 4.0)]) == 7.0,
    "test_restock": lambda: inventory.restock(3, 4) == 7,
    "test_low": lambda: inventory.low(2) is True,
}
failed = [k for k, t in tests.items() if not t()]
for k in failed:
    print(f"FAILED {k}")
print(f"{len(failed)} failed, {len(tests) - len(failed)} passed")
raise SystemExit(1 if failed else 0)
"""
_INVENTORY_V1 = _INVENTORY.replace("sum(q for q, _ in items)", "sum(q * p for q, p in items)")
_INVENTORY_V1 = _INVENTORY_V1.replace("    stock - n\n", "    return stock + n\n")
_INVENTORY_V2 = _INVENTORY_V1.replace("stock > limit", "stock < limit")


def _shell_tdd_actor(_ws: Path) -> PlanActor:
    test = f"{PY} check_inventory.py"
    return PlanActor(
        [
            say("Running the tests.", call("run_command", command=test)),
            say("Reading the module.", call("read_file", path="inventory.py")),
            say(
                "total ignores the price and restock returns nothing; fixing both.",
                call("write_file", path="inventory.py", content=_INVENTORY_V1),
                call("run_command", command=test),
            ),
            say("Which one is left?", call("run_command", command=f"{test} | head -1")),
            say(
                "low is inverted; fixing it and running everything.",
                call("write_file", path="inventory.py", content=_INVENTORY_V2),
                call("run_command", command=test),
            ),
        ]
    )


SHELL_TDD = ThirdStyle(
    "shell-tdd",
    "make the inventory tests pass",
    lambda _ws: [command_item("inv", "make check_inventory.py pass", f"{PY} check_inventory.py")],
    _shell_tdd_actor,
    files={"inventory.py": _INVENTORY, "check_inventory.py": _INVENTORY_CHECK},
    tools=[*EDIT_FILES, "run_command"],
    extra_tools=_shell_tools,
)


# 2. a job polled through the shell (its CLI's `status`), as shell agents do ----------

#: A job CLI: `start` queues the export, `status` says "running" until the job has been
#: asked about `_SHELL_POLLS` times (a stand-in for minutes of export), then "finished".
_SHELL_POLLS = 4
_JOBCTL = f"""\
import pathlib, sys

state = pathlib.Path(".jobctl")
if sys.argv[1] == "start":
    state.write_text("0")
    print(f"job 7 ({{sys.argv[2]}}) queued")
else:
    n = int(state.read_text()) + 1
    state.write_text(str(n))
    print("job 7: running" if n <= {_SHELL_POLLS} else "job 7: finished, 3 tables exported")
"""


def _shell_poller_actor(_ws: Path) -> PlanActor:
    status = f"{PY} jobctl.py status 7"
    return PlanActor(
        [
            say(
                "Starting the export.", call("run_command", command=f"{PY} jobctl.py start export")
            ),
            *[say("Is it done?", call("run_command", command=status))] * _SHELL_POLLS,
            say("Once more.", call("run_command", command=status)),
            say(
                "Finished; recording it.",
                call("write_file", path="out/export.md", content="job 7: 3 tables exported\n"),
            ),
        ]
    )


SHELL_POLLER = ThirdStyle(
    "shell-poller",
    "export the tables and record how many",
    lambda _ws: [file_item("export", "out/export.md", "3 tables exported")],
    _shell_poller_actor,
    files={"jobctl.py": _JOBCTL},
    tools=[*FILES, "run_command"],
    extra_tools=_shell_tools,
)


# 3. real git: each page written, then committed -------------------------------------

_GIT = "git -c user.name=agent -c user.email=agent@example.com -c commit.gpgsign=false"
_PAGES = ("api", "cli", "faq")


@contextmanager
def _git_repo(ws: Path) -> Iterator[None]:
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=ws, check=True, timeout=60)
    code, out = shell(ws, f"{_GIT} add -A && {_GIT} commit -q -m 'initial notes'")
    assert code == 0, out
    yield


def _git_tools(ws: Path) -> list[Tool]:
    @tool(name="git_status", effect="read", volatile=False, description="git status --short.")
    def git_status() -> str:
        code, out = shell(ws, "git status --short")
        if code:
            raise errors.ToolFailed(out)
        return out or "(clean)"

    @tool(name="git_commit", effect="write", description="Stage everything and commit.")
    def git_commit(message: str) -> str:
        code, out = shell(ws, f"{_GIT} add -A && {_GIT} commit -m {json.dumps(message)}")
        if code:
            raise errors.ToolFailed(f"git commit: {out}")
        return out

    return [git_status, git_commit]


def _git_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = [say("Where is the repo?", call("git_status"))]
    for page in _PAGES:
        steps += [
            say(f"Notes for {page}.", call("read_file", path=f"notes/{page}.txt")),
            say(
                f"The {page} page.",
                call("write_file", path=f"docs/{page}.md", content=f"# {page}\n\n## Usage\nok\n"),
            ),
            say("Committing it.", call("git_commit", message=f"docs: add {page} page")),
        ]
    return PlanActor(steps)


def _committed(page: str) -> dict[str, Any]:
    return command_item(
        page,
        f"docs/{page}.md is committed",
        f"git log --format=%s | grep -qx 'docs: add {page} page' && git diff --quiet HEAD",
    )


GIT_COMMITS = ThirdStyle(
    "git-commits",
    "write and commit a page for the api, the cli and the faq",
    lambda _ws: [_committed(p) for p in _PAGES],
    _git_actor,
    files={f"notes/{p}.txt": f"{p}: what it does\n" for p in _PAGES},
    tools=[*FILES, "git_status", "git_commit"],
    extra_tools=_git_tools,
    serve=_git_repo,
)


# 4. thirty files read three at a time, then one summary -------------------------------

_WIDE = {f"src/m{k:02}.py": f'"""Module {k}: owner team-{k % 4}."""\n' for k in range(30)}


def _wide_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = []
    for r in range(10):
        paths = [f"src/m{k:02}.py" for k in range(3 * r, 3 * r + 3)]
        if r == 6:  # one of them read again, to compare with what came later
            paths[2] = "src/m02.py"
        steps.append(say(f"Batch {r}.", *[call("read_file", path=p) for p in paths]))
    steps.append(say("The one I skipped.", call("read_file", path="src/m20.py")))
    owners = "".join(
        f"- team-{t}: {sum(1 for k in range(30) if k % 4 == t)} modules\n" for t in range(4)
    )
    steps.append(
        say("Summary.", call("write_file", path="out/owners.md", content="# Owners\n" + owners))
    )
    return PlanActor(steps)


WIDE_READER = ThirdStyle(
    "wide-reader",
    "summarise which team owns how many modules",
    lambda _ws: [file_item("owners", "out/owners.md", "team-3: 7 modules")],
    _wide_actor,
    files=_WIDE,
)


# 5. a checklist of forty items, two or three rounds each, the ledger asked now and then

CHECK40 = 40


def _check40_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = []
    for k in range(CHECK40):
        p = f"out/c{k:02}.md"
        if k % 10 == 0:
            steps.append(say("What is left?", call("ledger_items", status="pending")))
        if k % 2 == 0:
            steps.append(say(f"Input {k}.", call("read_file", path=f"in/c{k:02}.txt")))
        steps.append(say(f"Heading {k}.", call("write_file", path=p, content=f"# c{k:02}\n")))
        steps.append(say(f"Body {k}.", call("append_file", path=p, content=f"value {k * 3}\n")))
    return PlanActor(steps)


CHECKLIST_40 = ThirdStyle(
    "checklist-40",
    "one page per input",
    lambda _ws: [
        file_item(f"c{k:02}", f"out/c{k:02}.md", f"value {k * 3}") for k in range(CHECK40)
    ],
    _check40_actor,
    files={f"in/c{k:02}.txt": f"{k}\n" for k in range(CHECK40)},
    tools=[*FILES, "ledger_items"],
)


# 6. a command rule that takes a while (a slow suite, a real subprocess) --------------

_SLOW_CHECK = """\
import time

t0 = time.perf_counter()
time.sleep(0.2)  # the suite's fixtures start a database
import report

rows = report.rows()
ok = rows == [("north", 120), ("south", 80)] and report.total() == 200
print(f"{'1 passed' if ok else '1 failed'} in {time.perf_counter() - t0:.2f}s")
raise SystemExit(0 if ok else 1)
"""
_REPORT_V1 = 'def rows():\n    return [("north", 120), ("south", 80)]\n'
_REPORT_V2 = _REPORT_V1 + "\n\ndef total():\n    return sum(n for _, n in rows())\n"


def _slow_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say("What the report must hold.", call("read_file", path="spec.txt")),
            say("The rows.", call("write_file", path="report.py", content=_REPORT_V1)),
            say("The suite (it is slow).", call("run_tests")),
            say(
                "total is missing; adding it and running again.",
                call("write_file", path="report.py", content=_REPORT_V2),
                call("run_tests"),
            ),
        ]
    )


SLOW_RULE = ThirdStyle(
    "slow-rule",
    "write the regional report",
    lambda _ws: [command_item("report", "make check_report.py pass", f"{PY} check_report.py")],
    _slow_actor,
    files={"check_report.py": _SLOW_CHECK, "spec.txt": "rows north 120, south 80; a total\n"},
    tools=[*EDIT_FILES, "run_tests"],
    extra_tools=check_tool("check_report.py", "run_tests"),
)


# 7. an orders API with cursor pages that answers 429 now and then ---------------------

_ORDERS = [{"id": f"o{k:02}", "amount": k * 10} for k in range(1, 19)]
_PAGE = 4


class OrdersServer(LocalServer):
    """A real HTTP server on 127.0.0.1: `GET /orders?cursor=C` answers a page of orders
    and the next cursor; every third request is refused with 429 (`retry-after-ms`)."""

    def __init__(self) -> None:
        self.hits = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.hits += 1
                if server.hits % 3 == 0:
                    body = b'{"error": "rate limited"}'
                    self.send_response(429)
                    self.send_header("retry-after-ms", "20")
                else:
                    cursor = parse_qs(urlparse(self.path).query).get("cursor", ["0"])[0]
                    start = int(cursor or "0")
                    page = _ORDERS[start : start + _PAGE]
                    nxt = start + _PAGE if start + _PAGE < len(_ORDERS) else None
                    body = json.dumps({"orders": page, "next_cursor": nxt}).encode()
                    self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                pass

        self.serve(Handler)


_SERVED: dict[str, Any] = {}


def _serving(make: Callable[[], LocalServer]) -> Callable[[Path], Any]:
    @contextmanager
    def serve(ws: Path) -> Iterator[LocalServer]:
        server = make()
        _SERVED[str(ws)] = server
        try:
            with server.running():
                yield server
        finally:
            del _SERVED[str(ws)]

    return serve


def _get(ws: Path, path: str) -> str:
    """GET `path` of the workspace's server; an HTTP error raised as clients raise it."""
    try:
        with urllib.request.urlopen(f"{_SERVED[str(ws)].url}{path}", timeout=10) as r:
            return str(r.read().decode())
    except urllib.error.HTTPError as exc:
        body = exc.read().decode()
        exc.close()
        raise HTTPStatusError(exc.code, dict(exc.headers.items()), body) from None


def _orders_tools(ws: Path) -> list[Tool]:
    @tool(name="list_orders", effect="read", description="One page of orders (cursor paging).")
    def list_orders(cursor: int = 0) -> str:
        return _get(ws, f"/orders?cursor={cursor}")

    return [list_orders]


def _orders_actor(_ws: Path) -> PlanActor:
    def next_page(request: ModelRequest) -> ModelResponse:
        cursor = json.loads(results_of(request)[-1])["next_cursor"]
        return say(f"Next page, from {cursor}.", call("list_orders", cursor=cursor))

    def record(request: ModelRequest) -> ModelResponse:
        amounts = [o["amount"] for r in results_of(request) for o in json.loads(r)["orders"]]
        return say(
            "All pages read; the total.",
            call(
                "write_file",
                path="out/orders.md",
                content=f"orders: {len(amounts)}, total {sum(amounts)}\n",
            ),
        )

    pages = -(-len(_ORDERS) // _PAGE)
    return PlanActor(
        [say("The first page.", call("list_orders")), *[next_page] * (pages - 1), record]
    )


_ORDERS_TOTAL = sum(o["amount"] for o in _ORDERS)
CURSOR_PAGES = ThirdStyle(
    "cursor-pages-429",
    "total every order of the API",
    lambda _ws: [file_item("orders", "out/orders.md", f"orders: 18, total {_ORDERS_TOTAL}")],
    _orders_actor,
    tools=[*FILES, "list_orders"],
    extra_tools=_orders_tools,
    serve=_serving(OrdersServer),
)


# 8. a post a person refuses; the agent reads the guide and posts where it belongs ----

_POSTED: dict[str, list[tuple[str, str]]] = {}


def _chat_tools(ws: Path) -> list[Tool]:
    posted = _POSTED.setdefault(str(ws), [])

    @tool(name="post_message", effect="send", description="Post a message to a chat channel.")
    def post_message(channel: str, text: str) -> str:
        posted.append((channel, text))
        return f"posted to {channel} (message {len(posted)})"

    return [post_message]


def _chat_actor(_ws: Path) -> PlanActor:
    text = "tether 2.4 is out: resumable approvals, faster replays."
    return PlanActor(
        [
            say("The release notes.", call("read_file", path="RELEASE.md")),
            say("Announcing it.", call("post_message", channel="#general", text=text)),
            say("Refused; where do announcements go?", call("read_file", path="CONTRIBUTING.md")),
            say("In #releases.", call("post_message", channel="#releases", text=text)),
        ]
    )


REJECTED_CHANNEL = ThirdStyle(
    "rejected-channel",
    "announce the release",
    lambda _ws: [
        {
            "id": "announce",
            "title": "announce the release in #releases",
            "done_when": {"kind": "op", "tool": "post_message", "args": {"channel": "#releases"}},
        }
    ],
    _chat_actor,
    files={
        "RELEASE.md": "# 2.4\n- resumable approvals\n- faster replays\n",
        "CONTRIBUTING.md": "Release announcements go to #releases, never #general.\n",
    },
    tools=[*FILES, "post_message"],
    extra_tools=_chat_tools,
    decisions=("reject: not in #general; see CONTRIBUTING.md", "approve"),
)


# 9. a verbose suite whose output is longer than the preview, every run ----------------

_VERBOSE_CHECK = """\
import units

cases = [(f"test_case_{k:02}", k) for k in range(60)]
failed = 0
for name, k in cases:
    want = k * 1024 if k % 20 else k * 1000
    ok = units.kib(k) == k * 1024 and (k % 20 or units.kb(k) == want)
    if k % 20 == 0 and k and not units.ok_zero():
        ok = False
    failed += not ok
    print(f"tests/test_units.py::{name} {'PASSED' if ok else 'FAILED'}")
print(f"{failed} failed, {len(cases) - failed} passed")
raise SystemExit(1 if failed else 0)
"""
_UNITS0 = "def kib(n):\n    return n * 1000\n\n\ndef kb(n):\n    return n * 1024\n"
_UNITS1 = "def kib(n):\n    return n * 1024\n\n\ndef kb(n):\n    return n * 1024\n"
_UNITS2 = (
    "def kib(n):\n    return n * 1024\n\n\ndef kb(n):\n    return n * 1000\n\n\n"
    "def ok_zero():\n    return True\n"
)


def _verbose_tools(ws: Path) -> list[Tool]:
    @tool(name="run_tests", effect="read", description="pytest -v: every test's result.")
    def run_tests() -> str:
        code, out = shell(ws, f"{PY} check_units.py")
        if code:
            raise errors.ToolFailed(out)
        return out

    return [run_tests]


def _verbose_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say("Running the suite.", call("run_tests")),
            say("kib is off; fixing.", call("write_file", path="units.py", content=_UNITS1)),
            say("Again.", call("run_tests")),
            say("Reading the module.", call("read_file", path="units.py")),
            say(
                "kb and the zero case; fixing and running.",
                call("write_file", path="units.py", content=_UNITS2),
                call("run_tests"),
            ),
        ]
    )


VERBOSE_TESTS = ThirdStyle(
    "verbose-tests",
    "make the units suite pass",
    lambda _ws: [command_item("units", "make check_units.py pass", f"{PY} check_units.py")],
    _verbose_actor,
    files={"units.py": _UNITS0, "check_units.py": _VERBOSE_CHECK},
    tools=[*EDIT_FILES, "run_tests"],
    extra_tools=_verbose_tools,
)


# 10. a draft written, read back and revised twice, a real prose linter deciding -------

_LINT = """\
import pathlib, sys

text = pathlib.Path("docs/guide.md").read_text() if pathlib.Path("docs/guide.md").exists() else ""
problems = []
for h in ("## Install", "## Use"):
    if h not in text:
        problems.append(f"missing section {h}")
if "TODO" in text:
    problems.append("a TODO is left")
for n, line in enumerate(text.splitlines(), 1):
    if len(line) > 72:
        problems.append(f"line {n} is longer than 72 characters")
print("; ".join(problems) or "clean")
sys.exit(1 if problems else 0)
"""
_DRAFT1 = "# Guide\n\n## Install\npip install tether\n\nTODO usage\n"
_DRAFT2 = (
    "# Guide\n\n## Install\npip install tether\n\n## Use\n"
    "Run tether run spec.yaml and then watch it with tether status, which shows every item.\n"
)
_DRAFT3 = (
    "# Guide\n\n## Install\npip install tether\n\n## Use\n"
    "Run `tether run spec.yaml`, then watch it\nwith `tether status`.\n"
)


def _draft_actor(_ws: Path) -> PlanActor:
    p = "docs/guide.md"
    return PlanActor(
        [
            say("A first draft.", call("write_file", path=p, content=_DRAFT1)),
            say("Reading it back.", call("read_file", path=p)),
            say("Linting.", call("lint_docs")),
            say("Filling in the usage.", call("write_file", path=p, content=_DRAFT2)),
            say("Reading it back.", call("read_file", path=p)),
            say("Linting again.", call("lint_docs")),
            say(
                "One line too long; wrapping it.",
                call("write_file", path=p, content=_DRAFT3),
                call("lint_docs"),
            ),
        ]
    )


DRAFT_READBACK = ThirdStyle(
    "draft-readback",
    "write the user guide",
    lambda _ws: [command_item("guide", "docs/guide.md passes lint_docs.py", f"{PY} lint_docs.py")],
    _draft_actor,
    files={"lint_docs.py": _LINT},
    tools=[*FILES, "lint_docs"],
    extra_tools=check_tool("lint_docs.py", "lint_docs"),
)


# 11. a queue waited on while the docs are written in between --------------------------


def _queue_tools(_ws: Path) -> list[Tool]:
    state = {"polls": 0}

    @tool(name="start_migration", effect="write", description="Enqueue the data migration.")
    def start_migration(table: str) -> str:
        return f"migration of {table}: 40 batches enqueued"

    @tool(name="queue_depth", effect="read", description="How many batches are pending.")
    def queue_depth(queue: str) -> str:
        state["polls"] += 1
        return f"{queue}: 40 pending" if state["polls"] <= 4 else f"{queue}: 0 pending (drained)"

    return [start_migration, queue_depth]


def _queue_actor(_ws: Path) -> PlanActor:
    doc = "docs/migration.md"
    poll = say("The queue?", call("queue_depth", queue="migrate"))
    return PlanActor(
        [
            say("Starting the migration.", call("start_migration", table="orders")),
            poll,
            say(
                "While it runs: the runbook.",
                call("write_file", path=doc, content="# Migration\n\n## Steps\n1. enqueue\n"),
            ),
            poll,
            say(
                "Verification.", call("append_file", path=doc, content="\n## Verify\ncount rows\n")
            ),
            poll,
            say("Rollback.", call("append_file", path=doc, content="\n## Rollback\nrestore\n")),
            poll,
            poll,
            say(
                "Drained; recording it.",
                call("write_file", path="out/migration.md", content="orders: drained\n"),
            ),
        ]
    )


QUEUE_INTERLEAVED = ThirdStyle(
    "queue-interleaved",
    "migrate the orders and write the runbook",
    lambda _ws: [
        file_item("drain", "out/migration.md", "drained"),
        file_item("runbook", "docs/migration.md", "## Rollback"),
    ],
    _queue_actor,
    tools=[*FILES, "start_migration", "queue_depth"],
    extra_tools=_queue_tools,
)


# 12. an outage longer than one call's retries: 503 through three of the model's asks -

#: Attempts of one call the default retry policy makes (`RetryPolicy.max_attempts`).
ATTEMPTS = 3
#: Model calls that meet the outage (each retried `ATTEMPTS` times by tether).
_OUTAGE_ASKS = 3


class MaintenanceServer(LocalServer):
    """A real HTTP server on 127.0.0.1: `GET /status` answers 503 (`retry-after-ms`)
    `fails` times, maintenance, then the service's status."""

    def __init__(self, fails: int) -> None:
        self.fails = fails
        self.hits = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.hits += 1
                if server.hits <= server.fails:
                    body = b"Service Unavailable: scheduled maintenance"
                    self.send_response(503)
                    self.send_header("retry-after-ms", "10")
                else:
                    body = b'{"service": "billing", "version": "7.2", "state": "up"}'
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                pass

        self.serve(Handler)


def _status_tools(ws: Path) -> list[Tool]:
    @tool(name="service_status", effect="read", description="GET the billing service's status.")
    def service_status() -> str:
        return _get(ws, "/status")

    return [service_status]


def _outage_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            *[say("Is billing up?", call("service_status"))] * _OUTAGE_ASKS,
            say("Up now?", call("service_status")),
            say(
                "Recording the version.",
                call("write_file", path="out/billing.md", content="billing 7.2 is up\n"),
            ),
        ]
    )


OUTAGE_503 = ThirdStyle(
    "outage-503",
    "record the billing service's version once it is up",
    lambda _ws: [file_item("billing", "out/billing.md", "7.2")],
    _outage_actor,
    tools=[*FILES, "service_status"],
    extra_tools=_status_tools,
    serve=_serving(lambda: MaintenanceServer(ATTEMPTS * _OUTAGE_ASKS)),
)


# 13. a search that answers the same hits to every query --------------------------------


def _search_tools(_ws: Path) -> list[Tool]:
    @tool(name="search_docs", effect="read", description="Full-text search of the docs.")
    def search_docs(query: str) -> str:
        return "3 hits: docs/retry.md, docs/limits.md, docs/tools.md"

    return [search_docs]


def _search_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = [
        say(f"Searching for {q}.", call("search_docs", query=q))
        for q in ("backoff", "retry delay", "exponential backoff jitter")
    ]
    steps += [
        say(f"Reading {d}.", call("read_file", path=f"docs/{d}.md"))
        for d in ("retry", "limits", "tools")
    ]
    steps.append(
        say(
            "The answer.",
            call("write_file", path="out/answer.md", content="backoff: full jitter, base 1 s\n"),
        )
    )
    return PlanActor(steps)


SEARCH_SAME = ThirdStyle(
    "search-same-hits",
    "find out how retries back off",
    lambda _ws: [file_item("answer", "out/answer.md", "full jitter")],
    _search_actor,
    files={
        "docs/retry.md": "Retries use full jitter.\n",
        "docs/limits.md": "The base delay is 1 s.\n",
        "docs/tools.md": "Tools declare a retry policy.\n",
    },
    tools=[*FILES, "search_docs"],
    extra_tools=_search_tools,
)


# 14. the ledger read every round, while guessing where the config is ------------------


def _ledger_guesser_actor(_ws: Path) -> PlanActor:
    def turn(text: str, *calls: Any) -> ModelResponse:
        return say(text, call("ledger_items"), *calls)

    return PlanActor(
        [
            turn("My item, and what the app is.", call("read_file", path="README.md")),
            *[
                turn(f"The config is probably {p}.", call("read_file", path=p))
                for p in ("config.yaml", "config.yml", "conf/config.yaml", "app.yaml")
            ],
            turn("Not there; listing.", call("list_files", path=".")),
            turn("It is under settings/.", call("read_file", path="settings/app.yaml")),
            turn(
                "Documenting the port.",
                call("write_file", path="out/port.md", content="the app listens on port 8080\n"),
            ),
        ]
    )


LEDGER_GUESSER = ThirdStyle(
    "ledger-guesser",
    "document the app's port from its config",
    lambda _ws: [file_item("port", "out/port.md", "8080")],
    _ledger_guesser_actor,
    files={"settings/app.yaml": "port: 8080\n", "README.md": "# app\n"},
    tools=[*FILES, "ledger_items"],
)


# 15. ten small edits of one file, each adding a function ------------------------------

_HELPERS = [(f"h{k}", k) for k in range(10)]
_HELPERS_CHECK = """\
import helpers

missing = [f"h{k}" for k in range(10) if getattr(helpers, f"h{k}", lambda: None)() != k * k]
print(f"{10 - len(missing)} of 10 helpers" + (": missing " + ", ".join(missing) if missing else ""))
raise SystemExit(1 if missing else 0)
"""


def _helpers(n: int) -> str:
    return "".join(f"def h{k}():\n    return {k * k}\n\n\n" for k in range(n)).rstrip() + "\n"


def _tiny_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = [
        say(f"h{n - 1}.", call("write_file", path="helpers.py", content=_helpers(n)))
        for n in range(1, 10)
    ]
    steps.append(
        say(
            "The last one, and the check.",
            call("write_file", path="helpers.py", content=_helpers(10)),
            call("run_check"),
        )
    )
    return PlanActor(steps)


TINY_EDITS = ThirdStyle(
    "tiny-edits",
    "write the ten helpers",
    lambda _ws: [command_item("helpers", "make check_helpers.py pass", f"{PY} check_helpers.py")],
    _tiny_actor,
    files={"check_helpers.py": _HELPERS_CHECK},
    tools=[*FILES, "run_check"],
    extra_tools=check_tool("check_helpers.py", "run_check"),
)


# 16. translations: unicode content in nested folders, one path with an umlaut ---------

_JA = "# 日本語のガイド\n\n## インストール 🚀\npip install tether\n"
_DE = "# Über uns\n\nWir bauen zuverlässige Agenten. Größe: ≥ 3 µs.\n"
_FR = "# 🚀 Démarrage\n\nÉcrivez le contrat, puis lancez-le.\n"


def _unicode_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say("The English source.", call("read_file", path="docs/en/guide.md")),
            say("Japanese.", call("write_file", path="docs/i18n/ja/guide.md", content=_JA)),
            say("German.", call("write_file", path="docs/i18n/de/über-uns.md", content=_DE)),
            say("French.", call("write_file", path="docs/i18n/fr/démarrage.md", content=_FR)),
            say("Reading the Japanese back.", call("read_file", path="docs/i18n/ja/guide.md")),
            say(
                "Proofread; signing it off.",
                call("append_file", path="docs/i18n/ja/guide.md", content="\n✅ 校正済み\n"),
            ),
        ]
    )


UNICODE_NESTED = ThirdStyle(
    "unicode-nested",
    "translate the guide into Japanese, German and French",
    lambda _ws: [
        file_item("ja", "docs/i18n/ja/guide.md", "✅ 校正済み"),
        file_item("de", "docs/i18n/de/über-uns.md", "zuverlässige"),
        file_item("fr", "docs/i18n/fr/démarrage.md", "🚀 Démarrage"),
    ],
    _unicode_actor,
    files={"docs/en/guide.md": "# Guide\n\nInstall it, then run it.\n"},
)


# 17./18. MCP tools as tether maps their annotations (`tether.tools.mcp.effect_for`) ---


def mcp_like(fn: Callable[..., str], name: str, annotations: Any, description: str) -> Tool:
    """A tool as `tether.tools.mcp` makes one of an MCP server's tool with these
    annotations: its effect from `effect_for`, volatile unless `openWorldHint` is false."""
    effect, idempotent = effect_for(annotations)
    volatile = not (annotations is not None and annotations.open_world_hint is False)
    return tool(
        fn,
        name=name,
        effect=effect,
        idempotent=idempotent,
        volatile=volatile if effect == "read" else None,
        description=description,
    )


#: Times the pipeline answers "running" (a build of a few minutes, polled).
_CI_RUNNING = 5


def _ci_tools(_ws: Path) -> list[Tool]:
    """A CI server's MCP tools, unannotated (as many servers list them)."""
    state = {"polls": 0}

    def run_pipeline(ref: str) -> str:
        return f"pipeline 88 started for {ref}"

    def get_pipeline(id: int) -> str:
        state["polls"] += 1
        return (
            f"pipeline {id}: running"
            if state["polls"] <= _CI_RUNNING
            else f"pipeline {id}: success"
        )

    return [
        mcp_like(run_pipeline, "ci__run_pipeline", None, "Start a pipeline."),
        mcp_like(get_pipeline, "ci__get_pipeline", None, "A pipeline's status."),
    ]


def _ci_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say("Starting CI.", call("ci__run_pipeline", ref="main")),
            *[say("Status?", call("ci__get_pipeline", id=88))] * (_CI_RUNNING + 1),
            say(
                "Green; recording it.",
                call("write_file", path="out/ci.md", content="pipeline 88: success\n"),
            ),
        ]
    )


MCP_UNANNOTATED = ThirdStyle(
    "mcp-unannotated-poll",
    "run CI on main and record the result",
    lambda _ws: [file_item("ci", "out/ci.md", "success")],
    _ci_actor,
    tools=[*FILES, "ci__run_pipeline", "ci__get_pipeline"],
    extra_tools=_ci_tools,
)

#: A background worker (a real subprocess) taking jobs from a local SQLite queue: it
#: marks the job running, works until the agent waits for it (`wait_worker` ends its
#: silent phase, whatever the machine's speed), then marks it done.
_WORKER = """\
import pathlib, sqlite3, time

db = sqlite3.connect("queue.db", isolation_level=None)
db.execute("update jobs set state = 'running' where id = 1")
deadline = time.monotonic() + 30
while not pathlib.Path(".go").exists() and time.monotonic() < deadline:
    time.sleep(0.01)
db.execute("update jobs set state = 'done', result = '512 thumbnails' where id = 1")
"""


def _sqlite_tools(ws: Path) -> list[Tool]:
    """A SQLite MCP server's tools: `query` annotated read-only and closed-world
    (`openWorldHint: false`: it talks to a local file, nothing outside), `enqueue` a
    write; and the worker's supervisor."""
    from mcp.types import ToolAnnotations

    def query(sql: str) -> str:
        db = sqlite3.connect(ws / "queue.db")
        try:
            return json.dumps(db.execute(sql).fetchall())
        finally:
            db.close()

    def enqueue(kind: str) -> str:
        db = sqlite3.connect(ws / "queue.db", isolation_level=None)
        try:
            db.execute("create table if not exists jobs (id, kind, state, result)")
            db.execute("insert into jobs values (1, ?, 'queued', null)", (kind,))
        finally:
            db.close()
        _PROCS[str(ws)] = subprocess.Popen([sys.executable, "worker.py"], cwd=ws)
        deadline = time.monotonic() + 30
        while query("select state from jobs") == '[["queued"]]' and time.monotonic() < deadline:
            time.sleep(0.01)  # until the worker took it (a real, short wait)
        return "job 1 enqueued; a worker picked it up"

    @tool(name="wait_worker", effect="read", description="Wait until the worker exits.")
    def wait_worker() -> str:
        return f"worker exited with {_finish_job(ws, '.go')}"

    closed = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    return [
        mcp_like(query, "sqlite__query", closed, "Run a read-only SQL query."),
        mcp_like(enqueue, "sqlite__enqueue", ToolAnnotations(), "Enqueue a job."),
        wait_worker,
    ]


def _closed_world_actor(_ws: Path) -> PlanActor:
    state = "select state from jobs where id = 1"
    return PlanActor(
        [
            say("Queueing the thumbnails.", call("sqlite__enqueue", kind="thumbnails")),
            *[say("Its state?", call("sqlite__query", sql=state))] * 4,
            say("Still running; waiting for the worker.", call("wait_worker")),
            say("The result.", call("sqlite__query", sql="select state, result from jobs")),
            say(
                "Recording it.",
                call("write_file", path="out/thumbs.md", content="done: 512 thumbnails\n"),
            ),
        ]
    )


MCP_CLOSED_WORLD = ThirdStyle(
    "mcp-closed-world-poll",
    "make the thumbnails and record how many",
    lambda _ws: [file_item("thumbs", "out/thumbs.md", "512 thumbnails")],
    _closed_world_actor,
    files={"worker.py": _WORKER},
    tools=[*FILES, "sqlite__query", "sqlite__enqueue", "wait_worker"],
    extra_tools=_sqlite_tools,
)


# 19. a shell-only agent: writes with the shell, then fixes a typo everywhere with sed -

_SHELL_A = "# A\n\n## Overview\nteh first part\n"
_SHELL_B = "# B\n\n## Overview\nteh second part\n"


def _shell_only_actor(_ws: Path) -> PlanActor:
    def write(path: str, text: str) -> str:
        return f"mkdir -p docs && cat > {path} <<'EOF'\n{text}EOF"

    return PlanActor(
        [
            say("Looking around.", call("run_command", command="ls -R")),
            say("The notes.", call("run_command", command="cat notes.txt")),
            say("Page A.", call("run_command", command=write("docs/a.md", _SHELL_A))),
            say("Page B.", call("run_command", command=write("docs/b.md", _SHELL_B))),
            say("Any typos?", call("run_command", command="grep -rn teh docs || true")),
            say(
                "Fixing them in place.",
                call("run_command", command="sed -i 's/\\bteh\\b/the/g' docs/a.md docs/b.md"),
            ),
        ]
    )


SHELL_ONLY = ThirdStyle(
    "shell-only",
    "write pages A and B, spelled right",
    lambda _ws: [
        file_item("a", "docs/a.md", "## Overview"),
        file_item("b", "docs/b.md", "## Overview"),
        command_item("spelling", "no typos in docs/", "test -f docs/b.md && ! grep -rqw teh docs"),
    ],
    _shell_only_actor,
    files={"notes.txt": "two pages, A and B, each with an overview\n"},
    tools=["run_command"],
    extra_tools=_shell_tools,
)


# 20. a cluster's long status (past the preview) polled through a rolling upgrade -----

#: Nodes of the cluster; the status lists each (a long answer: an artifact every poll).
_NODES = 24


def _cluster_tools(_ws: Path) -> list[Tool]:
    state = {"polls": 0}

    @tool(name="upgrade_cluster", effect="write", description="Start a rolling upgrade.")
    def upgrade_cluster(version: str) -> str:
        return f"rolling upgrade to {version} started"

    @tool(name="describe_cluster", effect="read", description="Every node's version and state.")
    def describe_cluster() -> str:
        state["polls"] += 1
        upgraded = min(_NODES, 6 * (state["polls"] // 2))  # a batch every other poll
        nodes = [
            {
                "node": f"node-{k:02}.eu-west-1.compute.internal",
                "version": "1.31" if k < upgraded else "1.30",
                "state": "Ready",
                "observed_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            }
            for k in range(_NODES)
        ]
        return json.dumps({"upgraded": upgraded, "of": _NODES, "nodes": nodes})

    return [upgrade_cluster, describe_cluster]


def _cluster_actor(_ws: Path) -> PlanActor:
    polls = 2 * (_NODES // 6) - 1  # the last poll before every node is on 1.31
    return PlanActor(
        [
            say("Upgrading.", call("upgrade_cluster", version="1.31")),
            *[say("How far?", call("describe_cluster"))] * polls,
            say("All of them?", call("describe_cluster")),
            say(
                "Every node is on 1.31; recording it.",
                call("write_file", path="out/upgrade.md", content="24 of 24 nodes on 1.31\n"),
            ),
        ]
    )


LONG_STATUS = ThirdStyle(
    "long-status-poll",
    "upgrade the cluster to 1.31 and record it",
    lambda _ws: [file_item("upgrade", "out/upgrade.md", "24 of 24 nodes on 1.31")],
    _cluster_actor,
    tools=[*FILES, "upgrade_cluster", "describe_cluster"],
    extra_tools=_cluster_tools,
)


STYLES: dict[str, ThirdStyle] = {
    s.name: s
    for s in (
        SHELL_TDD,
        SHELL_POLLER,
        GIT_COMMITS,
        WIDE_READER,
        CHECKLIST_40,
        SLOW_RULE,
        CURSOR_PAGES,
        REJECTED_CHANNEL,
        VERBOSE_TESTS,
        DRAFT_READBACK,
        QUEUE_INTERLEAVED,
        OUTAGE_503,
        SEARCH_SAME,
        LEDGER_GUESSER,
        TINY_EDITS,
        UNICODE_NESTED,
        MCP_UNANNOTATED,
        MCP_CLOSED_WORLD,
        SHELL_ONLY,
        LONG_STATUS,
    )
}


if __name__ == "__main__":
    import asyncio

    asyncio.run(print_table(STYLES, sys.argv[1:]))
