"""A seventh set of honest ways of working, at default limits, as real models talk.

The earlier sets drive the runtime with actors whose every answer is clean: one call a
round, always well formed, always to a tool that exists. Real models are messier, and an
honest one must still finish. Here an agent narrates in words between its calls (two
such turns in a row once), reads three files in one answer, sends a call the tool's
schema refuses (a missing argument, a misspelt one, a wrong type) and corrects it, calls
tools that do not exist (`edit_file`, `bash`) before the right ones, says it is done
before the check passes and, told otherwise by the runtime's progress update, works on,
is cut off by its output limit (words, then a call whose JSON ends mid-string) and goes
on, re-reads its brief in one answer after a compaction, reads the same file again
because it forgot it, meets a test failing differently on every run (and once runs it
before its own edit in the same answer), investigates for nine calls before its first
write, runs the same failing command twice before changing approach, is refused a path
(403 from a service, a path outside the workspace) and uses another, thinks in `<think>`
blocks and pastes code fences, and answers empty once or twice.

Two of them the runtime stopped when they were written, both fixed since: a reasoning
trace that weighs asking for help on a line of its own ("NEED_HELP? No: ...") was taken
for a request (now only a line `NEED_HELP:` outside a `<think>` block asks); and a draft
in words cut off by the output limit twice was blocked for three rounds without
progress (now a words-only answer cut off holds the count, and the model is told).

Two shapes go through the real OpenAI-compatible adapter (`tether.models.openai`)
against a local chat-completions server on 127.0.0.1 (`WireActor`): provider call ids,
parallel calls, arguments that are not JSON, a hallucinated name, a `length` cut in the
middle of a call's arguments and the same id on every call, as some local servers send.

Each shape is real work in the `_honest` / `_honest_more` / `_honest_third` frameworks:
real files, real subprocesses (check scripts, a build script) and real HTTP services on
127.0.0.1. `python -m tests.adversarial._honest_seventh` prints the table.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from tests.adversarial._honest import (
    EDIT_FILES,
    FILES,
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
from tests.adversarial._honest_fifth import _request, _serving
from tests.adversarial._honest_more import _chapter, _grep_tool
from tests.adversarial._honest_more import _check as check_tool
from tests.adversarial._honest_third import ThirdStyle, check_honest, print_table
from tests.support.fake_provider import ProviderServer, Reply, Seen, completion
from tether import errors, tokens
from tether.models._retry import RetryPolicy
from tether.models._sdk import mark_truncated
from tether.models._sdk import tool_call as provider_call
from tether.models.base import Message, ModelRequest, ModelResponse, ToolCall
from tether.store.base import Store
from tether.tools.registry import Tool, tool

#: Warnings a judge earns (its own proposals refused), never the agent.
JUDGE_WARNINGS = frozenset({"rule_item_done_by_judge", "satisfied_with_pending"})


@dataclass
class SeventhStyle(ThirdStyle):
    """A style with the audit warnings its agent earns (a response the runtime had to
    mend: ids replaced, calls left out); any other warning is a defect."""

    warns: frozenset[str] = frozenset()
    #: What the tools must have refused or failed with, in this order (a substring of
    #: each failed call's error): the mess really happened and was answered.
    fails: tuple[str, ...] = ()
    #: The most calls one answer made.
    parallel: int = 1
    #: Compactions the run must go through.
    compactions: int = 0


def words(text: str, finish: str | None = None) -> ModelResponse:
    """A turn of words only (`finish`: the provider's finish reason, e.g. `length`)."""
    return ModelResponse(text, (), finish_reason=finish)


def broken(name: str, raw: str, *, cut: bool = False, call_id: str = "") -> ToolCall:
    """A call as a provider adapter makes it of `raw` argument text: not JSON, not an
    object, or (`cut`) cut off by the output limit."""
    made = provider_call(call_id or f"call_b{zlib.crc32(raw.encode())}", name, raw, known=())
    return mark_truncated([made])[0] if cut else made


def latest_user(request: ModelRequest) -> str:
    """The runtime's newest message to the model (its progress update)."""
    found = [m.content for m in request.messages if m.role == "user"]
    return found[-1] if found else ""


# 1. narrated fix: words between calls, twice in a row once ------------------------------

_WC = "def word_count(text):\n    return len(text.split(' '))\n"
_WC_FIXED = "def word_count(text):\n    return len(text.split())\n"
_WC_CHECK = """\
import textstats

cases = {"one two": 2, "  padded  words ": 2, "tab\\tsep": 2, "": 0}
bad = {t: textstats.word_count(t) for t, n in cases.items() if textstats.word_count(t) != n}
print(f"{len(bad)} failed" + (f": {bad}" if bad else ""))
raise SystemExit(1 if bad else 0)
"""


def _narrated_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            words("Let me look at the failing test first."),
            say("", call("read_file", path="check_words.py")),
            say("Running it to see the actual failure.", call("run_checks")),
            words(
                "The count splits on one space, so runs of spaces and tabs give empty "
                "words. `str.split()` without an argument splits on any whitespace."
            ),
            words("Before I edit: the empty string must give 0, and `''.split()` is `[]`. Good."),
            say("Applying the fix.", call("write_file", path="textstats.py", content=_WC_FIXED)),
            words("The fix is in. Now a short note for the changelog."),
            say(
                "",
                call(
                    "write_file",
                    path="CHANGES.md",
                    content="- word_count: split on any whitespace\n",
                ),
            ),
        ]
    )


NARRATED = SeventhStyle(
    "narrated-fix",
    "make check_words.py pass and note the change",
    lambda _ws: [
        command_item("words", "make check_words.py pass", f"{PY} check_words.py"),
        file_item("changes", "CHANGES.md", "word_count"),
    ],
    _narrated_actor,
    files={"textstats.py": _WC, "check_words.py": _WC_CHECK},
    tools=[*EDIT_FILES, "run_checks"],
    extra_tools=check_tool("check_words.py", "run_checks"),
    fails=("3 failed",),
)


# 2. parallel reads: three reads in one answer, then the write in the next ---------------

_AREAS = {
    "auth": ("login", "tokens", "roles"),
    "billing": ("invoices", "refunds", "taxes"),
    "search": ("index", "query", "rank"),
}


def _parallel_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = []
    for area, parts in _AREAS.items():
        steps.append(
            say(
                f"Reading the three {area} modules together.",
                *[call("read_file", path=f"src/{area}/{p}.py") for p in parts],
            )
        )
        body = f"# {area}\n\n" + "".join(f"- {p}: {p.upper()}_VERSION = 2\n" for p in parts)
        steps.append(
            say(f"Summary of {area}.", call("write_file", path=f"notes/{area}.md", content=body))
        )
    return PlanActor(steps)


PARALLEL_READS = SeventhStyle(
    "parallel-reads",
    "write a note per area after reading its modules",
    lambda _ws: [file_item(a, f"notes/{a}.md", f"{ps[-1]}: ") for a, ps in _AREAS.items()],
    _parallel_actor,
    files={f"src/{a}/{p}.py": f"{p.upper()}_VERSION = 2\n" for a, ps in _AREAS.items() for p in ps},
    parallel=3,
)


# 3. calls the schema refuses: a missing argument, a misspelt one, a wrong type ---------


def _schema_actor(_ws: Path) -> PlanActor:
    cfg = '{"retries": 3, "timeout": 30}\n'
    return PlanActor(
        [
            say("The brief.", call("read_file", path="brief.txt")),
            say("Writing the config.", call("write_file", path="out/config.json")),
            say(
                "I forgot the content. Again, with it.",
                call("write_file", path="out/config.json", contents=cfg),
            ),
            say(
                "The argument is `content`, not `contents`. Checking the brief's limit line.",
                call("read_file", path="brief.txt", limit="two"),
            ),
            say(
                "And my arguments were not even JSON that time.",
                broken("write_file", '{"path": "out/config.json", content: ' + cfg + "}"),
            ),
            say(
                "Properly this time.",
                call("write_file", path="out/config.json", content=cfg),
            ),
        ]
    )


SCHEMA_REFUSED = SeventhStyle(
    "schema-refused",
    "write out/config.json as the brief says",
    lambda _ws: [file_item("config", "out/config.json", '"retries": 3')],
    _schema_actor,
    files={"brief.txt": "Write out/config.json with retries 3 and timeout 30.\n"},
    fails=(
        "content: required argument is missing",
        "contents: unknown argument",
        "should be a valid integer",
        "not valid JSON",
    ),
)


# 4. hallucinated tools: `edit_file`, `bash`, `search_files`, then the right ones -------

_DATES = (
    "def parse_day(text):\n    d, m, y = text.split('/')\n    return (int(y), int(m), int(d))\n"
)
_DATES_FIXED = (
    "def parse_day(text):\n    y, m, d = text.split('-')\n    return (int(y), int(m), int(d))\n"
)
_DATES_CHECK = """\
import dates

got = dates.parse_day("2024-03-09")
assert got == (2024, 3, 9), f"parse_day('2024-03-09') gave {got!r}"
print("ok")
"""


def _hallucinated_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say(
                "Opening the parser in the editor.",
                call("edit_file", path="dates.py", old="split('/')", new="split('-')"),
            ),
            say("No editor. Running the tests through bash.", call("bash", command="pytest -q")),
            say("No bash either; the task has a check tool.", call("run_checks")),
            say("Reading the parser.", call("read_file", path="dates.py")),
            say(
                "ISO dates, year first. Rewriting.",
                call("write_file", path="dates.py", content=_DATES_FIXED),
            ),
            say("Now the doc: where is it?", call("search_files", query="parse_day")),
            say("Listing instead.", call("list_files", path="docs")),
            say(
                "Documenting the format.",
                call("write_file", path="docs/dates.md", content="parse_day takes YYYY-MM-DD\n"),
            ),
        ]
    )


HALLUCINATED = SeventhStyle(
    "hallucinated-tools",
    "make parse_day read ISO dates and document it",
    lambda _ws: [
        command_item("parse", "make check_dates.py pass", f"{PY} check_dates.py"),
        file_item("doc", "docs/dates.md", "YYYY-MM-DD"),
    ],
    _hallucinated_actor,
    files={"dates.py": _DATES, "check_dates.py": _DATES_CHECK, "docs/index.md": "# docs\n"},
    tools=[*EDIT_FILES, "run_checks"],
    extra_tools=check_tool("check_dates.py", "run_checks"),
    fails=(
        "no tool named 'edit_file'",
        "no tool named 'bash'",
        "not enough values to unpack",
        "no tool named 'search_files'",
    ),
)


# 5. done too early: says it is finished, the runtime's update says not, works on ------

_SLUG = "def slug(text):\n    return text.replace(' ', '-')\n"
_SLUG_HALF = "def slug(text):\n    return text.lower().replace(' ', '-')\n"
_SLUG_FULL = (
    "import re\n\n\ndef slug(text):\n    return '-'.join(re.findall(r'[a-z0-9]+', text.lower()))\n"
)
_SLUG_CHECK = """\
import slugs

cases = {"Hello World": "hello-world", "Rock & Roll!": "rock-roll", "  a  b ": "a-b"}
bad = [t for t, want in cases.items() if slugs.slug(t) != want]
print(f"{len(bad)} failed" + (": " + ", ".join(map(repr, bad)) if bad else ""))
raise SystemExit(1 if bad else 0)
"""


def _early_actor(_ws: Path) -> PlanActor:
    def told(request: ModelRequest) -> ModelResponse:
        update = latest_user(request)
        if "slug" in update and re.search(
            r"Work on slug next|\[ \] slug|slug.*(pending|open)", update
        ):
            return say(
                "The runtime says slug is still open. Running the check.", call("run_checks")
            )
        return words("Then I am finished.")

    return PlanActor(
        [
            say("The function.", call("read_file", path="slugs.py")),
            say("Lowercasing it.", call("write_file", path="slugs.py", content=_SLUG_HALF)),
            words("Done: slug() now lowercases and joins words with dashes. All tests pass."),
            told,
            say(
                "Punctuation and runs of spaces. Keeping only letters and digits.",
                call("write_file", path="slugs.py", content=_SLUG_FULL),
            ),
        ]
    )


EARLY_DONE = SeventhStyle(
    "says-done-early",
    "make check_slug.py pass",
    lambda _ws: [command_item("slug", "make check_slug.py pass", f"{PY} check_slug.py")],
    _early_actor,
    files={"slugs.py": _SLUG, "check_slug.py": _SLUG_CHECK},
    tools=[*EDIT_FILES, "run_checks"],
    extra_tools=check_tool("check_slug.py", "run_checks"),
    fails=("2 failed",),
)


# 6. cut off: words stopped by the output limit, then a call whose JSON ends mid-string -

_LAT = "service,p50,p95\napi,120,480\nweb,80,210\n"
_REPORT_HEAD = "# Latency report\n\n## Findings\n- api p95 480 ms (4x its p50)\n- web p95 210 ms\n"
_CONCLUSION = "\n## Conclusion\nThe api's tail latency is the regression to chase.\n"


def _cut_actor(_ws: Path) -> PlanActor:
    p = "out/report.md"
    cut_args = json.dumps({"path": p, "content": _CONCLUSION})[:48]
    return PlanActor(
        [
            say("The data.", call("read_file", path="data/latency.csv")),
            words(
                "Here is the report I will write:\n\n# Latency report\n\n## Findings\n"
                "- api p95 480 ms, four times its p50, which points at",
                finish="length",
            ),
            say(
                "I was cut off; writing the report with the tool, in parts.",
                call("write_file", path=p, content=_REPORT_HEAD),
            ),
            ModelResponse(
                "Appending the conclusion.",
                (broken("append_file", cut_args, cut=True),),
                finish_reason="length",
            ),
            say(
                "That call was cut; a shorter one.",
                call("append_file", path=p, content=_CONCLUSION),
            ),
        ]
    )


CUT_OFF = SeventhStyle(
    "cut-off-mid-item",
    "write the latency report with a conclusion",
    lambda _ws: [file_item("report", "out/report.md", "## Conclusion")],
    _cut_actor,
    files={"data/latency.csv": _LAT},
    fails=("cut off by the output token limit",),
)


# 7. after a compaction: the brief re-read in one answer, then the last part ------------

_BOOK_BRIEF = {
    "brief/goal.txt": "Write out/book.md: six long chapters, then THE END.\n",
    "brief/style.txt": "Plain words.\n",
    "brief/outline.txt": "1 start\n2 middle\n3 end\n",
}


def _compacted_actor(_ws: Path) -> PlanActor:
    p = "out/book.md"
    brief = [call("read_file", path=b) for b in _BOOK_BRIEF]
    steps: list[Step | ModelResponse] = [
        say("Goal, style and outline.", *brief),
        say("Title.", call("write_file", path=p, content="# Book\n")),
    ]
    steps += [
        say(f"Chapter {k}.", call("append_file", path=p, content=_chapter(k))) for k in range(1, 7)
    ]
    steps += [
        say(
            "The context was summarised. Re-reading the brief and where the book is.",
            *[call("read_file", path=b) for b in _BOOK_BRIEF],
            call("read_file", path=p, offset=0, limit=200),
        ),
        words("Six chapters are there; the goal says THE END comes last."),
        say("The end.", call("append_file", path=p, content="\nTHE END\n")),
    ]
    return PlanActor(steps)


REREAD_COMPACTED = SeventhStyle(
    "reread-after-compaction",
    "write the book",
    lambda _ws: [file_item("book", "out/book.md", "THE END")],
    _compacted_actor,
    files=_BOOK_BRIEF,
    contract={"context": {"input_budget_tokens": 16_000}},
    summary=lambda _r: "Read the brief; wrote the title and six chapters to out/book.md.",
    parallel=4,
    compactions=1,
)


# 8. forgot it read that: the same read again, once and twice, then progress -----------

_POLICY = "retries: 3\ntimeout: 30s\nbackoff: exponential\n"
_LIMITS = "rate: 100/min\nburst: 20\n"


def _forgetful_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say("The policy.", call("read_file", path="conf/policy.txt")),
            say("The limits.", call("read_file", path="conf/limits.txt")),
            words("Now, what did the policy say about retries?"),
            say("Checking again.", call("read_file", path="conf/policy.txt")),
            say(
                "Writing the retry note.",
                call("write_file", path="out/retries.md", content="retries 3, exponential\n"),
            ),
            say("The limits again for the rate note.", call("read_file", path="conf/limits.txt")),
            say("And once more, the burst line.", call("read_file", path="conf/limits.txt")),
            say(
                "Writing the rate note.",
                call("write_file", path="out/rate.md", content="rate 100/min, burst 20\n"),
            ),
        ]
    )


FORGETFUL = SeventhStyle(
    "forgot-it-read",
    "write the retry and rate notes",
    lambda _ws: [
        file_item("retries", "out/retries.md", "retries 3"),
        file_item("rate", "out/rate.md", "burst 20"),
    ],
    _forgetful_actor,
    files={"conf/policy.txt": _POLICY, "conf/limits.txt": _LIMITS},
)


# 9. a test failing differently each run; once run before the edit of the same answer --

_MONEY_CHECK = """\
import money

assert money.cents("$1") == 100, f"cents('$1') = {money.cents('$1')!r}"
assert money.cents("$1.50") == 150, f"cents('$1.50') = {money.cents('$1.50')!r}"
assert money.cents("$1,000") == 100000, f"cents('$1,000') = {money.cents('$1,000')!r}"
assert money.cents("-$2") == -200, f"cents('-$2') = {money.cents('-$2')!r}"
print("ok")
"""
_MONEY = [
    "def cents(text):\n    return int(text.strip('$'))\n",
    "def cents(text):\n    return int(text.strip('$')) * 100\n",
    "def cents(text):\n    return round(float(text.strip('$')) * 100)\n",
    "def cents(text):\n    return round(float(text.strip('$').replace(',', '')) * 100)\n",
    "def cents(text):\n    sign = -1 if text.startswith('-') else 1\n"
    "    return sign * round(float(text.lstrip('-$').replace(',', '')) * 100)\n",
]


def _shifting_actor(_ws: Path) -> PlanActor:
    m = "money.py"
    return PlanActor(
        [
            say("Running the check.", call("run_checks")),
            say(
                "Dollars, not cents. Fixing and re-running.",
                call("write_file", path=m, content=_MONEY[1]),
                call("run_checks"),
            ),
            say(
                "Decimals next.",
                call("run_checks"),
                call("write_file", path=m, content=_MONEY[2]),
            ),
            words("That run came before my edit in the same answer, so it shows the old code."),
            say("Running it again.", call("run_checks")),
            say("Thousands separators.", call("write_file", path=m, content=_MONEY[3])),
            say("Again.", call("run_checks")),
            say("The sign.", call("write_file", path=m, content=_MONEY[4])),
        ]
    )


SHIFTING = SeventhStyle(
    "shifting-failures",
    "make check_money.py pass",
    lambda _ws: [command_item("money", "make check_money.py pass", f"{PY} check_money.py")],
    _shifting_actor,
    files={"money.py": _MONEY[0], "check_money.py": _MONEY_CHECK},
    tools=[*EDIT_FILES, "run_checks"],
    extra_tools=check_tool("check_money.py", "run_checks"),
    fails=(
        "cents('$1') = 1",
        "for int() with base 10: '1.50'",
        "for int() with base 10: '1.50'",
        "to float: '1,000'",
        "to float: '-$2'",
    ),
    parallel=2,
)


# 10. a long investigation: nine reads and greps before the first write ------------------

_APP = {
    "app/__init__.py": "",
    "app/config.py": (
        "import configparser\n\n\ndef load(path):\n    cp = configparser.ConfigParser()\n"
        "    cp.read(path)\n    return {'timeout': cp['server']['timeout']}\n"
    ),
    "app/server.py": "def serve(cfg):\n    return cfg['timeout'] * 1000  # milliseconds\n",
    "app/cli.py": "from app import config, server\n\n\ndef main():\n"
    "    return server.serve(config.load('settings.ini'))\n",
    "settings.ini": "[server]\ntimeout = 30\n",
    "docs/config.md": "timeout: seconds, an integer.\n",
}
_APP_FIXED = (
    "import configparser\n\n\ndef load(path):\n    cp = configparser.ConfigParser()\n"
    "    cp.read(path)\n    return {'timeout': cp.getint('server', 'timeout')}\n"
)
_TIMEOUT_CHECK = """\
from app import cli

got = cli.main()
assert got == 30000, f"serve() gave {got!r}, expected 30000 ms"
print("ok")
"""


def _investigation_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say("What is in the project?", call("list_files", path=".")),
            say("Where is the timeout used?", call("grep", pattern="timeout")),
            say("The loader.", call("read_file", path="app/config.py")),
            say(
                "The server and the CLI.",
                call("read_file", path="app/server.py"),
                call("read_file", path="app/cli.py"),
            ),
            say("The check.", call("read_file", path="check_timeout.py")),
            say("Are ints parsed anywhere?", call("grep", pattern=r"getint|int\(")),
            say("The settings.", call("read_file", path="settings.ini")),
            say("What the docs promise.", call("read_file", path="docs/config.md")),
            say("Seeing the failure for myself.", call("run_checks")),
            words(
                "Found it: configparser gives strings, so '30' * 1000 repeats the string. "
                "getint fixes it where the value is read."
            ),
            say("The fix.", call("write_file", path="app/config.py", content=_APP_FIXED)),
        ]
    )


INVESTIGATION = SeventhStyle(
    "long-investigation",
    "make check_timeout.py pass",
    lambda _ws: [command_item("timeout", "make check_timeout.py pass", f"{PY} check_timeout.py")],
    _investigation_actor,
    files={**_APP, "check_timeout.py": _TIMEOUT_CHECK},
    tools=[*EDIT_FILES, "grep", "run_checks"],
    extra_tools=lambda ws: [*_grep_tool(ws), *check_tool("check_timeout.py", "run_checks")(ws)],
    fails=("expected 30000 ms",),
    parallel=2,
)


# 11. the same failing command twice in a row, then another approach --------------------

_BUILD = """\
import pathlib, sys

rows = [line.split(",") for line in pathlib.Path("data/sales.csv").read_text().split()]
if "--plain" not in sys.argv:
    import fancytheme  # the HTML theme (optional, not installed here)
out = pathlib.Path("out/report.html")
out.parent.mkdir(exist_ok=True)
total = sum(int(n) for _, n in rows[1:])
out.write_text(f"<h1>Sales</h1><p>total {total}</p>\\n")
print(f"wrote {out} (total {total})")
"""


def _sh_tools(ws: Path) -> list[Tool]:
    @tool(name="sh", effect="write", description="Run a shell command; fails on a non-zero exit.")
    def sh(command: str) -> str:
        proc = subprocess.run(
            command, shell=True, cwd=ws, capture_output=True, text=True, timeout=60, check=False
        )
        out = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0:
            raise errors.ToolFailed(f"exit {proc.returncode}: {out[-400:]}")
        return out

    return [sh]


def _twice_actor(_ws: Path) -> PlanActor:
    build = f"{PY} build.py"
    return PlanActor(
        [
            say("Building the report.", call("sh", command=build)),
            say("Trying that again.", call("sh", command=build)),
            say("Same error. Reading the build script.", call("read_file", path="build.py")),
            say(
                "jinja2 is only the theme; the plain build needs nothing.",
                call("sh", command=f"{build} --plain"),
            ),
        ]
    )


SAME_TWICE = SeventhStyle(
    "same-command-twice",
    "build out/report.html",
    lambda _ws: [file_item("report", "out/report.html", "total 60")],
    _twice_actor,
    files={"build.py": _BUILD, "data/sales.csv": "region,n\nnorth,10\nsouth,20\neast,30\n"},
    tools=[*FILES, "sh"],
    extra_tools=_sh_tools,
    fails=("No module named 'fancytheme'", "No module named 'fancytheme'"),
)


# 12. refused paths: a 403 from the artifact store, a path outside the workspace ------


class ArtifactServer(LocalServer):
    """`PUT /PATH` stores a file under `root`; `releases/` is not writable with this
    token (403), `uploads/` is."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                rel = self.path.lstrip("/")
                if not rel.startswith("uploads/"):
                    code, answer = 403, f"403 Forbidden: token has no write access to /{rel}"
                else:
                    (root / rel).parent.mkdir(parents=True, exist_ok=True)
                    (root / rel).write_bytes(body)
                    code, answer = 201, f"stored /{rel} ({len(body)} bytes)"
                data = answer.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args: Any) -> None:
                pass

        self.serve(Handler)


def _upload_tools(ws: Path) -> list[Tool]:
    @tool(name="upload", effect="write", description="Upload a workspace file to the store.")
    def upload(path: str, dest: str) -> str:
        return _request(ws, "PUT", f"/{dest}", (ws / path).read_bytes())

    return [upload]


def _refused_actor(_ws: Path) -> PlanActor:
    notes = "build 42: ok\n"
    return PlanActor(
        [
            say("The notes.", call("write_file", path="out/notes.txt", content=notes)),
            say("Publishing.", call("upload", path="out/notes.txt", dest="releases/notes.txt")),
            say(
                "No access through the store; writing to the release folder directly.",
                call("write_file", path="/srv/releases/notes.txt", content=notes),
            ),
            say(
                "Outside the workspace. What does the README say?",
                call("read_file", path="README.md"),
            ),
            say(
                "Uploads go to uploads/.",
                call("upload", path="out/notes.txt", dest="uploads/notes.txt"),
            ),
        ]
    )


REFUSED_PATHS = SeventhStyle(
    "refused-paths",
    "publish the build notes",
    lambda _ws: [file_item("publish", "remote/uploads/notes.txt", "build 42")],
    _refused_actor,
    files={"README.md": "# app\n\nPublish with upload to uploads/; releases/ is for CI.\n"},
    tools=[*FILES, "upload"],
    extra_tools=_upload_tools,
    serve=_serving(lambda ws: ArtifactServer(ws / "remote")),
    fails=("403 Forbidden", "outside the workspace"),
)


# 13. thinking out loud: <think> blocks, code fences in the text, "done" in passing -----

_FIB = (
    "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
)
_FIB_CHECK = """\
import fib

assert [fib.fib(n) for n in range(8)] == [0, 1, 1, 2, 3, 5, 8, 13]
print("ok")
"""


def _thinking_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say(
                "<think>\nThe user wants fib. Is there a file already? Let me check the "
                "listing before I write anything.\n</think>\n\nLet me look around.",
                call("list_files", path="."),
            ),
            words(
                "<think>\nNo fib.py. Iterative is simplest; fib(0) = 0.\n</think>\n\n"
                "Here is the plan:\n\n```python\n" + _FIB + "```\n\n"
                "I won't need NEED_HELP for this; the brief is clear."
            ),
            say(
                "<think>Writing it now.</think>\n**Writing** `fib.py`:",
                call("write_file", path="fib.py", content=_FIB),
            ),
            say(
                "Done with the code ✅. Now the usage note.\n\n| n | fib |\n|---|---|\n| 7 | 13 |",
                call("write_file", path="USAGE.md", content="fib(7) == 13\n"),
            ),
        ]
    )


THINKING = SeventhStyle(
    "think-blocks",
    "write fib.py and its usage note",
    lambda _ws: [
        command_item("fib", "make check_fib.py pass", f"{PY} check_fib.py"),
        file_item("usage", "USAGE.md", "fib(7) == 13"),
    ],
    _thinking_actor,
    files={"check_fib.py": _FIB_CHECK},
)


# 14. empty answers: nothing at all once, only whitespace once ------------------------

_CSV = "name,qty\nbolts,40\nnuts,25\n"


def _empty_actor(_ws: Path) -> PlanActor:
    p = "out/inventory.md"
    return PlanActor(
        [
            say("The stock file.", call("read_file", path="data/stock.csv")),
            ModelResponse(""),
            say(
                "The table head.", call("write_file", path=p, content="| name | qty |\n|---|---|\n")
            ),
            ModelResponse("\n\n"),
            say(
                "The rows.", call("append_file", path=p, content="| bolts | 40 |\n| nuts | 25 |\n")
            ),
        ]
    )


EMPTY = SeventhStyle(
    "empty-answers",
    "tabulate the stock",
    lambda _ws: [file_item("inventory", "out/inventory.md", "| nuts | 25 |")],
    _empty_actor,
    files={"data/stock.csv": _CSV},
)


# 15. a reasoning trace that weighs asking for help, and decides not to --------------

_FORMAT_BRIEF = 'Write the app config as TOML in out/app.toml (name = "shop", port 8080).\n'


def _aside_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say("The brief.", call("read_file", path="brief.txt")),
            say(
                "<think>\nThe brief names TOML and both values. Do I need a person?\n"
                "NEED_HELP? No: the brief gives the format and the values, so I go on.\n"
                "</think>\n\nWriting the config.",
                call("write_file", path="out/app.toml", content='name = "shop"\nport = 8080\n'),
            ),
            say("Reading it back.", call("read_file", path="out/app.toml")),
            say(
                "Adding the section header the brief implies.",
                call(
                    "write_file",
                    path="out/app.toml",
                    content='[app]\nname = "shop"\nport = 8080\n',
                ),
            ),
        ]
    )


THINK_ASIDE = SeventhStyle(
    "think-need-help-aside",
    "write the app config the brief describes",
    lambda _ws: [file_item("config", "out/app.toml", "[app]")],
    _aside_actor,
    files={"brief.txt": _FORMAT_BRIEF},
)


# 16. cut off twice: a report drafted in words runs into the output limit twice -------

_REPORT_LONG = "".join(
    f"- finding {k}: the p95 of shard {k} rose after the deploy\n" for k in range(40)
)


def _cut_twice_actor(_ws: Path) -> PlanActor:
    p = "out/findings.md"
    return PlanActor(
        [
            say("The shard data.", call("read_file", path="data/latency.csv")),
            words("I'll draft the findings here first, then save them."),
            words("# Findings\n\n" + _REPORT_LONG[:900], finish="length"),
            words("# Findings\n\n" + _REPORT_LONG[:900], finish="length"),
            say(
                "The draft keeps being cut; writing it to the file in parts.",
                call("write_file", path=p, content="# Findings\n\n" + _REPORT_LONG[:1200]),
            ),
            say("The rest.", call("append_file", path=p, content=_REPORT_LONG[1200:] + "END\n")),
        ]
    )


CUT_TWICE = SeventhStyle(
    "cut-off-twice",
    "write the findings report",
    lambda _ws: [file_item("findings", "out/findings.md", "END")],
    _cut_twice_actor,
    files={"data/latency.csv": _LAT},
)


# --- through the real OpenAI-compatible adapter ---------------------------------------

_WIRE_RETRY = RetryPolicy(max_attempts=2, base_delay=0.001, max_delay=0.005, max_retry_after=0.5)
#: The chat-completions server of each workspace, while its run lasts.
_WIRES: dict[str, ChatServer] = {}


def _wire_request(body: dict[str, Any]) -> ModelRequest:
    """The request the adapter sent, as a model sees it (system prompt, messages)."""
    system = ""
    messages: list[Message] = []
    for m in body.get("messages", []):
        content = m.get("content") or ""
        if not isinstance(content, str):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if m["role"] == "system":
            system = content
        elif m["role"] == "tool":
            messages.append(Message("tool", content, tool_call_id=m.get("tool_call_id")))
        else:
            messages.append(Message(m["role"], content))
    return ModelRequest("act", system, tuple(messages))


def _wire_answer(resp: ModelResponse, body: dict[str, Any]) -> dict[str, Any]:
    """`resp` as a chat completion: every call's id and raw argument text as given."""
    calls = [
        {
            "id": c.id,
            "type": "function",
            "function": {"name": c.name, "arguments": c.raw_arguments},
        }
        for c in resp.tool_calls
    ]
    finish = resp.finish_reason or ("tool_calls" if calls else "stop")
    prompt = tokens.estimate_text(json.dumps(body.get("messages", [])))
    out = tokens.estimate_text(resp.text + "".join(c.raw_arguments for c in resp.tool_calls))
    return completion(
        content=resp.text or None,
        tool_calls=calls or None,
        finish_reason=finish,
        model="local-chat",
        usage={"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out},
    )


class ChatServer:
    """A chat-completions server on 127.0.0.1 whose answers are the plan's rounds; what
    it was sent is kept in `seen` (and in `WIRE_LOG` under the workspace)."""

    def __init__(self, plan: PlanActor, seen: list[Seen]) -> None:
        self.plan = plan
        self.seen = seen

        def answer(seen: Seen) -> Reply:
            self.seen.append(seen)
            resp = PlanActor.__call__(plan, _wire_request(seen.body))
            return Reply(200, _wire_answer(resp, seen.body))

        self.server = ProviderServer(answer, keep_alive=True)
        self.url = f"http://127.0.0.1:{self.server.port}/v1"


class WireActor(PlanActor):
    """Plays its plan through `OpenAIModel` and the workspace's `ChatServer`: what the
    runtime gets back is what the real adapter parsed off the wire."""

    def __init__(self, ws: Path, steps: Sequence[Step | ModelResponse]) -> None:
        super().__init__(steps)
        self.ws = str(ws)

    async def __call__(self, request: ModelRequest) -> ModelResponse:  # type: ignore[override]
        from tether.models.openai import OpenAIModel

        async with OpenAIModel(
            "local-chat", base_url=_WIRES[self.ws].url, api_key="sk-local", retry=_WIRE_RETRY
        ) as model:
            return await model.complete(request)


def _wire_serving(ws: Path) -> Any:
    @contextmanager
    def serve() -> Iterator[ChatServer]:
        # The actor is made before the run serves: the plan is the one it plays.
        server = ChatServer(_PLANS.pop(str(ws)), WIRE_LOG.setdefault(str(ws), []))
        _WIRES[str(ws)] = server
        try:
            yield server
        finally:
            del _WIRES[str(ws)]
            server.server.close()

    return serve()


_PLANS: dict[str, PlanActor] = {}
#: What each workspace's chat server was sent (the test takes it).
WIRE_LOG: dict[str, list[Seen]] = {}


def _wire(steps: Sequence[Step | ModelResponse]) -> Any:
    def make(ws: Path) -> WireActor:
        actor = WireActor(ws, steps)
        _PLANS[str(ws)] = actor
        return actor

    return make


def wire_call(call_id: str, name: str, raw: str | dict[str, Any]) -> ToolCall:
    """A call as the server sends it: the provider's id, the argument text as is."""
    text = raw if isinstance(raw, str) else json.dumps(raw)
    return ToolCall(call_id, name, None, text)


# 17. over the wire: provider ids, parallel calls, text that is not JSON, a made-up tool -

_UNITS = "def to_km(miles):\n    return miles * 1.6\n"
_UNITS_FIXED = "def to_km(miles):\n    return round(miles * 1.609344, 3)\n"
_UNITS_CHECK = """\
import units

assert units.to_km(10) == 16.093, f"to_km(10) = {units.to_km(10)!r}"
print("ok")
"""


def _wire_messy_steps() -> list[Step | ModelResponse]:
    return [
        ModelResponse(
            "Reading the module and its check.",
            (
                wire_call("call_Qx81mZ", "read_file", {"path": "units.py"}),
                wire_call("call_7RkPa2", "read_file", {"path": "check_units.py"}),
                wire_call("call_c0FfEe", "list_files", {"path": "."}),
            ),
        ),
        ModelResponse(
            "Patching it.",
            (wire_call("call_p4tch1", "apply_patch", {"patch": "*** Update File: units.py"}),),
        ),
        ModelResponse(
            "No patch tool; writing the file.",
            (
                wire_call(
                    "call_wr1te0",
                    "write_file",
                    "{'path': 'units.py', 'content': 'def to_km(miles): ...'}",
                ),
            ),
        ),
        ModelResponse("", (wire_call("call_run000", "run_checks", ""),)),
        ModelResponse(
            "Off by a little: the exact factor.",
            (
                wire_call(
                    "call_wr1te2",
                    "write_file",
                    json.dumps(json.dumps({"path": "units.py", "content": _UNITS_FIXED})),
                ),
            ),
        ),
        ModelResponse(
            "The arguments were a JSON string, not an object. Once more, as an object.",
            (
                wire_call(
                    "call_wr1te1", "write_file", {"path": "units.py", "content": _UNITS_FIXED}
                ),
            ),
        ),
    ]


WIRE_MESSY = SeventhStyle(
    "wire-messy-calls",
    "make check_units.py pass",
    lambda _ws: [command_item("units", "make check_units.py pass", f"{PY} check_units.py")],
    _wire(_wire_messy_steps()),
    files={"units.py": _UNITS, "check_units.py": _UNITS_CHECK},
    tools=[*EDIT_FILES, "run_checks"],
    extra_tools=check_tool("check_units.py", "run_checks"),
    serve=_wire_serving,
    fails=(
        "no tool named 'apply_patch'",
        "not valid JSON",
        "to_km(10) = 16.0",
        "must be a JSON object",
    ),
    parallel=3,
)


# 18. over the wire: a `length` cut inside a call, and the same id on every call -------

_GLOSSARY = "lease: a time-bound claim on a task\nledger: the audited list of items\n"


def _wire_cut_steps() -> list[Step | ModelResponse]:
    g = "docs/glossary.md"
    entry = {"path": g, "content": "# Glossary\n\n- **lease**: a time-bound claim on a task\n"}
    cut = json.dumps(entry)[:40]
    return [
        ModelResponse(
            "Reading the terms and the docs index.",
            (
                wire_call("call_0", "read_file", {"path": "terms.txt"}),
                wire_call("call_0", "read_file", {"path": "docs/index.md"}),
            ),
        ),
        ModelResponse(
            "Writing the glossary.",
            (wire_call("call_0", "write_file", cut),),
            finish_reason="length",
        ),
        ModelResponse("Cut off; one entry per call.", (wire_call("call_0", "write_file", entry),)),
        ModelResponse(
            "",
            (
                wire_call(
                    "call_0",
                    "append_file",
                    {"path": g, "content": "- **ledger**: the audited list of items\n"},
                ),
            ),
        ),
    ]


WIRE_CUT = SeventhStyle(
    "wire-cut-same-ids",
    "write the glossary of both terms",
    lambda _ws: [file_item("glossary", "docs/glossary.md", "**ledger**")],
    _wire(_wire_cut_steps()),
    files={"terms.txt": _GLOSSARY, "docs/index.md": "# docs\n"},
    serve=_wire_serving,
    warns=frozenset({"call_ids_replaced"}),
    fails=("cut off by the output token limit",),
    parallel=2,
)


STYLES: dict[str, SeventhStyle] = {
    s.name: s
    for s in (
        NARRATED,
        PARALLEL_READS,
        SCHEMA_REFUSED,
        HALLUCINATED,
        EARLY_DONE,
        CUT_OFF,
        REREAD_COMPACTED,
        FORGETFUL,
        SHIFTING,
        INVESTIGATION,
        SAME_TWICE,
        REFUSED_PATHS,
        THINKING,
        EMPTY,
        THINK_ASIDE,
        CUT_TWICE,
        WIRE_MESSY,
        WIRE_CUT,
    )
}

#: The shapes whose actor talks through the real adapter.
WIRE_STYLES = ("wire-messy-calls", "wire-cut-same-ids")


# --- checking one -----------------------------------------------------------------------


def _rule_holds(ws: Path, rule: dict[str, Any]) -> bool:
    """An item's `done_when` checked again by hand, on the workspace as it is."""
    if rule["kind"] == "file":
        path = ws / rule["path"]
        return path.is_file() and rule.get("contains", "") in path.read_text()
    if rule["kind"] == "command":
        proc = subprocess.run(
            rule["command"], shell=True, cwd=ws, capture_output=True, timeout=60, check=False
        )
        return proc.returncode == 0
    raise AssertionError(f"no hand check for a {rule['kind']} rule")


async def check_seventh(store: Store, style: SeventhStyle, outcome: Outcome, ws: Path) -> None:
    """`check_honest` (satisfied, never blocked, in its planned rounds, at the default
    limits, honest by the oracle), and: every deliverable really there (each rule checked
    again by hand), the mess really met (the failures `fails` names, in order; an answer
    of `parallel` calls; `compactions`), and no audit warning but the judge's own and
    those the agent earned (`warns`)."""
    await check_honest(store, style, outcome, ws)
    for item in style.items(ws):
        assert _rule_holds(ws, item["done_when"]), f"{style.name}: {item['id']} not really done"
    events = await store.read_events(outcome.task_id)
    warned = {str(e.data.get("code")) for e in events if e.type == "audit.warning"}
    assert warned <= JUDGE_WARNINGS | style.warns, f"{style.name}: unearned warnings {warned}"
    assert style.warns <= warned, f"{style.name}: expected warnings {style.warns}, got {warned}"
    errors_seen = [
        str(e.data.get("error") or "")
        for e in events
        if e.type == "op.result" and e.data.get("status") != "succeeded"
    ]
    assert len(errors_seen) == len(style.fails), (style.name, errors_seen)
    for want, got in zip(style.fails, errors_seen, strict=True):
        assert want in got, f"{style.name}: expected {want!r} in {got!r}"
    calls = [e.data for e in events if e.type == "model.called" and e.data.get("purpose") == "act"]
    assert len(calls) == outcome.rounds, (style.name, len(calls))
    widest = max(int(c.get("tool_calls") or 0) for c in calls)
    assert widest == style.parallel, f"{style.name}: widest answer {widest} calls"
    compacted = sum(e.type == "context.compacted" for e in events)
    assert compacted == style.compactions, f"{style.name}: {compacted} compactions"


if __name__ == "__main__":
    import asyncio

    asyncio.run(print_table(STYLES, sys.argv[1:]))
