"""Failure classes: what an exception from a tool means for retrying.

- **transient**: the call did not take effect and may work later (connection refused,
  a connect timeout, 429, 503, `RetryLater`, `ToolFailed(retryable=True)`);
- **unknown**: the call may have taken effect but no answer came (a timeout after
  sending, a reset connection, 409/500/502/504 on a call with effects, `OutcomeUnknown`):
  reconcile, or retry with the same idempotency key when the tool is idempotent. For a
  read there is nothing to duplicate, so these are transient. A 409 on the op's first
  attempt is deterministic: no earlier request carried its key, so the conflict is with
  what was there before and the call did nothing;
- **deterministic**: retrying will not help (bad arguments, other 4xx, permission,
  missing file, `ToolFailed`): the message goes back to the model. A `ToolFailed` whose
  message says the service limited the rate (an MCP server's error result, a tool
  that reports the 429 it got: `HTTP 429`, `Too Many Requests`, `rate limit exceeded`,
  `Retry-After: 2`) is transient instead, after the delay it names: the call was
  refused, not wrong, and the model would only ask again;
- **validation**: the call worked but the result breaks the post-condition
  (`ValidationFailed`).

HTTP statuses are read by `tether.retry.classify_status`, the same reading the model
adapters use (see there for why 409 is `unknown` on a call with effects).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tether import errors
from tether.retry import FailureClass, classify_status, parse_retry_after
from tether.text import exc_text

__all__ = ["Classified", "classify", "classify_status", "rate_limited"]

#: Failures before anything was sent: the call cannot have taken effect.
_TRANSIENT_NAMES = frozenset(
    {"ConnectError", "ConnectTimeout", "PoolTimeout", "ConnectionRefusedError"}
)
#: Failures after the request may have been sent.
_UNKNOWN_NAMES = frozenset({
    "ReadTimeout", "WriteTimeout", "RemoteProtocolError", "ReadError", "WriteError",
    "ConnectionResetError", "BrokenPipeError", "IncompleteRead", "ServerDisconnectedError",
})  # fmt: skip


#: A message that says the service limited the rate (not one that merely mentions a
#: limit: "rate limit" needs a word that says it was hit).
_RATE_LIMITED = re.compile(
    r"\b(?:HTTP|status|code|error)[ :]*429\b|\b429 Too Many Requests\b|\bToo Many Requests\b"
    r"|\brate[ -]?limit(?:ed|s)? (?:exceeded|reached|hit)\b|\brate[ -]?limited\b"
    r"|\bretry[ -]after\b",
    re.IGNORECASE,
)
#: The delay such a message names: `Retry-After: 2`, `retry after 1.5 s`, `... 500 ms`.
_RETRY_AFTER = re.compile(
    r"\bretry[ -]after\b\W{0,3}(\d+(?:\.\d+)?)\s*(ms|milliseconds?|s|secs?|seconds?)?\b",
    re.IGNORECASE,
)
#: The longest delay read from a message (a longer one is the retry policy's to cap).
_MAX_TEXT_DELAY = 3600.0


def rate_limited(message: str) -> tuple[bool, float | None]:
    """Whether a tool's failure message says the service limited the rate, and the
    delay it names (seconds), if any."""
    if not _RATE_LIMITED.search(message[:2000]):
        return False, None
    found = _RETRY_AFTER.search(message[:2000])
    if found is None:
        return True, None
    value = float(found.group(1))
    if (found.group(2) or "").lower().startswith("m"):
        value /= 1000.0
    return True, min(value, _MAX_TEXT_DELAY)


@dataclass(frozen=True)
class Classified:
    """A failure's class, its message, and a delay the service asked for."""

    cls: FailureClass
    message: str
    delay: float | None = None
    #: The service is down and nothing was sent (`errors.ServiceDown`).
    down: bool = False
    #: The tool said "not now" (`errors.RetryLater`): asked again later, it may answer.
    later: bool = False
    #: The service limited the rate (HTTP 429, a tool's "rate limit exceeded"): it is up
    #: and answered, so its breaker does not count this as a failure.
    limited: bool = False


def _status(exc: BaseException) -> int | None:
    for obj in (exc, getattr(exc, "response", None)):
        for attr in ("status_code", "status"):
            value = getattr(obj, attr, None)
            if isinstance(value, int) and 100 <= value <= 599:
                return value
    return None


def _signal(exc: errors.ToolSignal, msg: str, has_effect: bool) -> Classified:
    """The class of a signal a tool raised on purpose."""
    if isinstance(exc, errors.RetryLater):
        return Classified("transient", msg, exc.delay, later=True)
    if isinstance(exc, errors.ValidationFailed):
        return Classified("validation", msg)
    if isinstance(exc, errors.OutcomeUnknown):
        return Classified("unknown" if has_effect else "transient", msg)
    if isinstance(exc, errors.ServiceDown):
        return Classified("transient", msg, down=True)
    if isinstance(exc, errors.ToolFailed):
        if exc.retryable:
            return Classified("transient", msg)
        limited, delay = rate_limited(msg)
        if limited:
            return Classified("transient", msg, delay, limited=True)
        return Classified("deterministic", msg)
    # Any other signal (`ApprovalRequired` is handled by the op runner before this: the
    # call waits for a human) goes back to the model.
    return Classified("deterministic", f"{type(exc).__name__}: {msg}")


def _http(exc: BaseException, status: int, msg: str, has_effect: bool, first: bool) -> Classified:
    headers = getattr(getattr(exc, "response", None), "headers", None)
    delay = None
    if headers is not None:
        try:
            delay = parse_retry_after(headers)
        except (AttributeError, TypeError):  # not a mapping of headers after all
            delay = None
    return Classified(
        classify_status(status, has_effect=has_effect, first=first),
        f"HTTP {status}: {msg}",
        delay,
        limited=status == 429,
    )


def classify(exc: BaseException, *, has_effect: bool, first: bool = False) -> Classified:
    """Classify an exception raised by a tool (see the module docstring); `first`: on
    its op's first attempt (`retry.classify_status`: a 409 then did nothing)."""
    # An error's text may quote what the tool was given or read, or fail (`tether.text`).
    msg = exc_text(exc)
    if isinstance(exc, errors.ToolSignal):
        return _signal(exc, msg, has_effect)
    status = _status(exc)
    if status is not None:
        return _http(exc, status, msg, has_effect, first)
    in_doubt: FailureClass = "unknown" if has_effect else "transient"
    names = {c.__name__ for c in type(exc).__mro__}
    if names & _TRANSIENT_NAMES:
        return Classified("transient", msg)
    if isinstance(exc, TimeoutError) or names & _UNKNOWN_NAMES:
        what = f"{type(exc).__name__}: {msg}" if msg != type(exc).__name__ else msg
        return Classified(in_doubt, what)
    if isinstance(exc, ConnectionError):
        return Classified(in_doubt, msg)
    return Classified("deterministic", f"{type(exc).__name__}: {msg}")
