"""Model providers on 127.0.0.1: real HTTP servers in a thread of the test.

- `ProviderServer`: the server on an ephemeral port; each POST is recorded (`requests`)
  and answered by a function of what was seen;
- `FakeProvider`: scripted replies in order (`queue`), for the adapter tests, which
  check what the official SDKs actually sent;
- `LedgerProvider`: the OpenAI chat completions (`POST /v1/chat/completions`) and the
  Anthropic messages (`POST /v1/messages`) wire formats, writing the file of the
  ledger's Next item, for a real `tether run` behind the chaos tests' fault proxy;
- `completion`, `READ`, `WRITE`, `model_request`: the wire and request pieces the
  adapter tests share.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tether.models.base import Message, ModelRequest, ToolSchema


@dataclass
class Reply:
    """What the server answers: a status, a JSON body (or text), headers, after a delay."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class Seen:
    """A request as the server received it (header names in lower case)."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins every handler thread
    block_on_close = True


class ProviderServer:
    """An HTTP server on an ephemeral port of 127.0.0.1 answering each POST with
    `answer(seen)`. `keep_alive`: HTTP/1.1 connections kept open, as real providers do;
    `close_after`: each response closes its connection. Serving from the start;
    `close` stops it (`contextlib.closing` in a fixture)."""

    def __init__(
        self,
        answer: Callable[[Seen], Reply],
        *,
        keep_alive: bool = False,
        close_after: bool = False,
    ) -> None:
        self.requests: list[Seen] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                seen = Seen(
                    "POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body
                )
                with server._lock:
                    server.requests.append(seen)
                    reply = answer(seen)
                if reply.delay:
                    time.sleep(reply.delay)
                data = (
                    reply.body.encode()
                    if isinstance(reply.body, str)
                    else json.dumps(reply.body).encode()
                )
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    if close_after:
                        self.send_header("connection", "close")
                        self.close_connection = True
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (a timeout) or the proxy cut the connection

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.httpd.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        """Stop serving and join the handler threads."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=30)


class FakeProvider(ProviderServer):
    """Scripted replies in order (`queue`); a 500 when none is left. `prefix`: the path
    of the API under the server (`/v1` for OpenAI, none for Anthropic's SDK, which adds
    it itself)."""

    def __init__(self, prefix: str = "/v1") -> None:
        self.replies: deque[Reply] = deque()
        self.prefix = prefix
        super().__init__(self._next_reply)

    def _next_reply(self, seen: Seen) -> Reply:
        if self.replies:
            return self.replies.popleft()
        return Reply(500, {"error": {"message": "no scripted reply"}})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.prefix}"

    def queue(
        self, status: int, body: Any, headers: dict[str, str] | None = None, delay: float = 0.0
    ) -> None:
        self.replies.append(Reply(status, body, headers or {}, delay))


# --------------------------------------------------------------- a provider for `tether run`

_NEXT = re.compile(r"^Next: (\S+)", re.M)


class LedgerProvider(ProviderServer):
    """OpenAI chat completions and Anthropic messages: a write of `out/<Next item>.txt`
    while the ledger names one, else a closing text; keep-alive connections."""

    def __init__(self, *, close_after: bool = False) -> None:
        super().__init__(_ledger_answer, keep_alive=True, close_after=close_after)


def _ledger_answer(seen: Seen) -> Reply:
    item = _next_item(seen.body)
    if seen.path.endswith("/messages"):
        return Reply(200, _anthropic_answer(item))
    return Reply(200, _openai_answer(item))


def _texts(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _texts(v)
    elif isinstance(value, list):
        for v in value:
            yield from _texts(v)


def _next_item(body: dict[str, Any]) -> str | None:
    # The ledger is in the messages, or in Anthropic's `system` on the first round.
    found = _NEXT.findall("\n".join(_texts([body.get("system"), body.get("messages")])))
    return None if not found or found[-1] == "nothing" else found[-1]


def _arguments(item: str) -> dict[str, str]:
    return {"path": f"out/{item}.txt", "content": f"{item} done\n"}


def _openai_answer(item: str | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": "All items are closed."}
    if item is not None:
        message = {
            "role": "assistant",
            "content": f"Writing {item}.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "write_file", "arguments": json.dumps(_arguments(item))},
                }
            ],
        }
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "fake",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if item else "stop",
            }
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
    }


def _anthropic_answer(item: str | None) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": "All items are closed."}]
    if item is not None:
        content = [
            {"type": "text", "text": f"Writing {item}."},
            {"type": "tool_use", "id": "toolu_1", "name": "write_file", "input": _arguments(item)},
        ]
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-fake",
        "content": content,
        "stop_reason": "tool_use" if item else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 100, "output_tokens": 10},
    }


# --------------------------------------------------------------- wire and request pieces


def completion(
    *,
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    usage: dict[str, Any] | None = None,
    finish_reason: str = "stop",
    model: str = "gpt-4.1-mini-2025-04-14",
) -> dict[str, Any]:
    """An OpenAI chat completion, as the API returns it."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": [],
    }
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
        "object": "chat.completion",
        "created": 1741570283,
        "model": model,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
        ],
        "usage": usage or {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
        "service_tier": "default",
        "system_fingerprint": "fp_test",
    }


READ = ToolSchema(
    "read_file",
    "Read a file of the workspace.",
    {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
)
WRITE = ToolSchema(
    "write_file",
    "Write a file.",
    {
        "type": "object",
        "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
        "required": ["path", "text"],
    },
)


def model_request(**kwargs: Any) -> ModelRequest:
    """An `act` request with the two file tools; `kwargs` replace its fields."""
    base: dict[str, Any] = {
        "purpose": "act",
        "system": "You are a careful agent.\n\n## Ledger\n- [ ] i1 read notes",
        "messages": (Message("user", "Start with item i1."),),
        "tools": (READ, WRITE),
    }
    base.update(kwargs)
    return ModelRequest(**base)
