"""The SQL stores write JSON data (a run state, an event's data) with pydantic's encoder
where that gives `json`'s text (`_rows.data_dumps`, `strict_data_dumps`): for any JSON
value the text is exactly `_rows.dumps`'s, `json.dumps(value, separators=(",", ":"),
ensure_ascii=False)` (strict: non-finite numbers as null), floats pydantic spells its
own way, odd keys and lone surrogates included."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tether.store._rows import (
    _data_text,
    data_dumps,
    dumps,
    strict_data_dumps,
    strict_dumps,
)
from tether.store._rows import data_no_nul as _data_no_nul
from tether.store._rows import dumps_no_nul as _dumps_no_nul
from tether.text import clean_text

_floats = (
    st.floats()
    | st.floats(-1e-3, 1e-3)
    | st.sampled_from([1e-4, -1e-4, 1e-5, 9.99e-5, 1.5e-7, 1e-10, 1e15, 1e16, 1e22, 5e-324])
)
_text = st.text(max_size=12) | st.sampled_from(["1e-7", "0.00001", "None", "x\ud800", "\x00"])
_keys = _text | st.integers(-5, 5) | st.booleans() | st.none() | _floats
_json: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | _floats | _text,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(_keys, inner, max_size=4)
        | st.tuples(inner, inner)
    ),
    max_leaves=12,
)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


@settings(max_examples=800, deadline=None)
@given(_json)
def test_the_text_is_jsons(value: Any) -> None:
    text = clean_text(json.dumps(value, separators=(",", ":"), ensure_ascii=False))
    assert data_dumps(value) == dumps(value) == text
    try:
        strict = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError:
        strict = dumps(_finite(value))
    assert strict_data_dumps(value) == strict_dumps(value) == clean_text(strict)
    assert _data_no_nul(value) == _dumps_no_nul(value)


def test_what_pydantic_spells_otherwise_is_left_to_json() -> None:
    for value in ([1e-5], [-1.5e-5], [9.99e-5], {"x": 1e-7}, {None: 1}, {math.inf: 1}):
        assert _data_text(value, "constants") is None
        assert data_dumps(value) == json.dumps(value, separators=(",", ":"))
    for x in (0.0, -0.0, 1e-4, 0.5, 1e-10, 1e16, 1e300, math.nan, math.inf):
        assert _data_text({"x": x}, "constants") == json.dumps({"x": x}, separators=(",", ":"))
    assert data_dumps({"a": "x\ud800y"}) == '{"a":"x\ufffdy"}'
