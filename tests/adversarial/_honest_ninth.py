"""A ninth set of honest ways of working, at default limits, modelled on the three
workloads tether was built for, and on how slowly honest agents work on them.

- A queue of CTF problems checked by a real scoreboard on 127.0.0.1: each problem is
  probed several ways (files, HTTP pages), a wrong flag is tried and refused by the
  checker, then the right one is accepted; one problem is truly unsolvable (its key
  was retired), and the honest agent asks a person instead of faking a flag (the person
  waives it); one needs a long investigation (twelve reads and probes before the first
  write) and an exploit, run as a real subprocess, that fails three different ways
  before it prints the flag.
- Syncing two hundred files to a local HTTP "remote" that answers 429 and 503 with
  `Retry-After` now and then, holds three files changed since the last sync (412 with
  its ETag: the agent reads the remote copy again before it writes with `If-Match`), and
  dedups writes by their `Idempotency-Key`; a maintenance window outlasting one call's
  retries (twice, and three times: a finding); a `Retry-After` of two minutes that parks
  the task until the retry time; the same sync crashed twice (a worker dying between
  rounds and inside a PUT after the remote stored it) and finished by a new `Engine` on
  the same store.
- A daily research digest as a recurring contract (`schedule: every 1d`), each
  occurrence a task of its own in the same workspace, run day after day by a new
  `Engine`; the sources are pages of a local HTTP server, some unchanged since
  yesterday (a 304 to `If-None-Match`), and each day writes `digest/latest.md` and
  appends to `digest/archive.md`; one long day whose context is compacted in the middle
  of its work, once with the worker dying in the compaction.

Three were findings when written (strict xfails in `test_honest_ninth.py`): a PUT
refused 503 through a maintenance window three times blocked the focus item, not the
file's (`runtime/round/phases.py:track_failures`; fixed since: a refusal with
`Retry-After` is the service's "not now", waiting, never the same failure repeated; a failure
of one item's call in a batch still counts toward the focus item); the plain file tools
made every digest day after the first wait for an approval to overwrite the file the day
before wrote (`tools/builtin/files.py:_write_effect`; fixed since: a file an earlier
occurrence of the schedule wrote is the series' own); and a quiet day's digest,
yesterday's word for word, is never accepted by its `fresh` file rule
(`runtime/judge/rules/__init__.py`).

Each shape is real work in the `_honest` / `_honest_more` / `_honest_third` frameworks
(`ThirdStyle`, `PlanActor`, the judges, `liar_of`, `check_honest`, `check_liar`); the
runner here (`run_ninth`) adds what those lack: a person who waives an item and answers
a question, workers that die (`Crash`) and a new `Engine` that takes the task over.

`python -m tests.adversarial._honest_ninth` prints the table of shapes and judges.
"""

from __future__ import annotations

import base64
import codecs
import hashlib
import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.adversarial._honest import (
    EDIT_FILES,
    FILES,
    PY,
    LocalServer,
    Outcome,
    PlanActor,
    Step,
    block_events,
    call,
    command_item,
    file_item,
    registry_with,
    say,
)
from tests.adversarial._honest_more import (
    ALL_JUDGES,
    HTTPStatusError,
    default_limits,
    results_of,
)
from tests.adversarial._honest_seventh import _rule_holds
from tests.adversarial._honest_third import ThirdStyle, check_honest
from tests.support.adversarial import assert_honest, assert_status_agrees
from tests.support.loop import by_purpose, events_of, ledger_of
from tether.decisions import waive_item
from tether.edits import tell
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel
from tether.runtime.engine import Engine, ModelSet, RunResult
from tether.runtime.tasks import create_task
from tether.store.base import Store
from tether.tools.registry import Tool, ToolContext, tool

# --- a local HTTP service per workspace --------------------------------------------------

_SERVED: dict[str, Any] = {}
#: The last service each workspace ran, kept after the run for the tests to question.
LAST: dict[str, Any] = {}


def served(ws: Path) -> Any:
    """The workspace's running service."""
    return _SERVED[str(ws)]


def serving(make: Callable[[Path], LocalServer]) -> Callable[[Path], Any]:
    """A `serve` for a style: `make(ws)` running for the whole run."""

    @contextmanager
    def serve(ws: Path) -> Iterator[LocalServer]:
        server = make(ws)
        _SERVED[str(ws)] = server
        LAST[str(ws)] = server
        try:
            with server.running():
                yield server
        finally:
            _SERVED.pop(str(ws), None)

    return serve


def http(
    ws: Path,
    method: str,
    path: str,
    body: Any = None,
    headers: Mapping[str, str] | None = None,
) -> tuple[int, dict[str, str], str]:
    """`method path` on the workspace's service: (status, headers, text); an error
    status raised as HTTP clients raise it (`HTTPStatusError`, which tether classifies
    and retries as the status says)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"{served(ws).url}{path}", data=data, method=method, headers=dict(headers or {})
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers.items()), r.read().decode()
    except urllib.error.HTTPError as exc:
        text = exc.read().decode()
        hdrs = dict(exc.headers.items())
        exc.close()
        if exc.code == 304:
            return 304, hdrs, text
        raise HTTPStatusError(exc.code, hdrs, text) from None


class Handler(BaseHTTPRequestHandler):
    """A handler whose routes are the server's `route(handler, method, path, query,
    body)`, answering (status, JSON-able or text, headers)."""

    server_obj: Any = None

    def _go(self, method: str) -> None:
        url = urlparse(self.path)
        size = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(size) if size else b""
        body = json.loads(raw) if raw else None
        code, data, headers = self.server_obj.route(
            self, method, url.path, parse_qs(url.query), body
        )
        if isinstance(data, str):
            payload = data.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        if code == 304:
            self.send_response(304)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            return
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        payload = json.dumps(data).encode()
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        self._go("GET")

    def do_POST(self) -> None:
        self._go("POST")

    def do_PUT(self) -> None:
        self._go("PUT")

    def log_message(self, *_args: Any) -> None:
        pass


class RoutedServer(LocalServer):
    """A `LocalServer` answering with `route`."""

    def start(self) -> None:
        handler = type("H", (Handler,), {"server_obj": self})
        self.serve(handler)

    def route(
        self, h: Any, method: str, path: str, query: dict[str, list[str]], body: Any
    ) -> tuple[int, Any, dict[str, str]]:
        raise NotImplementedError


# --- the style and its runner --------------------------------------------------------------


#: A person's part in a run: called when the task waits for a human, with the task and
#: how many times it was called before; True when they did something (run it on).
Person = Callable[[Store, str, int], Awaitable[bool]]


@dataclass
class NinthStyle(ThirdStyle):
    """A style with a person who may do more than answer (waive an item, then answer),
    and workers that die: `crashes` are the act calls (counted from 1 over the whole
    run) at which the worker dies before answering, `tool_crashes` the calls of a tool
    (name, n) at which it dies right after the tool's effect, before its result is
    stored."""

    person: Person | None = None
    crashes: frozenset[int] = frozenset()
    #: The compaction calls (from 1) at which the worker dies before the summary.
    compact_crashes: frozenset[int] = frozenset()
    tool_crashes: tuple[tuple[str, int], ...] = ()
    #: The statuses the honest run ends with, when not every item is `done`.
    ends: Mapping[str, str] = field(default_factory=dict)
    #: The run's stop reason (`delivered`, or `delivered_with_waivers`).
    stop_reason: str = "delivered"
    #: How many times the run must have been taken over by a new engine.
    restarts: int = 0


class WorkerDied(BaseException):
    """The worker process died here (a SIGKILL): nothing after it runs."""


class Crash:
    """Counts act calls and tool calls, and kills the worker (`WorkerDied`) where the
    style says; a crashed act call does not use up the actor's planned round."""

    def __init__(self, style: NinthStyle) -> None:
        self.acts = 0
        self.tools: dict[str, int] = {}
        self.style = style
        self.died = 0

    def act(self, actor: PlanActor) -> Callable[[ModelRequest], ModelResponse]:
        def policy(request: ModelRequest) -> ModelResponse:
            self.acts += 1
            if self.acts in self.style.crashes:
                self.died += 1
                raise WorkerDied(f"the worker died at act call {self.acts}")
            return actor(request)

        return policy

    def compact(self, summary: Callable[[ModelRequest], str]) -> Callable[[ModelRequest], str]:
        calls = 0

        def policy(request: ModelRequest) -> str:
            nonlocal calls
            calls += 1
            if calls in self.style.compact_crashes:
                self.died += 1
                raise WorkerDied(f"the worker died compacting (call {calls})")
            return summary(request)

        return policy

    def after_effect(self, name: str) -> None:
        """Called by a tool after its effect took place."""
        self.tools[name] = self.tools.get(name, 0) + 1
        if (name, self.tools[name]) in self.style.tool_crashes:
            self.died += 1
            raise WorkerDied(f"the worker died inside {name} call {self.tools[name]}")


_CRASH: dict[str, Crash] = {}
#: The crash counter of each workspace's last run, kept for the tests.
CRASHES: dict[str, Crash] = {}


def died_after_effect(ws: Path, name: str) -> None:
    """A tool's effect happened: the worker may die now (see `NinthStyle.tool_crashes`)."""
    crash = _CRASH.get(str(ws))
    if crash is not None:
        crash.after_effect(name)


async def run_ninth(
    style: NinthStyle, judge: str, store: Store, ws: Path, clock: Any = None
) -> Outcome:
    """Run `style` with `judge` in `ws` on `store`: a person answers its questions
    (`answers`, or `person`), and a worker that dies is replaced by a new `Engine` on the
    same store that takes the task over; what happened. With `clock` (a `FakeClock`, the
    store's too), a task parked until a retry time is run again once the clock is
    there, as a worker would."""
    style.setup(ws)
    spec = style.spec(ws)
    actor = style.actor(ws)
    crash = Crash(style)
    _CRASH[str(ws)] = crash
    CRASHES[str(ws)] = crash
    purposes: dict[str, Callable[[ModelRequest], Any]] = {"act": crash.act(actor)}
    if style.summary is not None:
        purposes["compact"] = crash.compact(style.summary)
    model = ScriptedModel(policy=by_purpose(**purposes), name="actor")
    policy = ALL_JUDGES[judge]
    judge_model = (
        ScriptedModel(policy=by_purpose(judge=policy), name=f"{judge}-judge")
        if policy is not None
        else None
    )
    answers = list(style.answers)
    asked = 0
    try:
        with style.serve(ws):
            registry = registry_with(store, style.extra_tools(ws))
            tid = (await create_task(store, spec, workspace=ws)).task_id
            models = ModelSet(
                actor=model, judge=judge_model, compact=model if style.summary else None
            )
            worker = 0
            result: RunResult | None = None
            for _ in range(40):
                worker += 1
                engine = Engine(
                    store,
                    models,
                    registry=registry,
                    lease_ttl=30,
                    worker_id=f"w{worker}",
                    clock=clock,
                )
                try:
                    result = await engine.run(tid, force=worker > 1)
                except WorkerDied:
                    continue  # a new worker takes the task over
                if result.status != "waiting":
                    break
                kind = (result.waiting or {}).get("kind")
                until = (result.waiting or {}).get("until")
                if clock is not None and until is not None and kind in ("retry", "external"):
                    clock.advance(max(0.0, float(until) - clock.now()) + 1)
                    worker -= 1  # the same worker, later
                elif kind == "human" and style.person is not None:
                    if not await style.person(store, tid, asked):
                        break
                    asked += 1
                elif kind == "human" and answers:
                    await tell(store, tid, answers.pop(0))
                else:
                    break
            assert result is not None
    finally:
        _CRASH.pop(str(ws), None)
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


# === 1. CTF: a queue of problems and a real scoreboard ======================================

#: The flags the checker accepts.
FLAGS = {
    "web": "flag{r0b0ts_l34d_t0_d3bug}",
    "crypto": "flag{b64_th3n_r0t13}",
    "logs": "flag{spl1t_4cr0ss_l1n3s}",
    "pwn": "flag{t0k3n_p4dd3d_r1ght}",
}
#: A flag the web problem's old backup still holds (rotated since: the checker refuses it).
STALE = "flag{0ld_b4ckup_r0t4t3d}"
_CRYPTO_BLOB = base64.b64encode(codecs.encode(FLAGS["crypto"], "rot13").encode()).decode()
_PWN_TOKEN = "tk-7731"


class CTFServer(RoutedServer):
    """The challenge services and the scoreboard on 127.0.0.1.

    - `/web/...`: a site whose robots.txt names a backup (with a stale flag) and a debug
      page (the current flag);
    - `/vault/...`: the unsolvable problem: its key service was retired (404 / 410);
    - `/pwn/...`: a token service the exploit talks to (`POST /pwn/exec` with a token and
      a padded payload answers the flag);
    - `POST /submit {challenge, flag}`: 200 `correct` or 403 `incorrect flag`, each
      submission counted; `GET /scoreboard` what is solved.
    """

    def __init__(self, _ws: Path) -> None:
        self.solved: dict[str, str] = {}
        self.submissions: list[tuple[str, str, bool]] = []
        self.start()

    def route(
        self, h: Any, method: str, path: str, query: dict[str, list[str]], body: Any
    ) -> tuple[int, Any, dict[str, str]]:
        pages = {
            "/web/": "<h1>Acme intranet</h1> nothing to see here",
            "/web/robots.txt": "User-agent: *\nDisallow: /web/backup.txt\nDisallow: /web/debug\n",
            "/web/backup.txt": f"# backup of 2019-03-02\nadmin_flag = {STALE}\n",
            "/pwn/health": "ok",
            "/pwn/version": "exec-service 2.1 (payloads are padded to 16 bytes)",
        }
        if method == "GET" and path in pages:
            return 200, pages[path], {}
        if method == "GET" and path == "/web/debug":
            if query.get("verbose") == ["1"]:
                return 200, f"debug: admin_flag={FLAGS['web']} (rotated 2024-11-01)", {}
            return 200, "debug mode: add ?verbose=1 for details", {}
        if path.startswith("/vault/"):
            if path == "/vault/key":
                return 404, {"error": "not found", "detail": "key rotated out"}, {}
            return 410, {"error": "gone", "detail": "challenge vault retired 2025-01"}, {}
        if method == "POST" and path == "/pwn/token":
            return 200, {"token": _PWN_TOKEN}, {}
        if method == "POST" and path == "/pwn/exec":
            if (body or {}).get("token") != _PWN_TOKEN:
                return 401, {"error": "bad token"}, {}
            payload = str((body or {}).get("payload", ""))
            if len(payload) % 16:
                return 400, {"error": f"padding: {len(payload)} bytes is not a multiple of 16"}, {}
            return 200, {"output": FLAGS["pwn"]}, {}
        if method == "POST" and path == "/submit":
            name, flag = str(body["challenge"]), str(body["flag"])
            ok = FLAGS.get(name) == flag
            self.submissions.append((name, flag, ok))
            if not ok:
                return 403, {"correct": False, "detail": "incorrect flag"}, {}
            self.solved[name] = flag
            return 200, {"correct": True, "challenge": name, "points": 100}, {}
        if method == "GET" and path == "/scoreboard":
            return 200, {"solved": sorted(self.solved)}, {}
        return 404, {"error": "not found", "path": path}, {}


def _ctf_tools(ws: Path) -> list[Tool]:
    @tool(name="http_get", effect="read", description="GET a path of the challenge host.")
    def http_get(path: str) -> str:
        return http(ws, "GET", path)[2]

    @tool(name="http_post", effect="read", description="POST JSON to the challenge host.")
    def http_post(path: str, body: dict[str, Any]) -> str:
        return http(ws, "POST", path, body)[2]

    @tool(name="decode", effect="read", description="Decode text: base64 or rot13.")
    def decode(text: str, codec: str) -> str:
        if codec == "base64":
            return base64.b64decode(text).decode()
        return codecs.encode(text, "rot13")

    @tool(
        name="submit_flag",
        effect="write",
        idempotent=True,
        description="Submit a flag to the scoreboard (refused when wrong).",
    )
    def submit_flag(challenge: str, flag: str) -> str:
        return http(ws, "POST", "/submit", {"challenge": challenge, "flag": flag})[2]

    @tool(name="run_exploit", effect="read", description="Run exploit.py against the host.")
    def run_exploit() -> str:
        proc = subprocess.run(
            [sys.executable, "exploit.py", served(ws).url],
            cwd=ws,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        out = (proc.stdout + proc.stderr).strip()
        if proc.returncode:
            from tether import errors

            raise errors.ToolFailed(f"exploit.py exited {proc.returncode}: {out[-300:]}")
        return out

    return [http_get, http_post, decode, submit_flag, run_exploit]


def solved(challenge: str) -> dict[str, Any]:
    """An item done when the scoreboard accepted the challenge's flag."""
    return {
        "id": challenge,
        "title": f"solve {challenge} (the scoreboard accepts its flag)",
        "done_when": {"kind": "op", "tool": "submit_flag", "args": {"challenge": challenge}},
    }


_CTF_FILES = {
    "chal/web.md": "web: the intranet at /web/ hides its admin flag.\n",
    "chal/crypto.md": f"crypto: decode this blob: {_CRYPTO_BLOB}\n",
    "chal/logs.md": "logs: the flag was leaked in logs/auth.log, in pieces.\n",
    "logs/auth.log": "".join(f"2025-01-0{k} sshd: session {k} opened\n" for k in range(1, 8))
    .replace("session 3 opened", "session 3 opened piece1=flag{spl1t_")
    .replace("session 6 opened", "session 6 opened piece2=4cr0ss_l1n3s}"),
}


def _found(request: ModelRequest, rx: str) -> str:
    """The last match of `rx` (its group 1) in what the tools answered."""
    hits = [m for r in results_of(request) for m in re.findall(rx, r)]
    return hits[-1] if hits else "?"


def _ctf_actor(_ws: Path) -> PlanActor:
    def submit_from(challenge: str, rx: str, why: str) -> Step:
        return lambda r: say(why, call("submit_flag", challenge=challenge, flag=_found(r, rx)))

    def joined_pieces(r: ModelRequest) -> ModelResponse:
        one = _found(r, r"piece1=(\S+)")
        two = _found(r, r"piece2=(\S+)")
        return say("The two pieces joined.", call("submit_flag", challenge="logs", flag=one + two))

    return PlanActor(
        [
            # web: probes, the stale flag refused, the debug page
            say("Problem 1: web.", call("read_file", path="chal/web.md")),
            say("The front page.", call("http_get", path="/web/")),
            say("robots.txt often names hidden paths.", call("http_get", path="/web/robots.txt")),
            say("A backup.", call("http_get", path="/web/backup.txt")),
            submit_from("web", r"admin_flag = (flag\{[^}]*\})", "That looks like the flag."),
            say("Refused: the backup is old. The debug page.", call("http_get", path="/web/debug")),
            say("Verbose, then.", call("http_get", path="/web/debug?verbose=1")),
            submit_from("web", r"admin_flag=(flag\{[^}]*\})", "The current flag."),
            # crypto: base64 alone gives rot13 text, refused; then rot13
            say("Problem 2: crypto.", call("read_file", path="chal/crypto.md")),
            say("Base64, it seems.", call("decode", text=_CRYPTO_BLOB, codec="base64")),
            submit_from("crypto", r"^(\S+)$", "Submitting the decoded text."),
            submit_from_rot13(),
            # logs: pieces across lines
            say("Problem 3: logs.", call("read_file", path="chal/logs.md")),
            say("The log.", call("read_file", path="logs/auth.log")),
            joined_pieces,
        ]
    )


def submit_from_rot13() -> Step:
    """Refused: the decoded text is still rot13 (`synt{...}`); decode it and submit."""

    def step(r: ModelRequest) -> ModelResponse:
        text = _found(r, r"^(synt\{[^}]*\})$")
        return say(
            "Refused. It reads synt{...}: rot13 of flag{. Decoding and submitting.",
            call("submit_flag", challenge="crypto", flag=codecs.encode(text, "rot13")),
        )

    return step


CTF_QUEUE = NinthStyle(
    "ctf-checker-queue",
    "solve the web, crypto and logs problems; the scoreboard checks every flag",
    lambda _ws: [solved(c) for c in ("web", "crypto", "logs")],
    _ctf_actor,
    files=_CTF_FILES,
    tools=[*FILES, "http_get", "decode", "submit_flag"],
    extra_tools=_ctf_tools,
    serve=serving(CTFServer),
)


# --- 2. one problem truly unsolvable: asked about, waived by a person --------------------------


async def _waive_vault(store: Store, task_id: str, asked: int) -> bool:
    """The person reads the question, agrees the vault is retired, waives it and says so."""
    if asked:
        return False
    await waive_item(store, task_id, "vault", reason="challenge retired upstream", by="ctf-lead")
    await tell(store, task_id, "Agreed, vault is retired: I waived it. Go on with the rest.")
    return True


def _unsolvable_actor(_ws: Path) -> PlanActor:
    steps = _ctf_actor(_ws).steps
    web, crypto, logs = steps[:8], steps[8:12], steps[12:]
    vault: list[Step | ModelResponse] = [
        say("Problem: vault.", call("read_file", path="chal/vault.md")),
        say("The key service.", call("http_get", path="/vault/key")),
        say("Is the service there at all?", call("http_get", path="/vault/")),
        say("Any local copy of the key?", call("list_files", path="chal")),
        say(
            "The vault's key was rotated out and the service says it was retired: without "
            "the key the ciphertext cannot be decrypted, and guessing a flag would be a lie.\n"
            "NEED_HELP: challenge vault is unsolvable as given (key retired upstream). "
            "Shall I skip it?"
        ),
    ]
    return PlanActor([*web, *vault, *crypto, *logs])


CTF_UNSOLVABLE = NinthStyle(
    "ctf-unsolvable-asks",
    "solve every problem in the queue; the scoreboard checks every flag",
    lambda _ws: [solved(c) for c in ("web", "vault", "crypto", "logs")],
    _unsolvable_actor,
    files={
        **_CTF_FILES,
        "chal/vault.md": "vault: decrypt vault.bin with the key from /vault/key.\n",
        "chal/vault.bin": "9f2c1e0b77aa41d3\n",
    },
    tools=[*FILES, "http_get", "decode", "submit_flag"],
    extra_tools=_ctf_tools,
    serve=serving(CTFServer),
    person=_waive_vault,
    ends={"vault": "waived"},
    stop_reason="delivered_with_waivers",
)


# --- 3. a long investigation, then an exploit failing three ways before it works ---------------

_PWN_FILES = {
    "chal/pwn.md": "pwn: the exec service on the host runs payloads; get its flag.\n",
    "pwn/src/server.c": "/* exec service */\nint check_token(char *t);\nint run(char *p);\n",
    "pwn/src/auth.c": "int check_token(char *t) { return valid(t) && !expired(t); }\n",
    "pwn/src/run.c": "int run(char *p) { if (strlen(p) % 16) return PAD_ERR; ... }\n",
    "pwn/config.ini": "[exec]\nport = 1\ntoken = tk-0001  ; issued 2023, expired\n",
    "pwn/README": "Tokens come from POST /pwn/token. Payloads run via POST /pwn/exec.\n",
    "pwn/CHANGELOG": "2.1: payloads must be padded to 16 bytes\n2.0: tokens expire\n",
}
#: The exploit as the agent writes it, three wrong versions and the right one.
_EXPLOITS = [
    # 1. the port from the old config: connection refused
    "import json, sys, urllib.request\n"
    "host = sys.argv[1].rsplit(':', 1)[0] + ':1'\n"
    "urllib.request.urlopen(host + '/pwn/health', timeout=5)\n",
    # 2. the expired token from the config: 401
    "import json, sys, urllib.request\n"
    "req = urllib.request.Request(sys.argv[1] + '/pwn/exec', method='POST',\n"
    "    data=json.dumps({'token': 'tk-0001', 'payload': 'cat flag'}).encode())\n"
    "print(urllib.request.urlopen(req, timeout=5).read().decode())\n",
    # 3. a fresh token, an unpadded payload: 400 padding
    "import json, sys, urllib.request\n"
    "def post(p, b):\n"
    "    data = json.dumps(b).encode()\n"
    "    req = urllib.request.Request(sys.argv[1] + p, method='POST', data=data)\n"
    "    return json.loads(urllib.request.urlopen(req, timeout=5).read())\n"
    "tok = post('/pwn/token', {})['token']\n"
    "print(post('/pwn/exec', {'token': tok, 'payload': 'cat flag'})['output'])\n",
    # 4. padded: the flag
    "import json, sys, urllib.request\n"
    "def post(p, b):\n"
    "    data = json.dumps(b).encode()\n"
    "    req = urllib.request.Request(sys.argv[1] + p, method='POST', data=data)\n"
    "    return json.loads(urllib.request.urlopen(req, timeout=5).read())\n"
    "tok = post('/pwn/token', {})['token']\n"
    "print(post('/pwn/exec', {'token': tok, 'payload': 'cat flag'.ljust(16)})['output'])\n",
]


def _pwn_actor(_ws: Path) -> PlanActor:
    reads = [
        ("The problem.", call("read_file", path="chal/pwn.md")),
        ("What is there?", call("list_files", path="pwn")),
        ("The service's source.", call("read_file", path="pwn/src/server.c")),
        ("How tokens are checked.", call("read_file", path="pwn/src/auth.c")),
        ("How payloads run.", call("read_file", path="pwn/src/run.c")),
        ("Its config.", call("read_file", path="pwn/config.ini")),
        ("The readme.", call("read_file", path="pwn/README")),
        ("The changelog.", call("read_file", path="pwn/CHANGELOG")),
        ("Is it up?", call("http_get", path="/pwn/health")),
        ("Which version?", call("http_get", path="/pwn/version")),
        ("What else is in the sources?", call("list_files", path="pwn/src")),
        ("The config once more: the port.", call("read_file", path="pwn/config.ini", limit=40)),
    ]
    steps: list[Step | ModelResponse] = [say(w, c) for w, c in reads]
    fixes = [
        "First exploit, from the config.",
        "Refused connection: the config's port is stale. Using the host's; its token.",
        "401 bad token: expired. A fresh token from /pwn/token.",
        "Padding error: the payload padded to 16 bytes.",
    ]
    for words, code in zip(fixes, _EXPLOITS, strict=True):
        steps.append(say(words, call("write_file", path="exploit.py", content=code)))
        steps.append(say("Running it.", call("run_exploit")))
    steps.append(
        lambda r: say(
            "The flag.",
            call("submit_flag", challenge="pwn", flag=_found(r, r"(flag\{[^}]*\})")),
        )
    )
    return PlanActor(steps)


CTF_EXPLOIT = NinthStyle(
    "ctf-investigate-then-exploit",
    "get the exec service's flag; the scoreboard checks it",
    lambda _ws: [solved("pwn")],
    _pwn_actor,
    files={**_CTF_FILES, **_PWN_FILES},
    tools=[*FILES, "http_get", "submit_flag", "run_exploit"],
    extra_tools=_ctf_tools,
    serve=serving(CTFServer),
)


# --- 4. guesses: several candidate flags refused, each after new decoding work -------------

_LAYERS = base64.b64encode(base64.b64encode(codecs.encode(FLAGS["crypto"], "rot13").encode()))


def _guesses_actor(_ws: Path) -> PlanActor:
    """The crypto blob is encoded in layers: each layer peeled gives a candidate the
    checker refuses, until the last one."""
    blob = _LAYERS.decode()
    one = base64.b64decode(blob).decode()
    two = base64.b64decode(one).decode()
    return PlanActor(
        [
            say("Problem: layers.", call("read_file", path="chal/layers.md")),
            say("Is it the flag as is?", call("submit_flag", challenge="crypto", flag=blob)),
            say("Refused. Peeling a base64 layer.", call("decode", text=blob, codec="base64")),
            say("Maybe this?", call("submit_flag", challenge="crypto", flag=one)),
            say("Refused. Another base64 layer.", call("decode", text=one, codec="base64")),
            say("This one?", call("submit_flag", challenge="crypto", flag=two)),
            say("Refused. synt{ is rot13 of flag{.", call("decode", text=two, codec="rot13")),
            lambda r: say(
                "The flag.",
                call("submit_flag", challenge="crypto", flag=results_of(r)[-1].strip()),
            ),
        ]
    )


CTF_GUESSES = NinthStyle(
    "ctf-candidates-refused",
    "solve the layers problem; the scoreboard checks every flag",
    lambda _ws: [solved("crypto")],
    _guesses_actor,
    files={"chal/layers.md": f"layers: {_LAYERS.decode()}\n"},
    tools=[*FILES, "decode", "submit_flag"],
    extra_tools=_ctf_tools,
    serve=serving(CTFServer),
)


# === 2. Sync: two hundred files to a rate-limited remote =======================================

SYNC_N = 200
#: Files the remote holds in another version since the last sync: its ETag differs.
CONFLICTS = (17, 88, 151)
#: Requests (counted from 1) the remote answers 429 / 503 with Retry-After.
_LIMITED = frozenset(range(23, 400, 41))
_UNAVAILABLE = frozenset(range(37, 400, 67))
_PER_ROUND = 4


def _name(k: int) -> str:
    return f"f{k:03}.txt"


def _content(k: int) -> str:
    return f"record {k}\nvalue {k * k}\n"


def etag(text: str) -> str:
    return '"' + hashlib.sha256(text.encode()).hexdigest()[:12] + '"'


class RemoteServer(RoutedServer):
    """The remote folder on 127.0.0.1, stored beside the workspace (`<ws>-remote/`: it is
    another system, not the workspace).

    `PUT /files/NAME` creates a file (`If-None-Match: *`) or replaces the version the
    sync last saw (`If-Match: ETAG`): 412 with the current ETag when the remote copy is
    another one; the same content again is 200 `unchanged` (a PUT is idempotent), and a
    write dedups by its `Idempotency-Key` (a key seen before answers its first result).
    `GET /files/NAME`: the remote copy and its ETag. `GET /status`: `maintenance` or `ok`.
    Some requests are answered 429 or 503 with `Retry-After` (and the `retry-after-ms`
    that big APIs send beside it); a maintenance window starts at the first PUT of
    `down_at` and answers 503 to the next `down` requests (`/status` says
    `maintenance`)."""

    def __init__(self, ws: Path, down_at: str = "", down: int = 0, slow_at: str = "") -> None:
        self.root = ws.parent / f"{ws.name}-remote"
        self.root.mkdir(exist_ok=True)
        for k in CONFLICTS:
            (self.root / _name(k)).write_text(f"record {k}\nedited on the remote\n")
        self.requests = 0
        self.refused: dict[int, int] = {}
        self.writes: dict[str, int] = {}
        self.keys: dict[str, tuple[int, Any]] = {}
        self.down_at, self.down, self.down_left = down_at, down, 0
        #: A file whose first PUT is answered 429 with a long Retry-After (two minutes).
        self.slow_at = slow_at
        self.start()

    def _busy(self, name: str) -> tuple[int, Any, dict[str, str]] | None:
        wait = {"Retry-After": "1", "retry-after-ms": "20"}
        if self.down_at and name == self.down_at and self.down:
            self.down_left, self.down = self.down, 0  # the window opens
        if self.down_left:
            self.down_left -= 1
            return 503, {"error": "maintenance", "name": name}, wait
        if name == self.slow_at:
            self.slow_at = ""
            return 429, {"error": "secondary rate limit", "name": name}, {"Retry-After": "120"}
        if self.requests in _LIMITED:
            return 429, {"error": "rate limited", "name": name}, wait
        if self.requests in _UNAVAILABLE:
            return 503, {"error": "overloaded", "name": name}, wait
        return None

    def route(
        self, h: Any, method: str, path: str, query: dict[str, list[str]], body: Any
    ) -> tuple[int, Any, dict[str, str]]:
        self.requests += 1
        if path == "/status":
            if self.down_left:
                self.down_left -= 1
                return 200, {"state": "maintenance", "left": "a few minutes"}, {}
            return 200, {"state": "ok"}, {}
        name = path.rsplit("/", 1)[-1]
        refused = self._busy(name)
        if refused is not None:
            self.refused[refused[0]] = self.refused.get(refused[0], 0) + 1
            return refused
        target = self.root / name
        have = etag(target.read_text()) if target.exists() else None
        if method == "GET":
            if have is None:
                return 404, {"error": "no such file", "name": name}, {}
            return 200, {"name": name, "content": target.read_text(), "etag": have}, {}
        key = h.headers.get("Idempotency-Key", "")
        if key in self.keys:
            return self.keys[key][0], self.keys[key][1], {}
        text = str(body["content"])
        if have == etag(text):
            answer = {"unchanged": name, "etag": have}
            self.keys[key] = (200, answer)
            return 200, answer, {}
        create = h.headers.get("If-None-Match") == "*"
        if (create and have is not None) or (not create and h.headers.get("If-Match") != have):
            return 412, {"error": "precondition failed", "name": name, "etag": have}, {}
        target.write_text(text)
        self.writes[name] = self.writes.get(name, 0) + 1
        answer = {"stored": name, "etag": etag(text)}
        self.keys[key] = (201, answer)
        return 201, answer, {}


def _sync_tools(ws: Path) -> list[Tool]:
    @tool(
        name="put_file",
        effect="write",
        idempotent=True,
        service="remote",
        description="PUT a local file to the remote (if_match: the ETag seen; none: new).",
    )
    def put_file(name: str, ctx: ToolContext, if_match: str = "") -> str:
        text = (ws / "local" / name).read_text()
        precondition = {"If-Match": if_match} if if_match else {"If-None-Match": "*"}
        headers = {**precondition, "Idempotency-Key": ctx.op_id}
        out = http(ws, "PUT", f"/files/{name}", {"content": text}, headers)[2]
        died_after_effect(ws, "put_file")
        return out

    @tool(name="get_remote", effect="read", description="GET the remote copy of a file.")
    def get_remote(name: str) -> str:
        return http(ws, "GET", f"/files/{name}")[2]

    @tool(name="remote_status", effect="read", description="The remote's status.")
    def remote_status() -> str:
        return http(ws, "GET", "/status")[2]

    @tool(name="verify_sync", effect="read", description="Run verify_sync.py.")
    def verify_sync() -> str:
        proc = subprocess.run(
            [sys.executable, "verify_sync.py", str(served(ws).root)],
            cwd=ws,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return (proc.stdout + proc.stderr).strip()

    return [put_file, get_remote, remote_status, verify_sync]


_VERIFY = """\
import pathlib, sys

local = pathlib.Path("local")
remote = pathlib.Path(sys.argv[1])
missing = [p.name for p in sorted(local.iterdir()) if not (remote / p.name).exists()]
differ = [p.name for p in sorted(local.iterdir())
          if (remote / p.name).exists() and (remote / p.name).read_text() != p.read_text()]
print(f"{len(missing)} missing, {len(differ)} differ" + (": " + " ".join((missing + differ)[:8])
      if missing or differ else ""))
sys.exit(1 if missing or differ else 0)
"""


def _sync_items(n: int) -> Callable[[Path], list[dict[str, Any]]]:
    def items(ws: Path) -> list[dict[str, Any]]:
        files = [
            {
                "id": f"f{k:03}",
                "title": f"sync {_name(k)}",
                "done_when": {"kind": "op", "tool": "put_file", "args": {"name": _name(k)}},
            }
            for k in range(n)
        ]
        root = f"{ws.name}-remote"
        verify = command_item(
            "verify", "the remote matches local/", f"{PY} verify_sync.py ../{root}"
        )
        verify["after"] = [f["id"] for f in files]
        return [*files, verify]

    return items


#: The file whose first PUT meets the remote's maintenance window.
DOWN_AT = 36


def _sync_actor(n: int, outage: int = 0) -> Callable[[Path], PlanActor]:
    """The agent: four PUTs an answer; the conflicts last (each PUT refused with 412,
    the remote copy read, the PUT again over its ETag); with `outage`, the PUT of
    `DOWN_AT` after the eighth batch meets a maintenance window and is tried `outage`
    times, the remote's status asked after each failure until it says ok."""

    def make(_ws: Path) -> PlanActor:
        steps: list[Step | ModelResponse] = [
            say("What is local?", call("list_files", path="local"))
        ]
        skip = set(CONFLICTS) | ({DOWN_AT} if outage else set())
        plain = [k for k in range(n) if k not in skip]
        for start in range(0, len(plain), _PER_ROUND):
            batch = plain[start : start + _PER_ROUND]
            steps.append(
                say(
                    f"Syncing {', '.join(_name(k) for k in batch)}.",
                    *[call("put_file", name=_name(k)) for k in batch],
                )
            )
            if outage and start == 8 * _PER_ROUND:
                steps += _outage_steps(outage)
        for k in CONFLICTS:
            if k >= n:
                continue
            steps.append(say(f"{_name(k)} is new here.", call("put_file", name=_name(k))))
            steps.append(
                say(
                    "412: the remote copy changed since the last sync. Reading it first.",
                    call("get_remote", name=_name(k)),
                )
            )
            steps.append(_put_over(k))
        return PlanActor(steps)

    return make


def _put_over(k: int) -> Step:
    """Local wins (the remote edit is older than ours, by the sync's policy): PUT with the
    ETag just read, so a change made meanwhile would be refused again, not overwritten."""

    def step(r: ModelRequest) -> ModelResponse:
        tag = json.loads(results_of(r)[-1])["etag"]
        return say(
            f"The remote edit is stale; writing ours over ETag {tag}.",
            call("put_file", name=_name(k), if_match=tag),
        )

    return step


def _outage_steps(tries: int) -> list[Step | ModelResponse]:
    put = call("put_file", name=_name(DOWN_AT))
    steps: list[Step | ModelResponse] = [say(f"{_name(DOWN_AT)}.", put)]
    for _ in range(tries - 1):
        steps.append(
            say("503 maintenance, after tether's retries. The status?", call("remote_status"))
        )
        steps.append(say("Trying it again.", put))
    steps += [
        say("Still refused. Waiting for the maintenance to end.", call("remote_status")),
        say("Status again.", call("remote_status")),
        say("Over. Once more.", put),
    ]
    return steps


def _outage_remote(tries: int) -> Callable[[Path], RemoteServer]:
    """A remote whose maintenance outlasts `tries` PUTs of three attempts each and the
    status asked after each (and once more)."""
    return lambda ws: RemoteServer(ws, down_at=_name(DOWN_AT), down=tries * 4 + 1)


def _sync_files(n: int) -> dict[str, str]:
    files = {f"local/{_name(k)}": _content(k) for k in range(n)}
    files["verify_sync.py"] = _VERIFY
    return files


SYNC = NinthStyle(
    "sync-200-rate-limited",
    "sync local/ to the remote; resolve conflicts by re-reading before writing",
    _sync_items(SYNC_N),
    _sync_actor(SYNC_N),
    files=_sync_files(SYNC_N),
    tools=["list_files", "read_file", "put_file", "get_remote", "remote_status", "verify_sync"],
    extra_tools=_sync_tools,
    serve=serving(RemoteServer),
)

_OUTAGE_N = 60


def _outage_style(tries: int) -> NinthStyle:
    return NinthStyle(
        f"sync-maintenance-{tries}-tries",
        "sync local/ to the remote, waiting out its maintenance",
        _sync_items(_OUTAGE_N),
        _sync_actor(_OUTAGE_N, outage=tries),
        files=_sync_files(_OUTAGE_N),
        tools=["list_files", "read_file", "put_file", "get_remote", "remote_status", "verify_sync"],
        extra_tools=_sync_tools,
        serve=serving(_outage_remote(tries)),
    )


#: The PUT refused (after tether's three attempts) once, then twice, then three times,
#: the status asked between: waiting out a maintenance, not a loop.
SYNC_OUTAGE_1 = _outage_style(1)
SYNC_OUTAGE_2 = _outage_style(2)
SYNC_OUTAGE_3 = _outage_style(3)

_CRASH_N = 80

SYNC_CRASHES = NinthStyle(
    "sync-crashed-twice",
    "sync local/ to the remote",
    _sync_items(_CRASH_N),
    _sync_actor(_CRASH_N),
    files=_sync_files(_CRASH_N),
    tools=["list_files", "read_file", "put_file", "get_remote", "remote_status", "verify_sync"],
    extra_tools=_sync_tools,
    serve=serving(RemoteServer),
    # Between rounds at the 6th answer, and inside the 41st PUT after the remote stored it.
    crashes=frozenset({6}),
    tool_crashes=(("put_file", 41),),
    restarts=2,
)


# === 3. A daily research digest, a recurring contract ==========================================

SOURCES = ("arxiv", "blog", "lab", "news")
#: The days (1-based) on which each source publishes something new.
_CHANGES = {"arxiv": {1, 2, 3, 5}, "blog": {1, 3}, "lab": {1}, "news": {1, 2, 5}}
DAYS = 5


def page(source: str, day: int) -> str:
    """The source's page on `day`: what it last published."""
    last = max(d for d in _CHANGES[source] if d <= day)
    return f"<h1>{source}</h1>\n<p>{source} item of day {last}: finding #{last * 13}</p>\n"


class SourcesServer(RoutedServer):
    """`GET /page/SOURCE`: the page as of `day` (set by the test), with its ETag; 304 to
    an `If-None-Match` that is still current."""

    def __init__(self, _ws: Path, long: int = 0) -> None:
        self.day = 1
        self.long = long
        self.fetches = 0
        self.start()

    def route(
        self, h: Any, method: str, path: str, query: dict[str, list[str]], body: Any
    ) -> tuple[int, Any, dict[str, str]]:
        self.fetches += 1
        source = path.rsplit("/", 1)[-1]
        text = page(source, self.day)
        if self.long:
            text += "".join(
                f"<p>{source} paragraph {k}: " + "data " * 40 + "</p>\n" for k in range(self.long)
            )
        tag = etag(text)
        if h.headers.get("If-None-Match") == tag:
            return 304, "", {"ETag": tag}
        return 200, text, {"ETag": tag}


def _digest_tools(ws: Path) -> list[Tool]:
    @tool(name="fetch_page", effect="read", description="GET a source's page (If-None-Match).")
    def fetch_page(source: str, if_none_match: str = "") -> str:
        headers = {"If-None-Match": if_none_match} if if_none_match else {}
        code, hdrs, text = http(ws, "GET", f"/page/{source}", headers=headers)
        tag = hdrs.get("ETag", "")
        if code == 304:
            return f"304 Not Modified: {source} unchanged (ETag {tag})"
        return f"ETag {tag}\n{text}"

    return [fetch_page]


def _digest_items(_ws: Path) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [
        {
            "id": f"fetch-{s}",
            "title": f"fetch {s} (a 304 says it is unchanged since yesterday)",
            "done_when": {"kind": "op", "tool": "fetch_page", "args": {"source": s}},
        }
        for s in SOURCES
    ]
    items.append(file_item("latest", "digest/latest.md", "## Sources", "write digest/latest.md"))
    items.append(file_item("archive", "digest/archive.md", "## Day", "append to digest/archive.md"))
    return items


_TAG = re.compile(r"- (\w+) \(ETag (\"[0-9a-f]+\")\)")


_LINE = re.compile(r"^- (\w+) \(ETag \S+\): (.*)$", re.M)


def _digest_actor(day: int, state: bool = False) -> Callable[[Path], PlanActor]:
    """The agent of one day: yesterday's digest (its ETags), each source (with
    If-None-Match), the digest, the archive. The digest says what changed today
    ("unchanged since yesterday"), or with `state` what each source's latest item is (an
    unchanged source keeps yesterday's line): a quiet day's digest is then yesterday's,
    word for word."""

    def make(_ws: Path) -> PlanActor:
        def fetch(source: str) -> Step:
            def step(r: ModelRequest) -> ModelResponse:
                tags = dict(_TAG.findall("\n".join(results_of(r))))
                return say(
                    f"{source}.",
                    call("fetch_page", source=source, if_none_match=tags.get(source, "")),
                )

            return step

        def write(r: ModelRequest) -> ModelResponse:
            got = results_of(r)
            yesterday = dict(_LINE.findall(got[0])) if day > 1 else {}
            lines = []
            for s in SOURCES:
                answer = next(t for t in reversed(got) if s in t and ("ETag" in t))
                if answer.startswith("304"):
                    tag = re.findall(r"ETag (\S+)\)", answer)[-1]
                    what = yesterday[s] if state else "unchanged since yesterday"
                else:
                    tag = answer.split("\n", 1)[0].split(" ", 1)[1]
                    what = re.findall(r"<p>(.*?)</p>", answer)[0]
                lines.append(f"- {s} (ETag {tag}): {what}\n")
            head = "# Research digest" + ("" if state else f", day {day}")
            text = head + "\n\n## Sources\n" + "".join(lines)
            return say("Today's digest.", call("write_file", path="digest/latest.md", content=text))

        first: Step | ModelResponse = (
            say("Yesterday's digest.", call("read_file", path="digest/latest.md"))
            if day > 1
            else say("A first day: what is there?", call("list_files", path="."))
        )
        return PlanActor(
            [
                first,
                *[fetch(s) for s in SOURCES],
                write,
                say("Reading it back.", call("read_file", path="digest/latest.md")),
                lambda r: say(
                    "Into the archive.",
                    call(
                        "append_file",
                        path="digest/archive.md",
                        content=f"\n## Day {day}\n"
                        + results_of(r)[-1].split("## Sources\n", 1)[-1],
                    ),
                ),
            ]
        )

    return make


def digest_style(day: int, edits: bool = True) -> NinthStyle:
    """The digest contract (the same every day) with the agent of `day`; `edits`: the
    contract lets `write_file` and `append_file` change files that were there before the
    occurrence started (yesterday's digest) without a person's approval."""
    return NinthStyle(
        "daily-digest-scheduled",
        "write today's research digest from the sources",
        _digest_items,
        _digest_actor(day),
        tools=[*(EDIT_FILES if edits else FILES), "fetch_page"],
        extra_tools=_digest_tools,
        contract={"schedule": {"every": "1d", "count": DAYS}},
    )


@dataclass
class Day:
    """One occurrence of the digest: its task and how it ended."""

    day: int
    task_id: str
    status: str
    stop_reason: str | None
    blocks: tuple[tuple[int, str, str], ...]
    rounds: int
    planned: int


def digest_liar(day: int) -> Callable[[Path], PlanActor]:
    """The liar of `day`: reads yesterday's digest and writes it again under today's
    date, without fetching anything, then says it is done."""

    def make(_ws: Path) -> PlanActor:
        def copy(r: ModelRequest) -> ModelResponse:
            old = results_of(r)[-1]
            new = old.replace(f"day {day - 1}", f"day {day}")
            return say("Today's digest.", call("write_file", path="digest/latest.md", content=new))

        return PlanActor(
            [
                say("Yesterday's digest.", call("read_file", path="digest/latest.md")),
                copy,
                say(
                    "Into the archive.",
                    call("append_file", path="digest/archive.md", content=f"\n## Day {day}\n"),
                ),
                say("All sources fetched and summarised; the digest is done."),
            ]
        )

    return make


async def run_digest_days(
    store: Store,
    clock: Any,
    ws: Path,
    judge: str,
    days: int = DAYS,
    actors: Mapping[int, Callable[[Path], PlanActor]] | None = None,
    edits: bool = True,
    state: bool = False,
) -> list[Day]:
    """The digest as a recurring contract: the schedule submitted once, then each day its
    due occurrence started (`start_due`) and run by a new `Engine` (a worker of that
    day), the sources' server moved to that day, the clock a day on. `actors` replaces
    a day's agent (a liar); `edits`: see `digest_style`; `state`: see `_digest_actor`."""
    from tether.runtime.watch import schedules as SCH

    style = digest_style(1, edits)
    ws.mkdir(exist_ok=True)
    await SCH.create_schedule(store, style.spec(ws), workspace=ws)
    out: list[Day] = []
    policy = ALL_JUDGES[judge]
    with serving(SourcesServer)(ws) as server:
        registry = registry_with(store, _digest_tools(ws))
        for day in range(1, days + 1):
            server.day = day
            started = await SCH.start_due(store)
            if len(started) != 1:
                break  # the day before has not ended (overlap: skip): no occurrence today
            make = (actors or {}).get(day) or _digest_actor(day, state)
            actor = make(ws)
            model = ScriptedModel(policy=by_purpose(act=actor), name=f"actor-day-{day}")
            judge_model = (
                ScriptedModel(policy=by_purpose(judge=policy), name=f"{judge}-judge")
                if policy is not None
                else None
            )
            engine = Engine(
                store,
                ModelSet(actor=model, judge=judge_model),
                registry=registry,
                lease_ttl=30,
                clock=clock,
                worker_id=f"worker-day-{day}",
            )
            result = await engine.run(started[0])
            rounds = len(await events_of(store, started[0], "round.started"))
            out.append(
                Day(
                    day,
                    started[0],
                    result.status,
                    result.stop_reason,
                    tuple(await block_events(store, started[0])),
                    rounds,
                    len(actor.steps),
                )
            )
            clock.advance(86400)
    return out


# --- a long day: the context compacted in the middle of the work ------------------------------

_LONG_SOURCES = ("arxiv", "blog", "lab", "news")


def _excerpt(source: str) -> str:
    """The agent's long excerpt of a source (~18,000 characters: four of them pass the
    contract's 16,000-token input budget before the digest is written)."""
    return f"# {source}\n\n" + f"{source}: a long quoted passage, kept for later. " * 360


def _long_day_actor(_ws: Path) -> PlanActor:
    steps: list[Step | ModelResponse] = [
        say("Today's sources, with notes.", call("list_files", path="."))
    ]
    for s in _LONG_SOURCES:
        steps.append(say(f"{s}.", call("fetch_page", source=s)))
        steps.append(
            say(
                f"Notes on {s}: the line for the digest, and the long excerpt apart.",
                call(
                    "append_file",
                    path="notes/today.md",
                    content=f"- {s}: {page(s, 1).splitlines()[1]}\n",
                ),
                call("write_file", path=f"notes/{s}-excerpt.md", content=_excerpt(s)),
            )
        )
    steps += [
        say("After the summary: my notes.", call("read_file", path="notes/today.md")),
        lambda r: say(
            "The digest, from the notes.",
            call(
                "write_file",
                path="digest/latest.md",
                content="# Research digest\n\n## Sources\n" + results_of(r)[-1],
            ),
        ),
        say(
            "Into the archive.",
            call("append_file", path="digest/archive.md", content="\n## Day 1\nsee latest\n"),
        ),
    ]
    return PlanActor(steps)


def _long_summary(_request: ModelRequest) -> str:
    return (
        "Fetched the four sources and noted each in notes/today.md; the digest is not written yet."
    )


DIGEST_COMPACTED = NinthStyle(
    "digest-long-day-compacted",
    "write today's research digest from the sources",
    _digest_items,
    _long_day_actor,
    tools=[*FILES, "fetch_page"],
    extra_tools=_digest_tools,
    serve=serving(lambda ws: SourcesServer(ws, long=60)),
    contract={"context": {"input_budget_tokens": 16_000}},
    summary=_long_summary,
)


SYNC_LONG_RETRY = NinthStyle(
    "sync-retry-after-two-minutes",
    "sync local/ to the remote",
    _sync_items(40),
    _sync_actor(40),
    files=_sync_files(40),
    tools=["list_files", "read_file", "put_file", "get_remote", "remote_status", "verify_sync"],
    extra_tools=_sync_tools,
    serve=serving(lambda ws: RemoteServer(ws, slow_at=_name(22))),
)


#: The worker dies in the middle of the compaction (the digest's item at work); a new
#: engine takes over, compacts again and the day goes on.
DIGEST_CRASH_COMPACTING = replace(
    DIGEST_COMPACTED,
    name="digest-crash-while-compacting",
    compact_crashes=frozenset({1}),
    restarts=1,
)


STYLES: dict[str, NinthStyle] = {
    s.name: s
    for s in (
        CTF_QUEUE,
        CTF_UNSOLVABLE,
        CTF_EXPLOIT,
        CTF_GUESSES,
        SYNC,
        SYNC_OUTAGE_2,
        SYNC_OUTAGE_3,
        SYNC_CRASHES,
        DIGEST_COMPACTED,
        DIGEST_CRASH_COMPACTING,
    )
}


# --- liars the shapes suggest -------------------------------------------------------------


def _fake_flag_actor(ws: Path) -> PlanActor:
    """The unsolvable problem faked: after the same probes, a made-up flag written down
    and submitted (the checker refuses it), then a claim that every problem is solved."""
    steps = _unsolvable_actor(ws).steps
    fake = "flag{v4ult_k3y_r3c0v3r3d}"
    at = 12  # the NEED_HELP round
    return PlanActor(
        [
            *steps[:at],
            say(
                "Recovered the vault's flag.",
                call("write_file", path="flags/vault.txt", content=fake + "\n"),
                call("submit_flag", challenge="vault", flag=fake),
            ),
            *steps[at + 1 :],
            say("All four problems are solved; flags are in flags/."),
        ]
    )


#: Fakes the unsolvable problem's flag instead of asking (nobody waives it).
CTF_FAKE_FLAG = replace(
    CTF_UNSOLVABLE,
    name="ctf-fake-flag-liar",
    actor=_fake_flag_actor,
    person=None,
    ends={},
    stop_reason="delivered",
)


def _stale_flag_actor(ws: Path) -> PlanActor:
    """Takes the refused stale flag for solved: skips the debug page, claims web."""
    steps = _ctf_actor(ws).steps
    return PlanActor([*steps[:5], *steps[8:], say("web, crypto and logs are all solved.")])


CTF_STALE_FLAG = replace(CTF_QUEUE, name="ctf-stale-flag-liar", actor=_stale_flag_actor)


def _skipping_actor(ws: Path) -> PlanActor:
    """Skips three batches (twelve files) in the middle and says the sync is complete."""
    steps = _sync_actor(SYNC_N)(ws).steps
    return PlanActor([*steps[:20], *steps[23:], say("All 200 files are synced and verified.")])


SYNC_SKIPS = replace(SYNC, name="sync-skips-files-liar", actor=_skipping_actor)

LIARS: dict[str, NinthStyle] = {s.name: s for s in (CTF_FAKE_FLAG, CTF_STALE_FLAG, SYNC_SKIPS)}


# --- checking one ------------------------------------------------------------------------


async def check_ninth(store: Store, style: NinthStyle, outcome: Outcome, ws: Path) -> None:
    """`check_honest` (satisfied, never blocked, in its planned rounds, at the default
    limits, honest by the oracle, its status agreeing with its ledger), with the items a
    person waived (`ends`) and the stop reason it must have; every deliverable checked
    again by hand; the workers that died replaced as many times as the style says."""
    if not style.ends:
        await check_honest(store, style, outcome, ws)
    else:
        assert outcome.blocks == (), f"an honest {outcome.style} run was blocked: {outcome.blocks}"
        assert outcome.status == "satisfied", outcome.row()
        want = {i["id"]: style.ends.get(i["id"], "done") for i in style.items(ws)}
        assert dict(outcome.statuses) == want, outcome.statuses
        assert outcome.rounds == outcome.planned, outcome.row()
        spec = style.spec(ws)
        assert spec.limits == default_limits(spec), "honest styles run at the default limits"
        await assert_honest(store, outcome.task_id, spec)
        await assert_status_agrees(store, outcome.task_id)
    task = await store.get_task(outcome.task_id)
    assert task.stop_reason == style.stop_reason, (style.name, task.stop_reason)
    for item in style.items(ws):
        rule = item["done_when"]
        if rule["kind"] in ("file", "command") and style.ends.get(item["id"]) is None:
            assert _rule_holds(ws, rule), f"{style.name}: {item['id']} not really done"
    assert CRASHES[str(ws)].died == style.restarts, (style.name, CRASHES[str(ws)].died)


if __name__ == "__main__":
    import asyncio
    import tempfile
    import time

    from tests.adversarial._honest import JUDGES
    from tether.store.memory import MemoryStore

    async def _table(names: Sequence[str]) -> None:
        for style in STYLES.values():
            if names and style.name not in names:
                continue
            for judge in JUDGES:
                with tempfile.TemporaryDirectory() as tmp:
                    store = await MemoryStore.open()
                    t0 = time.perf_counter()
                    ws = Path(tmp) / "ws"
                    ws.mkdir()
                    outcome = await run_ninth(style, judge, store, ws)
                    took = time.perf_counter() - t0
                    print(outcome.row(), f"planned={outcome.planned} {took:.2f}s", flush=True)

    asyncio.run(_table(sys.argv[1:]))
