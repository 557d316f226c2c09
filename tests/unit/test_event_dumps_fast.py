"""`Event.data` and `Event.json_text` call pydantic's serializer without
`model_dump`'s wrapper (issue 22): for every event type and any field values, they
give exactly what `model_dump(mode="json")` and `model_dump_json()` give, so the stored
JSON does not change (but for `Millis` fields, which `data` writes to the microsecond)."""

from __future__ import annotations

import types
import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether import events as ev

_text = st.text(max_size=12)  # any code point: non-ASCII, escapes, surrogates left out
_json: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()  # NaN and the infinities too
    | _text,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(_text, inner, max_size=3)
        | st.tuples(inner, inner)
    ),
    max_leaves=8,
)


def _strategy(annotation: Any) -> st.SearchStrategy[Any]:
    """Values of a field's type (`Any`: anything JSON-like, tuples too)."""
    if annotation is Any:
        return _json
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(_strategy(a) for a in args))
    if origin is dict:
        return st.dictionaries(_strategy(args[0]), _strategy(args[1]), max_size=3)
    if origin is list:
        return st.lists(_strategy(args[0]), max_size=3)
    simple: dict[Any, st.SearchStrategy[Any]] = {
        str: _text,
        int: st.integers(-(2**70), 2**70),
        float: st.floats(),
        bool: st.booleans(),
        type(None): st.none(),
    }
    return simple[annotation]


def _events(cls: type[ev.Event]) -> st.SearchStrategy[ev.Event]:
    fields = {
        name: _strategy(f.annotation) if f.is_required() else st.none() | _strategy(f.annotation)
        for name, f in cls.model_fields.items()
    }

    def build(values: dict[str, Any]) -> ev.Event:
        given_ = {
            k: v for k, v in values.items() if v is not None or cls.model_fields[k].is_required()
        }
        try:
            return cls(**given_)
        except Exception:  # a value the field refuses (None for a required one)
            return cls.model_construct(**given_)

    return st.fixed_dictionaries(fields).map(build)


@pytest.mark.parametrize("cls", sorted(ev.EVENT_TYPES.values(), key=lambda c: c.TYPE))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_data_and_json_text_are_pydantic_s_dumps(cls: type[ev.Event], data: Any) -> None:
    event = data.draw(_events(cls))
    expected = ev.Event.model_dump(event, mode="json")
    for key in cls.MILLIS:
        if type(expected[key]) is float:
            expected[key] = round(expected[key], 3)
    got = ev.Event.data(event)
    assert repr(got) == repr(expected)  # NaN != NaN: the representation is compared
    assert event.json_text() == event.model_dump_json()
    # The type's own `data` (which may drop keys) is built on it, as before.
    assert ev.encode(event)[2].keys() <= expected.keys()


def test_unknown_events_dump_their_extra_fields() -> None:
    event = ev.decode("some.future.event", {"a": 1, "b": [1, "x"], "c": {"d": None}})
    assert (
        event.data() == event.model_dump(mode="json") == {"a": 1, "b": [1, "x"], "c": {"d": None}}
    )
    assert event.json_text() == event.model_dump_json()
