"""Typed events: every type round-trips; readers tolerate newer and older writers."""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from typing import Any

import pytest

from tether import events
from tether.events import EVENT_SCHEMA_VERSION, EVENT_TYPES, Event, UnknownEvent, decode, encode

TYPE_NAMES = sorted(EVENT_TYPES)


def sample(annotation: Any, n: int = 1) -> Any:
    """A non-default, JSON-friendly value for a field annotation."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        return sample(inner[0], n)
    if origin is list:
        (inner,) = typing.get_args(annotation)
        return [sample(inner, n), sample(inner, n + 1)]
    if origin is dict and typing.get_args(annotation)[1] is not typing.Any:
        key_type, value_type = typing.get_args(annotation)
        return {sample(key_type, n): sample(value_type, n)}
    if origin is dict or annotation is dict:
        return {"key": n, "nested": {"list": [1, "two", None], "flag": True}}
    if annotation is str:
        return f"value-{n} ünïcode ✓"
    if annotation is bool:
        return True
    if annotation is int:
        return 40 + n
    if annotation is float:
        return 2.5 + n
    if annotation is typing.Any:
        return {"any": n}
    raise AssertionError(f"no sample for {annotation!r}")


def required_only(cls: type[Event]) -> dict[str, Any]:
    return {name: sample(f.annotation) for name, f in cls.model_fields.items() if f.is_required()}


def every_field(cls: type[Event]) -> dict[str, Any]:
    return {name: sample(f.annotation, 7) for name, f in cls.model_fields.items()}


def through_json(data: dict[str, Any]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(json.dumps(data))
    return loaded


def test_registry_holds_every_event_class() -> None:
    defined = {
        obj
        for _, obj in inspect.getmembers(events, inspect.isclass)
        if issubclass(obj, Event) and obj not in (Event, UnknownEvent)
    }
    assert defined == set(EVENT_TYPES.values())
    for name, cls in EVENT_TYPES.items():
        assert name == cls.TYPE
        assert re.fullmatch(r"[a-z]+(\.[a-z_]+)+", name), name
        assert cls.__doc__, f"{name} has no docstring"
    assert len({cls.TYPE for cls in EVENT_TYPES.values()}) == len(EVENT_TYPES)


def test_a_type_cannot_be_registered_twice() -> None:
    with pytest.raises(RuntimeError, match="defined twice"):

        @events._register("task.created")
        class Again(Event):
            pass


@pytest.mark.parametrize("type_name", TYPE_NAMES)
def test_round_trip_every_field(type_name: str) -> None:
    cls = EVENT_TYPES[type_name]
    event = cls(**every_field(cls))
    name, version, data = encode(event)
    assert name == type_name
    assert version == EVENT_SCHEMA_VERSION
    back = decode(name, through_json(data))
    assert type(back) is cls
    assert back == event
    assert back.data() == data
    # Encoding is stable: the same event gives the same bytes.
    assert json.dumps(encode(back)[2], sort_keys=True) == json.dumps(data, sort_keys=True)


@pytest.mark.parametrize("type_name", TYPE_NAMES)
def test_round_trip_with_defaults(type_name: str) -> None:
    cls = EVENT_TYPES[type_name]
    event = cls(**required_only(cls))
    name, _, data = encode(event)
    assert decode(name, through_json(data)) == event


@pytest.mark.parametrize("type_name", TYPE_NAMES)
def test_missing_optional_fields_get_defaults(type_name: str) -> None:
    # An older writer that did not know the optional fields yet.
    cls = EVENT_TYPES[type_name]
    data = required_only(cls)
    back = decode(type_name, through_json(data))
    assert type(back) is cls
    for fname, f in cls.model_fields.items():
        if not f.is_required():
            assert getattr(back, fname) == f.get_default(call_default_factory=True), fname


@pytest.mark.parametrize("type_name", TYPE_NAMES)
def test_extra_fields_from_a_newer_writer_are_ignored(type_name: str) -> None:
    cls = EVENT_TYPES[type_name]
    event = cls(**every_field(cls))
    _, _, data = encode(event)
    newer = {**data, "added_in_v9": {"deep": [1, 2]}, "another": "x"}
    back = decode(type_name, through_json(newer))
    assert back == event
    assert "added_in_v9" not in back.data()
    assert not hasattr(back, "added_in_v9")


def test_default_factories_are_not_shared() -> None:
    a = events.ApprovalRequested(request_id="r1", what="pay")
    b = events.ApprovalRequested(request_id="r2", what="pay")
    assert a.options == ["approve", "reject", "modify"]
    assert a.options is not b.options


def test_unknown_type_decodes_as_unknown_event() -> None:
    data = {"op_id": "x", "flavour": "new", "nested": {"a": [1]}}
    ev = decode("future.shiny_thing", data)
    assert type(ev) is UnknownEvent
    # Its payload is kept whole, so a timeline can still show it.
    assert ev.data() == data


def test_unknown_event_cannot_be_written() -> None:
    ev = decode("future.shiny_thing", {"a": 1})
    with pytest.raises(TypeError, match="UnknownEvent"):
        encode(ev)


def test_unregistered_class_cannot_be_written() -> None:
    class Adhoc(Event):
        x: int = 1

    with pytest.raises(TypeError, match="not a registered event type"):
        encode(Adhoc())


def test_events_are_frozen() -> None:
    ev = events.UserMessage(text="hi")
    with pytest.raises(Exception, match="frozen"):
        ev.text = "changed"  # type: ignore[misc]


def test_example_payload_shapes() -> None:
    ev = events.LedgerUpdated(
        version=3, diff=[{"item": "a", "field": "status", "before": "pending", "after": "done"}]
    )
    assert encode(ev) == (
        "ledger.updated",
        EVENT_SCHEMA_VERSION,
        {
            "version": 3,
            "diff": [{"item": "a", "field": "status", "before": "pending", "after": "done"}],
            "cause": "judge",
        },
    )
    status = decode("task.status", {"src": "running", "dst": "satisfied"})
    assert isinstance(status, events.TaskStatusChanged)
    assert status.stop_reason is None and status.reason == ""


def test_a_timeline_line_cut_short_says_so() -> None:
    from tether.report.describe import describe_event, shorten

    assert shorten("short", 10) == "short"
    assert shorten("x" * 11, 10) == "x" * 9 + "…" and len(shorten("x" * 11, 10)) == 10
    long_error = "permission denied while writing catalog.csv " * 10

    from types import SimpleNamespace

    event = SimpleNamespace(
        type="op.result", data={"tool": "write_file", "status": "failed", "error": long_error}
    )
    _, text = describe_event(event)
    assert text.endswith("…") and long_error[:60] in text
