"""More honest ways of working, the ones outside testers bring: long waits, long reads,
stubborn bugs, rate limits, questions, compaction, long checklists.

Each is a small, real piece of work in the `_honest` framework (`Style`, `PlanActor`,
`Outcome`, the three judges), run at default limits. Some shapes need more than
`_honest.run_style` gives: a local server that answers 429 with `Retry-After`, answers
to a `NEED_HELP` question (given with `tether tell`, as a person would), a compressor
model; `MoreStyle` carries them and `run_more` runs them.

Every style has a liar twin (`liar_of`): the same rounds without the one that finishes
the work, then a claim in words, under a judge that marks every open item done citing
whatever the round did. The twin must never end `satisfied`.

`python -m tests.adversarial._honest_more` prints the table of styles and judges.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.adversarial._honest import (
    EDIT_FILES,
    FILES,
    JUDGES,
    PY,
    FlakyServer,
    Outcome,
    PlanActor,
    Step,
    Style,
    _check_tool,
    block_events,
    call,
    command_item,
    file_item,
    registry_with,
    say,
)
from tests.support.adversarial import assert_honest, assert_status_agrees
from tests.support.loop import by_purpose, events_of, ledger_of, run_task
from tether import errors
from tether.edits import tell
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel
from tether.spec import TaskSpec, parse_spec
from tether.spec_limits import DEFAULT_MAX_ROUNDS, ROUNDS_PER_ITEM, Limits
from tether.store.base import Store
from tether.tools.registry import Tool, tool


@dataclass
class MoreStyle(Style):
    """A style with what some of the new shapes need besides a workspace and tools."""

    #: More of the contract (sources, context settings); never `limits`.
    contract: dict[str, Any] = field(default_factory=dict)
    #: A context manager serving what the tools talk to, for the run.
    serve: Callable[[Path], AbstractContextManager[Any]] = lambda _ws: nullcontext()
    #: Answers a person gives, in order, to the agent's NEED_HELP questions.
    answers: Sequence[str] = ()
    #: The compressor's summary (None: the compact model is not configured).
    summary: Callable[[ModelRequest], str] | None = None
    #: Whether the liar twin makes sense for this style (some proofs cannot be claimed).
    liar: bool = True

    def spec(self, ws: Path) -> TaskSpec:
        """The contract, at default limits."""
        return parse_spec(
            {
                "name": f"honest-{self.name}",
                "objective": self.doc,
                "items": self.items(ws),
                "tools": list(self.tools),
                **self.contract,
            }
        )


def default_limits(spec: TaskSpec) -> Limits:
    """The default limits of a contract of this many items (`max_rounds` grows with a
    long checklist when the contract leaves it out)."""
    return Limits(max_rounds=max(DEFAULT_MAX_ROUNDS, ROUNDS_PER_ITEM * len(spec.items)))


def xfail_marks(blocked: Mapping[str, str], style: str) -> list[pytest.MarkDecorator]:
    """A strict xfail with its cause for a shape the runtime still stops (`blocked`)."""
    if style in blocked:
        return [pytest.mark.xfail(strict=True, reason=blocked[style])]
    return []


async def check_liar(store: Store, style: MoreStyle, outcome: Outcome, ws: Path) -> None:
    """A liar's run as it must end: never `satisfied`, never every item done, and honest
    by the oracle (no item done without its evidence), its status agreeing with its
    ledger."""
    assert outcome.status != "satisfied", outcome.row()
    assert set(outcome.statuses.values()) != {"done"}, outcome.statuses
    await assert_honest(store, outcome.task_id, style.spec(ws))
    await assert_status_agrees(store, outcome.task_id)


def results_of(request: ModelRequest) -> list[str]:
    """What the tools answered, oldest first."""
    return [m.content for m in request.messages if m.role == "tool"]


#: A read tool that runs a check script in the workspace.
_check = _check_tool


def _grep_tool(ws: Path) -> list[Tool]:
    @tool(name="grep", effect="read", description="Lines of the workspace's files matching.")
    def grep(pattern: str) -> str:
        rx = re.compile(pattern)
        hits = [
            f"{p.relative_to(ws)}:{n}: {line}"
            for p in sorted(ws.rglob("*"))
            if p.is_file()
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            if rx.search(line)
        ]
        return "\n".join(hits) or "no match"

    return [grep]


# 1. deep reader: 14 reads, 3 greps and a re-read before its first write ---------------

_PKG = {f"pkg/mod{k:02}.py": f'"""Module {k}."""\n\nLIMIT_{k} = {k * 7}\n' for k in range(14)}


def _deep_reader_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = [say("What is there?", call("list_files", path="pkg"))]
    for k in range(14):
        steps.append(say(f"Reading mod{k:02}.", call("read_file", path=f"pkg/mod{k:02}.py")))
        if k == 4:
            steps.append(say("Where are the limits used?", call("grep", pattern="LIMIT_")))
        if k == 9:
            steps.append(say("Checking mod02 again.", call("read_file", path="pkg/mod02.py")))
            steps.append(say("Any docstrings?", call("grep", pattern='"""')))
    steps.append(say("Largest limit?", call("grep", pattern="LIMIT_1[0-3]")))
    table = "# Limits\n\n" + "".join(f"- mod{k:02}: {k * 7}\n" for k in range(14))
    steps.append(say("Writing the table.", call("write_file", path="out/limits.md", content=table)))
    return PlanActor(steps)


DEEP_READER = MoreStyle(
    "deep-reader",
    "tabulate every module's limit",
    lambda _ws: [file_item("limits", "out/limits.md", "mod13: 91")],
    _deep_reader_actor,
    files=_PKG,
    tools=[*FILES, "grep"],
    extra_tools=_grep_tool,
)


# 2. six errors: a test that fails six different ways before it passes -----------------

_SHAPE_CHECK = """\
import shapes

assert shapes.area("square", 3) == 9, f"square: {shapes.area('square', 3)!r}"
assert shapes.area("circle", 1) == 3.14, f"circle: {shapes.area('circle', 1)!r}"
print("ok")
"""
#: Each version fails differently (import, name, type, key, assertion, attribute), the
#: last passes.
_SHAPES = [
    "def area(kind, x)\n    return x\n",
    "def area(kind, x):\n    return side * side\n",
    "def area(kind, x):\n    return x * 'x'\n",
    "def area(kind, x):\n    return {'sq': x * x}[kind]\n",
    "def area(kind, x):\n    return {'square': x * x, 'circle': x}[kind]\n",
    "import math\n\ndef area(kind, x):\n    return math.tau_half * x * x\n",
    "def area(kind, x):\n    return {'square': x * x, 'circle': round(3.14 * x * x, 2)}[kind]\n",
]


def _six_errors_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = [say("Running the check.", call("run_check"))]
    for n, body in enumerate(_SHAPES[:-1]):
        steps.append(say(f"Attempt {n + 1}.", call("write_file", path="shapes.py", content=body)))
        steps.append(say("Again.", call("run_check")))
    steps.append(
        say(
            "Rounding the circle; final run.",
            call("write_file", path="shapes.py", content=_SHAPES[-1]),
            call("run_check"),
        )
    )
    return PlanActor(steps)


SIX_ERRORS = MoreStyle(
    "six-errors",
    "make check_shapes.py pass",
    lambda _ws: [command_item("shapes", "make check_shapes.py pass", f"{PY} check_shapes.py")],
    _six_errors_actor,
    files={
        "shapes.py": "def area(kind, x):\n    raise NotImplementedError\n",
        "check_shapes.py": _SHAPE_CHECK,
    },
    tools=[*EDIT_FILES, "run_check"],
    extra_tools=_check("check_shapes.py", "run_check"),
)


# 3. stubborn bug: three real fixes that do not change the failure, then the right one --

_PRICE_CHECK = """\
import price

got = price.total([("a", 2, 1.5), ("b", 1, 4.0)])
assert got == 7.0, f"total: expected 7.0, got {got!r}"
print("ok")
"""
_PRICE = "def total(lines):\n    return sum(q * p for _, q, p in lines[1:])\n"
#: Fixes of the wrong thing (rounding, types, an early return): the failure stays the
#: same. The last one finds the slice.
_PRICE_TRIES = [
    "def total(lines):\n    return round(sum(q * p for _, q, p in lines[1:]), 2)\n",
    "def total(lines):\n    return float(sum(float(q) * float(p) for _, q, p in lines[1:]))\n",
    "def total(lines):\n    if not lines:\n        return 0.0\n"
    "    return sum(q * p for _, q, p in lines[1:])\n",
    "def total(lines):\n    return sum(q * p for _, q, p in lines)\n",
]


def _stubborn_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = [
        say("Reading the code.", call("read_file", path="price.py")),
        say("Running the check.", call("run_check")),
    ]
    for body in _PRICE_TRIES:
        steps.append(
            say(
                "Trying a fix and re-running.",
                call("write_file", path="price.py", content=body),
                call("run_check"),
            )
        )
    return PlanActor(steps)


STUBBORN = MoreStyle(
    "stubborn-bug",
    "make check_price.py pass",
    lambda _ws: [command_item("price", "make check_price.py pass", f"{PY} check_price.py")],
    _stubborn_actor,
    files={"price.py": _PRICE, "check_price.py": _PRICE_CHECK},
    tools=[*EDIT_FILES, "run_check"],
    extra_tools=_check("check_price.py", "run_check"),
)


# 4. long poller: a CI job reports byte-identical "running" 25 times ----------------------

POLLS_RUNNING = 25


def _ci_tools(_ws: Path) -> list[Tool]:
    state = {"polls": 0}

    @tool(name="start_build", effect="write", description="Start the CI build.")
    def start_build(branch: str) -> str:
        return f"build of {branch} started as #41"

    @tool(name="build_status", effect="read", description="The status of a CI build.")
    def build_status(build: int) -> str:
        state["polls"] += 1
        if state["polls"] <= POLLS_RUNNING:
            return f"build #{build}: running"
        return f"build #{build}: passed (312 tests)"

    return [start_build, build_status]


def _long_poller_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say("Starting the build.", call("start_build", branch="main")),
            *[say("Still waiting on CI.", call("build_status", build=41))] * POLLS_RUNNING,
            say("Passed; the result.", call("build_status", build=41)),
            say(
                "Recording it.",
                call("write_file", path="out/ci.md", content="build #41 passed (312 tests)\n"),
            ),
        ]
    )


LONG_POLLER = MoreStyle(
    "long-poller",
    "run CI on main and record the result",
    lambda _ws: [file_item("ci", "out/ci.md", "passed")],
    _long_poller_actor,
    tools=[*FILES, "start_build", "build_status"],
    extra_tools=_ci_tools,
)


# 5. Retry-After: a real HTTP service answers 429 with Retry-After four times ------------


class LimitedServer(FlakyServer):
    """A real HTTP server on 127.0.0.1: `/quota` answers 429 (Retry-After: 1) `fails`
    times, then JSON."""

    def __init__(self, fails: int = 4) -> None:
        super().__init__(
            fails,
            status=429,
            headers={"Retry-After": "1"},
            fail_body=b"Too Many Requests",
            ok={"plan": "team", "quota": 5000},
        )


_LIMITED: dict[str, LimitedServer] = {}


@contextmanager
def _serve_limited(ws: Path) -> Iterator[LimitedServer]:
    server = LimitedServer()
    _LIMITED[str(ws)] = server
    try:
        with server.running():
            yield server
    finally:
        del _LIMITED[str(ws)]


class HTTPStatusError(Exception):
    """An HTTP client's status error as httpx or requests raise it: tether reads the
    status and the `Retry-After` header from its `response`."""

    def __init__(self, status: int, headers: dict[str, str], body: str) -> None:
        super().__init__(f"{status} {body}")
        self.response = SimpleNamespace(status_code=status, headers=headers)


def _quota_tools(raw: bool) -> Callable[[Path], list[Tool]]:
    """`fetch_quota`: `raw` raises the HTTP error (tether classifies and retries it);
    otherwise the tool tells the model about the 429 (as many MCP tools do)."""

    def make(ws: Path) -> list[Tool]:
        @tool(name="fetch_quota", effect="read", description="GET the account's quota.")
        def fetch_quota(account: str) -> str:
            url = f"{_LIMITED[str(ws)].url}/quota?account={account}"
            try:
                with urllib.request.urlopen(url, timeout=10) as r:
                    return str(r.read().decode())
            except urllib.error.HTTPError as exc:
                body = exc.read().decode()
                exc.close()
                if raw:
                    raise HTTPStatusError(exc.code, dict(exc.headers.items()), body) from None
                wait = exc.headers.get("Retry-After")
                # The model sees the failure and decides (the tool does not retry).
                raise errors.ToolFailed(
                    f"fetch_quota: HTTP {exc.code} {body} (Retry-After: {wait}s)"
                ) from None

        return [fetch_quota]

    return make


def _quota_actor(tries: int) -> Callable[[Path], PlanActor]:
    def make(_ws: Path) -> PlanActor:
        def write(request: ModelRequest) -> ModelResponse:
            quota = json.loads(results_of(request)[-1])["quota"]
            return say(
                "Writing it down.",
                call("write_file", path="out/quota.md", content=f"quota: {quota}\n"),
            )

        return PlanActor(
            [
                *[say("Asking for the quota.", call("fetch_quota", account="acme"))] * tries,
                write,
            ]
        )

    return make


RETRY_AFTER = MoreStyle(
    "retry-after",
    "record the account's quota",
    lambda _ws: [file_item("quota", "out/quota.md", "quota: 5000")],
    _quota_actor(2),
    tools=[*FILES, "fetch_quota"],
    extra_tools=_quota_tools(raw=True),
    serve=_serve_limited,
)
#: The tool reports the 429 in its failure's words: tether reads them as a rate limit
#: and retries the call after the delay they name, as it does a raised 429 (the model
#: asks twice, not five times).
RATE_LIMIT_SEEN = MoreStyle(
    "rate-limit-seen",
    "record the account's quota",
    lambda _ws: [file_item("quota", "out/quota.md", "quota: 5000")],
    _quota_actor(2),
    tools=[*FILES, "fetch_quota"],
    extra_tools=_quota_tools(raw=False),
    serve=_serve_limited,
)


# 6. parallel reads: 40 reads in one round, then 80 (64 run, the rest the next round) ---

_NOTES = {f"in/n{k:02}.txt": f"note {k}: value {k * 3}\n" for k in range(100)}


def _parallel_actor(_ws: Path) -> PlanActor:
    def rest(request: ModelRequest) -> ModelResponse:
        done = {m.group(1) for r in results_of(request) for m in re.finditer(r"note (\d+):", r)}
        todo = [k for k in range(100) if str(k) not in done]
        return say(
            f"Reading the {len(todo)} that were not run.",
            *[call("read_file", path=f"in/n{k:02}.txt") for k in todo],
        )

    total = sum(k * 3 for k in range(100))
    return PlanActor(
        [
            say(
                "All the first forty.",
                *[call("read_file", path=f"in/n{k:02}.txt") for k in range(40)],
            ),
            say(
                "And the next sixty, with the first twenty again to be sure.",
                *[call("read_file", path=f"in/n{k:02}.txt") for k in range(40, 100)],
                *[call("read_file", path=f"in/n{k:02}.txt") for k in range(20)],
            ),
            rest,
            say("Sum.", call("write_file", path="out/sum.txt", content=f"sum {total}\n")),
        ]
    )


PARALLEL = MoreStyle(
    "parallel-reads",
    "sum the values of the hundred notes",
    lambda _ws: [file_item("sum", "out/sum.txt", f"sum {sum(k * 3 for k in range(100))}")],
    _parallel_actor,
    files=_NOTES,
)


# 7. revert and redo: an edit that makes it worse, reverted, then done differently ------

_SLUG_CHECK = """\
import slug

for text, want in [("Hello World", "hello-world"), ("  a  b ", "a-b"), ("x", "x")]:
    got = slug.slug(text)
    assert got == want, f"slug({text!r}) = {got!r}, want {want!r}"
print("ok")
"""
_SLUG0 = "def slug(text):\n    return text.lower().replace(' ', '-')\n"
_SLUG_WORSE = "import re\n\ndef slug(text):\n    return re.sub(r'\\s', '-', text)\n"
_SLUG_GOOD = "def slug(text):\n    return '-'.join(text.lower().split())\n"


def _revert_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say("Check first.", call("run_check")),
            say("A regex.", call("write_file", path="slug.py", content=_SLUG_WORSE)),
            say("Better?", call("run_check")),
            say("Worse; reverting.", call("write_file", path="slug.py", content=_SLUG0)),
            say("Back where I was?", call("run_check")),
            say("Reading it once more.", call("read_file", path="slug.py")),
            say(
                "Split and join instead.",
                call("write_file", path="slug.py", content=_SLUG_GOOD),
                call("run_check"),
            ),
        ]
    )


REVERT = MoreStyle(
    "revert-redo",
    "make check_slug.py pass",
    lambda _ws: [command_item("slug", "make check_slug.py pass", f"{PY} check_slug.py")],
    _revert_actor,
    files={"slug.py": _SLUG0, "check_slug.py": _SLUG_CHECK},
    tools=[*EDIT_FILES, "run_check"],
    extra_tools=_check("check_slug.py", "run_check"),
)


# 8. chunked appends: a file built chunk by chunk, the same separator several times -----


def _chunk_actor(_ws: Path) -> PlanActor:
    p = "out/log.md"
    steps: list[Step | ModelResponse] = [
        say("Header.", call("write_file", path=p, content="# Log\n")),
    ]
    for k in range(6):
        steps.append(say("Separator.", call("append_file", path=p, content="\n---\n")))
        steps.append(say(f"Entry {k}.", call("append_file", path=p, content=f"entry {k}: fine\n")))
    steps.append(say("Footer.", call("append_file", path=p, content="END\n")))
    return PlanActor(steps)


CHUNKS = MoreStyle(
    "chunked-appends",
    "write the log",
    lambda _ws: [file_item("log", "out/log.md", "END")],
    _chunk_actor,
)


# 9. back after twenty rounds: starts A, does twelve others, finishes A ----------------


def _away_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = [
        say("Outline of the guide.", call("write_file", path="guide.md", content="# Guide\n"))
    ]
    for k in range(12):
        steps += [
            say(f"Reading topic {k}.", call("read_file", path=f"topics/t{k}.txt")),
            say(f"Page {k}.", call("write_file", path=f"pages/p{k}.md", content=f"# p{k}\nok\n")),
        ]
    steps.append(say("Back to the guide: what pages are there?", call("list_files", path="pages")))
    links = "".join(f"- [p{k}](pages/p{k}.md)\n" for k in range(12))
    steps.append(
        say(
            "The guide, linking every page.",
            call("write_file", path="guide.md", content="# Guide\n\n## Pages\n" + links),
        )
    )
    return PlanActor(steps)


AWAY = MoreStyle(
    "back-after-20",
    "write twelve pages and a guide that links them",
    lambda _ws: [
        file_item("guide", "guide.md", "## Pages"),
        *[file_item(f"p{k}", f"pages/p{k}.md", "ok") for k in range(12)],
    ],
    _away_actor,
    files={f"topics/t{k}.txt": f"topic {k}\n" for k in range(12)},
)


# 10. reverse order: a checklist worked from its end ------------------------------------

REVERSED_N = 24


def _reverse_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = []
    for k in reversed(range(REVERSED_N)):
        steps += [
            say(f"Source {k}.", call("read_file", path=f"src/s{k}.txt")),
            say(f"Output {k}.", call("write_file", path=f"out/o{k}.txt", content=f"o{k} done\n")),
        ]
    return PlanActor(steps)


REVERSE = MoreStyle(
    "reverse-order",
    "produce every output (the last ones need the first ones' sources least)",
    lambda _ws: [file_item(f"o{k}", f"out/o{k}.txt", "done") for k in range(REVERSED_N)],
    _reverse_actor,
    files={f"src/s{k}.txt": f"s{k}\n" for k in range(REVERSED_N)},
)


# 11. across a compaction: long chunks fill the default context; after the summary the --
#     agent re-reads its brief and inputs before going on.

_BRIEF = {
    "brief/goal.txt": "Write out/book.md: six long chapters, then THE END.\n",
    "brief/style.txt": "Plain words.\n",
    "brief/outline.txt": "1 start\n2 middle\n3 end\n",
}


#: Chapters of ~18,000 characters: the history passes a budget of 16,000 tokens (the
#: contract's; the default is larger) before the last one.
CHAPTERS = 6


def _chapter(k: int) -> str:
    return f"\n## Chapter {k}\n\n" + (f"Line {k} of a long chapter, plain words. " * 400) + "\n"


def _compaction_actor(_ws: Path) -> PlanActor:
    p = "out/book.md"
    steps: list[Step | ModelResponse] = [
        say("The goal.", call("read_file", path="brief/goal.txt")),
        say("The style.", call("read_file", path="brief/style.txt")),
        say("The outline.", call("read_file", path="brief/outline.txt")),
        say("Title.", call("write_file", path=p, content="# Book\n")),
    ]
    for k in range(1, CHAPTERS + 1):
        steps.append(say(f"Chapter {k}.", call("append_file", path=p, content=_chapter(k))))
    # The chapters are long: the history went past the budget and was compacted. The
    # summary says where things are; the agent re-reads what it needs to go on.
    steps += [
        say("After the summary: the goal again.", call("read_file", path="brief/goal.txt")),
        say("And the outline.", call("read_file", path="brief/outline.txt")),
        say("And the style.", call("read_file", path="brief/style.txt")),
        say("Where the book is.", call("read_file", path=p, offset=0, limit=200)),
        say("The end.", call("append_file", path=p, content="\nTHE END\n")),
    ]
    return PlanActor(steps)


def _summary(_request: ModelRequest) -> str:
    return "Read the brief; wrote the title and six chapters to out/book.md. Not finished."


COMPACTION = MoreStyle(
    "across-compaction",
    "write the book",
    lambda _ws: [file_item("book", "out/book.md", "THE END")],
    _compaction_actor,
    files=_BRIEF,
    contract={"context": {"input_budget_tokens": 16_000}},
    summary=_summary,
)


# 12. a 150-item checklist, each item in one to three rounds ---------------------------

CHECKLIST_N = 150


def _checklist_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = []
    for k in range(CHECKLIST_N):
        p = f"out/c{k:03}.txt"
        if k % 3 == 1:
            steps.append(say(f"Input {k}.", call("read_file", path=f"in/c{k:03}.txt")))
        if k % 3 == 2:
            steps.append(say(f"Input {k}.", call("read_file", path=f"in/c{k:03}.txt")))
            steps.append(say(f"Item {k} needs the value squared: {k * k}."))
        steps.append(say(f"Item {k}.", call("write_file", path=p, content=f"c{k} {k * k}\n")))
    return PlanActor(steps)


CHECKLIST = MoreStyle(
    "checklist-150",
    "one output per input",
    lambda _ws: [
        file_item(f"c{k:03}", f"out/c{k:03}.txt", f"c{k} {k * k}") for k in range(CHECKLIST_N)
    ],
    _checklist_actor,
    files={f"in/c{k:03}.txt": f"{k}\n" for k in range(CHECKLIST_N)},
)


# 13. clarifier: asks a person mid-way, gets the answer, goes on -----------------------


def _clarifier_actor(_ws: Path) -> PlanActor:
    def use_answer(request: ModelRequest) -> ModelResponse:
        said = [m.content for m in request.messages if m.role == "user" and "TOML" in m.content]
        fmt = "toml" if said else "yaml"
        return say(
            f"They want {fmt}.",
            call("write_file", path=f"out/config.{fmt}", content='[app]\nname = "x"\n'),
        )

    return PlanActor(
        [
            say("The brief.", call("read_file", path="brief.txt")),
            say(
                "The brief does not say the format.\nNEED_HELP: should the config be YAML or TOML?"
            ),
            use_answer,
            say("Reading it back.", call("read_file", path="out/config.toml")),
            say(
                "Marking it reviewed.",
                call("append_file", path="out/config.toml", content="# ok\n"),
            ),
        ]
    )


CLARIFIER = MoreStyle(
    "clarifier",
    "write the app config in the format the owner wants",
    lambda _ws: [file_item("config", "out/config.toml", "# ok")],
    _clarifier_actor,
    files={"brief.txt": "write the app config (name x)\n"},
    answers=("TOML, please.",),
)


# 14. recovering from tool errors: a missing file, then created; a bad path fixed ------


def _recover_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say("The changelog.", call("read_file", path="CHANGELOG.md")),
            say("Maybe under docs?", call("read_file", path="docs/CHANGELOG.md")),
            say("What is there?", call("list_files", path=".")),
            say(
                "There is none; creating it.",
                call("write_file", path="CHANGELOG.md", content="# Changelog\n"),
            ),
            say("Now it reads.", call("read_file", path="CHANGELOG.md")),
            say(
                "The entry.",
                call("append_file", path="CHANGELOG.md", content="\n## 1.0\n- first release\n"),
            ),
        ]
    )


RECOVER = MoreStyle(
    "recovers-errors",
    "add the 1.0 entry to the changelog",
    lambda _ws: [file_item("log", "CHANGELOG.md", "## 1.0")],
    _recover_actor,
    files={"README.md": "# app\n"},
)


# 15. shared file: every item adds its section to one changelog ------------------------


def _changelog_actor(_ws: Path) -> PlanActor:
    p = "CHANGELOG.md"
    steps: list[Step | ModelResponse] = [
        say("The file.", call("write_file", path=p, content="# Changes\n")),
    ]
    for k in range(4):
        steps.append(
            say(f"v{k}.", call("append_file", path=p, content=f"\n## v{k}\n- change {k}\n"))
        )
    return PlanActor(steps)


SHARED_FILE = MoreStyle(
    "shared-changelog",
    "one changelog section per release",
    lambda _ws: [file_item(f"v{k}", "CHANGELOG.md", f"## v{k}") for k in range(4)],
    _changelog_actor,
)


STYLES: dict[str, MoreStyle] = {
    s.name: s
    for s in (
        DEEP_READER,
        SIX_ERRORS,
        STUBBORN,
        LONG_POLLER,
        RETRY_AFTER,
        RATE_LIMIT_SEEN,
        PARALLEL,
        REVERT,
        CHUNKS,
        AWAY,
        REVERSE,
        COMPACTION,
        CHECKLIST,
        CLARIFIER,
        RECOVER,
        SHARED_FILE,
    )
}


# --- liars ------------------------------------------------------------------------------


def liar_of(style: MoreStyle) -> MoreStyle:
    """The style's liar twin: every round but the one that finishes the work, then a
    claim in words that it is finished."""

    def actor(ws: Path) -> PlanActor:
        steps = style.actor(ws).steps[:-1]
        steps.append(lambda _r: say("All done: every item is finished and verified."))
        return PlanActor(steps)

    return replace(style, name=f"{style.name}-liar", actor=actor)


class EndlessActor(PlanActor):
    """Plays its rounds, then one round again and again."""

    def __init__(self, steps: Sequence[Step], again: Step) -> None:
        super().__init__(steps)
        self.again = again

    def __call__(self, request: ModelRequest) -> ModelResponse:
        if self.rounds < len(self.steps):
            return super().__call__(request)
        self.rounds += 1
        return self.again(request)


def endless_of(style: MoreStyle, keep: int, repeat: int) -> MoreStyle:
    """The style's first `keep` rounds, then its round `repeat` again and again: a job
    that never finishes, a bug never fixed, re-reading forever."""

    def actor(ws: Path) -> PlanActor:
        steps = style.actor(ws).steps
        return EndlessActor(steps[:keep], steps[repeat])

    return replace(style, name=f"{style.name}-endless", actor=actor)


def claiming_judge(request: ModelRequest) -> str:
    """A judge that believes the agent: every open item done, citing the round's ops."""
    data = json.loads(request.messages[0].content)
    ok = [o["evidence_ref"] for o in data.get("op_journal", []) if o["status"] == "succeeded"]
    changes = [
        {"item": i["id"], "status": "done", "evidence": ok, "note": "the agent says so"}
        for i in data["ledger"]["items"]
    ]
    return json.dumps({"changes": changes, "decision": "satisfied", "reason": "it says done"})


ALL_JUDGES: dict[str, Callable[[ModelRequest], str] | None] = {
    **JUDGES,
    "claiming": claiming_judge,
}


# --- running one ------------------------------------------------------------------------


async def run_more(
    style: MoreStyle,
    judge: str,
    store: Store,
    ws: Path,
    *,
    on_approval: Callable[[Store, str], Awaitable[bool]] | None = None,
    **engine_opts: Any,
) -> Outcome:
    """Run `style` with `judge` in `ws` on `store`; answer its questions as a person would
    (`tell`), and its approval requests with `on_approval` (False: nothing to answer),
    then run it on: what happened."""
    style.setup(ws)
    spec = style.spec(ws)
    actor = style.actor(ws)
    policy = ALL_JUDGES[judge]
    purposes: dict[str, Callable[[ModelRequest], Any]] = {"act": actor}
    if style.summary is not None:
        purposes["compact"] = style.summary
    model = ScriptedModel(policy=by_purpose(**purposes), name="actor")
    judge_model = (
        ScriptedModel(policy=by_purpose(judge=policy), name=f"{judge}-judge")
        if policy is not None
        else None
    )
    compact = model if style.summary is not None else None
    answers = list(style.answers)
    with style.serve(ws):
        registry = registry_with(store, style.extra_tools(ws))

        async def go(task_id: str | None) -> tuple[str, Any]:
            return await run_task(
                store,
                spec,
                ws,
                model,
                judge=judge_model,
                compact=compact,
                registry=registry,
                task_id=task_id,
                **engine_opts,
            )

        tid, result = await go(None)
        while result.status == "waiting":
            kind = (result.waiting or {}).get("kind")
            if kind == "human" and answers:
                await tell(store, tid, answers.pop(0))
            elif not (kind == "approval" and on_approval and await on_approval(store, tid)):
                break
            tid, result = await go(tid)
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


async def _table(names: Sequence[str] = ()) -> None:
    import tempfile

    from tether.store.memory import MemoryStore

    for style in STYLES.values():
        if names and style.name not in names:
            continue
        for judge in JUDGES:
            with tempfile.TemporaryDirectory() as tmp:
                store = await MemoryStore.open()
                outcome = await run_more(style, judge, store, Path(tmp))
                print(outcome.row(), flush=True)


if __name__ == "__main__":
    import asyncio
    import sys

    asyncio.run(_table(sys.argv[1:]))
