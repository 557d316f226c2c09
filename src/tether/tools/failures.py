"""Failure classes: what an exception from a tool means for retrying.

- **transient**: the call did not take effect and may work later (connection refused,
  429, 503, `RetryLater`, `ToolFailed(retryable=True)`);
- **unknown**: the call may have taken effect but no answer came (a timeout after
  sending, a reset connection, 500/502/504 on a write): reconcile, or retry with the
  same idempotency key when the tool is idempotent;
- **deterministic**: retrying will not help (bad arguments, 4xx, permission, missing
  file): the message goes back to the model;
- **validation**: the call worked but the result breaks the post-condition.
"""

from __future__ import annotations

from dataclasses import dataclass

from tether import errors
from tether.tools.retry import FailureClass

_TRANSIENT_NAMES = ("ConnectError", "ConnectTimeout", "PoolTimeout", "ConnectionRefusedError")
_UNKNOWN_NAMES = (
    "ReadTimeout", "WriteTimeout", "RemoteProtocolError", "ReadError", "WriteError",
    "ConnectionResetError", "BrokenPipeError", "IncompleteRead", "ServerDisconnectedError",
)  # fmt: skip


@dataclass(frozen=True)
class Classified:
    """A failure's class, its message, and a delay the service asked for."""

    cls: FailureClass
    message: str
    delay: float | None = None


def _status(exc: BaseException) -> int | None:
    for obj in (exc, getattr(exc, "response", None)):
        for attr in ("status_code", "status"):
            value = getattr(obj, attr, None)
            if isinstance(value, int) and 100 <= value <= 599:
                return value
    return None


def classify_status(status: int, *, has_effect: bool) -> FailureClass:
    """The class of an HTTP status: 408/425/429/503 transient; 500/502/504 unknown for a
    call with effects (it may have run) and transient for a read; other 4xx
    deterministic."""
    if status in (408, 425, 429, 503):
        return "transient"
    if status >= 500:
        return "unknown" if has_effect and status in (500, 502, 504) else "transient"
    if status >= 400:
        return "deterministic"
    return "deterministic"


def classify(exc: BaseException, *, has_effect: bool) -> Classified:
    """Classify an exception raised by a tool (see the module docstring)."""
    msg = str(exc) or type(exc).__name__
    if isinstance(exc, errors.RetryLater):
        return Classified("transient", msg, exc.delay)
    if isinstance(exc, errors.ValidationFailed):
        return Classified("validation", msg)
    if isinstance(exc, errors.OutcomeUnknown):
        return Classified("unknown" if has_effect else "transient", msg)
    if isinstance(exc, errors.ToolFailed):
        return Classified("transient" if exc.retryable else "deterministic", msg)
    status = _status(exc)
    if status is not None:
        cls = classify_status(status, has_effect=has_effect)
        delay = None
        headers = getattr(getattr(exc, "response", None), "headers", None)
        if headers is not None:
            try:
                delay = float(headers.get("retry-after")) if headers.get("retry-after") else None
            except (TypeError, ValueError):
                delay = None
        return Classified(cls, f"HTTP {status}: {msg}", delay)
    names = {c.__name__ for c in type(exc).__mro__}
    if names & set(_TRANSIENT_NAMES) or isinstance(exc, ConnectionRefusedError):
        return Classified("transient", msg)
    if isinstance(exc, TimeoutError) or names & set(_UNKNOWN_NAMES):
        what = f"{type(exc).__name__}: {msg}" if msg != type(exc).__name__ else msg
        return Classified("unknown" if has_effect else "transient", what)
    if isinstance(exc, ConnectionError):
        return Classified("unknown" if has_effect else "transient", msg)
    return Classified("deterministic", f"{type(exc).__name__}: {msg}")
