"""The SQL stores' JSON encoders (issue 22): `_dumps` writes the text `json.dumps` does
(built once, not per call), and event data, JSON already, is written by pydantic's
encoder to text that reads back as the same data."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from tether import events as ev
from tether.store import _rows
from tether.store import _rules as rules
from tether.store._event_fields import FIELDS

VALUES: list[Any] = [
    {"a": [1, 2.5, None, True, False, 'x\u00e9\n\t\x00\x1f\u2028"\\/'], "b": {}},
    {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "neg": -0.0},
    {2: "int key", 1.5: "float key", True: "bool key", None: "none key"},
    (1, [2, (3,)]),
    "a string \u00e9",
    12345678901234567890123,
    1e-07,
    1e16,
    1796581997.4282427,
    [],
    {},
    None,
]


def _stdlib(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


@pytest.mark.parametrize("value", VALUES)
def test_dumps_writes_the_text_json_dumps_writes(value: Any) -> None:
    assert _rows.dumps(value) == _stdlib(value)


def test_dumps_refuses_what_json_refuses_with_the_same_error() -> None:
    for value in ({"a": object()}, {1, 2}, b"bytes", {(1, 2): 3}):
        with pytest.raises(TypeError) as ours:
            _rows.dumps(value)
        with pytest.raises(TypeError) as theirs:
            _stdlib(value)
        assert str(ours.value) == str(theirs.value)


def test_dumps_refuses_a_value_that_holds_itself() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises((RecursionError, ValueError)):
        _rows.dumps(loop)


def test_dumps_is_not_left_broken_by_a_failed_call() -> None:
    with pytest.raises(TypeError):
        _rows.dumps({"a": [1, {"b": object()}]})
    shared = {"k": [1, 2]}
    assert _rows.dumps([shared, shared]) == _stdlib([shared, shared])


EVENTS: list[ev.Event] = [
    ev.OpResult(op_id="o", tool="t", status="succeeded", duration_ms=0.000012, summary="é\x00"),
    ev.ModelCalled(call_id="c", purpose="act", model="m", latency_ms=1e-7, input_tokens=3),
    ev.RoundStarted(round=1, turn=1, item="work"),
    ev.TaskCreated(name="n", objective="o", items=1, launch={"x": [1e-05, 1e16, None]}),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e.TYPE)
def test_event_data_text_reads_back_as_the_data(event: ev.Event) -> None:
    name, _, data = ev.encode(event)
    compacted = rules.compact(name, data)
    text = _rows.json_text(compacted)
    assert json.loads(text) == json.loads(_rows.dumps(compacted)) == compacted
    assert ev.decode(name, rules.expand(name, json.loads(text))).data() == data


def test_stored_events_are_compacted_and_written_with_the_encoder_given() -> None:
    events = EVENTS[:3]
    rows = _rows.stored_events(events, _rows.dumps)
    assert [(t, s) for t, s, _ in rows] == [(e.TYPE, ev.EVENT_SCHEMA_VERSION) for e in events]
    for (name, _, text), event in zip(rows, events, strict=True):
        assert text == _rows.dumps(rules.compact(name, ev.encode(event)[2]))
    fast = _rows.stored_events(events)
    assert [json.loads(t) for _, _, t in fast] == [json.loads(t) for _, _, t in rows]


def _compact_by_fields(type_name: str, data: dict[str, Any]) -> dict[str, Any]:
    """`compact` as it reads `FIELDS` field by field (its table is made from them)."""
    fields = FIELDS.get(type_name)
    if fields is None:
        return data
    out = dict(data)
    for field in fields:
        if len(field) == 2 and field[0] in out:
            value = out[field[0]]
            if type(value) is type(field[1]) and value == field[1]:
                del out[field[0]]
    return out


def test_compact_leaves_out_what_the_fields_table_says() -> None:
    others: dict[type, Any] = {bool: 0, int: False, float: 0, str: None, type(None): "", list: {}}
    for type_name, fields in [*FIELDS.items(), ("future.thing", None)]:
        names = [f[0] for f in fields or ()]
        shapes = [
            {f[0]: f[1] if len(f) == 2 else "set" for f in fields or ()},  # all at default
            {f[0]: others.get(type(f[-1]), "x") for f in fields or ()},  # same value, other type
            {n: "x" for n in names[::2]},  # some missing
            {"extra": None},
        ]
        for data in shapes:
            assert rules.compact(type_name, data) == _compact_by_fields(type_name, data)
