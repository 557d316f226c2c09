"""A sixth set of honest ways of working, at default limits, as agents that run for
hours work: a research digest written day by day over twenty days (each day's sources
change, yesterday's digest re-read), a CTF queue where one challenge needs a long
brute-force job in the background while another is solved, a data backfill whose
status moves slowly, a write answered 500 after it was stored (reconciled by reading
back), a question asked mid-item whose answer rewrites the draft, eighty items in one
round each with long reads, a build log far past the preview paged through, a docs
build whose warnings drop to zero, a module split into several files, a paginated API
whose `next` token repeats on its last page, a download in Range chunks ending on a
416, a book written across two compactions, an API token that expires every few
calls, a resource locked by another process for a while, a regression found with `git
bisect`, a daily ingest whose source renames a column, and a rate-limited API declared
a service (a 429 on each page's first try).

Each shape is real work in the `_honest` / `_honest_more` / `_honest_third` frameworks:
real files, real subprocesses (a brute-force job, a backfill job, a lock holder, check
and build scripts) and real HTTP services on 127.0.0.1.

`python -m tests.adversarial._honest_sixth` prints the table of shapes and judges.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
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
from tests.adversarial._honest_fifth import _answer, _request, _serving
from tests.adversarial._honest_fourth import _GIT, shell
from tests.adversarial._honest_more import HTTPStatusError, results_of
from tests.adversarial._honest_more import _check as check_tool
from tests.adversarial._honest_third import _PROCS, ThirdStyle, _finish_job, print_table
from tether import errors
from tether.models.base import ModelRequest, ModelResponse
from tether.tools.registry import Reconciliation, Tool, tool

# 1. a research digest, one day a round-trip, twenty days --------------------------------

_DAYS = 20


def _headline(day: int) -> str:
    return f"day {day:02}: {['rates', 'chips', 'grid', 'rain', 'ports'][day % 5]} story {day * 7}"


class SourcesServer(LocalServer):
    """`GET /sources?day=N`: that day's sources (each day others), with a fetch time."""

    def __init__(self, _ws: Path) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                day = int(parse_qs(urlparse(self.path).query)["day"][0])
                items = [
                    {"title": _headline(day), "url": f"https://news.example/{day}/{k}"}
                    for k in range(3)
                ]
                _answer(self, 200, {"day": day, "items": items, "fetched_at": time.time()})

            def log_message(self, *_args: Any) -> None:
                pass

        self.serve(Handler)


def _digest_tools(ws: Path) -> list[Tool]:
    @tool(name="fetch_sources", effect="read", description="The day's sources.")
    def fetch_sources(day: int) -> str:
        return _request(ws, "GET", f"/sources?day={day}")

    return [fetch_sources]


def _digest_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = []
    for day in range(1, _DAYS + 1):
        if day > 1:
            steps.append(
                say("Yesterday's digest first.", call("read_file", path=f"digest/{day - 1:02}.md"))
            )
        steps.append(say(f"Day {day}'s sources.", call("fetch_sources", day=day)))
        steps.append(
            say(
                f"Day {day}'s digest.",
                call("write_file", path=f"digest/{day:02}.md", content=f"# {_headline(day)}\n"),
            )
        )
    return PlanActor(steps)


DIGEST = ThirdStyle(
    "daily-digest",
    "write the research digest of each day",
    lambda _ws: [
        file_item(f"d{day:02}", f"digest/{day:02}.md", _headline(day))
        for day in range(1, _DAYS + 1)
    ],
    _digest_actor,
    tools=[*FILES, "fetch_sources"],
    extra_tools=_digest_tools,
    serve=_serving(SourcesServer),
)


# 2. a CTF queue: a brute-force job in the background, another challenge meanwhile ----

_PIN = "7319"
_PIN_HASH = hashlib.sha256(_PIN.encode()).hexdigest()
_CRACK = """\
import hashlib, pathlib, sys, time

target = sys.argv[1]
deadline = time.monotonic() + 30
# The search is long: it runs until the go marker says the hours have passed.
while not pathlib.Path("jobs/.go").exists() and time.monotonic() < deadline:
    time.sleep(0.01)
for k in range(10000):
    pin = f"{k:04}"
    if hashlib.sha256(pin.encode()).hexdigest() == target:
        pathlib.Path("jobs/crack.out").write_text(f"FOUND {pin}\\n")
        break
"""
_CRACK_POLLS = 3
_XOR_FLAG = "flag{x0r_1s_n0t_crypt0}"
_XOR_KEY = 0x2A
_XOR_HEX = bytes(b ^ _XOR_KEY for b in _XOR_FLAG.encode()).hex()


def _ctf_tools(ws: Path) -> list[Tool]:
    state = {"polls": 0}

    @tool(name="start_crack", effect="write", description="Start brute-forcing a hash.")
    def start_crack(target: str) -> str:
        (ws / "jobs").mkdir(exist_ok=True)
        _PROCS[str(ws)] = subprocess.Popen([sys.executable, "crack.py", target], cwd=ws)
        return "crack job started (out: jobs/crack.out)"

    @tool(name="crack_status", effect="read", description="The brute-force job's progress.")
    def crack_status() -> str:
        state["polls"] += 1
        if state["polls"] < _CRACK_POLLS:
            return f"running: {state['polls'] * 31}% of the keyspace"
        _finish_job(ws, "jobs/.go")
        return (ws / "jobs/crack.out").read_text()

    @tool(name="xor_decode", effect="read", description="XOR-decode a hex string.")
    def xor_decode(hex: str, key: int) -> str:
        return bytes(b ^ key for b in bytes.fromhex(hex)).decode(errors="replace")

    return [start_crack, crack_status, xor_decode]


def _ctf_actor(_ws: Path) -> PlanActor:
    def record_pin(request: ModelRequest) -> ModelResponse:
        pin = re.findall(r"FOUND (\d{4})", "\n".join(results_of(request)))
        return say("The PIN.", call("write_file", path="out/pin.txt", content=(pin or ["?"])[-1]))

    return PlanActor(
        [
            say("Challenge 1: a hashed PIN.", call("read_file", path="chal/pin.md")),
            say("Brute force it in the background.", call("start_crack", target=_PIN_HASH)),
            say("Meanwhile challenge 2.", call("read_file", path="chal/xor.md")),
            say("Single-byte XOR; 0x2a guessed.", call("xor_decode", hex=_XOR_HEX, key=_XOR_KEY)),
            say("Flag 2.", call("write_file", path="out/xor.txt", content=_XOR_FLAG + "\n")),
            *[say("How far is the crack?", call("crack_status"))] * _CRACK_POLLS,
            record_pin,
        ]
    )


CTF_QUEUE = ThirdStyle(
    "ctf-bruteforce-bg",
    "solve both challenges",
    lambda _ws: [file_item("pin", "out/pin.txt", _PIN), file_item("xor", "out/xor.txt", _XOR_FLAG)],
    _ctf_actor,
    files={
        "crack.py": _CRACK,
        "chal/pin.md": f"The PIN is four digits; sha256 = {_PIN_HASH}\n",
        "chal/xor.md": f"Ciphertext (hex): {_XOR_HEX}; the key is one byte.\n",
    },
    tools=[*FILES, "start_crack", "crack_status", "xor_decode"],
    extra_tools=_ctf_tools,
)


# 3. a backfill migration: a real job fills a SQLite column one tick at a time --------

_BACKFILL = """\
import pathlib, sqlite3, sys, time

db = sqlite3.connect("app.db")
db.execute("ALTER TABLE users ADD COLUMN email_lower TEXT")
db.commit()
ticks = pathlib.Path("ticks")
done = 0
deadline = time.monotonic() + 30
while done < 5 and time.monotonic() < deadline:
    seen = len(list(ticks.iterdir())) if ticks.exists() else 0
    while done < min(seen, 5):
        db.execute(
            "UPDATE users SET email_lower = lower(email) WHERE id > ? AND id <= ?",
            (done * 20, done * 20 + 20),
        )
        db.commit()
        done += 1
    time.sleep(0.01)
"""
_SCHEMA_CHECK = """\
import sqlite3, sys

db = sqlite3.connect("app.db")
cols = [r[1] for r in db.execute("PRAGMA table_info(users)")]
if "email_lower" not in cols:
    print("email_lower: missing"); sys.exit(1)
left = db.execute("SELECT count(*) FROM users WHERE email_lower IS NULL").fetchone()[0]
print(f"email_lower: {100 - left} of 100 backfilled")
sys.exit(1 if left else 0)
"""


def _make_db(ws: Path) -> None:
    import sqlite3

    db = sqlite3.connect(ws / "app.db")
    db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT)")
    db.executemany("INSERT INTO users VALUES (?, ?)", [(k, f"U{k}@Ex.COM") for k in range(1, 101)])
    db.commit()
    db.close()


def _backfill_tools(ws: Path) -> list[Tool]:
    _make_db(ws)
    state = {"polls": 0}

    @tool(name="run_migration", effect="write", description="Start the backfill migration.")
    def run_migration(name: str) -> str:
        (ws / "ticks").mkdir(exist_ok=True)
        _PROCS[str(ws)] = subprocess.Popen([sys.executable, "backfill.py"], cwd=ws)
        return f"migration {name} started"

    @tool(name="schema_check", effect="read", description="How far the backfill is.")
    def schema_check() -> str:
        state["polls"] += 1
        (ws / "ticks" / str(state["polls"])).touch()  # time passes between polls
        if state["polls"] >= 5:
            _finish_job(ws)
        else:
            target = state["polls"] * 20
            for _ in range(3000):  # the job catches up with the tick
                out = subprocess.run(
                    [sys.executable, "schema_check.py"],
                    cwd=ws,
                    capture_output=True,
                    text=True,
                    timeout=60,
                ).stdout
                if f"{target} of 100" in out:
                    break
                time.sleep(0.01)
        proc = subprocess.run(
            [sys.executable, "schema_check.py"], cwd=ws, capture_output=True, text=True, timeout=60
        )
        return proc.stdout.strip()

    return [run_migration, schema_check]


def _backfill_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say("The migration plan.", call("read_file", path="MIGRATION.md")),
            say("Starting it.", call("run_migration", name="0042_email_lower")),
            *[say("How far is the backfill?", call("schema_check"))] * 5,
        ]
    )


BACKFILL = ThirdStyle(
    "backfill-migration",
    "add and backfill users.email_lower",
    lambda _ws: [command_item("backfill", "every user has email_lower", f"{PY} schema_check.py")],
    _backfill_actor,
    files={
        "backfill.py": _BACKFILL,
        "schema_check.py": _SCHEMA_CHECK,
        "MIGRATION.md": "0042: add users.email_lower and backfill it in batches.\n",
    },
    tools=[*FILES, "run_migration", "schema_check"],
    extra_tools=_backfill_tools,
)


# 4. a write answered 500 after the server stored it; read back, not repeated ---------


class RecordServer(LocalServer):
    """`PUT /records/NAME` stores under `root`; the third PUT fails with a 500 *after*
    storing (a timeout behind a proxy). `GET /records/NAME` reads one back."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.puts = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                server.puts += 1
                name = self.path.rsplit("/", 1)[-1]
                (root / name).write_bytes(self.rfile.read(int(self.headers["Content-Length"])))
                if server.puts == 3:
                    _answer(self, 500, {"error": "upstream timed out"})
                    return
                _answer(self, 201, {"stored": name})

            def do_GET(self) -> None:
                target = root / self.path.rsplit("/", 1)[-1]
                if not target.exists():
                    _answer(self, 404, {"error": "not found"})
                    return
                _answer(self, 200, json.loads(target.read_text()))

            def log_message(self, *_args: Any) -> None:
                pass

        self.serve(Handler)


_RECORDS = ("alpha", "beta", "gamma", "delta", "epsilon")


def _record_tools(ws: Path, reconciles: bool = True) -> list[Tool]:
    async def reconcile(op: Any, _ctx: Any) -> Reconciliation:
        """The tool author's read-back: the record there with the value sent is done."""
        try:
            got = json.loads(_request(ws, "GET", f"/records/{op.args['name']}"))
        except HTTPStatusError:
            return Reconciliation("not_done")
        if got == {"name": op.args["name"], "value": op.args["value"]}:
            return Reconciliation("done", f"{op.args['name']} is stored (read back)")
        return Reconciliation("unknown")

    @tool(
        name="put_record",
        effect="write",
        reconcile=reconcile if reconciles else None,
        description="Store a record on the server.",
    )
    def put_record(name: str, value: int) -> str:
        body = json.dumps({"name": name, "value": value}).encode()
        return _request(ws, "PUT", f"/records/{name}", body)

    @tool(name="get_record", effect="read", description="Read a record back from the server.")
    def get_record(name: str) -> str:
        return _request(ws, "GET", f"/records/{name}")

    return [put_record, get_record]


_RECORDS_CHECK = """\
import json, pathlib, sys

names = ["alpha", "beta", "gamma", "delta", "epsilon"]
ok = [n for n in names if pathlib.Path("remote", n).exists()
      and json.loads(pathlib.Path("remote", n).read_text())["value"] == len(n)]
print(f"{len(ok)} of {len(names)} records")
sys.exit(0 if len(ok) == len(names) else 1)
"""


def _record_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = []
    for name in _RECORDS:
        steps.append(say(f"Storing {name}.", call("put_record", name=name, value=len(name))))
        if name == "gamma":  # its PUT answered 500: did it land?
            steps.append(say("A 500: reading it back first.", call("get_record", name=name)))
    return PlanActor(steps)


WRITE_500 = ThirdStyle(
    "write-500-readback",
    "store the five records on the server",
    lambda _ws: [command_item("records", "all five records stored", f"{PY} check_records.py")],
    _record_actor,
    files={"check_records.py": _RECORDS_CHECK},
    tools=[*FILES, "put_record", "get_record"],
    extra_tools=_record_tools,
    serve=_serving(lambda ws: RecordServer(ws / "remote")),
)


# 5. a question mid-item: the draft rewritten the way the answer says --------------------


def _help_actor(_ws: Path) -> PlanActor:
    def rewrite(request: ModelRequest) -> ModelResponse:
        said = any("metric" in m.content for m in request.messages if m.role == "user")
        unit = "km" if said else "mi"
        return say(
            f"Rewriting the draft in {unit}.",
            call("write_file", path="out/route.md", content=f"# Route\n\ntotal: 42 {unit}\n"),
        )

    return PlanActor(
        [
            say("The legs.", call("read_file", path="legs.csv")),
            say(
                "A first draft.",
                call("write_file", path="out/route.md", content="# Route\n\ntotal: 26 mi\n"),
            ),
            say("The readers are in two countries.\nNEED_HELP: miles or kilometres?"),
            rewrite,
        ]
    )


HELP_REWRITE = ThirdStyle(
    "help-then-rewrite",
    "write the route summary in the unit the owner wants",
    lambda _ws: [file_item("route", "out/route.md", "total: 42 km")],
    _help_actor,
    files={"legs.csv": "leg,km\na,20\nb,22\n"},
    answers=("Use metric, please.",),
)


# 6. eighty items, one round each, every round a long read ----------------------------

_EIGHTY = 80
_LONG = "".join(f"row {k:04}: " + "lorem ipsum dolor " * 8 + "\n" for k in range(40))


def _eighty_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say(
                f"Item {k}.",
                call("read_file", path=f"in/{k:02}.txt"),
                call("write_file", path=f"out/{k:02}.txt", content=f"item {k} ok\n"),
            )
            for k in range(_EIGHTY)
        ]
    )


EIGHTY = ThirdStyle(
    "eighty-long-reads",
    "one summary per input",
    lambda _ws: [file_item(f"i{k:02}", f"out/{k:02}.txt", f"item {k} ok") for k in range(_EIGHTY)],
    _eighty_actor,
    files={f"in/{k:02}.txt": f"input {k}\n" + _LONG for k in range(_EIGHTY)},
)


# 7. a build log far past the preview: paged through to the one error ------------------

_BUILD = """\
import pathlib, sys

lines = [f"[{k:05}] compiling unit_{k:05}.c ... ok" for k in range(6000)]
cfg = pathlib.Path("build.cfg").read_text()
broken = "opt=O9" in cfg
if broken:
    lines.insert(1500, "[01500] ERROR build.cfg: unknown optimisation level O9 (use O2)")
print("\\n".join(lines))
sys.exit(1 if broken else 0)
"""


def _build_tools(ws: Path) -> list[Tool]:
    @tool(name="build", effect="read", description="Run the build; its whole log.")
    def build() -> str:
        proc = subprocess.run(
            [sys.executable, "build.py"], cwd=ws, capture_output=True, text=True, timeout=60
        )
        return proc.stdout + f"\nexit {proc.returncode}\n"

    return [build]


def _artifact_id(request: ModelRequest) -> str:
    ids = re.findall(r'read_artifact\(artifact_id="([^"]+)"', "\n".join(results_of(request)))
    return ids[-1] if ids else "?"


def _build_actor(_ws: Path) -> PlanActor:
    def page(offset: int) -> Step:
        return lambda r: say(
            f"The log from {offset}.",
            call("read_artifact", artifact_id=_artifact_id(r), offset=offset, limit=20_000),
        )

    return PlanActor(
        [
            say("Building.", call("build")),
            page(20_000),
            page(40_000),
            say(
                "The error: O9. Fixing the config and building again.",
                call("write_file", path="build.cfg", content="opt=O2\n"),
                call("build"),
            ),
        ]
    )


BUILD_LOG = ThirdStyle(
    "build-log-artifact",
    "make the build pass",
    lambda _ws: [command_item("build", "the build passes", f"{PY} build.py > /dev/null")],
    _build_actor,
    files={"build.py": _BUILD, "build.cfg": "opt=O9\n"},
    tools=[*EDIT_FILES, "read_artifact", "build"],
    extra_tools=_build_tools,
)


# 8. a docs build whose warnings drop to zero, one page a round ------------------------

_DOCS_BUILD = """\
import pathlib, re, sys

pages = sorted(pathlib.Path("docs").glob("*.md"))
names = {p.stem for p in pages}
warnings = [f"WARNING {p.name}: broken link to {t}" for p in pages
            for t in re.findall(r"\\]\\((\\w+)\\.md\\)", p.read_text()) if t not in names]
print("\\n".join(warnings))
print(f"build finished with {len(warnings)} warnings")
sys.exit(1 if warnings else 0)
"""
_DOC_PAGES = ("index", "install", "usage", "api", "faq", "changes")


def _doc(k: int, fixed: bool) -> str:
    nxt = _DOC_PAGES[(k + 1) % len(_DOC_PAGES)]
    return f"# {_DOC_PAGES[k]}\n\nNext: [{nxt}]({nxt if fixed else nxt + 'x'}.md)\n"


def _docs_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = [say("Building the docs.", call("docs_build"))]
    for k, name in enumerate(_DOC_PAGES):
        steps.append(
            say(
                f"Fixing the link on {name}.",
                call("write_file", path=f"docs/{name}.md", content=_doc(k, True)),
                call("docs_build"),
            )
        )
    return PlanActor(steps)


DOCS_WARNINGS = ThirdStyle(
    "docs-warnings-drop",
    "build the docs with no warnings",
    lambda _ws: [command_item("docs", "the docs build cleanly", f"{PY} docs_build.py")],
    _docs_actor,
    files={
        "docs_build.py": _DOCS_BUILD,
        **{f"docs/{n}.md": _doc(k, False) for k, n in enumerate(_DOC_PAGES)},
    },
    tools=[*EDIT_FILES, "docs_build"],
    extra_tools=check_tool("docs_build.py", "docs_build"),
)


# 9. one module split into four files, the old one left as a shim ---------------------

_PARTS = {
    "parse": "def parse(s):\n    return s.split(',')\n",
    "fmt": "def fmt(xs):\n    return ';'.join(xs)\n",
    "clean": "def clean(s):\n    return s.strip().lower()\n",
    "count": "def count(xs):\n    return len(xs)\n",
}
_UTILS = "\n\n".join(_PARTS.values())
_SHIM = "".join(f"from textkit.{n} import {n}  # noqa: F401\n" for n in _PARTS)
_SPLIT_CHECK = """\
import pathlib, sys
sys.path.insert(0, ".")
from textkit.utils import parse, fmt, clean, count
assert fmt(parse(clean(" A,B "))) == "a;b" and count(["x"]) == 1
for n in ("parse", "fmt", "clean", "count"):
    assert f"def {n}" in pathlib.Path(f"textkit/{n}.py").read_text(), n
    assert f"def {n}" not in pathlib.Path("textkit/utils.py").read_text(), n
print("split ok")
"""


def _split_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = [
        say("The module.", call("read_file", path="textkit/utils.py")),
    ]
    for name, body in _PARTS.items():
        steps.append(
            say(f"textkit/{name}.py.", call("write_file", path=f"textkit/{name}.py", content=body))
        )
    steps.append(
        say(
            "utils re-exports them; checking.",
            call("write_file", path="textkit/utils.py", content=_SHIM),
            call("check_split"),
        )
    )
    return PlanActor(steps)


SPLIT = ThirdStyle(
    "split-module",
    "split textkit/utils.py into one file per function",
    lambda _ws: [command_item("split", "one file per function", f"{PY} check_split.py")],
    _split_actor,
    files={"textkit/__init__.py": "", "textkit/utils.py": _UTILS, "check_split.py": _SPLIT_CHECK},
    tools=[*EDIT_FILES, "check_split"],
    extra_tools=check_tool("check_split.py", "check_split"),
)


# 10. a paginated API whose `next` token repeats on the last page -------------------------

_PAGES = 7


class PagedServer(LocalServer):
    """`GET /orders?cursor=C`: ten orders a page; the last page's `next` is its own
    cursor (a known bug of the API), with a fresh request id on every answer."""

    def __init__(self, _ws: Path) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                cur = parse_qs(urlparse(self.path).query).get("cursor", ["c0"])[0]
                k = int(cur[1:])
                orders = [{"id": k * 10 + j, "total": (k * 10 + j) % 17} for j in range(10)]
                nxt = f"c{min(k + 1, _PAGES - 1)}"
                _answer(self, 200, {"orders": orders, "next": nxt, "rid": time.time_ns()})

            def log_message(self, *_args: Any) -> None:
                pass

        self.serve(Handler)


_ORDERS_TOTAL = sum(i % 17 for i in range(_PAGES * 10))


def _paged_tools(ws: Path) -> list[Tool]:
    @tool(name="list_orders", effect="read", description="One page of orders.")
    def list_orders(cursor: str = "c0") -> str:
        return _request(ws, "GET", f"/orders?cursor={cursor}")

    return [list_orders]


def _paged_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = [
        say(f"Page {k + 1}.", call("list_orders", cursor=f"c{k}")) for k in range(_PAGES)
    ]
    steps.append(
        say(
            "The same next again: once more to be sure.",
            call("list_orders", cursor=f"c{_PAGES - 1}"),
        )
    )
    steps.append(
        say(
            "It repeats: that was the last page.",
            call("write_file", path="out/orders.txt", content=f"orders total {_ORDERS_TOTAL}\n"),
        )
    )
    return PlanActor(steps)


REPEAT_NEXT = ThirdStyle(
    "repeating-next",
    "total every order",
    lambda _ws: [file_item("total", "out/orders.txt", f"orders total {_ORDERS_TOTAL}")],
    _paged_actor,
    tools=[*FILES, "list_orders"],
    extra_tools=_paged_tools,
    serve=_serving(PagedServer),
)


# 11. a download in Range chunks; a 416 says the end is passed -------------------------

_BLOB = bytes((k * 31 + 7) % 251 for k in range(20_000))
_CHUNK = 4096


class BlobServer(LocalServer):
    """`GET /blob` with `Range: bytes=A-B`: 206 with the part, 416 past the end."""

    def __init__(self, _ws: Path) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                a, b = (int(x) for x in self.headers["Range"].split("=")[1].split("-"))
                if a >= len(_BLOB):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(_BLOB)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                part = _BLOB[a : b + 1]
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {a}-{a + len(part) - 1}/{len(_BLOB)}")
                self.send_header("Content-Length", str(len(part)))
                self.end_headers()
                self.wfile.write(part)

            def log_message(self, *_args: Any) -> None:
                pass

        self.serve(Handler)


def _range_tools(ws: Path) -> list[Tool]:
    import urllib.error
    import urllib.request

    from tests.adversarial._honest_fifth import _SERVED

    @tool(name="fetch_range", effect="write", description="Append bytes A-B of the blob to a file.")
    def fetch_range(start: int, end: int, path: str) -> str:
        req = urllib.request.Request(
            f"{_SERVED[str(ws)].url}/blob", headers={"Range": f"bytes={start}-{end}"}
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                data = r.read()
                rng = r.headers["Content-Range"]
        except urllib.error.HTTPError as exc:
            rng = exc.headers.get("Content-Range")
            exc.close()
            raise errors.ToolFailed(f"416 Range Not Satisfiable ({rng})") from None
        (ws / path).parent.mkdir(parents=True, exist_ok=True)
        with open(ws / path, "ab") as f:
            f.write(data)
        return f"206 {rng}: {len(data)} bytes appended"

    return [fetch_range]


_BLOB_SHA = hashlib.sha256(_BLOB).hexdigest()


def _range_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = []
    k = 0
    while k * _CHUNK < len(_BLOB) + _CHUNK:
        a = k * _CHUNK
        steps.append(
            say(
                f"Chunk {k + 1}.",
                call("fetch_range", start=a, end=a + _CHUNK - 1, path="dl/blob.bin"),
            )
        )
        k += 1
    steps.append(
        say(
            "416: past the end; the file is whole. Its checksum.",
            call("write_file", path="dl/blob.sha256", content=f"{_BLOB_SHA}  blob.bin\n"),
        )
    )
    return PlanActor(steps)


RANGE_416 = ThirdStyle(
    "range-416",
    "download the blob",
    lambda _ws: [
        command_item(
            "blob",
            "the blob is downloaded whole",
            f"cd dl && echo '{_BLOB_SHA}  blob.bin' | sha256sum -c --quiet - "
            f"&& grep -q {_BLOB_SHA} blob.sha256",
        )
    ],
    _range_actor,
    tools=[*FILES, "fetch_range"],
    extra_tools=_range_tools,
    serve=_serving(BlobServer),
)


# 12. a book of two parts written across two compactions -------------------------------


_CHAPTERS = 6


def _part(p: int, k: int) -> str:
    return f"\n## Part {p} chapter {k}\n\n" + (f"Sentence {p}.{k}, plain words. " * 450) + "\n"


def _twice_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = [
        say("The brief.", call("read_file", path="brief.txt")),
    ]
    for p in (1, 2):
        path = f"out/part{p}.md"
        steps.append(say(f"Part {p}.", call("write_file", path=path, content=f"# Part {p}\n")))
        for k in range(1, _CHAPTERS + 1):
            steps.append(
                say(f"Chapter {p}.{k}.", call("append_file", path=path, content=_part(p, k)))
            )
        steps.append(say("After the summary: the brief.", call("read_file", path="brief.txt")))
        steps.append(say("Where it is.", call("read_file", path=path, offset=0, limit=200)))
        steps.append(say(f"Part {p} ends.", call("append_file", path=path, content="\nEND\n")))
    return PlanActor(steps)


COMPACT_TWICE = ThirdStyle(
    "compaction-twice",
    "write the two parts",
    lambda _ws: [file_item("p1", "out/part1.md", "END"), file_item("p2", "out/part2.md", "END")],
    _twice_actor,
    files={"brief.txt": "Two parts, six long chapters each, each ending in END.\n"},
    contract={"context": {"input_budget_tokens": 16_000}},
    summary=lambda _r: "Wrote part 1 (and maybe part 2) chapter by chapter; see out/.",
)


# 13. an API token that expires every four calls ------------------------------------------

_REPORTS = 10


class TokenServer(LocalServer):
    """`POST /token` gives a token good for four calls; `GET /report/K` with it, or 401."""

    def __init__(self, _ws: Path) -> None:
        self.tokens: dict[str, int] = {}
        self.issued = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                server.issued += 1
                tok = f"t{server.issued}"
                server.tokens[tok] = 4
                _answer(self, 200, {"token": tok, "uses": 4})

            def do_GET(self) -> None:
                tok = self.headers.get("Authorization", "")
                if server.tokens.get(tok, 0) <= 0:
                    _answer(self, 401, {"error": "token expired"})
                    return
                server.tokens[tok] -= 1
                k = int(self.path.rsplit("/", 1)[-1])
                _answer(self, 200, {"report": k, "sum": k * 11})

            def log_message(self, *_args: Any) -> None:
                pass

        self.serve(Handler)


def _token_tools(ws: Path) -> list[Tool]:
    import urllib.error
    import urllib.request

    from tests.adversarial._honest_fifth import _SERVED

    held = {"token": ""}

    @tool(name="refresh_token", effect="write", description="Get a new API token.")
    def refresh_token() -> str:
        held["token"] = json.loads(_request(ws, "POST", "/token", b"{}"))["token"]
        return f"new token {held['token']} (4 uses)"

    @tool(name="get_report", effect="read", description="One report, with the held token.")
    def get_report(k: int) -> str:
        req = urllib.request.Request(
            f"{_SERVED[str(ws)].url}/report/{k}", headers={"Authorization": held["token"]}
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return str(r.read().decode())
        except urllib.error.HTTPError as exc:
            text = exc.read().decode()
            exc.close()
            raise HTTPStatusError(exc.code, dict(exc.headers.items()), text) from None

    return [refresh_token, get_report]


def _token_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = [say("A token.", call("refresh_token"))]
    for k in range(_REPORTS):
        if k and k % 4 == 0:
            steps.append(say(f"Report {k}.", call("get_report", k=k)))  # a 401
            steps.append(say("Expired: a new token.", call("refresh_token")))
        steps.append(
            say(
                f"Report {k}.",
                call("get_report", k=k),
                call("append_file", path="out/reports.csv", content=f"{k},{k * 11}\n"),
            )
        )
    return PlanActor(steps)


TOKEN_EXPIRY = ThirdStyle(
    "token-expiry",
    "collect the ten reports",
    lambda _ws: [file_item("reports", "out/reports.csv", f"{_REPORTS - 1},{(_REPORTS - 1) * 11}")],
    _token_actor,
    tools=[*FILES, "refresh_token", "get_report"],
    extra_tools=_token_tools,
    serve=_serving(TokenServer),
)


# 14. a file locked by another process for a while --------------------------------------

_HOLDER = """\
import os, pathlib, time

lock = pathlib.Path("shared/.lock")
lock.write_text(str(os.getpid()))
deadline = time.monotonic() + 30
while not pathlib.Path("shared/.release").exists() and time.monotonic() < deadline:
    time.sleep(0.01)
lock.unlink()
"""
_LOCK_POLLS = 4


def _lock_tools(ws: Path) -> list[Tool]:
    (ws / "shared").mkdir(exist_ok=True)
    proc = subprocess.Popen([sys.executable, "holder.py"], cwd=ws)
    _PROCS[str(ws)] = proc
    for _ in range(3000):
        if (ws / "shared/.lock").exists():
            break
        time.sleep(0.01)
    state = {"polls": 0}

    @tool(name="lock_status", effect="read", description="Who holds the shared lock.")
    def lock_status() -> str:
        state["polls"] += 1
        if state["polls"] >= _LOCK_POLLS:
            _finish_job(ws, "shared/.release")
        lock = ws / "shared/.lock"
        return f"locked by pid {lock.read_text()}" if lock.exists() else "free"

    @tool(name="write_shared", effect="write", description="Write the shared ledger (locked).")
    def write_shared(content: str) -> str:
        if (ws / "shared/.lock").exists():
            raise errors.ToolFailed("423 Locked: shared/ledger.txt is held by another process")
        (ws / "shared/ledger.txt").write_text(content)
        return "written"

    return [lock_status, write_shared]


def _lock_actor(_ws: Path) -> PlanActor:
    return PlanActor(
        [
            say("Writing the ledger.", call("write_shared", content="balance 140\n")),
            *[say("Locked: who holds it?", call("lock_status"))] * _LOCK_POLLS,
            say("Free now.", call("write_shared", content="balance 140\n")),
        ]
    )


LOCKED = ThirdStyle(
    "locked-resource",
    "write the balance to the shared ledger",
    lambda _ws: [file_item("ledger", "shared/ledger.txt", "balance 140")],
    _lock_actor,
    files={"holder.py": _HOLDER},
    tools=[*FILES, "lock_status", "write_shared"],
    extra_tools=_lock_tools,
)


# 15. a regression found with `git bisect`, commit by commit ---------------------------

_BISECT_N = 16
_CULPRIT = 11
_CALC_AT = "RATE = {rate}\n\n\ndef fee(amount):\n    return amount * RATE // 100\n"
_BISECT_CHECK = """\
import sys
sys.path.insert(0, ".")
from calc import fee
ok = fee(1000) == 30
print("PASS" if ok else f"FAIL fee(1000) = {fee(1000)}")
sys.exit(0 if ok else 1)
"""
_CULPRIT_SUBJECT = "calc: rates in basis points"


@contextmanager
def _bisect_repo(ws: Path) -> Iterator[None]:
    """A repository of sixteen commits; the twelfth breaks `fee`."""
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=ws, check=True, timeout=60)
    for k in range(_BISECT_N):
        (ws / "calc.py").write_text(_CALC_AT.format(rate=300 if k >= _CULPRIT else 3))
        (ws / "CHANGES").write_text("".join(f"change {j}\n" for j in range(k + 1)))
        subject = _CULPRIT_SUBJECT if k == _CULPRIT else f"change {k}"
        code, out = shell(ws, f"{_GIT} add -A && {_GIT} commit -q -m {json.dumps(subject)}")
        assert code == 0, out
        if k == 0:
            shell(ws, "git tag v1.0")
    yield


def _bisect_tools(ws: Path) -> list[Tool]:
    @tool(name="git_bisect", effect="write", description="Run `git bisect ARGS`.")
    def git_bisect(args: str) -> str:
        code, out = shell(ws, f"{_GIT} bisect {args}")
        if code:
            raise errors.ToolFailed(out)
        return out

    @tool(name="run_check", effect="read", description="Run check_fee.py at the checkout.")
    def run_check() -> str:
        at = shell(ws, "git log -1 --format=%h")[1]
        return shell(ws, f"{PY} check_fee.py")[1] + f"\n(at {at})"

    return [git_bisect, run_check]


#: Test-and-mark rounds `git bisect` needs for sixteen commits (checked by the tests).
_BISECT_STEPS = 4


def _bisect_actor(_ws: Path) -> PlanActor:
    def mark(request: ModelRequest) -> ModelResponse:
        verdict = "good" if results_of(request)[-1].startswith("PASS") else "bad"
        return say(f"Marking it {verdict}.", call("git_bisect", args=verdict))

    def record(request: ModelRequest) -> ModelResponse:
        found = re.findall(r"\n\n    (.+)\n", results_of(request)[-1])
        return say(
            "Found it; recording it and ending the bisect.",
            call("write_file", path="out/culprit.txt", content=(found or ["?"])[0] + "\n"),
            call("git_bisect", args="reset"),
        )

    steps: list[Step | ModelResponse] = [
        say("The failing check.", call("run_check")),
        say("Bisecting between v1.0 and HEAD.", call("git_bisect", args="start HEAD v1.0")),
    ]
    for _ in range(_BISECT_STEPS):
        steps += [say("Testing this commit.", call("run_check")), mark]
    steps.append(record)
    return PlanActor(steps)


BISECT = ThirdStyle(
    "git-bisect",
    "find the commit that broke fee() and leave the repository on main",
    lambda _ws: [
        file_item("culprit", "out/culprit.txt", _CULPRIT_SUBJECT),
        command_item("main", "back on main", 'test "$(git branch --show-current)" = main'),
    ],
    _bisect_actor,
    files={"check_fee.py": _BISECT_CHECK, ".gitignore": "out/\n"},
    tools=[*FILES, "git_bisect", "run_check"],
    extra_tools=_bisect_tools,
    serve=_bisect_repo,
)


# 16. a daily ingest whose source renames a column on day five ---------------------------

_INGEST = """\
import csv, json, pathlib, sys

src, col, per = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = list(csv.DictReader(open(src)))
if col not in rows[0]:
    sys.exit(f"ingest: no column {col!r} in {src} (columns: {', '.join(rows[0])})")
total = sum(int(r[col]) for r in rows) / per
day = pathlib.Path(src).stem
pathlib.Path("out").mkdir(exist_ok=True)
pathlib.Path(f"out/{day}.json").write_text(json.dumps({"day": day, "total": total}))
print(f"{day}: {len(rows)} rows, total {total}")
"""
_INGEST_DAYS = 8
_DRIFT_DAY = 5


def _ingest_csv(day: int) -> str:
    cents = day >= _DRIFT_DAY
    head = "date,amount_cents\n" if cents else "date,amount\n"
    return head + "".join(
        f"2026-11-{day:02},{(day * 10 + k) * (100 if cents else 1)}\n" for k in range(5)
    )


def _ingest_total(day: int) -> float:
    return float(sum(day * 10 + k for k in range(5)))


def _ingest_tools(ws: Path) -> list[Tool]:
    @tool(name="ingest", effect="write", description="Ingest a day's CSV: column, divisor.")
    def ingest(path: str, column: str, per: int = 1) -> str:
        code, out = shell(ws, f"{PY} ingest.py {path} {column} {per}")
        if code:
            raise errors.ToolFailed(out)
        return out

    return [ingest]


def _ingest_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = []
    for day in range(1, _INGEST_DAYS + 1):
        path = f"data/day{day}.csv"
        if day == _DRIFT_DAY:
            steps.append(say(f"Day {day}.", call("ingest", path=path, column="amount")))
            steps.append(say("The column is gone: the header.", call("read_file", path=path)))
        cents = day >= _DRIFT_DAY
        column, per = ("amount_cents", 100) if cents else ("amount", 1)
        steps.append(say(f"Day {day}.", call("ingest", path=path, column=column, per=per)))
    return PlanActor(steps)


SCHEMA_DRIFT = ThirdStyle(
    "schema-drift",
    "ingest each day's sales file",
    lambda _ws: [
        file_item(f"day{d}", f"out/day{d}.json", f'"total": {_ingest_total(d)}')
        for d in range(1, _INGEST_DAYS + 1)
    ],
    _ingest_actor,
    files={
        "ingest.py": _INGEST,
        **{f"data/day{d}.csv": _ingest_csv(d) for d in range(1, _INGEST_DAYS + 1)},
    },
    tools=[*FILES, "ingest"],
    extra_tools=_ingest_tools,
)


# 17. a rate-limited API declared as a service: a 429 on each page's first try ---------

_RL_PAGES = 12


class RateLimitedServer(LocalServer):
    """`GET /orders/K`: the first request of each page answers 429 with `Retry-After: 0`
    (the API's burst limit), the next one the page."""

    def __init__(self, _ws: Path) -> None:
        seen: set[str] = set()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path not in seen:
                    seen.add(self.path)
                    body = b'{"error": "rate limited"}'
                    self.send_response(429)
                    self.send_header("Retry-After", "0")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                _answer(self, 200, {"page": self.path, "rows": 10})

            def log_message(self, *_args: Any) -> None:
                pass

        self.serve(Handler)


def _rl_tools(ws: Path, service: str | None = "orders") -> list[Tool]:
    @tool(name="get_page", effect="read", service=service, description="A page of orders.")
    def get_page(k: int) -> str:
        return _request(ws, "GET", f"/orders/{k}")

    return [get_page]


def _rl_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = [
        say(f"Page {k}.", call("get_page", k=k)) for k in range(_RL_PAGES)
    ]
    steps.append(
        say("Counted.", call("write_file", path="out/rows.txt", content=f"rows {_RL_PAGES * 10}\n"))
    )
    return PlanActor(steps)


RATE_LIMITED_SERVICE = ThirdStyle(
    "paged-429-breaker",
    "count the order rows",
    lambda _ws: [file_item("rows", "out/rows.txt", f"rows {_RL_PAGES * 10}")],
    _rl_actor,
    tools=[*FILES, "get_page"],
    extra_tools=_rl_tools,
    serve=_serving(RateLimitedServer),
)


STYLES: dict[str, ThirdStyle] = {
    s.name: s
    for s in (
        DIGEST,
        CTF_QUEUE,
        BACKFILL,
        WRITE_500,
        HELP_REWRITE,
        EIGHTY,
        BUILD_LOG,
        DOCS_WARNINGS,
        SPLIT,
        REPEAT_NEXT,
        RANGE_416,
        COMPACT_TWICE,
        TOKEN_EXPIRY,
        LOCKED,
        BISECT,
        SCHEMA_DRIFT,
        RATE_LIMITED_SERVICE,
    )
}


if __name__ == "__main__":
    import asyncio

    asyncio.run(print_table(STYLES, sys.argv[1:]))
