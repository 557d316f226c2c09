"""The CLI's logging (`tether.cli._logging`): levels and formats, JSON lines with the
run's fields, stderr only, configured once."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest

from tether import telemetry
from tether.cli import _logging, load_commands


@pytest.fixture(autouse=True)
def restore_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    monkeypatch.setattr(_logging, "_json", False)
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name in _logging.CHATTY:
        logging.getLogger(name).setLevel(logging.NOTSET)


def record(msg: str = "hello %s", *args: object, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("tether.worker", logging.INFO, __file__, 1, msg, args or ("x",), None)
    for k, v in extra.items():
        setattr(rec, k, v)
    return rec


def test_levels_and_formats_in_any_case_else_a_clear_error() -> None:
    assert _logging.parse_level("DEBUG") == "debug"
    assert _logging.parse_level(None) == "warning"
    assert _logging.parse_format("JSON") == "json"
    with pytest.raises(ValueError, match="not a log level; use one of debug, info"):
        _logging.parse_level("loud")
    with pytest.raises(ValueError, match="not a log format; use one of text, json"):
        _logging.parse_format("xml")


def test_a_json_line_carries_the_runs_fields() -> None:
    fmt = _logging.JsonFormatter()
    plain = json.loads(fmt.format(record()))
    assert set(plain) == {"time", "level", "logger", "message"}
    assert plain["level"] == "info" and plain["logger"] == "tether.worker"
    assert plain["message"] == "hello x" and plain["time"].endswith("Z")
    with telemetry.span("tether.round", {"tether.task_id": "t1"}) as span:
        telemetry.set_attributes(span, {"tether.round": 7})
        inside = json.loads(fmt.format(record(event="round.ended")))
    assert (inside["task_id"], inside["round"], inside["event"]) == ("t1", 7, "round.ended")
    # `extra=` wins over the run's fields; outside the span they are gone.
    assert json.loads(fmt.format(record(task_id="t2")))["task_id"] == "t2"
    assert "task_id" not in json.loads(fmt.format(record()))
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        failed = record()
        failed.exc_info = sys.exc_info()
    assert "RuntimeError: boom" in json.loads(fmt.format(failed))["exc"]


def test_a_text_line_shows_the_fields() -> None:
    line = _logging.TextFormatter().format(record(task_id="t1", round=3))
    assert line.endswith(" INFO tether.worker: [task=t1 round=3] hello x")


def test_configure_logs_to_the_current_stderr_once(monkeypatch: pytest.MonkeyPatch) -> None:
    _logging.configure("info", "json")
    _logging.configure("info", "json")  # again: replaces, never doubles
    stderr, stdout = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    monkeypatch.setattr(sys, "stdout", stdout)
    logging.getLogger("tether.worker").info("started")
    logging.getLogger("tether.worker").debug("not shown")
    logging.getLogger("httpx").info("HTTP Request: POST ...")  # chatty below debug
    lines = stderr.getvalue().splitlines()
    assert [json.loads(x)["message"] for x in lines] == ["started"]
    assert stdout.getvalue() == ""
    assert _logging.json_mode()
    _logging.configure("debug", "text")
    logging.getLogger("httpx").debug("shown at debug")
    assert "DEBUG httpx: shown at debug" in stderr.getvalue()


def test_a_global_options_value_is_not_taken_for_the_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loaded: list[str] = []
    monkeypatch.setattr("importlib.import_module", lambda name: loaded.append(name))
    load_commands(["--log-level", "debug", "worker", "--once"])
    assert loaded == ["tether.cli.worker"]
