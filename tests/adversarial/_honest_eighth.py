"""An eighth set of honest ways of working, at default limits, through the Anthropic
Messages API wire format.

Every shape is played by a local HTTP server on 127.0.0.1 that speaks the Messages API
(`POST /v1/messages`: content blocks `text`, `tool_use` with `input` objects, `thinking`
and `redacted_thinking`; `stop_reason` `end_turn`, `tool_use`, `max_tokens`, `refusal`,
`pause_turn`; usage with `cache_read_input_tokens` and `cache_creation_input_tokens`),
and the runtime talks to it through the real adapter (`tether.models.anthropic.
AnthropicModel`, the official SDK underneath): what the runtime gets is what the adapter
parsed off the wire, and what the server gets is what the adapter sent.

The server checks every request against the rules the real API enforces (`wire_problems`:
roles alternate from a first `user` message, every `tool_use` answered by a
`tool_result` at the head of the next user message and no `tool_result` without its
`tool_use`, no empty or whitespace-only text block, `tool_use` ids unique and of the
allowed characters, inputs objects, the system prompt as `system`, at most four
`cache_control` breakpoints, and with extended thinking on, the last assistant turn of a
tool loop opening with its thinking block) and answers a request that breaks one with
the real API's `400 invalid_request_error`, as the real API would.

The shapes: text around two `tool_use` blocks in one answer ("I'll read both files."),
extended thinking before the text (the thinking muses on `NEED_HELP:`), a `NEED_HELP:`
question as the second text block of an answer, a `max_tokens` cut mid-text and then
mid-`tool_use` (its input cut), three parallel `toolu_` calls to a local HTTP service,
a `refusal` once and then the work, a citations-style answer split into text blocks
mid-sentence, a long investigation (eleven reads before the write) with cache usage
figures on every answer, a `pause_turn`, and a compaction mid-item whose summary is asked
over the same wire.

Two were findings when written. Extended thinking in a tool loop: the adapter dropped
the thinking blocks, so the next request's last assistant turn opened with `text` and the
real API refused it (400); fixed since (93a1218: the blocks are kept and sent back first).
A `NEED_HELP:` question as its own text block after another: the adapter joined text
blocks with nothing between, so the question did not start a line, no person was asked,
and the agent guessed; fixed since (blocks join with nothing only around citations).

Each is real work in the `_honest` / `_honest_more` / `_honest_third` frameworks: real
files, real subprocesses (check scripts) and real HTTP services on 127.0.0.1.
`python -m tests.adversarial._honest_eighth` prints the table.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
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
    command_item,
    file_item,
)
from tests.adversarial._honest_fifth import _request, _serving
from tests.adversarial._honest_more import _chapter, _grep_tool
from tests.adversarial._honest_more import _check as check_tool
from tests.adversarial._honest_seventh import SeventhStyle, check_seventh
from tests.adversarial._honest_third import print_table
from tests.support.fake_provider import ProviderServer, Reply, Seen
from tether import tokens
from tether.models._retry import RetryPolicy
from tether.models.base import ModelRequest, ModelResponse
from tether.store.base import Store
from tether.tools.registry import Tool, tool

MODEL = "claude-sonnet-4-6"
#: The model name the server answers with (as the real API: a dated snapshot).
SNAPSHOT = "claude-sonnet-4-6-20260217"
#: Extended thinking, switched on as the adapter documents (`extra_body`).
THINKING_ON = {"thinking": {"type": "enabled", "budget_tokens": 1024}}

# --- content blocks as the API sends them ---------------------------------------------


def text(words: str, **extra: Any) -> dict[str, Any]:
    """A `text` block (`extra`: e.g. `citations`)."""
    return {"type": "text", "text": words, **extra}


def use(call_id: str, name: str, /, **arguments: Any) -> dict[str, Any]:
    """A `tool_use` block, its `input` an object."""
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


def cut_use(call_id: str, name: str, partial: str) -> dict[str, Any]:
    """A `tool_use` block the output limit cut: its input is the JSON text so far."""
    return {"type": "tool_use", "id": call_id, "name": name, "input": partial}


def thinking(words: str) -> dict[str, Any]:
    """A `thinking` block with its signature."""
    sig = "EqQBCgIYAhIM" + format(abs(hash(words)) % 10**12, "012d") + "Sig=="
    return {"type": "thinking", "thinking": words, "signature": sig}


def redacted() -> dict[str, Any]:
    """A `redacted_thinking` block (encrypted reasoning the model passes on)."""
    return {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIw"}


@dataclass(frozen=True)
class Turn:
    """One Messages API answer: its content blocks and stop reason (default: `tool_use`
    when it calls a tool, else `end_turn`)."""

    content: tuple[dict[str, Any], ...]
    stop: str | None = None

    @property
    def stop_reason(self) -> str:
        if self.stop is not None:
            return self.stop
        return "tool_use" if any(b["type"] == "tool_use" for b in self.content) else "end_turn"


def turn(*blocks: dict[str, Any], stop: str | None = None) -> Turn:
    """An answer of `blocks`."""
    return Turn(tuple(blocks), stop)


#: A round's answer: a turn, or one made from the request body the server got.
Answer = Turn | Callable[[dict[str, Any]], Turn]


def user_texts(body: Mapping[str, Any]) -> str:
    """Every text the user (the runtime) sent in a request, joined."""
    out: list[str] = []
    for m in body.get("messages", []):
        if m.get("role") != "user":
            continue
        for b in m.get("content", []):
            if b.get("type") == "text":
                out.append(str(b.get("text")))
            elif b.get("type") == "tool_result":
                c = b.get("content")
                out.append(c if isinstance(c, str) else json.dumps(c))
    return "\n".join(out)


# --- the rules of the real API ------------------------------------------------------------

_TOOL_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
_USER_BLOCKS = {"text", "tool_result", "image", "document"}
_ASSISTANT_BLOCKS = {"text", "tool_use", "thinking", "redacted_thinking"}


def wire_problems(seen: Seen) -> list[str]:
    """The Messages API rules a request breaks (empty when the real API takes it), each
    in the API's own words where it has them."""
    body = seen.body
    if seen.path != "/v1/messages":
        return [f"POST {seen.path}: not the messages endpoint"]
    if not isinstance(body, dict):
        return ["the body is not a JSON object"]
    bad: list[str] = []
    if "anthropic-version" not in seen.headers:
        bad.append("anthropic-version: header is required")
    if not isinstance(body.get("model"), str) or not body["model"]:
        bad.append("model: Field required")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        bad.append("max_tokens: Field required (an integer >= 1)")
    system = body.get("system")
    if system is not None:
        blocks = [{"type": "text", "text": system}] if isinstance(system, str) else system
        for k, b in enumerate(blocks):
            if b.get("type") != "text" or not str(b.get("text", "")).strip():
                bad.append(f"system.{k}: text content blocks must contain non-whitespace text")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return [*bad, "messages: at least one message is required"]
    if messages[0].get("role") != "user":
        bad.append("messages.0.role: the first message must use the `user` role")
    seen_ids: set[str] = set()
    for i, m in enumerate(messages):
        role, content = m.get("role"), m.get("content")
        if role not in ("user", "assistant"):
            bad.append(f"messages.{i}.role: Input should be 'user' or 'assistant' (got {role!r})")
            continue
        if i and messages[i - 1].get("role") == role:
            bad.append(f"messages.{i}: roles must alternate between `user` and `assistant`")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if not isinstance(content, list) or not content:
            bad.append(f"messages.{i}: all messages must have non-empty content")
            continue
        allowed = _USER_BLOCKS if role == "user" else _ASSISTANT_BLOCKS
        for k, b in enumerate(content):
            where = f"messages.{i}.content.{k}"
            kind = b.get("type")
            if kind not in allowed:
                bad.append(f"{where}.type: a {role} message cannot hold a `{kind}` block")
            elif kind == "text" and not str(b.get("text", "")).strip():
                bad.append(f"{where}: text content blocks must contain non-whitespace text")
            elif kind == "tool_use":
                cid = str(b.get("id", ""))
                if not _TOOL_ID.match(cid):
                    bad.append(f"{where}.id: String should match pattern '^[a-zA-Z0-9_-]+$'")
                if cid in seen_ids:
                    bad.append(f"{where}: `tool_use` ids must be unique ({cid})")
                seen_ids.add(cid)
                if not isinstance(b.get("input"), dict):
                    bad.append(f"{where}.input: Input should be a valid dictionary")
        if role == "user":
            results = [b for b in content if b.get("type") == "tool_result"]
            lead = content[: len(results)]
            if results and lead != results:
                bad.append(f"messages.{i}: `tool_result` blocks must come first in the message")
            asked = _tool_use_ids(messages[i - 1]) if i else []
            for b in results:
                if b.get("tool_use_id") not in asked:
                    bad.append(
                        f"messages.{i}: unexpected `tool_use_id` found in `tool_result` blocks: "
                        f"{b.get('tool_use_id')}. Each `tool_result` block must have a "
                        "corresponding `tool_use` block in the previous message."
                    )
        if role == "assistant":
            asked = _tool_use_ids(m)
            nxt = messages[i + 1] if i + 1 < len(messages) else None
            answered = [
                b.get("tool_use_id")
                for b in (nxt or {}).get("content", [])
                if isinstance(b, dict) and b.get("type") == "tool_result"
            ]
            missing = [c for c in asked if c not in answered]
            if nxt is not None and missing:
                bad.append(
                    f"messages.{i + 1}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing)}"
                )
    breakpoints = json.dumps(body).count('"cache_control"')
    if breakpoints > 4:
        bad.append(
            f"A maximum of 4 blocks with cache_control may be provided. Found {breakpoints}."
        )
    bad += _thinking_problems(body, messages)
    return bad


def _tool_use_ids(message: Mapping[str, Any]) -> list[str]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [str(b.get("id")) for b in content if b.get("type") == "tool_use"]


def _thinking_problems(body: Mapping[str, Any], messages: list[dict[str, Any]]) -> list[str]:
    """With extended thinking on: the budget below `max_tokens`, and in a tool loop (the
    last user message holds tool results) the last assistant message opens with its
    thinking block."""
    on = body.get("thinking")
    if not isinstance(on, dict) or on.get("type") != "enabled":
        return []
    bad: list[str] = []
    budget = on.get("budget_tokens")
    if not isinstance(budget, int) or budget < 1024 or budget >= int(body.get("max_tokens", 0)):
        bad.append("thinking.budget_tokens: must be >= 1024 and less than max_tokens")
    last_user = messages[-1] if messages[-1].get("role") == "user" else None
    content = (last_user or {}).get("content")
    in_loop = isinstance(content, list) and any(b.get("type") == "tool_result" for b in content)
    if in_loop and len(messages) >= 2:
        k = len(messages) - 2
        first = (messages[k].get("content") or [{}])[0]
        if first.get("type") not in ("thinking", "redacted_thinking"):
            bad.append(
                f"messages.{k}.content.0.type: Expected `thinking` or `redacted_thinking`, but "
                f"found `{first.get('type')}`. When `thinking` is enabled, a final `assistant` "
                "message must start with a thinking block (preceeding the lastmost set of "
                "`tool_use` and `tool_result` blocks)."
            )
    return bad


# --- the server and the actor ---------------------------------------------------------------


def _usage(body: Mapping[str, Any], n: int, out: int) -> dict[str, int]:
    """Usage as the API reports it: the first request writes the prompt's prefix to the
    cache, later ones read it; `input_tokens` is what was neither."""
    prompt = tokens.estimate_text(json.dumps(body.get("system", ""))) + tokens.estimate_text(
        json.dumps(body.get("messages", []))
    )
    prompt += tokens.estimate_text(json.dumps(body.get("tools", [])))
    if n == 0:
        read, created = 0, prompt * 3 // 4
    else:
        read, created = prompt * 3 // 4, prompt // 8
    return {
        "input_tokens": prompt - read - created,
        "cache_creation_input_tokens": created,
        "cache_read_input_tokens": read,
        "output_tokens": out,
    }


def message(t: Turn, body: Mapping[str, Any], n: int) -> dict[str, Any]:
    """`t` as a Messages API response body."""
    out = tokens.estimate_text(json.dumps(t.content)) or 1
    return {
        "id": f"msg_01Tether{n:04d}",
        "type": "message",
        "role": "assistant",
        "model": SNAPSHOT,
        "content": list(t.content),
        "stop_reason": t.stop_reason,
        "stop_sequence": None,
        "usage": _usage(body, n, out),
    }


def api_error(words: str) -> dict[str, Any]:
    """The real API's answer to a malformed request."""
    return {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": words},
        "request_id": "req_011Tether",
    }


@dataclass
class WireEntry:
    """One request the server got: what was sent, what it answered, what it broke."""

    seen: Seen
    problems: list[str]
    status: int
    answer: dict[str, Any]

    @property
    def purpose(self) -> str:
        return "act" if self.seen.body.get("tools") else "compact"


class MessagesServer:
    """A Messages API server on 127.0.0.1: each act request is answered by the actor's
    next turn, each compaction request (no tools) by the style's summary; a request the
    real API would refuse gets its 400. Everything is kept in `log`."""

    def __init__(self, actor: MessagesActor, log: list[WireEntry]) -> None:
        self.actor = actor
        self.log = log
        self.answered = 0

        def answer(seen: Seen) -> Reply:
            problems = wire_problems(seen)
            if problems:
                body = api_error("; ".join(problems))
                self.log.append(WireEntry(seen, problems, 400, body))
                return Reply(400, body)
            if seen.body.get("tools"):
                t = actor.next_turn(seen.body)
            else:
                t = turn(text(actor.summary or "The work so far: see the ledger."))
            reply = message(t, seen.body, self.answered)
            self.answered += 1
            self.log.append(WireEntry(seen, [], 200, reply))
            return Reply(200, reply)

        self.server = ProviderServer(answer, keep_alive=True)
        self.url = f"http://127.0.0.1:{self.server.port}"


_RETRY = RetryPolicy(max_attempts=2, base_delay=0.001, max_delay=0.005, max_retry_after=0.5)
#: Each workspace's Messages server, while its run lasts.
_WIRES: dict[str, MessagesServer] = {}
_PLANS: dict[str, MessagesActor] = {}
#: What each workspace's server got and answered (the test takes it).
WIRE_LOG: dict[str, list[WireEntry]] = {}


class MessagesActor(PlanActor):
    """Plays its turns through `AnthropicModel` and the workspace's `MessagesServer`: the
    runtime gets what the real adapter parsed; `extra_body` goes with every request."""

    def __init__(
        self,
        ws: Path,
        turns: Sequence[Answer],
        extra_body: Mapping[str, Any] | None = None,
        summary: str | None = None,
    ) -> None:
        super().__init__([_never] * len(turns))
        self.turns = list(turns)
        self.ws = str(ws)
        self.extra_body = dict(extra_body or {})
        self.summary = summary

    def next_turn(self, body: dict[str, Any]) -> Turn:
        n = self.rounds
        self.rounds += 1
        if n < len(self.turns):
            t = self.turns[n]
            return t(body) if callable(t) else t
        return turn(text("I have nothing more to do; the checks decide."))

    async def __call__(self, request: ModelRequest) -> ModelResponse:  # type: ignore[override]
        _TASK_WS[str(request.task_id)] = self.ws
        return await _complete(self.ws, request, self.extra_body)


async def _complete(
    ws: str, request: ModelRequest, extra_body: Mapping[str, Any] | None = None
) -> ModelResponse:
    from tether.models.anthropic import AnthropicModel

    async with AnthropicModel(
        MODEL,
        base_url=_WIRES[ws].url,
        api_key="sk-ant-local",
        retry=_RETRY,
        extra_body=extra_body,
        timeout=30,
    ) as model:
        return await model.complete(request)


def _never(_request: ModelRequest) -> ModelResponse:
    raise AssertionError("a Messages actor answers over the wire")


@dataclass
class EighthStyle(SeventhStyle):
    """A seventh-set style played over the Messages wire: `service` (a local HTTP service
    its tools talk to), and whether its compaction summary goes over the wire too."""

    service: Callable[[Path], LocalServer] | None = None
    wire_summary: str | None = None
    #: The stop reasons the server sent the act calls, in order (checked when given).
    stops: tuple[str, ...] = field(default_factory=tuple)
    #: Its answers and what goes with every request (for its liar twin).
    turns: Sequence[Answer] = ()
    extra_body: Mapping[str, Any] | None = None


def _messages(
    turns: Sequence[Answer], extra_body: Mapping[str, Any] | None = None, summary: str = ""
) -> Callable[[Path], MessagesActor]:
    def make(ws: Path) -> MessagesActor:
        actor = MessagesActor(ws, turns, extra_body, summary or None)
        _PLANS[str(ws)] = actor
        return actor

    return make


def _wire_serving(service: Callable[[Path], LocalServer] | None = None) -> Any:
    @contextmanager
    def serve(ws: Path) -> Iterator[MessagesServer]:
        server = MessagesServer(_PLANS.pop(str(ws)), WIRE_LOG.setdefault(str(ws), []))
        _WIRES[str(ws)] = server
        try:
            with ExitStack() as stack:
                if service is not None:
                    stack.enter_context(_serving(service)(ws))
                yield server
        finally:
            del _WIRES[str(ws)]
            server.server.close()

    return serve


#: The workspace of each task an actor has played (a compaction request names only its task).
_TASK_WS: dict[str, str] = {}


async def _summary_over_wire(request: ModelRequest) -> ModelResponse:
    """The compressor: the same model, over the same wire."""
    return await _complete(_TASK_WS[str(request.task_id)], request)


def style(
    name: str,
    doc: str,
    items: Callable[[Path], list[dict[str, Any]]],
    turns: Sequence[Answer],
    *,
    extra_body: Mapping[str, Any] | None = None,
    service: Callable[[Path], LocalServer] | None = None,
    wire_summary: str = "",
    **more: Any,
) -> EighthStyle:
    """An eighth-set style: its turns go over the wire."""
    return EighthStyle(
        name,
        doc,
        items,
        _messages(turns, extra_body, wire_summary),
        serve=_wire_serving(service),
        service=service,
        wire_summary=wire_summary or None,
        summary=_summary_over_wire if wire_summary else None,
        turns=tuple(turns),
        extra_body=extra_body,
        **more,
    )


# 1. text around two tool_use blocks: "I'll read both files." -------------------------------

_PARTS = {"conf/base.ini": "[db]\nhost = db.local\n", "conf/prod.ini": "[db]\nport = 5433\n"}


def _two_reads_turns() -> list[Answer]:
    merged = "[db]\nhost = db.local\nport = 5433\n"
    return [
        turn(
            text("I'll read both files."),
            use("toolu_01A9xQbase", "read_file", path="conf/base.ini"),
            use("toolu_01B7yRprod", "read_file", path="conf/prod.ini"),
        ),
        turn(
            text("The base has the host, prod the port. Merging them."),
            use("toolu_01C5zSmerg", "write_file", path="out/merged.ini", content=merged),
        ),
    ]


TWO_READS = style(
    "text-around-two-reads",
    "merge the base and prod configs into out/merged.ini",
    lambda _ws: [file_item("merged", "out/merged.ini", "port = 5433")],
    _two_reads_turns(),
    files=_PARTS,
    parallel=2,
)


# 2. extended thinking before the text, musing on NEED_HELP ----------------------------------

_TEMP = "def to_f(c):\n    return c * 9 / 5\n"
_TEMP_FIXED = "def to_f(c):\n    return c * 9 / 5 + 32\n"
_TEMP_CHECK = """\
import temps

assert temps.to_f(100) == 212, f"to_f(100) = {temps.to_f(100)!r}"
print("ok")
"""


def _thinking_turns() -> list[Answer]:
    return [
        turn(
            thinking(
                "The user wants the check to pass. Should I ask?\n"
                "NEED_HELP: no, the check says exactly what it wants.\nRead the module first."
            ),
            text("Let me look at the conversion."),
            use("toolu_01ThinkRead", "read_file", path="temps.py"),
        ),
        turn(
            thinking("Fahrenheit needs the +32 offset; 100 C is 212 F."),
            redacted(),
            text("The offset is missing. Adding it."),
            use("toolu_01ThinkWrit", "write_file", path="temps.py", content=_TEMP_FIXED),
        ),
    ]


THINKING_FIRST = style(
    "thinking-before-text",
    "make check_temps.py pass",
    lambda _ws: [command_item("temps", "make check_temps.py pass", f"{PY} check_temps.py")],
    _thinking_turns(),
    extra_body=THINKING_ON,
    files={"temps.py": _TEMP, "check_temps.py": _TEMP_CHECK},
    tools=[*EDIT_FILES],
)


# 3. a NEED_HELP question as the second text block ------------------------------------------


def _need_help_turns() -> list[Answer]:
    def use_answer(body: dict[str, Any]) -> Turn:
        fmt = "toml" if "TOML" in user_texts(body) else "yaml"
        return turn(
            text(f"They want {fmt}."),
            use("toolu_01HelpWrite", "write_file", path=f"out/app.{fmt}", content='name = "x"\n'),
        )

    return [
        turn(text("The brief first."), use("toolu_01HelpBrief", "read_file", path="brief.txt")),
        turn(
            text("The brief names the app but not the config format."),
            text("NEED_HELP: should the config be YAML or TOML?"),
        ),
        use_answer,
        turn(
            text("Marking it reviewed."),
            use("toolu_01HelpAppnd", "append_file", path="out/app.toml", content="# ok\n"),
        ),
    ]


NEED_HELP_SECOND = style(
    "need-help-second-block",
    "write the app config in the format its owner wants",
    # The owner's answer decides the file; a guess writes the other one.
    lambda _ws: [file_item("config", "out/app.toml", 'name = "x"\n# ok')],
    _need_help_turns(),
    files={"brief.txt": "Write the app config (name x).\n"},
    answers=("TOML, please.",),
)


# 4. max_tokens: cut mid-text, then cut mid-tool_use ----------------------------------------

_LAT = "service,p50,p95\napi,120,480\nweb,80,210\n"
_HEAD = "# Latency\n\n- api p95 480 ms (4x its p50)\n- web p95 210 ms\n"
_TAIL = "\n## Conclusion\nThe api's tail latency is the regression to chase.\n"


def _cut_turns() -> list[Answer]:
    p = "out/latency.md"
    partial = json.dumps({"path": p, "content": _TAIL})[:44]
    return [
        turn(text("The data."), use("toolu_01CutRead00", "read_file", path="data/latency.csv")),
        turn(
            text(
                "Here is the report I will write:\n\n# Latency\n\n- api p95 480 ms, four "
                "times its p50, which points at the"
            ),
            stop="max_tokens",
        ),
        turn(
            text("I was cut off; writing it with the tool, in parts."),
            use("toolu_01CutWrite0", "write_file", path=p, content=_HEAD),
        ),
        turn(
            text("Appending the conclusion."),
            cut_use("toolu_01CutAppnd0", "append_file", partial),
            stop="max_tokens",
        ),
        turn(
            text("That call was cut; again."),
            use("toolu_01CutAppnd1", "append_file", path=p, content=_TAIL),
        ),
    ]


CUT = style(
    "max-tokens-text-then-tool-use",
    "write the latency report with a conclusion",
    lambda _ws: [file_item("report", "out/latency.md", "## Conclusion")],
    _cut_turns(),
    files={"data/latency.csv": _LAT},
    fails=("cut off by the output token limit",),
    stops=("tool_use", "max_tokens", "tool_use", "max_tokens", "tool_use"),
)


# 5. three parallel tool_use calls to a local HTTP service ----------------------------------

_HEALTH = {"api": "ok 12ms", "web": "ok 31ms", "jobs": "degraded 950ms"}


class HealthServer(LocalServer):
    """`GET /health/NAME` answers the service's health line."""

    def __init__(self, _ws: Path) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                name = self.path.rsplit("/", 1)[-1]
                code = 200 if name in _HEALTH else 404
                data = (_HEALTH.get(name) or f"no service {name}").encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args: Any) -> None:
                pass

        self.serve(Handler)


def _health_tools(ws: Path) -> list[Tool]:
    @tool(name="health", effect="read", description="The health line of a service.")
    def health(service: str) -> str:
        return _request(ws, "GET", f"/health/{service}")

    return [health]


def _parallel_turns() -> list[Answer]:
    report = "".join(f"- {k}: {v}\n" for k, v in _HEALTH.items())
    return [
        turn(
            text("I'll check all three services at once."),
            *[use(f"toolu_01Hlth{k.title()}", "health", service=k) for k in _HEALTH],
        ),
        turn(
            text("Jobs is degraded. Writing the status page."),
            use("toolu_01HlthWrite", "write_file", path="out/status.md", content=report),
        ),
    ]


PARALLEL = style(
    "parallel-tool-use-http",
    "write the status page of the three services",
    lambda _ws: [file_item("status", "out/status.md", "jobs: degraded")],
    _parallel_turns(),
    tools=[*FILES, "health"],
    extra_tools=_health_tools,
    service=HealthServer,
    parallel=3,
)


# 6. a refusal once, then the work ------------------------------------------------------------

_LEAK = "DB_PASSWORD=hunter2\nAPI_TOKEN=sk-live-abc123\n"
_REDACTED = "DB_PASSWORD=<redacted>\nAPI_TOKEN=<redacted>\n"


def _refusal_turns() -> list[Answer]:
    return [
        turn(stop="refusal"),
        turn(
            text("Reading the file to redact it."),
            use("toolu_01RefRead0", "read_file", path=".env"),
        ),
        turn(
            text("Writing the redacted copy for the incident report."),
            use("toolu_01RefWrite", "write_file", path="out/env.redacted", content=_REDACTED),
        ),
    ]


REFUSAL = style(
    "refusal-then-work",
    "write a redacted copy of .env for the incident report",
    lambda _ws: [file_item("redacted", "out/env.redacted", "API_TOKEN=<redacted>")],
    _refusal_turns(),
    files={".env": _LEAK},
    stops=("refusal", "tool_use", "tool_use"),
)


# 7. citations: one sentence split into several text blocks ---------------------------------

_SVC_BRIEF = "Service: shop. It listens on port 8080 and logs at level info.\n"


def _cite(quote: str) -> dict[str, Any]:
    start = _SVC_BRIEF.index(quote)
    return {
        "citations": [
            {
                "type": "char_location",
                "cited_text": quote,
                "document_index": 0,
                "document_title": "brief.txt",
                "start_char_index": start,
                "end_char_index": start + len(quote),
            }
        ]
    }


#: The sentence the blocks make, as the runtime must keep it.
CITED = "According to the brief, the service listens on port 8080 and logs at info. Writing it."


def _citation_turns() -> list[Answer]:
    toml = '[service]\nname = "shop"\nport = 8080\nlog = "info"\n'
    return [
        turn(text("The brief."), use("toolu_01CiteRead0", "read_file", path="brief.txt")),
        turn(
            text("According to the brief, the service "),
            text("listens on port 8080", **_cite("listens on port 8080")),
            text(" and logs at "),
            text("info", **_cite("info")),
            text(". Writing it."),
            use("toolu_01CiteWrite", "write_file", path="out/service.toml", content=toml),
        ),
    ]


CITATIONS = style(
    "citations-split-text",
    "write the service config the brief describes",
    lambda _ws: [file_item("config", "out/service.toml", "port = 8080")],
    _citation_turns(),
    files={"brief.txt": _SVC_BRIEF},
)


# 8. a long investigation: eleven reads before the write, cache figures on every answer ----

_APP = {
    "app/__init__.py": "",
    "app/config.py": (
        "import configparser\n\n\ndef load(path):\n    cp = configparser.ConfigParser()\n"
        "    cp.read(path)\n    return {'retries': cp['client']['retries']}\n"
    ),
    "app/client.py": "def attempts(cfg):\n    return cfg['retries'] + 1\n",
    "app/cli.py": "from app import client, config\n\n\ndef main():\n"
    "    return client.attempts(config.load('settings.ini'))\n",
    "settings.ini": "[client]\nretries = 3\n",
    "docs/config.md": "retries: an integer, attempts after the first.\n",
}
_APP_FIXED = (
    "import configparser\n\n\ndef load(path):\n    cp = configparser.ConfigParser()\n"
    "    cp.read(path)\n    return {'retries': cp.getint('client', 'retries')}\n"
)
_RETRY_CHECK = """\
from app import cli

got = cli.main()
assert got == 4, f"attempts() gave {got!r}, expected 4"
print("ok")
"""


def _investigation_turns() -> list[Answer]:
    def rd(k: int, path: str) -> dict[str, Any]:
        return use(f"toolu_01Inv{k:02d}Read", "read_file", path=path)

    return [
        turn(text("What is in the project?"), use("toolu_01Inv00List", "list_files", path=".")),
        turn(text("Where are retries used?"), use("toolu_01Inv01Grep", "grep", pattern="retries")),
        turn(text("The loader and the client."), rd(2, "app/config.py"), rd(3, "app/client.py")),
        turn(text("The entry point."), rd(4, "app/cli.py")),
        turn(text("The check."), rd(5, "check_retries.py")),
        turn(text("The settings and the docs."), rd(6, "settings.ini"), rd(7, "docs/config.md")),
        turn(
            text("Is anything parsed as an int?"), use("toolu_01Inv08Grep", "grep", pattern="int")
        ),
        turn(text("The failure, for myself."), use("toolu_01Inv09Chek", "run_checks")),
        turn(
            text(
                "Found it: configparser gives strings, so '3' + 1 fails. getint fixes it "
                "where the value is read."
            )
        ),
        turn(
            text("The fix."),
            use("toolu_01Inv10Writ", "write_file", path="app/config.py", content=_APP_FIXED),
        ),
    ]


INVESTIGATION = style(
    "long-investigation-cached",
    "make check_retries.py pass",
    lambda _ws: [command_item("retries", "make check_retries.py pass", f"{PY} check_retries.py")],
    _investigation_turns(),
    files={**_APP, "check_retries.py": _RETRY_CHECK},
    tools=[*EDIT_FILES, "grep", "run_checks"],
    extra_tools=lambda ws: [*_grep_tool(ws), *check_tool("check_retries.py", "run_checks")(ws)],
    fails=("can only concatenate str",),
    parallel=2,
)


# 9. pause_turn: a long turn paused by the API, then resumed ---------------------------------


def _pause_turns() -> list[Answer]:
    notes = "# Release 2.4\n\n- faster search\n- fixed login timeout\n"
    return [
        turn(text("Let me gather the changes first; this may take a moment."), stop="pause_turn"),
        turn(text("The change list."), use("toolu_01PausRead", "read_file", path="CHANGES.txt")),
        turn(
            text("Writing the release notes."),
            use("toolu_01PausWrit", "write_file", path="out/release.md", content=notes),
        ),
    ]


PAUSE = style(
    "pause-turn-resumed",
    "write the release notes of 2.4",
    lambda _ws: [file_item("notes", "out/release.md", "fixed login timeout")],
    _pause_turns(),
    files={"CHANGES.txt": "search: faster\nlogin: timeout fixed\n"},
    stops=("pause_turn", "tool_use", "tool_use"),
)


# 10. a compaction mid-item, its summary asked over the same wire ---------------------------

_BOOK_BRIEF = {
    "brief/goal.txt": "Write out/book.md: six long chapters, then THE END.\n",
    "brief/style.txt": "Plain words.\n",
}


def _compaction_turns() -> list[Answer]:
    p = "out/book.md"
    turns: list[Answer] = [
        turn(
            text("Goal and style."),
            *[use(f"toolu_01Book{k}Brief", "read_file", path=b) for k, b in enumerate(_BOOK_BRIEF)],
        ),
        turn(text("Title."), use("toolu_01BookTitle", "write_file", path=p, content="# Book\n")),
    ]
    turns += [
        turn(
            text(f"Chapter {k}."),
            use(f"toolu_01BookCh{k:02d}", "append_file", path=p, content=_chapter(k)),
        )
        for k in range(1, 7)
    ]
    turns += [
        turn(
            text("The context was summarised. Where is the book?"),
            use("toolu_01BookReRead", "read_file", path=p, offset=0, limit=200),
        ),
        turn(
            text("The end."),
            use("toolu_01BookTheEnd", "append_file", path=p, content="\nTHE END\n"),
        ),
    ]
    return turns


COMPACTION = style(
    "compaction-over-the-wire",
    "write the book",
    lambda _ws: [file_item("book", "out/book.md", "THE END")],
    _compaction_turns(),
    files=_BOOK_BRIEF,
    contract={"context": {"input_budget_tokens": 16_000}},
    wire_summary="Read the brief; wrote the title and six chapters to out/book.md.",
    parallel=2,
    compactions=1,
)


# 11. a thinking block with no extended thinking asked: never read as words ------------------


def _stray_thinking_turns() -> list[Answer]:
    return [
        turn(
            text("Listing the workspace."),
            use("toolu_01StryList", "list_files", path="."),
        ),
        turn(
            text(
                "<thinking>\nNEED_HELP: should the note be long? No, one line.\n</thinking>\n\n"
                "Writing the note."
            ),
            use("toolu_01StryWrit", "write_file", path="NOTE.md", content="reviewed: ok\n"),
        ),
    ]


TAGGED_THINKING = style(
    "thinking-tag-in-text",
    "write the review note",
    lambda _ws: [file_item("note", "NOTE.md", "reviewed: ok")],
    _stray_thinking_turns(),
    files={"README.md": "# app\n"},
)


STYLES: dict[str, EighthStyle] = {
    s.name: s
    for s in (
        TWO_READS,
        THINKING_FIRST,
        NEED_HELP_SECOND,
        CUT,
        PARALLEL,
        REFUSAL,
        CITATIONS,
        INVESTIGATION,
        PAUSE,
        COMPACTION,
        TAGGED_THINKING,
    )
}


def liar_of(s: EighthStyle) -> EighthStyle:
    """The shape's liar twin over the same wire: every answer but the one that finishes
    the work, then a claim in words that it is finished."""
    claim = turn(text("All done: every item is finished and verified."))
    turns = [*s.turns[:-1], claim]
    return replace(
        s,
        name=f"{s.name}-liar",
        actor=_messages(turns, s.extra_body, s.wire_summary or ""),
        turns=tuple(turns),
        stops=(),
    )


# --- checking one -----------------------------------------------------------------------


def wire_of(ws: Path) -> list[WireEntry]:
    """What the workspace's Messages server got and answered."""
    return WIRE_LOG.get(str(ws), [])


async def check_eighth(store: Store, style: EighthStyle, outcome: Outcome, ws: Path) -> None:
    """`check_seventh` (satisfied in its planned rounds at default limits, every
    deliverable really there, the mess really met, no unearned warning), and over the
    wire: every request one the real API takes, one act request a round, every act
    call's model the server's, and the stop reasons the server sent (`stops`) those the
    runtime recorded."""
    log = wire_of(ws)
    refused = [p for e in log for p in e.problems]
    assert refused == [], f"{style.name}: the real API would refuse: {refused}"
    await check_seventh(store, style, outcome, ws)
    acts = [e for e in log if e.purpose == "act"]
    assert len(acts) == outcome.rounds, (style.name, len(acts), outcome.rounds)
    events = await store.read_events(outcome.task_id)
    calls = [e.data for e in events if e.type == "model.called" and e.data.get("purpose") == "act"]
    assert {c["model"] for c in calls} == {SNAPSHOT}, style.name
    if style.stops:
        assert tuple(e.answer["stop_reason"] for e in acts) == style.stops, style.name
    compacts = [e for e in log if e.purpose == "compact"]
    assert len(compacts) == (style.compactions if style.wire_summary else 0), style.name


if __name__ == "__main__":
    import asyncio

    asyncio.run(print_table(STYLES, sys.argv[1:]))
