"""Honest agents of many working styles, for the other side of the adversarial tests.

Each style is a small, real piece of work: files to read and write in a workspace, a few
tools of its own (a check that runs a real script, a local HTTP service that answers 503
before it answers, a batch service that rate-limits a first call), and a scripted actor
that works the way real agents work: it reads before it writes, runs checks that fail
and converge, retries a service it sees failing, drafts and rewrites, records claims
toward a count, thinks aloud between working rounds. Every item of every style has a
`done_when` rule, so that it can finish under any judge (the rules alone, an LLM judge,
or one that attaches nothing), and no style raises a limit: they run at the defaults.

`run_style` runs one style with one judge and returns what happened (`Outcome`); the
tests in `test_honest_styles.py` assert that every style is `satisfied` with no item
ever blocked. `python -m tests.adversarial._honest` prints the table of all styles and
judges (rounds, blocked or not, where and why) for the code on the import path.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.loop import by_purpose, events_of, ledger_of, run_task
from tether import errors
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.spec import TaskSpec, parse_spec
from tether.store.base import Store
from tether.tools.builtin.files import default_registry
from tether.tools.registry import Tool, ToolContext, ToolRegistry, tool

PY = shlex.quote(sys.executable)
FILES = ["list_files", "read_file", "write_file", "append_file"]
#: Editing files that were in the workspace before the task is what a coding agent does;
#: such a contract lets `write_file` overwrite them without a human's approval.
EDIT_FILES: list[Any] = [
    "list_files",
    "read_file",
    {"name": "write_file", "approval": False},
    {"name": "append_file", "approval": False},
]


# --- the actor: a plan of rounds --------------------------------------------------------

Step = Callable[[ModelRequest], ModelResponse]


def say(text: str, *calls: Any) -> ModelResponse:
    """An actor reply (words, and the calls of the round)."""
    return ModelResponse(text, tuple(calls))


def call(name: str, /, **args: Any) -> Any:
    """A tool call."""
    return tool_call(name, **args)


def tool_results(request: ModelRequest) -> list[str]:
    """What the tools answered, oldest first, as the model sees them."""
    return [m.content for m in request.messages if m.role == "tool"]


def last_result(request: ModelRequest) -> str:
    """The newest tool answer."""
    found = tool_results(request)
    return found[-1] if found else ""


def fixed(response: ModelResponse) -> Step:
    """A round that does not depend on what came before."""
    return lambda _request: response


class PlanActor:
    """Plays its rounds in order, one per act request; words only once they run out.

    The plan is the honest agent's own: it does not read the ledger to decide what to
    claim, it just works; the runtime's rules decide when an item is done."""

    def __init__(self, steps: Sequence[Step | ModelResponse]) -> None:
        self.steps = [s if callable(s) else fixed(s) for s in steps]
        self.rounds = 0

    def __call__(self, request: ModelRequest) -> ModelResponse:
        n = self.rounds
        self.rounds += 1
        if n < len(self.steps):
            return self.steps[n](request)
        return say("I have nothing more to do; the checks decide.")


# --- judges -----------------------------------------------------------------------------


def _payload(request: ModelRequest) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(request.messages[0].content)
    return data


#: A bullet of the judge's instructions that tells it to attach evidence to work that is
#: not finished (in-progress evidence). Today's instructions have none; a literal judge
#: attaches such evidence only once its instructions ask for it.
_IN_PROGRESS_RULE = re.compile(r"in[ _-]progress[^\n]*evidence|evidence[^\n]*in[ _-]progress", re.I)


def _bullets(instructions: str) -> list[str]:
    """The instruction bullets (a bullet and its continuation lines as one)."""
    out: list[str] = []
    for line in instructions.splitlines():
        if line.lstrip().startswith("- "):
            out.append(line.strip())
        elif out and line.startswith("  ") and line.strip():
            out[-1] += " " + line.strip()
        elif not line.strip():
            out.append("")
    return [b for b in out if b]


def literal_judge(request: ModelRequest) -> str:
    """An LLM judge that does what tether's judge instructions say, and nothing more.

    - It marks an item done only with a succeeded op of the round that proves it, cited
      by its evidence_ref: a write of the file the item's title names, in a round
      focused on it (for an item with a `done_when` rule the audit refuses that: the
      rule decides, as the instructions say).
    - It attaches in-progress evidence only when its instructions ask for it (a bullet
      that speaks of in-progress evidence): then the round's succeeded ops go to the
      focus item as `in_progress`, as such a bullet describes.
    - `satisfied` only when the ledger it was shown has nothing left but the focus item
      it marks done; otherwise `continue`.
    """
    data = _payload(request)
    focus = data.get("focus_item")
    journal = data.get("op_journal", [])
    items = {i["id"]: i for i in data["ledger"]["items"]}
    changes: list[dict[str, Any]] = []
    ok = [o for o in journal if o["status"] == "succeeded"]
    if focus in items:
        title = str(items[focus]["title"])
        proof = [
            o["evidence_ref"]
            for o in ok
            if o["tool"] in ("write_file", "append_file")
            and str(o["args"].get("path", "")) in title
        ]
        wants_progress = any(_IN_PROGRESS_RULE.search(b) for b in _bullets(request.system))
        if proof:
            changes.append({"item": focus, "status": "done", "evidence": proof})
        elif ok and wants_progress:
            changes.append(
                {
                    "item": focus,
                    "status": "in_progress",
                    "evidence": [o["evidence_ref"] for o in ok],
                    "note": "work of this round",
                }
            )
    left = [i for i in items if not any(c["item"] == i and c["status"] == "done" for c in changes)]
    decision = "satisfied" if not left else "continue"
    return json.dumps({"changes": changes, "decision": decision, "reason": "per the journal"})


def silent_judge(_: ModelRequest) -> str:
    """An LLM judge that attaches nothing, ever."""
    return json.dumps({"changes": [], "decision": "continue", "reason": "no opinion"})


JUDGES: dict[str, Callable[[ModelRequest], str] | None] = {
    "rules": None,  # `judge: rules`: no LLM judge at all
    "literal": literal_judge,
    "silent": silent_judge,
}


# --- styles -----------------------------------------------------------------------------


@dataclass
class Style:
    """One honest way of working: the workspace it starts from, its contract, its tools
    and its actor."""

    name: str
    doc: str
    items: Callable[[Path], list[dict[str, Any]]]
    actor: Callable[[Path], PlanActor]
    files: Mapping[str, str] = field(default_factory=dict)
    tools: Sequence[Any] = tuple(FILES)
    extra_tools: Callable[[Path], list[Tool]] = lambda _ws: []

    def spec(self, ws: Path) -> TaskSpec:
        """The contract, at default limits."""
        return parse_spec(
            {
                "name": f"honest-{self.name}",
                "objective": self.doc,
                "items": self.items(ws),
                "tools": list(self.tools),
            }
        )

    def setup(self, ws: Path) -> None:
        """Write the workspace's starting files."""
        for rel, text in self.files.items():
            p = ws / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)


def file_item(item: str, path: str, contains: str, title: str | None = None) -> dict[str, Any]:
    """An item done when `path` holds `contains`."""
    return {
        "id": item,
        "title": title or f"write {path}",
        "done_when": {"kind": "file", "path": path, "contains": contains},
    }


def command_item(item: str, title: str, command: str) -> dict[str, Any]:
    """An item done when `command` exits 0 in the workspace."""
    return {"id": item, "title": title, "done_when": {"kind": "command", "command": command}}


def run_script(ws: Path, script: str, tool_name: str) -> str:
    """Run a check script of the workspace; its output, or a failure the model reads."""
    proc = subprocess.run(
        [sys.executable, script],
        cwd=ws,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    out = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        raise errors.ToolFailed(f"{tool_name}: {out}")
    return out


# 1. explorer: reads several files before each note it writes ---------------------------

_MODULES = {
    "store": ["store/base.py", "store/memory.py", "store/sql.py"],
    "runtime": ["runtime/engine.py", "runtime/round/phases.py", "runtime/judge/judges.py"],
    "web": ["web/app.py", "web/api.py"],
}


def _explorer_files() -> dict[str, str]:
    out = {}
    for mod, paths in _MODULES.items():
        for p in paths:
            out[f"src/{p}"] = f'"""{mod}: {Path(p).stem} module."""\n\ndef {Path(p).stem}(): ...\n'
    return out


def _explorer_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = [say("Surveying the tree.", call("list_files", path="src"))]
    for mod, paths in _MODULES.items():
        steps.append(say(f"What is in {mod}?", call("list_files", path=f"src/{mod}")))
        steps += [say(f"Reading {p}.", call("read_file", path=f"src/{p}")) for p in paths]
        body = f"# {mod}\n\n## Findings\n" + "".join(f"- {p}: one function\n" for p in paths)
        steps.append(
            say(
                f"Writing the {mod} note.", call("write_file", path=f"notes/{mod}.md", content=body)
            )
        )
    return PlanActor(steps)


EXPLORER = Style(
    "explorer",
    "write a note on each package after reading its files",
    lambda _ws: [file_item(m, f"notes/{m}.md", "## Findings") for m in _MODULES],
    _explorer_actor,
    files=_explorer_files(),
)


# 2. converging fixer: 3 failing checks -> 2 -> 1 -> 0, through a real check -----------

_CALC_BUGGY = """\
def add(a, b):
    return a - b


def mul(a, b):
    return a + b


def neg(a):
    return a
"""
_CALC_CHECK = """\
import calc

checks = {
    "test_add": lambda: calc.add(2, 3) == 5,
    "test_mul": lambda: calc.mul(2, 3) == 6,
    "test_neg": lambda: calc.neg(4) == -4,
}
failed = [name for name, check in checks.items() if not check()]
summary = f"{len(failed)} failed, {len(checks) - len(failed)} passed"
print(summary + (": " + ", ".join(failed) if failed else ""))
raise SystemExit(1 if failed else 0)
"""


def _fix(text: str, *fixes: tuple[str, str]) -> str:
    for old, new in fixes:
        text = text.replace(old, new)
    return text


_ADD = ("return a - b", "return a + b")
_MUL = ("return a + b\n\n\ndef neg", "return a * b\n\n\ndef neg")
_NEG = ("def neg(a):\n    return a\n", "def neg(a):\n    return -a\n")


def _check_tool(script: str, name: str) -> Callable[[Path], list[Tool]]:
    def make(ws: Path) -> list[Tool]:
        @tool(name=name, effect="read", description=f"Run {script} in the workspace.")
        def run_checks(ctx: ToolContext) -> str:
            return run_script(ws, script, name)

        return [run_checks]

    return make


def _converging_actor(_ws: Path) -> PlanActor:
    v1 = _fix(_CALC_BUGGY, _ADD)
    v2 = _fix(v1, _MUL)
    v3 = _fix(v2, _NEG)
    return PlanActor(
        [
            say("Running the checks first.", call("run_checks")),
            say(
                "add subtracts; fixing it and re-running.",
                call("write_file", path="calc.py", content=v1),
                call("run_checks"),
            ),
            say(
                "mul adds; fixing it and re-running.",
                call("write_file", path="calc.py", content=v2),
                call("run_checks"),
            ),
            say(
                "neg is the identity; fixing it.",
                call("write_file", path="calc.py", content=v3),
                call("run_checks"),
            ),
        ]
    )


CONVERGING = Style(
    "converging-fixer",
    "make the calc checks pass",
    lambda _ws: [command_item("calc", "make check_calc.py pass", f"{PY} check_calc.py")],
    _converging_actor,
    files={"calc.py": _CALC_BUGGY, "check_calc.py": _CALC_CHECK},
    tools=[*EDIT_FILES, "run_checks"],
    extra_tools=_check_tool("check_calc.py", "run_checks"),
)


# 3. wandering fixer: fixes that break something else, failing differently, then pass --

_PARSE_BUGGY = """\
def parse(line):
    key, value = line.split(":")
    return key, value
"""
_PARSE_CHECK = """\
import parse

cases = {
    "test_simple": ("a: 1", ("a", "1")),
    "test_spaces": ("  b :  2 ", ("b", "2")),
    "test_colon_in_value": ("url: http://x", ("url", "http://x")),
    "test_empty_value": ("c:", ("c", "")),
}
failed = []
for name, (line, want) in cases.items():
    try:
        ok = parse.parse(line) == want
    except Exception as exc:
        ok = False
        name += f" ({type(exc).__name__})"
    if not ok:
        failed.append(name)
summary = f"{len(failed)} failed, {len(cases) - len(failed)} passed"
print(summary + (": " + ", ".join(failed) if failed else ""))
raise SystemExit(1 if failed else 0)
"""
_PARSE_V1 = """\
def parse(line):
    key, value = line.split(":")
    return key.strip(), value.strip()
"""
_PARSE_V2 = """\
def parse(line):
    key, value = line.split(":", 1)
    return key, value.strip()
"""
_PARSE_V3 = """\
def parse(line):
    key, value = line.split(":", 1)
    return key.strip(), value.strip()
"""


def _wandering_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say("Reading the parser.", call("read_file", path="parse.py")),
            say("And its checks.", call("run_parse_checks")),
            say("Strip the parts.", call("write_file", path="parse.py", content=_PARSE_V1)),
            say("Did that help?", call("run_parse_checks")),
            say("Split once; rewriting.", call("write_file", path="parse.py", content=_PARSE_V2)),
            say("Again.", call("run_parse_checks")),
            say(
                "I dropped the key strip; reading my version back.",
                call("read_file", path="parse.py"),
            ),
            say(
                "Both fixes together, and a final run.",
                call("write_file", path="parse.py", content=_PARSE_V3),
                call("run_parse_checks"),
            ),
        ]
    )


WANDERING = Style(
    "wandering-fixer",
    "make the parser checks pass",
    lambda _ws: [command_item("parser", "make check_parse.py pass", f"{PY} check_parse.py")],
    _wandering_actor,
    files={"parse.py": _PARSE_BUGGY, "check_parse.py": _PARSE_CHECK},
    tools=[*EDIT_FILES, "run_parse_checks"],
    extra_tools=_check_tool("check_parse.py", "run_parse_checks"),
)


# 4. flaky service the model sees: a local HTTP server answers 503 twice, then 200 -----


class LocalServer:
    """A real HTTP server on 127.0.0.1 with `handler`, served in a thread (`running`)."""

    def serve(self, handler: type[BaseHTTPRequestHandler]) -> None:
        """Bind an ephemeral port for `handler` (call once, from `__init__`)."""
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @contextmanager
    def running(self) -> Iterator[Any]:
        """The server, serving until the block ends."""
        self.thread.start()
        try:
            yield self
        finally:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.thread.join()


class FlakyServer(LocalServer):
    """A real HTTP server on 127.0.0.1: a GET answers `status` (with `headers` and
    `fail_body`) `fails` times, then 200 with `ok` as JSON. By default `/release`
    answers 503 twice."""

    def __init__(
        self,
        fails: int = 2,
        status: int = 503,
        headers: dict[str, str] | None = None,
        fail_body: bytes = b"Service Unavailable: warming up",
        ok: dict[str, Any] | None = None,
    ) -> None:
        self.fails = fails
        self.hits = 0
        server = self
        answer = json.dumps(ok or {"channel": "stable", "version": "2.4.1"}).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.hits += 1
                if server.hits <= server.fails:
                    body = fail_body
                    self.send_response(status)
                    for name, value in (headers or {}).items():
                        self.send_header(name, value)
                else:
                    body = answer
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                pass

        self.serve(Handler)


_SERVERS: dict[str, FlakyServer] = {}


def _fetch_tools(ws: Path) -> list[Tool]:
    server = _SERVERS[str(ws)]

    @tool(name="fetch_release", effect="read", description="GET the release info of a channel.")
    def fetch_release(channel: str) -> str:
        try:
            with urllib.request.urlopen(f"{server.url}/release?channel={channel}", timeout=10) as r:
                return str(r.read().decode())
        except urllib.error.HTTPError as exc:
            # The model sees the failure and decides (the tool does not retry on its own).
            raise errors.ToolFailed(
                f"fetch_release: HTTP {exc.code} {exc.read().decode()}"
            ) from None

    return [fetch_release]


def _flaky_actor(_ws: Path) -> PlanActor:
    def write_notes(request: ModelRequest) -> ModelResponse:
        version = json.loads(last_result(request))["version"]
        text = f"# Release notes\n\nstable is at {version}\n"
        return say("Writing the notes.", call("write_file", path="out/release.md", content=text))

    return PlanActor(
        [
            say("Fetching the release.", call("fetch_release", channel="stable")),
            say(
                "503; the service is warming up. Trying again.",
                call("fetch_release", channel="stable"),
            ),
            say("Still 503. Once more.", call("fetch_release", channel="stable")),
            write_notes,
        ]
    )


FLAKY_HTTP = Style(
    "flaky-http",
    "write release notes for the stable channel",
    lambda _ws: [file_item("notes", "out/release.md", "2.4.1")],
    _flaky_actor,
    tools=[*FILES, "fetch_release"],
    extra_tools=_fetch_tools,
)


# 5. rate-limited batches: a tool with a counter refuses each batch's first call -------


def _batch_tools(_ws: Path) -> list[Tool]:
    seen: dict[str, int] = {}

    @tool(name="submit_batch", effect="write", description="Submit a prepared batch file.")
    def submit_batch(batch: str) -> str:
        seen[batch] = seen.get(batch, 0) + 1
        if seen[batch] == 1:
            raise errors.ToolFailed(f"submit_batch: 429 Too Many Requests for {batch}; slow down")
        return f"accepted {batch} as job {100 + len(seen)}"

    return [submit_batch]


def _batch_actor(_ws: Path) -> PlanActor:
    # The tool's "429 Too Many Requests" is read as a rate limit: tether retries the
    # call itself (`tools.failures.rate_limited`), so each submit is accepted in the
    # round that asks for it and the agent goes on.
    steps: list[Step | ModelResponse] = []
    for b in ("b1", "b2"):
        rows = "".join(f"{b},{k},{k * k}\n" for k in range(5))
        steps += [
            say(f"Preparing {b}.", call("write_file", path=f"batches/{b}.csv", content=rows)),
            say(f"Submitting {b}.", call("submit_batch", batch=b)),
        ]
    return PlanActor(steps)


BATCHES = Style(
    "rate-limited-batches",
    "submit both batches",
    lambda _ws: [
        {
            "id": b,
            "title": f"submit batch {b}",
            "done_when": {"kind": "op", "tool": "submit_batch", "args": {"batch": b}},
        }
        for b in ("b1", "b2")
    ],
    _batch_actor,
    tools=[*FILES, "submit_batch"],
    extra_tools=_batch_tools,
)


# 6. drafter: writes, reads back, rewrites until a real check passes ------------------

_ESSAY_CHECK = """\
import pathlib, re, sys

text = pathlib.Path("out/essay.md").read_text() if pathlib.Path("out/essay.md").exists() else ""
words = len(re.findall(r"\\w+", text))
missing = [s for s in ("## Summary", "## Risks", "## Next steps") if s not in text]
problems = ([f"{words} words, need 60"] if words < 60 else []) + [f"missing {s}" for s in missing]
print("; ".join(problems) or f"ok: {words} words")
sys.exit(1 if problems else 0)
"""
_WORDS = (
    "The migration moves the ledger to the new store without downtime "
    "and keeps every audit record. "
)


def _drafter_actor(_ws: Path) -> PlanActor:
    v1 = "## Summary\n" + _WORDS
    v2 = v1 + "\n## Risks\n" + _WORDS * 2
    v3 = v2 + "\n## Next steps\n" + _WORDS * 2
    w = "out/essay.md"
    return PlanActor(
        [
            say("First draft.", call("write_file", path=w, content=v1)),
            say("Reading it back.", call("read_file", path=w)),
            say("Too thin; checking it.", call("check_essay")),
            say("Adding risks.", call("write_file", path=w, content=v2)),
            say("Reading it back.", call("read_file", path=w)),
            say("Adding next steps.", call("write_file", path=w, content=v3)),
        ]
    )


DRAFTER = Style(
    "drafter",
    "write the migration essay",
    lambda _ws: [
        command_item(
            "essay", "write out/essay.md that passes check_essay.py", f"{PY} check_essay.py"
        )
    ],
    _drafter_actor,
    files={"check_essay.py": _ESSAY_CHECK},
    tools=[*FILES, "check_essay"],
    extra_tools=_check_tool("check_essay.py", "check_essay"),
)


# 7. researcher: reads a source, quotes it, records claims toward min_count ------------

_PAPER = """\
Tether keeps a goal ledger per task. The ledger is the audited truth about progress.
Every verdict passes a mechanical audit before it reaches the ledger.
Evidence must resolve to committed ops or valid artifacts.
Compaction never turns pending work into done work.
"""
_QUOTES = [
    "The ledger is the audited truth about progress.",
    "Every verdict passes a mechanical audit before it reaches the ledger.",
    "Evidence must resolve to committed ops or valid artifacts.",
]
_SNAP = re.compile(r"cite snapshot artifact (\S+)")
_EV = re.compile(r"evidence artifact (\S+)")


def _researcher_actor(_ws: Path) -> PlanActor:
    def snapshot(request: ModelRequest) -> str:
        found = [m for r in tool_results(request) for m in _SNAP.findall(r)]
        return found[-1]

    def quote(k: int) -> Step:
        return lambda r: say(
            "Quoting it.",
            call(
                "record_evidence",
                source_artifact=snapshot(r),
                excerpt=_QUOTES[k],
                location=f"line {k + 1}",
            ),
        )

    def claim(k: int) -> Step:
        return lambda r: say(
            "Recording the claim.",
            call(
                "record_claim",
                text=f"claim {k}: {_QUOTES[k]}",
                evidence=[_EV.findall(last_result(r))[-1]],
                topic="design",
            ),
        )

    steps: list[Step | ModelResponse] = [
        say("Reading the paper.", call("read_source", source="paper"))
    ]
    for k in range(3):
        steps += [quote(k), claim(k)]
        if k == 1:
            steps.append(
                say("Re-reading the second half.", call("read_source", source="paper", offset=120))
            )
    return PlanActor(steps)


RESEARCHER = Style(
    "researcher",
    "record three sourced claims about the design",
    lambda _ws: [
        {
            "id": "claims",
            "title": "three claims about the design, each quoting the paper",
            "done_when": {
                "kind": "artifact",
                "artifact_kind": "claim",
                "name": "design",
                "min_count": 3,
            },
        }
    ],
    _researcher_actor,
    files={"docs/paper.txt": _PAPER},
    tools=["read_source", "record_evidence", "record_claim", "list_files"],
)


def _researcher_spec(ws: Path) -> TaskSpec:
    return parse_spec(
        {
            "name": "honest-researcher",
            "objective": RESEARCHER.doc,
            "items": RESEARCHER.items(ws),
            "tools": list(RESEARCHER.tools),
            "sources": [
                {"id": "paper", "kind": "document", "version": "v1", "location": "docs/paper.txt"}
            ],
        }
    )


# 8. interleaver: starts A, does B (which A needs), back to A --------------------------


def _interleaver_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say(
                "Starting the API page.",
                call("write_file", path="docs/api.md", content="# API\n\nTODO endpoints\n"),
            ),
            say(
                "The API page needs the CLI names; reading the CLI.",
                call("read_file", path="cli.txt"),
            ),
            say(
                "Writing the CLI page first.",
                call(
                    "write_file",
                    path="docs/cli.md",
                    content="# CLI\n\n## Commands\n- run\n- status\n",
                ),
            ),
            say("Back to the API page.", call("read_file", path="docs/cli.md")),
            say(
                "Finishing the API page.",
                call(
                    "write_file",
                    path="docs/api.md",
                    content="# API\n\n## Endpoints\n- POST /run (tether run)\n"
                    "- GET /status (tether status)\n",
                ),
            ),
            say("Index of what exists.", call("list_files", path="docs")),
            say(
                "Writing the index.",
                call(
                    "write_file",
                    path="docs/index.md",
                    content="# Docs\n\n- [api](api.md)\n- [cli](cli.md)\n",
                ),
            ),
        ]
    )


INTERLEAVER = Style(
    "interleaver",
    "document the API and the CLI, with an index",
    lambda _ws: [
        file_item("api", "docs/api.md", "## Endpoints"),
        file_item("cli", "docs/cli.md", "## Commands"),
        file_item("index", "docs/index.md", "(cli.md)"),
    ],
    _interleaver_actor,
    files={"cli.txt": "commands: run, status\n"},
)


# 9. one long item: many varied rounds of successful work ------------------------------

_INPUTS = {f"data/in{k}.txt": f"{k}\n{k * 10}\n" for k in range(1, 6)}
_DATASET_CHECK = """\
import pathlib, sys

p = pathlib.Path("out/dataset.csv")
rows = p.read_text().splitlines() if p.exists() else []
problems = []
if not rows or rows[0] != "k,a,b":
    problems.append("missing header k,a,b")
body = [r for r in rows[1:] if not r.startswith("total")]
if len(body) < 5:
    problems.append(f"{len(body)} rows of 5")
if not any(r.startswith("total,") for r in rows):
    problems.append("missing total row")
print("; ".join(problems) or "ok")
sys.exit(1 if problems else 0)
"""


def _long_actor(_ws: Path) -> PlanActor:
    p = "out/dataset.csv"
    rows = [f"{k},{k},{k * 10}\n" for k in range(1, 6)]
    steps: list[Step | ModelResponse] = [
        say("What inputs are there?", call("list_files", path="data"))
    ]
    steps += [
        say(f"Reading in{k}.", call("read_file", path=f"data/in{k}.txt")) for k in range(1, 4)
    ]
    steps += [
        say(
            "Header and the first rows.",
            call("write_file", path=p, content="k,a,b\n" + "".join(rows[:3])),
        ),
        say("Validating what I have.", call("validate_dataset")),
        say(
            "Reading the last inputs.",
            call("read_file", path="data/in4.txt"),
            call("read_file", path="data/in5.txt"),
        ),
        say("Appending rows 4 and 5.", call("append_file", path=p, content="".join(rows[3:]))),
        say("Reading it back.", call("read_file", path=p)),
        say("Validating again.", call("validate_dataset")),
        say(
            "Checking the totals by hand against in1.",
            call("read_file", path="data/in1.txt", limit=1),
        ),
        say("Appending the total row.", call("append_file", path=p, content="total,15,150\n")),
    ]
    return PlanActor(steps)


LONG_ITEM = Style(
    "long-item",
    "build out/dataset.csv from the inputs",
    lambda _ws: [
        command_item(
            "dataset", "build out/dataset.csv (check_dataset.py passes)", f"{PY} check_dataset.py"
        )
    ],
    _long_actor,
    files={**_INPUTS, "check_dataset.py": _DATASET_CHECK},
    tools=[*FILES, "validate_dataset"],
    extra_tools=_check_tool("check_dataset.py", "validate_dataset"),
)


# 10. thinker: a words-only round between working rounds -------------------------------


def _thinker_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = []
    for part in ("intro", "body"):
        steps += [
            say(f"Reading the brief for {part}.", call("read_file", path=f"brief/{part}.txt")),
            say(
                f"Plan for {part}: one heading, two sentences, then the checklist line. "
                "No tool needed for this step."
            ),
            say("Reading the style guide.", call("read_file", path="brief/style.txt")),
            say("Thinking about the tone: plain words, short sentences. Writing next."),
            say(
                f"Writing {part}.",
                call(
                    "write_file", path=f"out/{part}.md", content=f"# {part}\n\nPlain words.\nDONE\n"
                ),
            ),
        ]
    return PlanActor(steps)


THINKER = Style(
    "thinker",
    "write the intro and the body",
    lambda _ws: [file_item(p, f"out/{p}.md", "DONE") for p in ("intro", "body")],
    _thinker_actor,
    files={
        "brief/intro.txt": "say what it is\n",
        "brief/body.txt": "say how it works\n",
        "brief/style.txt": "plain\n",
    },
)


# 11. doc reader: reads the docs between edits, validates with a real check ------------

_CONFIG_DOC = "\n".join(
    [
        "# Configuration",
        "Section 1: the file is out/app.toml and starts with [app].",
        "Section 2: name is required, a quoted string.",
        "Section 3: retries is required, an integer from 1 to 9.",
        "Section 4: timeout is optional, in seconds.",
    ]
)
_CONFIG_CHECK = """\
import pathlib, sys, tomllib

p = pathlib.Path("out/app.toml")
try:
    app = tomllib.loads(p.read_text())["app"]
except Exception as exc:
    print(f"cannot read out/app.toml: {type(exc).__name__}")
    sys.exit(1)
missing = [k for k in ("name", "retries") if k not in app]
print(("missing " + ", ".join(missing)) if missing else "ok")
sys.exit(1 if missing else 0)
"""


def _doc_reader_actor(_ws: Path) -> PlanActor:
    doc = "docs/config.md"
    cfg = "out/app.toml"
    return PlanActor(
        [
            say("Reading the docs.", call("read_file", path=doc, limit=70)),
            say("The header first.", call("write_file", path=cfg, content="[app]\n")),
            say("Next section of the docs.", call("read_file", path=doc, offset=70, limit=50)),
            say(
                "Adding the name.", call("write_file", path=cfg, content='[app]\nname = "tether"\n')
            ),
            say("Validating.", call("check_config")),
            say("Retries are missing; the docs say more.", call("read_file", path=doc, offset=120)),
            say("Adding retries.", call("append_file", path=cfg, content="retries = 3\n")),
        ]
    )


DOC_READER = Style(
    "doc-reader",
    "write a valid out/app.toml",
    lambda _ws: [
        command_item(
            "config", "write out/app.toml (check_config.py passes)", f"{PY} check_config.py"
        )
    ],
    _doc_reader_actor,
    files={"docs/config.md": _CONFIG_DOC, "check_config.py": _CONFIG_CHECK},
    tools=[*FILES, "check_config"],
    extra_tools=_check_tool("check_config.py", "check_config"),
)


# 12. verifier: writes, lists, reads back, then signs each file off --------------------


def _verifier_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = []
    for k in (1, 2, 3):
        p = f"out/part{k}.txt"
        steps += [
            say(f"Writing part {k}.", call("write_file", path=p, content=f"part {k}\n")),
            say("Is it there?", call("list_files", path="out")),
            say("Reading it back.", call("read_file", path=p)),
            say("Looks right; signing it off.", call("append_file", path=p, content="verified\n")),
        ]
    return PlanActor(steps)


VERIFIER = Style(
    "verifier",
    "write and verify three parts",
    lambda _ws: [file_item(f"part{k}", f"out/part{k}.txt", "verified") for k in (1, 2, 3)],
    _verifier_actor,
)


# 13. poller: submits a job and polls it; the same answer twice while it runs -------


def _job_tools(_ws: Path) -> list[Tool]:
    state = {"polls": 0, "submitted": 0}
    answers = ["queued", "running", "running", "finished: 12 rows in out/report.csv"]

    @tool(name="submit_job", effect="write", description="Start the report job.")
    def submit_job(kind: str) -> str:
        state["submitted"] += 1
        return f"job {kind}-1 submitted"

    @tool(name="job_status", effect="read", description="The status of a job.")
    def job_status(job: str) -> str:
        state["polls"] += 1
        return f"{job}: {answers[min(state['polls'], len(answers)) - 1]}"

    return [submit_job, job_status]


def _poller_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say("Starting the job.", call("submit_job", kind="report")),
            *[say("How is it doing?", call("job_status", job="report-1")) for _ in range(4)],
            say(
                "Finished; recording the result.",
                call("write_file", path="out/job.md", content="report-1: 12 rows\n"),
            ),
        ]
    )


POLLER = Style(
    "poller",
    "run the report job and record its result",
    lambda _ws: [file_item("job", "out/job.md", "12 rows")],
    _poller_actor,
    tools=[*FILES, "submit_job", "job_status"],
    extra_tools=_job_tools,
)


STYLES: dict[str, Style] = {
    s.name: s
    for s in (
        EXPLORER,
        CONVERGING,
        WANDERING,
        FLAKY_HTTP,
        BATCHES,
        DRAFTER,
        RESEARCHER,
        INTERLEAVER,
        LONG_ITEM,
        THINKER,
        DOC_READER,
        VERIFIER,
        POLLER,
    )
}


# --- running one -------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What happened to one honest run."""

    style: str
    judge: str
    status: str
    rounds: int
    #: (round, item, why) of every block the event log records.
    blocks: tuple[tuple[int, str, str], ...]
    statuses: Mapping[str, str]
    #: The rounds the actor planned (it finishes in exactly these when nothing stops it).
    planned: int = 0
    task_id: str = ""

    @property
    def blocked(self) -> bool:
        """Whether any item was ever blocked (or skipped by the runtime)."""
        return bool(self.blocks)

    def row(self) -> str:
        """One line of the before/after table."""
        where = "; ".join(f"{item} at round {r}: {why[:90]}" for r, item, why in self.blocks)
        return f"{self.style:22} {self.judge:8} {self.status:10} rounds={self.rounds:<3} " + (
            f"BLOCKED {where}" if self.blocked else "not blocked"
        )


async def block_events(store: Store, task_id: str) -> list[tuple[int, str, str]]:
    """Every block the event log records: the runtime's `item_blocked`/`item_skipped`
    warnings and any ledger update that moved an item to `blocked`, with the round."""
    found: list[tuple[int, str, str]] = []
    round_no = 0
    for e in await store.read_events(task_id):
        data = e.data
        if e.type == "round.started":
            round_no = int(data["round"])
        elif e.type == "audit.warning" and data.get("code") in ("item_blocked", "item_skipped"):
            found.append((round_no, str(data["details"].get("item")), str(data["message"])))
        elif e.type == "ledger.updated":
            for ch in data.get("diff", []):
                if ch.get("field") == "status" and ch.get("after") in ("blocked", "skipped"):
                    hit = (round_no, str(ch["item"]))
                    if not any((r, i) == hit for r, i, _ in found):
                        found.append((*hit, "ledger: status -> " + str(ch["after"])))
    return found


def registry_with(store: Store, tools: Sequence[Tool]) -> ToolRegistry:
    """The built-in tools and `tools`."""
    reg = default_registry(lambda: store)
    for t in tools:
        reg.add(t)
    return reg


def registry_for(style: Style, store: Store, ws: Path) -> ToolRegistry:
    """The built-in tools and the style's own."""
    return registry_with(store, style.extra_tools(ws))


async def run_style(style: Style, judge: str, store: Store, ws: Path) -> Outcome:
    """Run `style` with `judge` in `ws` on `store`: what happened."""
    style.setup(ws)
    spec = _researcher_spec(ws) if style is RESEARCHER else style.spec(ws)
    actor = style.actor(ws)
    judge_policy = JUDGES[judge]
    model = ScriptedModel(policy=by_purpose(act=actor), name="actor")
    judge_model = (
        ScriptedModel(policy=by_purpose(judge=judge_policy), name=f"{judge}-judge")
        if judge_policy is not None
        else None
    )
    server = FlakyServer() if style is FLAKY_HTTP else None
    if server is not None:
        _SERVERS[str(ws)] = server
        with server.running():
            tid, result = await run_task(
                store, spec, ws, model, judge=judge_model, registry=registry_for(style, store, ws)
            )
        del _SERVERS[str(ws)]
    else:
        tid, result = await run_task(
            store, spec, ws, model, judge=judge_model, registry=registry_for(style, store, ws)
        )
    led = await ledger_of(store, tid)
    rounds = len(await events_of(store, tid, "round.started"))
    return Outcome(
        style.name,
        judge,
        result.status,
        rounds,
        tuple(await block_events(store, tid)),
        {d.id: s.status for d, s in led.items()},
        len(actor.steps),
        tid,
    )


async def _table() -> None:
    import tempfile

    from tether.store.memory import MemoryStore

    for style in STYLES.values():
        for judge in JUDGES:
            with tempfile.TemporaryDirectory() as tmp:
                store = await MemoryStore.open()
                outcome = await run_style(style, judge, store, Path(tmp))
                print(outcome.row(), flush=True)


if __name__ == "__main__":
    import asyncio

    asyncio.run(_table())
