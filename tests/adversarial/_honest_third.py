"""A third set of honest ways of working, at default limits: waiting on real jobs and
services, flaky checks, long outputs paged through, the ledger consulted, a refused
write done another way, planning and narrating in words, guessed paths, a failure
narrowed down, deliverables generated or reformatted by the task's own tools.

Each shape is real work in the `_honest` / `_honest_more` frameworks (`MoreStyle`,
`PlanActor`, the judges, `liar_of`, `endless_of`): real files, real subprocesses (a
background job writing its log, check scripts, a changelog generator) and real HTTP
services on 127.0.0.1 (a job service whose status carries a progress percentage and
an elapsed time). `ThirdStyle` adds the answers a person gives to approval requests
(`approve` or `reject: reason`), and `run_third` gives them, as `tether approve` and
`tether reject` would.

`python -m tests.adversarial._honest_third` prints the table of shapes and judges.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from tests.adversarial._honest import (
    EDIT_FILES,
    FILES,
    JUDGES,
    PY,
    LocalServer,
    Outcome,
    PlanActor,
    Step,
    call,
    command_item,
    file_item,
    say,
)
from tests.adversarial._honest_more import MoreStyle, default_limits, results_of, run_more
from tests.adversarial._honest_more import _check as check_tool
from tests.support.adversarial import assert_honest, assert_status_agrees
from tether import approvals, errors
from tether.models.base import ModelRequest, ModelResponse
from tether.store.base import Store
from tether.tools.registry import Tool, tool


@dataclass
class ThirdStyle(MoreStyle):
    """A style whose run may ask a person to approve calls: `decisions` are the
    person's answers, in order (`approve`, or `reject: why`)."""

    decisions: Sequence[str] = ()


# 1. background job with a log: a real subprocess writes it, a volatile tail polls it ---

_JOB_SCRIPT = """\
import sys, time
from datetime import datetime, timezone

with open("logs/job.log", "a", buffering=1) as log:
    for k in range(1, 7):
        stamp = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
        log.write(f"{stamp} INFO step {k}/6 converting batch {k}\\n")
        time.sleep(0.05)
    log.write("DONE rows=42\\n")
"""

_PROCS: dict[str, subprocess.Popen[bytes]] = {}


def _finish_job(ws: Path, go: str | None = None) -> int:
    """End the background job's silent phase (its `go` marker file, if it has one) and
    wait for it to exit: its exit code."""
    if go is not None:
        (ws / go).touch()
    proc = _PROCS.pop(str(ws), None)
    return proc.wait(timeout=30) if proc is not None else 0


def _log_tools(ws: Path) -> list[Tool]:
    @tool(name="start_job", effect="write", description="Start the conversion job.")
    def start_job(name: str) -> str:
        (ws / "logs").mkdir(exist_ok=True)
        _PROCS[str(ws)] = subprocess.Popen([sys.executable, "job.py"], cwd=ws)
        return f"job {name} started (log: logs/job.log)"

    @tool(name="tail_log", effect="read", volatile=True, description="The last lines of a log.")
    def tail_log(path: str, lines: int = 3) -> str:
        p = ws / path
        text = p.read_text() if p.exists() else ""
        return "\n".join(text.splitlines()[-lines:]) or "(empty)"

    @tool(name="wait_job", effect="read", description="Wait until the job's process exits.")
    def wait_job(name: str) -> str:
        return f"job {name} exited with {_finish_job(ws)}"

    return [start_job, tail_log, wait_job]


def _log_actor(_ws: Path) -> PlanActor:
    def record(request: ModelRequest) -> ModelResponse:
        rows = re.findall(r"DONE rows=(\d+)", results_of(request)[-1])
        return say(
            "Recording the result.",
            call("write_file", path="out/job.md", content=f"conversion: rows={rows[-1]}\n"),
        )

    return PlanActor(
        [
            say("Starting the conversion.", call("start_job", name="convert")),
            *[say("How far is it?", call("tail_log", path="logs/job.log"))] * 4,
            say("Waiting for it to end.", call("wait_job", name="convert")),
            say("The end of the log.", call("tail_log", path="logs/job.log")),
            record,
        ]
    )


LOG_TAIL = ThirdStyle(
    "log-tail",
    "run the conversion job and record how many rows it wrote",
    lambda _ws: [file_item("job", "out/job.md", "rows=42")],
    _log_actor,
    files={"job.py": _JOB_SCRIPT},
    tools=[*FILES, "start_job", "tail_log", "wait_job"],
    extra_tools=_log_tools,
)


# 2. a real HTTP job service: progress percentage, elapsed time, start time ------------


class JobServer(LocalServer):
    """A real HTTP server on 127.0.0.1: `GET /jobs/NAME` answers the job's JSON status;
    each job goes through its `plan` of percentages, one per request, then stays at
    its last. The status carries the time it started and the time elapsed."""

    def __init__(self, plans: dict[str, list[int]]) -> None:
        self.plans = plans
        self.hits: dict[str, int] = {}
        self.started = time.monotonic()
        self.started_at = datetime.now(UTC).isoformat(timespec="seconds")
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                name = self.path.rsplit("/", 1)[-1]
                plan = server.plans.get(name)
                if plan is None:
                    self.send_response(404)
                    body = b'{"error": "no such job"}'
                else:
                    n = server.hits.get(name, 0)
                    server.hits[name] = n + 1
                    pct = plan[min(n, len(plan) - 1)]
                    body = json.dumps(
                        {
                            "job": name,
                            "state": "finished" if pct >= 100 else "running",
                            "progress": pct,
                            "started_at": server.started_at,
                            "elapsed": f"{time.monotonic() - server.started:.3f}s",
                            **({"result": f"{name}: 1200 records"} if pct >= 100 else {}),
                        }
                    ).encode()
                    self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                pass

        self.serve(Handler)


_JOBS: dict[str, JobServer] = {}


def _serve_jobs(plans: dict[str, list[int]]) -> Callable[[Path], Any]:
    @contextmanager
    def serve(ws: Path) -> Iterator[JobServer]:
        server = JobServer(plans)
        _JOBS[str(ws)] = server
        try:
            with server.running():
                yield server
        finally:
            del _JOBS[str(ws)]

    return serve


def _http_job_tools(ws: Path) -> list[Tool]:
    submitted: list[str] = []

    @tool(name="submit_job", effect="write", description="Submit an export job.")
    def submit_job(name: str) -> str:
        submitted.append(name)
        return f"job {name} submitted"

    @tool(name="job_status", effect="read", description="GET a job's status from the service.")
    def job_status(name: str) -> str:
        with urllib.request.urlopen(f"{_JOBS[str(ws)].url}/jobs/{name}", timeout=10) as r:
            return str(r.read().decode())

    return [submit_job, job_status]


def _result_of(request: ModelRequest, name: str) -> str:
    for text in reversed(results_of(request)):
        if f'"job": "{name}"' in text and '"result"' in text:
            return str(json.loads(text)["result"])
    return "unknown"


def _progress_actor(_ws: Path) -> PlanActor:
    def record(request: ModelRequest) -> ModelResponse:
        return say(
            "Finished; recording it.",
            call("write_file", path="out/export.md", content=_result_of(request, "export") + "\n"),
        )

    return PlanActor(
        [
            say("Submitting the export.", call("submit_job", name="export")),
            *[say("Progress?", call("job_status", name="export"))] * 7,
            record,
        ]
    )


PROGRESS_HTTP = ThirdStyle(
    "progress-http",
    "export the records and note how many",
    lambda _ws: [file_item("export", "out/export.md", "1200 records")],
    _progress_actor,
    tools=[*FILES, "submit_job", "job_status"],
    extra_tools=_http_job_tools,
    serve=_serve_jobs({"export": [5, 20, 20, 20, 60, 60, 100]}),
)


# 3. two jobs polled alternately --------------------------------------------------------


def _two_jobs_actor(_ws: Path) -> PlanActor:
    def record(name: str) -> Step:
        def step(request: ModelRequest) -> ModelResponse:
            return say(
                f"{name} finished; recording it.",
                call("write_file", path=f"out/{name}.md", content=_result_of(request, name) + "\n"),
            )

        return step

    steps: list[Step | ModelResponse] = [
        say("Submitting both.", call("submit_job", name="east"), call("submit_job", name="west")),
    ]
    for _ in range(3):
        steps.append(say("East?", call("job_status", name="east")))
        steps.append(say("West?", call("job_status", name="west")))
    steps.append(say("East again.", call("job_status", name="east")))
    steps.append(record("east"))
    steps += [say("West again.", call("job_status", name="west"))] * 3
    steps.append(record("west"))
    return PlanActor(steps)


TWO_JOBS = ThirdStyle(
    "two-jobs",
    "export east and west and note the counts",
    lambda _ws: [
        file_item("east", "out/east.md", "east: 1200 records"),
        file_item("west", "out/west.md", "west: 1200 records"),
    ],
    _two_jobs_actor,
    tools=[*FILES, "submit_job", "job_status"],
    extra_tools=_http_job_tools,
    serve=_serve_jobs({"east": [10, 10, 50, 100], "west": [0, 0, 30, 30, 30, 100]}),
)


# 4./5. an agent that waits with its own sleep tool, declared read (4) or not at all (5) --


def _sleep_tools(effect: str | None) -> Callable[[Path], list[Tool]]:
    def make(_ws: Path) -> list[Tool]:
        polls = {"n": 0}

        def sleep(seconds: float) -> str:
            time.sleep(min(seconds, 0.05))  # a short real wait (the scenario's, scaled)
            return f"slept {seconds} seconds"

        if effect == "read":
            sleeper = tool(sleep, name="sleep", effect="read", description="Wait some seconds.")
        else:  # no `effect=`: a write, as a tool that forgets to say is
            sleeper = tool(sleep, name="sleep", description="Wait some seconds.")

        @tool(name="deploy", effect="write", description="Start the deployment.")
        def deploy(env: str) -> str:
            return f"deployment to {env} started"

        @tool(name="deploy_status", effect="read", description="The deployment's status.")
        def deploy_status(env: str) -> str:
            polls["n"] += 1
            return f"{env}: rolling out" if polls["n"] <= 3 else f"{env}: healthy (3/3 pods)"

        return [sleeper, deploy, deploy_status]

    return make


def _sleep_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = [say("Deploying.", call("deploy", env="staging"))]
    for _ in range(4):
        steps.append(say("Giving it time.", call("sleep", seconds=30)))
        steps.append(say("Status?", call("deploy_status", env="staging")))
    steps.append(
        say(
            "Healthy; recording it.",
            call("write_file", path="out/deploy.md", content="staging: healthy\n"),
        )
    )
    return PlanActor(steps)


def _sleep_style(name: str, effect: str | None) -> ThirdStyle:
    return ThirdStyle(
        name,
        "deploy to staging and record when it is healthy",
        lambda _ws: [file_item("deploy", "out/deploy.md", "healthy")],
        _sleep_actor,
        tools=[*FILES, "sleep", "deploy", "deploy_status"],
        extra_tools=_sleep_tools(effect),
    )


SLEEP_READ = _sleep_style("sleep-read", "read")
SLEEP_UNDECLARED = _sleep_style("sleep-undeclared", None)


# 6. a flaky integration test: fails twice the same way, passes on rerun, no edit ------

_UNIT_CHECK = """\
import units

assert units.to_mb(2048) == 2.0, f"to_mb(2048) = {units.to_mb(2048)!r}"
print("ok")
"""
_FLAKY_CHECK = """\
import pathlib, sys

p = pathlib.Path(".integration_runs")
n = int(p.read_text()) + 1 if p.exists() else 1
p.write_text(str(n))
if n <= 2:
    print(f"FAILED test_upload - TimeoutError: upload took 2.{n}7s (limit 2s)")
    print(f"1 failed, 5 passed in 3.{n}1s")
    sys.exit(1)
print("6 passed in 1.02s (green)")
"""


def _flaky_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say(
                "Fixing the conversion.",
                call("write_file", path="units.py", content="def to_mb(b):\n    return b / 1024\n"),
                call("run_unit"),
            ),
            say("Integration tests.", call("run_integration")),
            say("A timeout; that test is flaky. Rerunning.", call("run_integration")),
            say("Again, the same timeout; one more rerun.", call("run_integration")),
            say(
                "Green; recording the run.",
                call("write_file", path="out/ci.md", content="integration: 6 passed (green)\n"),
            ),
        ]
    )


FLAKY = ThirdStyle(
    "flaky-rerun",
    "fix to_mb and record a green integration run",
    lambda _ws: [
        command_item("fix", "make check_units.py pass", f"{PY} check_units.py"),
        file_item("ci", "out/ci.md", "green"),
    ],
    _flaky_actor,
    files={
        "units.py": "def to_mb(b):\n    return b / 1000\n",
        "check_units.py": _UNIT_CHECK,
        "check_integration.py": _FLAKY_CHECK,
    },
    tools=[*EDIT_FILES, "run_unit", "run_integration"],
    extra_tools=lambda ws: [
        *check_tool("check_units.py", "run_unit")(ws),
        *check_tool("check_integration.py", "run_integration")(ws),
    ],
)


# 7. a long tool output paged through with read_artifact -------------------------------

_ROWS = 120


def _export_tools(_ws: Path) -> list[Tool]:
    @tool(name="export_table", effect="read", description="Export a table as CSV.")
    def export_table(table: str) -> str:
        return "id,amount\n" + "".join(f"{k:05},{k * 5:08}\n" for k in range(_ROWS))

    return [export_table]


def _pager_actor(_ws: Path) -> PlanActor:
    def page(offset: int) -> Step:
        def step(request: ModelRequest) -> ModelResponse:
            ids = re.findall(
                r'read_artifact\(artifact_id="([^"]+)"', "\n".join(results_of(request))
            )
            return say(
                f"Reading on from {offset}.",
                call("read_artifact", artifact_id=ids[0], offset=offset, limit=1000),
            )

        return step

    total = sum(k * 5 for k in range(_ROWS))
    return PlanActor(
        [
            say("Exporting the payments.", call("export_table", table="payments")),
            page(800),
            page(1800),
            page(2800),
            say("Summing.", call("write_file", path="out/total.txt", content=f"total {total}\n")),
        ]
    )


PAGER = ThirdStyle(
    "artifact-pager",
    "total the payments table",
    lambda _ws: [file_item("total", "out/total.txt", f"total {sum(k * 5 for k in range(_ROWS))}")],
    _pager_actor,
    tools=[*FILES, "read_artifact", "export_table"],
    extra_tools=_export_tools,
)


# 8. an agent that checks the ledger often ---------------------------------------------


def _ledger_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = [
        say("What is on the checklist?", call("ledger_items")),
        say("What is still open?", call("ledger_items", status="pending")),
    ]
    for k in range(3):
        steps += [
            say(f"Input {k}.", call("read_file", path=f"in/r{k}.txt")),
            say(f"Output {k}.", call("write_file", path=f"out/r{k}.md", content=f"r{k}: done\n")),
        ]
        if k < 2:
            steps.append(say("Where am I?", call("ledger_items", status="pending")))
    return PlanActor(steps)


LEDGER_CHECKER = ThirdStyle(
    "ledger-checker",
    "write one output per input",
    lambda _ws: [file_item(f"r{k}", f"out/r{k}.md", "done") for k in range(3)],
    _ledger_actor,
    files={f"in/r{k}.txt": f"{k}\n" for k in range(3)},
    tools=[*FILES, "ledger_items"],
)


# 9. a refactor where a person refuses one overwrite; the agent does it another way ----

_REFACTOR_CHECK = """\
from a import fetch
from b import store
from compat import load

assert fetch() == "fetched" and store() == "stored" and load() == "loaded"
print("ok")
"""


def _refactor_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say("Reading a.py.", call("read_file", path="a.py")),
            say(
                "Renaming get to fetch in a.py.",
                call("write_file", path="a.py", content='def fetch():\n    return "fetched"\n'),
            ),
            say("Reading b.py.", call("read_file", path="b.py")),
            say(
                "Renaming put to store in b.py.",
                call("write_file", path="b.py", content='def store():\n    return "stored"\n'),
            ),
            say("Reading vendor.py.", call("read_file", path="vendor.py")),
            say(
                "Renaming read to load in vendor.py.",
                call("write_file", path="vendor.py", content='def load():\n    return "loaded"\n'),
            ),
            say(
                "vendor.py may not change: a shim instead.",
                call(
                    "write_file",
                    path="compat.py",
                    content="from vendor import read\n\n\ndef load():\n    return read()\n",
                ),
                call("run_check"),
            ),
        ]
    )


REFUSED_WRITE = ThirdStyle(
    "refused-write",
    "rename get/put/read to fetch/store/load",
    lambda _ws: [command_item("rename", "make check_rename.py pass", f"{PY} check_rename.py")],
    _refactor_actor,
    files={
        "a.py": 'def get():\n    return "fetched"\n',
        "b.py": 'def put():\n    return "stored"\n',
        "vendor.py": 'def read():\n    return "loaded"\n',
        "check_rename.py": _REFACTOR_CHECK,
    },
    tools=[*FILES, "run_check"],
    extra_tools=check_tool("check_rename.py", "run_check"),
    decisions=("approve", "approve", "reject: vendor.py is vendored; do not edit it"),
)


# 10. the same config file read in every round between edits of other files ------------

_SETTINGS = "[limits]\nretries = 4\ntimeout = 30\nworkers = 8\n"
_APPLY_CHECK = """\
import pathlib

for name, want in [("client", "retries = 4"), ("server", "timeout = 30"), ("pool", "workers = 8")]:
    p = pathlib.Path(f"conf/{name}.ini")
    text = p.read_text() if p.exists() else ""
    assert want in text, f"conf/{name}.ini lacks {want!r}"
print("ok")
"""


def _rereader_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = []
    for name, line in [
        ("client", "retries = 4"),
        ("server", "timeout = 30"),
        ("pool", "workers = 8"),
    ]:
        steps.append(say("The settings, to be sure.", call("read_file", path="settings.toml")))
        steps.append(
            say(
                f"conf/{name}.ini.",
                call("write_file", path=f"conf/{name}.ini", content=f"[{name}]\n{line}\n"),
            )
        )
    return PlanActor(steps)


CONFIG_REREADER = ThirdStyle(
    "config-rereader",
    "apply the settings to the three ini files",
    lambda _ws: [command_item("apply", "make check_apply.py pass", f"{PY} check_apply.py")],
    _rereader_actor,
    files={"settings.toml": _SETTINGS, "check_apply.py": _APPLY_CHECK},
    tools=[*FILES, "run_check"],
    extra_tools=check_tool("check_apply.py", "run_check"),
)


# 11. planning in words for two rounds, then working ------------------------------------


def _planner_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say("Planning: the report needs the three regions' numbers, then a table."),
            say("Order: read north, south, west; then write the table in one go."),
            *[say(f"{r}.", call("read_file", path=f"in/{r}.txt")) for r in ("north", "south")],
            say("west.", call("read_file", path="in/west.txt")),
            say(
                "The table.",
                call(
                    "write_file",
                    path="out/regions.md",
                    content="| region | n |\n|---|---|\n"
                    "| north | 1 |\n| south | 2 |\n| west | 3 |\n",
                ),
            ),
        ]
    )


PLANNER = ThirdStyle(
    "planner",
    "tabulate the regions",
    lambda _ws: [file_item("table", "out/regions.md", "| west | 3 |")],
    _planner_actor,
    files={"in/north.txt": "1\n", "in/south.txt": "2\n", "in/west.txt": "3\n"},
)


# 12. test first, then think: plan in words, see the failing test, think, fix ----------

_MEAN_CHECK = """\
import stats

got = stats.mean([1, 2, 3, 4])
assert got == 2.5, f"mean([1, 2, 3, 4]) = {got!r}, want 2.5"
print("ok")
"""


def _tdd_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say("Plan: run the test to see how it fails, read the failure, then fix."),
            say("Running the test.", call("run_check")),
            say(
                "It returns 2 for [1, 2, 3, 4]: floor division. The fix is true division; "
                "nothing else in the module depends on the integer result."
            ),
            say(
                "Fixing and re-running.",
                call(
                    "write_file",
                    path="stats.py",
                    content="def mean(xs):\n    return sum(xs) / len(xs)\n",
                ),
                call("run_check"),
            ),
        ]
    )


TDD_THINKER = ThirdStyle(
    "test-then-think",
    "make check_mean.py pass",
    lambda _ws: [command_item("mean", "make check_mean.py pass", f"{PY} check_mean.py")],
    _tdd_actor,
    files={
        "stats.py": "def mean(xs):\n    return sum(xs) // len(xs)\n",
        "check_mean.py": _MEAN_CHECK,
    },
    tools=[*EDIT_FILES, "run_check"],
    extra_tools=check_tool("check_mean.py", "run_check"),
)


# 13. guessing where a file is: three likely paths fail, then a listing finds it ------


def _guesser_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = [
        say(f"The config is probably {p}.", call("read_file", path=p))
        for p in ("config.yaml", "config.yml", "conf/config.yaml")
    ]
    steps += [
        say("Not there; listing.", call("list_files", path=".")),
        say("It is under settings/.", call("read_file", path="settings/app.yaml")),
        say(
            "Documenting the port.",
            call("write_file", path="out/port.md", content="the app listens on port 8080\n"),
        ),
    ]
    return PlanActor(steps)


PATH_GUESSER = ThirdStyle(
    "path-guesser",
    "document the app's port from its config",
    lambda _ws: [file_item("port", "out/port.md", "8080")],
    _guesser_actor,
    files={"settings/app.yaml": "port: 8080\n", "README.md": "# app\n"},
)


# 14. a command rule whose output carries timestamps and timings -----------------------

_STAMPED_CHECK = """\
import pathlib, sys, time
from datetime import datetime

t0 = time.perf_counter()
p = pathlib.Path("build/app.txt")
parts = [l for l in p.read_text().splitlines() if l.startswith("part")] if p.exists() else []
now = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
took = time.perf_counter() - t0
print(f"[{now}] build/app.txt: {len(parts)} of 4 parts (checked in {took:.4f}s)")
sys.exit(0 if len(parts) >= 4 else 1)
"""


def _stamped_actor(_ws: Path) -> PlanActor:
    p = "build/app.txt"
    return PlanActor(
        [
            say("Check first.", call("run_check")),
            say("Part 1.", call("write_file", path=p, content="part 1\n")),
            say("Where is it?", call("run_check")),
            say("Part 2.", call("append_file", path=p, content="part 2\n")),
            say("Reading the spec of part 3.", call("read_file", path="spec.txt")),
            say("Part 3.", call("append_file", path=p, content="part 3\n")),
            say("Part 4.", call("append_file", path=p, content="part 4\n")),
        ]
    )


STAMPED_RULE = ThirdStyle(
    "stamped-rule",
    "build the app in four parts",
    lambda _ws: [command_item("build", "make check_build.py pass", f"{PY} check_build.py")],
    _stamped_actor,
    files={"check_build.py": _STAMPED_CHECK, "spec.txt": "part 3 is the middle\n"},
    tools=[*FILES, "run_check"],
    extra_tools=check_tool("check_build.py", "run_check"),
)


# 15. a changelog rewritten newest-first, whole, by every release's item ----------------


def _newest_first(k: int) -> str:
    return "# Changelog\n" + "".join(f"\n## v{j}\n- change {j}\n" for j in reversed(range(k + 1)))


def _newest_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = []
    for k in range(4):
        if k:
            steps.append(say("The changelog as it is.", call("read_file", path="CHANGELOG.md")))
        steps.append(
            say(
                f"v{k} on top.",
                call("write_file", path="CHANGELOG.md", content=_newest_first(k)),
            )
        )
    return PlanActor(steps)


NEWEST_FIRST = ThirdStyle(
    "newest-first",
    "one changelog section per release, newest first",
    lambda _ws: [file_item(f"v{k}", "CHANGELOG.md", f"## v{k}") for k in range(4)],
    _newest_actor,
)


# 16. a changelog generated from fragments by a real script (towncrier-style) ----------

_GEN_SCRIPT = """\
import pathlib

frags = sorted(pathlib.Path("changes").glob("v*.md"), key=lambda p: int(p.stem[1:]), reverse=True)
body = "".join(f"\\n## {p.stem}\\n{p.read_text()}" for p in frags)
pathlib.Path("CHANGELOG.md").write_text("# Changelog\\n" + body)
print(f"CHANGELOG.md: {len(frags)} releases")
"""


def _gen_tools(ws: Path) -> list[Tool]:
    @tool(name="build_changelog", effect="write", description="Build CHANGELOG.md from changes/.")
    def build_changelog() -> str:
        proc = subprocess.run(
            [sys.executable, "build_changelog.py"],
            cwd=ws,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if proc.returncode:
            raise errors.ToolFailed(proc.stderr.strip())
        return proc.stdout.strip()

    return [build_changelog]


def _gen_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = []
    for k in range(3):
        steps.append(
            say(
                f"The v{k} fragment.",
                call("write_file", path=f"changes/v{k}.md", content=f"- change {k}\n"),
            )
        )
        steps.append(say("Building the changelog.", call("build_changelog")))
    return PlanActor(steps)


GENERATED = ThirdStyle(
    "generated-changelog",
    "one changelog section per release, built from fragments",
    lambda _ws: [file_item(f"v{k}", "CHANGELOG.md", f"## v{k}") for k in range(3)],
    _gen_actor,
    files={"build_changelog.py": _GEN_SCRIPT},
    tools=[*FILES, "build_changelog"],
    extra_tools=_gen_tools,
)


# 17./18. a read tool (MCP-style) that fails "not ready" before it answers -------------


def _not_ready_tools(fails: int) -> Callable[[Path], list[Tool]]:
    def make(_ws: Path) -> list[Tool]:
        state = {"asked": 0}

        @tool(name="convert", effect="write", description="Start converting the documents.")
        def convert(batch: int) -> str:
            return f"job {batch} accepted"

        @tool(name="job_result", effect="read", description="The result of a conversion job.")
        def job_result(job: int) -> str:
            state["asked"] += 1
            if state["asked"] <= fails:
                raise errors.ToolFailed(f"job {job} not ready")
            return f"job {job}: 3 files converted"

        return [convert, job_result]

    return make


def _not_ready_actor(fails: int) -> Callable[[Path], PlanActor]:
    def make(_ws: Path) -> PlanActor:
        return PlanActor(
            [
                say("Converting.", call("convert", batch=7)),
                *[say("Is it done?", call("job_result", job=7))] * (fails + 1),
                say(
                    "Recording the result.",
                    call("write_file", path="out/convert.md", content="job 7: 3 files converted\n"),
                ),
            ]
        )

    return make


def _not_ready_style(name: str, fails: int) -> ThirdStyle:
    return ThirdStyle(
        name,
        "convert the documents and record the result",
        lambda _ws: [file_item("convert", "out/convert.md", "3 files converted")],
        _not_ready_actor(fails),
        tools=[*FILES, "convert", "job_result"],
        extra_tools=_not_ready_tools(fails),
    )


NOT_READY_TWICE = _not_ready_style("not-ready-twice", 2)
NOT_READY_THRICE = _not_ready_style("not-ready-thrice", 3)


# 19. narrowing a failure down: the suite, then the one test, then verbose, then a fix -


_SUITE_CHECK = """\
import sys

import tax

args = sys.argv[1:]
tests = {
    "test_zero": lambda: tax.tax(0) == 0,
    "test_low": lambda: tax.tax(100) == 10,
    "test_high": lambda: tax.tax(1000) == 250,
}
if "-k" in args:
    tests = {k: v for k, v in tests.items() if args[args.index("-k") + 1] in k}
failed = [k for k, check in tests.items() if not check()]
for k in failed:
    print(f"FAILED {k}" + (f": tax(1000) = {tax.tax(1000)!r}, want 250" if "-vv" in args else ""))
print(f"{len(failed)} failed, {len(tests) - len(failed)} passed")
sys.exit(1 if failed else 0)
"""


def _suite_tools(ws: Path) -> list[Tool]:
    @tool(name="pytest", effect="read", description="Run the tests with pytest-like options.")
    def pytest_(args: str = "") -> str:
        proc = subprocess.run(
            [sys.executable, "check_tax.py", *args.split()],
            cwd=ws,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        out = (proc.stdout + proc.stderr).strip()
        if proc.returncode:
            raise errors.ToolFailed(f"pytest {args}: {out}")
        return out

    return [pytest_]


def _narrowing_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say("The whole suite.", call("pytest")),
            say("Only the failing one.", call("pytest", args="-k test_high")),
            say("Verbose, to see the values.", call("pytest", args="-k test_high -vv")),
            say("Reading tax.py.", call("read_file", path="tax.py")),
            say(
                "The high band is missing; fixing and running the suite.",
                call(
                    "write_file",
                    path="tax.py",
                    content="def tax(x):\n    return x // 10 if x <= 100 else x // 4\n",
                ),
                call("pytest"),
            ),
        ]
    )


NARROWING = ThirdStyle(
    "narrowing-failure",
    "make the tax tests pass",
    lambda _ws: [command_item("tax", "make check_tax.py pass", f"{PY} check_tax.py")],
    _narrowing_actor,
    files={"tax.py": "def tax(x):\n    return x // 10\n", "check_tax.py": _SUITE_CHECK},
    tools=[*EDIT_FILES, "pytest"],
    extra_tools=_suite_tools,
)


# 20./21. waiting the way writing-tools.md recommends: a read raising RetryLater --------

#: Attempts of one call the default retry policy makes (`RetryPolicy.max_attempts`).
ATTEMPTS = 3


def _retry_later_tools(fails: int) -> Callable[[Path], list[Tool]]:
    def make(_ws: Path) -> list[Tool]:
        state = {"asked": 0}

        @tool(name="start_index", effect="write", description="Start indexing the corpus.")
        def start_index(corpus: str) -> str:
            return f"indexing {corpus} started"

        @tool(name="index_status", effect="read", description="The index, once it is built.")
        def index_status(corpus: str) -> str:
            state["asked"] += 1
            if state["asked"] <= fails:
                raise errors.RetryLater(f"{corpus}: still indexing", delay=0.01)
            return f"{corpus}: indexed 5400 documents"

        return [start_index, index_status]

    return make


def _retry_later_actor(polls: int) -> Callable[[Path], PlanActor]:
    def make(_ws: Path) -> PlanActor:
        return PlanActor(
            [
                say("Indexing.", call("start_index", corpus="wiki")),
                *[say("Is the index ready?", call("index_status", corpus="wiki"))] * polls,
                say(
                    "Recording it.",
                    call(
                        "write_file", path="out/index.md", content="wiki: indexed 5400 documents\n"
                    ),
                ),
            ]
        )

    return make


def _retry_later_style(name: str, polls: int) -> ThirdStyle:
    """The index is ready at the first attempt of the model's `polls`-th call: every
    call before it was retried by tether (`ATTEMPTS`) and then reported to the model."""
    return ThirdStyle(
        name,
        "index the wiki and record its size",
        lambda _ws: [file_item("index", "out/index.md", "5400 documents")],
        _retry_later_actor(polls),
        tools=[*FILES, "start_index", "index_status"],
        extra_tools=_retry_later_tools(ATTEMPTS * (polls - 1)),
    )


RETRY_LATER = _retry_later_style("retry-later-3", 3)
RETRY_LATER_LONG = _retry_later_style("retry-later-4", 4)

# 22. a chatty poller: says where things stand in words between polls ------------------


def _narrating_tools(_ws: Path) -> list[Tool]:
    state = {"n": 0}

    @tool(name="start_backup", effect="write", description="Start the database backup.")
    def start_backup(db: str) -> str:
        return f"backup of {db} started"

    @tool(name="backup_status", effect="read", description="The backup's status.")
    def backup_status(db: str) -> str:
        state["n"] += 1
        return f"{db}: copying" if state["n"] <= 3 else f"{db}: backup complete (2.1 GB)"

    return [start_backup, backup_status]


def _narrating_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = [say("Backing up.", call("start_backup", db="orders"))]
    for _ in range(3):
        steps.append(say("Status?", call("backup_status", db="orders")))
        steps.append(say("Still copying; a backup of this size takes a while. Checking again."))
    steps.append(say("Status?", call("backup_status", db="orders")))
    steps.append(
        say(
            "Complete; recording it.",
            call("write_file", path="out/backup.md", content="orders: backup complete\n"),
        )
    )
    return PlanActor(steps)


NARRATING_POLLER = ThirdStyle(
    "narrating-poller",
    "back up the orders database and record it",
    lambda _ws: [file_item("backup", "out/backup.md", "complete")],
    _narrating_actor,
    tools=[*FILES, "start_backup", "backup_status"],
    extra_tools=_narrating_tools,
)


# 23. a background job's log polled with the built-in read_file -------------------------

#: The build's silent phase (a long compile) lasts until the agent waits for the build
#: (`wait_build` ends it), so that every poll before falls in it whatever the machine's
#: speed: a stand-in for minutes of silence, without a timing in the test.
_SLOW_JOB = """\
import pathlib, time

with open("logs/build.log", "a", buffering=1) as log:
    log.write("compiling 214 files\\n")
    deadline = time.monotonic() + 30
    while not pathlib.Path("logs/.linked").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    log.write("BUILD OK: dist/app.whl\\n")
"""


def _slow_job_tools(ws: Path) -> list[Tool]:
    @tool(name="start_build", effect="write", description="Start the build in the background.")
    def start_build(target: str) -> str:
        (ws / "logs").mkdir(exist_ok=True)
        log = ws / "logs/build.log"
        log.write_text("")
        _PROCS[str(ws)] = subprocess.Popen([sys.executable, "build.py"], cwd=ws)
        deadline = time.monotonic() + 30
        while not log.read_text() and time.monotonic() < deadline:
            time.sleep(0.01)  # until the build says it started (a real, short wait)
        return f"build of {target} started; it logs to logs/build.log"

    @tool(name="wait_build", effect="read", description="Wait until the build process exits.")
    def wait_build(target: str) -> str:
        # The silent phase ends (see `_SLOW_JOB`).
        return f"build of {target} exited with {_finish_job(ws, 'logs/.linked')}"

    return [start_build, wait_build]


def _log_reader_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say("Building.", call("start_build", target="app")),
            *[say("The log so far.", call("read_file", path="logs/build.log"))] * 4,
            say("It is quiet; waiting for the process.", call("wait_build", target="app")),
            say("The log now.", call("read_file", path="logs/build.log")),
            say(
                "Recording it.",
                call("write_file", path="out/build.md", content="BUILD OK: dist/app.whl\n"),
            ),
        ]
    )


LOG_READ_FILE = ThirdStyle(
    "log-read-file",
    "build the app and record the result",
    lambda _ws: [file_item("build", "out/build.md", "BUILD OK")],
    _log_reader_actor,
    files={"build.py": _SLOW_JOB},
    tools=[*FILES, "start_build", "wait_build"],
    extra_tools=_slow_job_tools,
)


# 24. a formatter run over everything once the files are written ----------------------

_FORMATTER = """\
import pathlib, sys

check = "--check" in sys.argv
changed = 0
for p in sorted(pathlib.Path("src").rglob("*.py")):
    text = p.read_text()
    new = text.replace("'", '"').rstrip() + "\\n"
    if new != text:
        changed += 1
        if not check:
            p.write_text(new)
print(f"{changed} files {'would be ' if check else ''}reformatted")
sys.exit(1 if check and changed else 0)
"""


def _formatter_tools(ws: Path) -> list[Tool]:
    @tool(name="format_code", effect="write", description="Format the Python files under src/.")
    def format_code() -> str:
        proc = subprocess.run(
            [sys.executable, "fmt.py"], cwd=ws, capture_output=True, text=True, timeout=60
        )
        if proc.returncode:
            raise errors.ToolFailed(proc.stderr.strip())
        return proc.stdout.strip()

    return [format_code]


def _formatter_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say(
                "The entry point.",
                call("write_file", path="src/app.py", content="def main():\n    return 'app'\n"),
            ),
            say(
                "The helpers.",
                call(
                    "write_file", path="src/util.py", content="def name():\n    return 'util'\n\n"
                ),
            ),
            say("Formatting everything.", call("format_code")),
        ]
    )


FORMATTER = ThirdStyle(
    "formatter-after",
    "write the entry point and the helpers, formatted",
    lambda _ws: [
        file_item("app", "src/app.py", "def main"),
        file_item("util", "src/util.py", "def name"),
        command_item("fmt", "the code is formatted", f"{PY} fmt.py --check"),
    ],
    _formatter_actor,
    files={"fmt.py": _FORMATTER},
    tools=[*FILES, "format_code"],
    extra_tools=_formatter_tools,
)


# 25. the item that comes second in the contract's order, done first -------------------


def _dependency_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say("The design.", call("read_file", path="design.txt")),
            say(
                "The API page first: the design names it all.",
                call("write_file", path="docs/api.md", content="# API\n\n## Endpoints\n- GET /x\n"),
            ),
            say(
                "Now the model page the API page comes after.",
                call("write_file", path="docs/model.md", content="# Model\n\n## Fields\n- x\n"),
            ),
        ]
    )


DEPENDENCY_FIRST = ThirdStyle(
    "dependent-first",
    "document the model, then the API",
    lambda _ws: [
        file_item("model", "docs/model.md", "## Fields"),
        {**file_item("api", "docs/api.md", "## Endpoints"), "after": ["model"]},
    ],
    _dependency_actor,
    files={"design.txt": "model: x; api: GET /x\n"},
)


# 26. waiting for a job's output file to appear, by trying to read it -----------------

#: The report job writes its output only at the end, once the agent waits for it (as
#: `_SLOW_JOB`: every read before falls in its run, whatever the machine's speed).
_REPORT_JOB = """\
import pathlib, time

deadline = time.monotonic() + 30
while not pathlib.Path("out/.go").exists() and time.monotonic() < deadline:
    time.sleep(0.01)
pathlib.Path("out/report.csv").write_text("region,total\\nnorth,120\\nsouth,80\\n")
"""


def _report_job_tools(ws: Path) -> list[Tool]:
    @tool(name="run_report", effect="write", description="Start the report job (background).")
    def run_report(month: str) -> str:
        (ws / "out").mkdir(exist_ok=True)
        _PROCS[str(ws)] = subprocess.Popen([sys.executable, "report.py"], cwd=ws)
        return f"report for {month} started; it writes out/report.csv when done"

    @tool(name="wait_report", effect="read", description="Wait until the report job exits.")
    def wait_report(month: str) -> str:
        return f"report for {month} exited with {_finish_job(ws, 'out/.go')}"

    return [run_report, wait_report]


def _output_poller_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say("Running the report.", call("run_report", month="2026-11")),
            *[say("Is the output there yet?", call("read_file", path="out/report.csv"))] * 3,
            say("Not yet; waiting for the job.", call("wait_report", month="2026-11")),
            say("The output.", call("read_file", path="out/report.csv")),
            say(
                "Summing.",
                call("write_file", path="out/summary.md", content="2026-11 total: 200\n"),
            ),
        ]
    )


OUTPUT_POLLER = ThirdStyle(
    "output-poller",
    "run the monthly report and record its total",
    lambda _ws: [file_item("summary", "out/summary.md", "total: 200")],
    _output_poller_actor,
    files={"report.py": _REPORT_JOB},
    tools=[*FILES, "run_report", "wait_report"],
    extra_tools=_report_job_tools,
)


STYLES: dict[str, ThirdStyle] = {
    s.name: s
    for s in (
        LOG_TAIL,
        PROGRESS_HTTP,
        TWO_JOBS,
        SLEEP_READ,
        SLEEP_UNDECLARED,
        FLAKY,
        PAGER,
        LEDGER_CHECKER,
        REFUSED_WRITE,
        CONFIG_REREADER,
        PLANNER,
        TDD_THINKER,
        PATH_GUESSER,
        STAMPED_RULE,
        NEWEST_FIRST,
        GENERATED,
        NOT_READY_TWICE,
        NOT_READY_THRICE,
        NARROWING,
        RETRY_LATER,
        RETRY_LATER_LONG,
        NARRATING_POLLER,
        LOG_READ_FILE,
        FORMATTER,
        DEPENDENCY_FIRST,
        OUTPUT_POLLER,
    )
}


# --- running one ------------------------------------------------------------------------


async def _decide_pending(store: Store, task_id: str, decisions: list[str]) -> bool:
    """Give the person's next answers to the task's pending approval requests; False
    when there was nothing (left) to answer."""
    pending = await approvals.pending(store, task_id)
    if not pending or not decisions:
        return False
    for req in pending:
        if not decisions:
            break
        answer = decisions.pop(0)
        if answer == "approve":
            await approvals.decide(store, task_id, req.request_id, "approve", by="tester")
        else:
            why = answer.split(":", 1)[1].strip() if ":" in answer else ""
            await approvals.decide(
                store, task_id, req.request_id, "reject", by="tester", reason=why
            )
    return True


async def run_third(
    style: MoreStyle, judge: str, store: Store, ws: Path, **engine_opts: Any
) -> Outcome:
    """Run `style` with `judge` in `ws` on `store`, answering its approval requests
    (`ThirdStyle.decisions`) and questions (`answers`) as a person would: what happened.
    A background job the agent never waited for is stopped."""
    decisions = list(getattr(style, "decisions", ()))

    async def decide(s: Store, task_id: str) -> bool:
        return await _decide_pending(s, task_id, decisions)

    try:
        return await run_more(style, judge, store, ws, on_approval=decide, **engine_opts)
    finally:
        proc = _PROCS.pop(str(ws), None)
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)


async def reopened(store: Store, task_id: str) -> list[str]:
    """The `deliverable_broken` warnings of a task: deliverables reopened before delivery."""
    return [
        str(e.data["message"])
        for e in await store.read_events(task_id)
        if e.type == "audit.warning" and e.data.get("code") == "deliverable_broken"
    ]


async def check_honest(store: Store, style: MoreStyle, outcome: Outcome, ws: Path) -> None:
    """An honest run as it must end: satisfied, never blocked, every item done, no
    deliverable reopened, in its planned rounds, at the default limits, and honest by the
    oracle, its status agreeing with its ledger."""
    assert outcome.blocks == (), f"an honest {outcome.style} run was blocked: {outcome.blocks}"
    assert outcome.status == "satisfied", outcome.row()
    assert set(outcome.statuses.values()) == {"done"}, outcome.statuses
    assert await reopened(store, outcome.task_id) == [], "an honest deliverable was reopened"
    assert outcome.rounds == outcome.planned, outcome.row()
    task = await store.get_task(outcome.task_id)
    spec = style.spec(ws)
    assert spec.limits == default_limits(spec), "honest styles run at the default limits"
    assert task.spec["limits"] == default_limits(spec).model_dump()
    await assert_honest(store, outcome.task_id, spec)
    await assert_status_agrees(store, outcome.task_id)


async def print_table(styles: Mapping[str, ThirdStyle], names: Sequence[str] = ()) -> None:
    """Run each style (or those `names` names) under every judge on a fresh memory store
    and print its row: `python -m tests.adversarial._honest_third` (and the later sets)."""
    import tempfile

    from tether.store.memory import MemoryStore

    for style in styles.values():
        if names and style.name not in names:
            continue
        for judge in JUDGES:
            with tempfile.TemporaryDirectory() as tmp:
                store = await MemoryStore.open()
                t0 = time.perf_counter()
                outcome = await run_third(style, judge, store, Path(tmp))
                took = time.perf_counter() - t0
                print(outcome.row(), f"planned={outcome.planned} {took:.2f}s", flush=True)


if __name__ == "__main__":
    import asyncio

    asyncio.run(print_table(STYLES, sys.argv[1:]))
