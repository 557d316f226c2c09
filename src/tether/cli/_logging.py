"""The CLI's logging: the one place the standard library's logging is set up.

`tether --log-level LEVEL` (or `TETHER_LOG_LEVEL`; `warning` by default) and
`--log-format text|json` (or `TETHER_LOG_FORMAT`; `text` by default) configure the root
logger once, before the command runs. Lines go to stderr, so a command's output on
stdout stays clean for a pipe. The text format is one line per record: UTC time,
level, logger, the run's fields (`task=... round=...`) and the message. The JSON
format is one object per line: `time` (RFC 3339, UTC), `level`, `logger`, `message`,
and where known `task_id`, `round` and `event` (from the record's `extra=`, else from
the run the line was logged in, `telemetry.log_fields()`), and `exc` (the traceback).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from tether import telemetry

LEVELS = ("debug", "info", "warning", "error", "critical")
FORMATS = ("text", "json")
DEFAULT_LEVEL = "warning"
DEFAULT_FORMAT = "text"
#: The fields of a record a line shows besides the message, when present.
FIELDS = ("task_id", "round", "event")
#: Loggers of libraries that log every HTTP request at info: shown from debug only.
CHATTY = ("httpx", "httpcore")


def parse_level(value: str | None) -> str:
    """`value` as one of `LEVELS` (any case); `ValueError` names the choices."""
    level = (value or DEFAULT_LEVEL).strip().lower()
    if level not in LEVELS:
        raise ValueError(f"{value!r} is not a log level; use one of {', '.join(LEVELS)}")
    return level


def parse_format(value: str | None) -> str:
    """`value` as one of `FORMATS` (any case); `ValueError` names the choices."""
    fmt = (value or DEFAULT_FORMAT).strip().lower()
    if fmt not in FORMATS:
        raise ValueError(f"{value!r} is not a log format; use one of {', '.join(FORMATS)}")
    return fmt


def _time(record: logging.LogRecord) -> str:
    at = datetime.fromtimestamp(record.created, UTC)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The run's fields of a record: its own (`extra=`) over the run's it was logged in."""
    out = dict(telemetry.log_fields())
    for name in FIELDS:
        value = getattr(record, name, None)
        if value is not None:
            out[name] = value
    return {k: out[k] for k in FIELDS if out.get(k) is not None}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as JSON."""
        doc: dict[str, Any] = {
            "time": _time(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **fields_of(record),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """`TIME LEVEL LOGGER [task=... round=...] MESSAGE`, one line (and a traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a line of text."""
        fields = " ".join(f"{k.removesuffix('_id')}={v}" for k, v in fields_of(record).items())
        line = f"{_time(record)} {record.levelname} {record.name}: "
        line += f"[{fields}] " if fields else ""
        line += record.getMessage()
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to the `sys.stderr` of the moment (a live display that redirects it
    keeps the lines above itself)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        """The current stderr."""
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


_json = False


def json_mode() -> bool:
    """Whether log lines are JSON (a command's own lines on stderr then go to the log)."""
    return _json


def configure(level: str | None = None, fmt: str | None = None) -> None:
    """Set up the root logger: one handler on stderr at `level`, in format `fmt`.
    Configuring again replaces what an earlier call installed."""
    global _json
    lvl = getattr(logging, parse_level(level).upper())
    _json = parse_format(fmt) == "json"
    handler = StderrHandler()
    handler.setFormatter(JsonFormatter() if _json else TextFormatter())
    handler._tether = True  # type: ignore[attr-defined]
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_tether", False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(lvl)
    for name in CHATTY:
        logging.getLogger(name).setLevel(max(lvl, logging.WARNING) if lvl > logging.DEBUG else lvl)
