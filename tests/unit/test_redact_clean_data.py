"""`Redactor.clean_data` says a value needs no masking only when `Redactor.data` would
change nothing in it: the journal skips the masked copy of an op's result on its word."""

from __future__ import annotations

import datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tether.redact import Redactor

SECRET = "sk-live-0123456789"
_pieces = st.sampled_from(
    ["", "ok", SECRET, "http://u:p@h/x", "Authorization: x", "BEARER abcdefghij", "é\n\"'"]
)
_text = st.lists(_pieces, max_size=3).map("".join)
_json: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | _text,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(_text, inner, max_size=3)
        | st.tuples(inner, inner)
    ),
    max_leaves=8,
)


@given(_json)
def test_clean_data_is_never_wrong_about_a_value(value: Any) -> None:
    redactor = Redactor((SECRET,))
    if redactor.clean_data(value):
        assert repr(redactor.data(value)) == repr(value)


def test_clean_data_sees_secrets_in_keys_values_and_nesting() -> None:
    redactor = Redactor((SECRET,))
    assert redactor.clean_data({"a": [1, 2.5, None, True, ["x", {"b": "y"}]]})
    assert not redactor.clean_data({"a": [1, {"b": f"key {SECRET}"}]})
    assert not redactor.clean_data({SECRET: 1})
    assert not redactor.clean_data(["see https://tok@host", None])
    assert not redactor.clean_data(["Bearer abcdefghijk"])


def test_clean_data_refuses_what_it_cannot_read() -> None:
    # An object a serializer would turn into text: the caller takes the long way.
    redactor = Redactor(())
    assert not redactor.clean_data({"at": datetime.date(2026, 1, 1)})
    assert not redactor.clean_data([b"bytes"])
    assert not redactor.clean_data({1.5j: "x"})
    assert not redactor.clean_data({"a": ("x",)})  # `data` makes it a list
