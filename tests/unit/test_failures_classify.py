"""`tether.tools.failures.classify`: what an exception from a tool means for retrying.

Every failure class, every HTTP status family (with 409 decided once, in
`tether.retry.classify_status`, for tools and model adapters alike), and timeouts
before and after the request was sent."""

from __future__ import annotations

import email.utils
import http.client
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from tether import errors
from tether.models._retry import is_transient_status
from tether.retry import classify_status
from tether.tools.failures import Classified, classify


def both(exc: BaseException) -> tuple[Classified, Classified]:
    """The classification for a call with effects, and for a read."""
    return classify(exc, has_effect=True), classify(exc, has_effect=False)


# --- signals a tool raises on purpose -----------------------------------------------------


def test_retry_later_is_transient_with_its_delay() -> None:
    for c in both(errors.RetryLater("busy", delay=2.5)):
        assert (c.cls, c.message, c.delay) == ("transient", "busy", 2.5)


def test_validation_failed() -> None:
    for c in both(errors.ValidationFailed("no id in the answer")):
        assert (c.cls, c.message) == ("validation", "no id in the answer")


def test_outcome_unknown_depends_on_effects() -> None:
    write, read = both(errors.OutcomeUnknown("no answer"))
    assert (write.cls, read.cls) == ("unknown", "transient")


def test_tool_failed() -> None:
    for c in both(errors.ToolFailed("no such key")):
        assert (c.cls, c.message) == ("deterministic", "no such key")
    for c in both(errors.ToolFailed("try again", retryable=True)):
        assert c.cls == "transient"


def test_approval_required_fails_the_call_today() -> None:
    # Not wired (see its docstring): the model hears about it, nothing waits.
    for c in both(errors.ApprovalRequired("needs a manager")):
        assert (c.cls, c.message) == ("deterministic", "ApprovalRequired: needs a manager")


# --- HTTP statuses ------------------------------------------------------------------------


@dataclass
class Response:
    status_code: int
    headers: dict[str, str] = field(default_factory=dict)


class HTTPError(Exception):
    """An HTTP client's error: the status on the response, as httpx and requests have it."""

    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"status {status}")
        self.response = Response(status, headers or {})


class StatusError(Exception):
    """An error that carries the status itself (`.status`, as aiohttp has it)."""

    def __init__(self, status: Any) -> None:
        super().__init__("failed")
        self.status = status


#: (status, class for a call with effects, class for a read)
STATUSES = [
    (100, "deterministic", "deterministic"),
    (204, "deterministic", "deterministic"),
    (304, "deterministic", "deterministic"),
    (400, "deterministic", "deterministic"),
    (401, "deterministic", "deterministic"),
    (403, "deterministic", "deterministic"),
    (404, "deterministic", "deterministic"),
    (405, "deterministic", "deterministic"),
    (408, "transient", "transient"),
    (409, "unknown", "transient"),
    (410, "deterministic", "deterministic"),
    (412, "deterministic", "deterministic"),
    (413, "deterministic", "deterministic"),
    (422, "deterministic", "deterministic"),
    (425, "transient", "transient"),
    (429, "transient", "transient"),
    (451, "deterministic", "deterministic"),
    (500, "unknown", "transient"),
    (501, "transient", "transient"),
    (502, "unknown", "transient"),
    (503, "transient", "transient"),
    (504, "unknown", "transient"),
    (507, "transient", "transient"),
    (529, "transient", "transient"),
    (599, "transient", "transient"),
]


@pytest.mark.parametrize(("status", "with_effect", "read"), STATUSES)
def test_status_families(status: int, with_effect: str, read: str) -> None:
    assert classify_status(status, has_effect=True) == with_effect
    assert classify_status(status, has_effect=False) == read
    write_c, read_c = both(HTTPError(status))
    assert (write_c.cls, read_c.cls) == (with_effect, read)
    assert write_c.message == f"HTTP {status}: status {status}"
    assert classify(StatusError(status), has_effect=True).cls == with_effect


def test_409_is_in_doubt_for_a_call_with_effects() -> None:
    # With an idempotency key a 409 says "a request with this key is in progress (or
    # done)": telling the model (deterministic) could make it call again under a new key.
    assert classify(HTTPError(409), has_effect=True).cls == "unknown"
    assert classify(HTTPError(409), has_effect=False).cls == "transient"


def test_409_on_an_ops_first_attempt_did_nothing() -> None:
    # No earlier request carried the op's key: the conflict is with what was there
    # before ("already exists"), the call did nothing, and the model is told.
    assert classify(HTTPError(409), has_effect=True, first=True).cls == "deterministic"
    assert classify_status(409, has_effect=True, first=True) == "deterministic"
    # A read is retried as before; the other in-doubt statuses stay in doubt.
    assert classify(HTTPError(409), has_effect=False, first=True).cls == "transient"
    for status in (500, 502, 504):
        assert classify(StatusError(status), has_effect=True, first=True).cls == "unknown"


def test_model_adapters_read_statuses_the_same_way() -> None:
    # A model call has no effects: one classifier, `has_effect=False`.
    for status in range(400, 600):
        assert is_transient_status(status) is (
            classify_status(status, has_effect=False) == "transient"
        )
    assert is_transient_status(409) and is_transient_status(529)
    assert not is_transient_status(400) and not is_transient_status(422)


@pytest.mark.parametrize("bogus", [0, 99, 600, "503", None, True])
def test_a_status_out_of_range_is_not_a_status(bogus: Any) -> None:
    assert classify(StatusError(bogus), has_effect=True).cls == "deterministic"


def test_retry_after_header() -> None:
    assert classify(HTTPError(429, {"Retry-After": "12"}), has_effect=True).delay == 12.0
    assert classify(HTTPError(503, {"retry-after-ms": "250"}), has_effect=True).delay == 0.25
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    delay = classify(HTTPError(503, {"Retry-After": when}), has_effect=True).delay
    assert delay is not None and 25 <= delay <= 31
    assert classify(HTTPError(503, {"Retry-After": "soon"}), has_effect=True).delay is None
    assert classify(HTTPError(503), has_effect=True).delay is None


# --- timeouts and connections: before or after the request was sent -----------------------


def named(name: str, base: type[BaseException] = Exception) -> BaseException:
    """An exception of a class called `name` (the names HTTP client libraries use)."""
    return type(name, (base,), {})("boom")


BEFORE_SEND = [
    named("ConnectTimeout"),
    named("ConnectError"),
    named("PoolTimeout"),
    ConnectionRefusedError("connection refused"),
    named("ConnectTimeout", TimeoutError),  # a timeout, but while connecting
]
AFTER_SEND = [
    TimeoutError("timed out"),
    named("ReadTimeout"),
    named("WriteTimeout"),
    named("ReadError"),
    named("WriteError"),
    named("RemoteProtocolError"),
    named("ServerDisconnectedError"),
    ConnectionResetError("reset by peer"),
    BrokenPipeError("broken pipe"),
    http.client.IncompleteRead(b"partial"),
    http.client.RemoteDisconnected("closed"),
    ConnectionAbortedError("aborted"),  # any other ConnectionError
]


@pytest.mark.parametrize("exc", BEFORE_SEND, ids=lambda e: type(e).__name__)
def test_failures_before_sending_are_transient(exc: BaseException) -> None:
    # Nothing reached the service: safe to send again, effects or not.
    write, read = both(exc)
    assert (write.cls, read.cls) == ("transient", "transient")


@pytest.mark.parametrize("exc", AFTER_SEND, ids=lambda e: type(e).__name__)
def test_failures_after_sending_are_in_doubt(exc: BaseException) -> None:
    # The request may have been acted on: unknown for a call with effects.
    write, read = both(exc)
    assert (write.cls, read.cls) == ("unknown", "transient")


def test_a_timeout_message_names_the_exception() -> None:
    assert classify(named("ReadTimeout"), has_effect=True).message == "ReadTimeout: boom"
    assert classify(TimeoutError(), has_effect=True).message == "TimeoutError"


def test_real_http_client_timeouts() -> None:
    httpx2 = pytest.importorskip("httpx2", reason="httpx2 (the SDKs' HTTP client) is not installed")
    assert classify(httpx2.ConnectTimeout("x"), has_effect=True).cls == "transient"
    assert classify(httpx2.ConnectError("x"), has_effect=True).cls == "transient"
    assert classify(httpx2.PoolTimeout("x"), has_effect=True).cls == "transient"
    assert classify(httpx2.ReadTimeout("x"), has_effect=True).cls == "unknown"
    assert classify(httpx2.WriteTimeout("x"), has_effect=True).cls == "unknown"
    assert classify(httpx2.RemoteProtocolError("x"), has_effect=True).cls == "unknown"
    assert classify(httpx2.ReadTimeout("x"), has_effect=False).cls == "transient"


# --- everything else ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc", [ValueError("bad"), KeyError("k"), FileNotFoundError("gone"), RuntimeError("bug")]
)
def test_other_exceptions_are_deterministic(exc: BaseException) -> None:
    for c in both(exc):
        assert c.cls == "deterministic"
        assert c.message.startswith(type(exc).__name__ + ": ")


@pytest.mark.parametrize(
    ("message", "delay"),
    [
        ("fetch_quota: HTTP 429 Too Many Requests (Retry-After: 2s)", 2.0),
        ("Error: 429", None),
        ("rate limit exceeded, retry after 500 ms", 0.5),
        ("You are being rate-limited", None),
        ("status code 429; Retry-After: 99999", 3600.0),
    ],
)
def test_a_tool_failure_that_says_it_was_rate_limited_is_transient(
    message: str, delay: float | None
) -> None:
    """An MCP server's error result, or a tool reporting the 429 it got, in words."""
    got = classify(errors.ToolFailed(message), has_effect=True)
    assert (got.cls, got.delay) == ("transient", delay)


@pytest.mark.parametrize(
    "message", ["Rate limit set to 100 per minute", "HTTP 4290 bytes", "File not found"]
)
def test_a_tool_failure_that_only_mentions_a_limit_goes_to_the_model(message: str) -> None:
    assert classify(errors.ToolFailed(message), has_effect=False).cls == "deterministic"


def test_a_rate_limit_is_marked_for_the_breaker() -> None:
    """A 429, or a tool's message saying the rate was limited, is the service answering:
    `limited` tells its breaker not to count it as a failure (a 503 is counted)."""
    assert classify(HTTPError(429), has_effect=True).limited
    assert classify(errors.ToolFailed("HTTP 429 Too Many Requests"), has_effect=False).limited
    assert not classify(StatusError(503), has_effect=True).limited
    assert not classify(errors.ToolFailed("no such file"), has_effect=False).limited
