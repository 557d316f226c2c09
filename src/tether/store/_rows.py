"""Records to and from the SQL stores' rows.

A record is read from its row (by column name: psycopg's `dict_row`, `sqlite3.Row`)
by its fields' annotations (`_reading`). A worker reads thousands of rows (a task's
events, its ops) on the threads whose Python competes with its event loop for the GIL,
so each record class gets a reader function made once from its readings, the way
`dataclasses` makes `__init__`: one call per row, no loop over the fields.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from json import encoder as json_encoder
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic_core import PydanticSerializationError, to_json

from tether.store import _rules as rules
from tether.store.base import OpRecord, StoredEvent
from tether.text import clean_text

if TYPE_CHECKING:  # the event models load where a commit encodes them, not to read
    from tether import events as ev

R = TypeVar("R")
Row = Mapping[str, Any]


def _encoder(*, allow_nan: bool) -> Callable[[Any], str]:
    """`json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=...)`'s
    `encode`, with the C encoder it builds anew at every call built once: a commit
    encodes its run state, ops and marks (issue 22). The same text; no check for a value
    that holds itself (a `RecursionError` instead of a `ValueError`: a table of the
    containers under way could not be shared by threads); what JSON cannot hold raises
    the same `TypeError` (the encoder's `default`). Encoding keeps no state in it:
    threads share it."""
    py = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=allow_nan)
    make: Any = getattr(json_encoder, "c_make_encoder", None)
    if make is None:  # a Python without the C accelerator: the encoder's own way
        return py.encode
    c_encode = make(
        None, py.default, json_encoder.encode_basestring, None, ":", ",", False, False, allow_nan
    )

    def encode(obj: Any) -> str:
        return "".join(c_encode(obj, 0))

    return encode


_ENCODE = _encoder(allow_nan=True)
#: Standard JSON, without NaN and infinities: PostgreSQL's `json` type takes nothing else.
_ENCODE_STRICT = _encoder(allow_nan=False)


def dumps(obj: Any) -> str:
    """`json.dumps(obj, separators=(",", ":"), ensure_ascii=False)`: the SQL stores'
    JSON text (the same text, see `_encoder`), lone surrogates cleaned: they have no
    UTF-8 form, and the database would refuse the commit (`tether.text`; ASCII text is
    not even searched)."""
    return clean_text(_ENCODE(obj))


def strict_dumps(obj: Any) -> str:
    """`dumps` as standard JSON: a NaN or an infinity (a model's tool arguments may
    carry one: Python's `json.loads` takes `NaN`) is written as `null`, where `dumps`
    writes `NaN`, which PostgreSQL refuses (the commit would fail and stop the run).
    One encoding when there is none, as `dumps`."""
    try:
        return clean_text(_ENCODE_STRICT(obj))
    except ValueError:  # out of range: a non-finite float somewhere in `obj`
        return dumps(_finite(obj))


#: What pydantic's encoder spells otherwise than `json`'s: a float below 1e-4 in size
#: but 0 (`0.00001` and `1e-7` for `1e-05` and `1e-07`; every other float is spelt
#: alike, NaN and the infinities too), and a key that is None or a non-finite float
#: (`"None"`, `"inf"` for `"null"`, `"Infinity"`). A string may hold the same text.
_SPELT = re.compile(r'[0-9]e-[0-9](?![0-9])|0\.0000|"(?:None|-?inf|nan)":')


def _data_text(data: Any, inf_nan: Literal["constants", "null"]) -> str | None:
    """`json`'s text of JSON data written by pydantic's encoder (in Rust: about a third
    of the C encoder's instructions); None when it may differ: a lone surrogate (which
    pydantic refuses) or a float it spells its own way (`_SPELT`)."""
    try:
        out: str = to_json(data, inf_nan_mode=inf_nan).decode()
    except ValueError:
        return None
    maybe = "e-" in out or "0.0000" in out or 'None":' in out
    if (maybe or 'inf":' in out or 'nan":' in out) and _SPELT.search(out) is not None:
        return None
    return out


def data_dumps(data: Any) -> str:
    """`dumps` of JSON data (dicts with string keys, lists, strings, numbers, booleans,
    None: a run state, an event's `data`), the same text, written by pydantic's encoder
    when that gives it (`_data_text`). Not for records, whose values a tool or a
    caller gives: `json` refuses a set or a date there (`TypeError`), which pydantic
    would write."""
    out = _data_text(data, "constants")
    return dumps(data) if out is None else out


def strict_data_dumps(data: Any) -> str:
    """`strict_dumps` of JSON data, as `data_dumps`."""
    out = _data_text(data, "null")
    return strict_dumps(data) if out is None else out


_LEAVES = frozenset({str, int, float, bool, type(None)})
_LEAVES_OR_DICT = _LEAVES | {dict}
_STR = frozenset({str})


def flat(value: Any, *, nested: bool = False) -> bool:
    """True if `value` is a dict of string keys and plain values (strings, ints, floats,
    booleans, None; `nested`: or such dicts), by exact type (checked in C): JSON data,
    which `data_dumps` writes as `dumps` does (an op's arguments, result, error: a tool
    or a caller gives them, and they may hold what `json` refuses, a set, a date)."""
    if type(value) is not dict or not _STR.issuperset(map(type, value)):
        return False
    kinds = set(map(type, value.values()))
    if kinds <= _LEAVES:
        return True
    return (
        nested
        and kinds <= _LEAVES_OR_DICT
        and all(flat(v) for v in value.values() if type(v) is dict)
    )


#: A JSON `\u0000` escape (not an escaped backslash followed by `u0000`).
_NUL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def dumps_no_nul(obj: Any) -> str:
    """`dumps` for PostgreSQL, whose jsonb (and text) cannot hold a NUL: a model's text
    or tool arguments may carry one, stored as U+FFFD so a stray control character never
    fails a commit (the run would stop on a StoreError as if the database were down)."""
    return _no_nul(strict_dumps(obj))  # PostgreSQL's json takes no NaN either


def data_no_nul(data: Any) -> str:
    """`dumps_no_nul` of JSON data (an event's), the same text (`data_dumps`)."""
    return _no_nul(strict_data_dumps(data))


def _no_nul(out: str) -> str:
    return _NUL_ESCAPE.sub(r"\1\\ufffd", out) if "\\u0000" in out else out


def _finite(value: Any) -> Any:
    """`value` with NaN and infinities as None (floats only: JSON's other types as they
    are), for `strict_dumps`."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def json_text(data: Any) -> str:
    """`dumps` of data that is JSON already (`ev.encode`'s: string keys, JSON values),
    by pydantic's encoder, in Rust: the same text but for how some floats are spelt
    (`1e-7` for `1e-07`; both read back as the same float)."""
    try:
        return to_json(data).decode()
    except PydanticSerializationError:  # a lone surrogate (`tether.text`), or no JSON
        return dumps(data)


def stored_events(
    items: Sequence[ev.Event], dumps: Callable[[Any], str] = json_text
) -> list[tuple[str, int, str]]:
    """`(type, schema_version, data)` of each event as a SQL store writes it: its data
    compacted (`_rules.compact`), as JSON text (`dumps`)."""
    from tether import events as ev

    out = []
    for event in items:
        type_name, schema, data = ev.encode(event)
        out.append((type_name, schema, dumps(rules.compact(type_name, data))))
    return out


def json_out(value: Any) -> Any:
    """A JSON column's value: text parsed (SQLite), a document as it is (psycopg)."""
    return json.loads(value) if isinstance(value, str | bytes | bytearray) else value


def _reading(cls: type[Any]) -> tuple[tuple[str, str], ...]:
    """`(field, how its column is read)` for a record dataclass, by the field's annotation:
    `int`, `bool`, a JSON document (`dict`, `{}` when NULL; an optional one may be None),
    a JSON list read as a tuple, or the value as the database gives it."""
    ways = {
        "int": "int",
        "bool": "bool",
        "dict[str, Any]": "json_or_empty",
        "dict[str, Any] | None": "json",
        "tuple[str, ...]": "tuple",
    }
    got = _READINGS.get(cls)
    if got is None:
        got = tuple((f.name, ways.get(str(f.type), "raw")) for f in dataclasses.fields(cls))
        _READINGS[cls] = got
    return got


_READINGS: dict[type[Any], tuple[tuple[str, str], ...]] = {}

#: Each reading as a Python expression of the column's value `{v}`.
_EXPRESSIONS = {
    "int": "int({v})",
    "bool": "bool({v})",
    "json_or_empty": "(json_out({v}) or {{}})",
    "json": "json_out({v})",
    "tuple": "tuple(json_out({v}) or ())",
    "raw": "{v}",
}
#: What a record's field is made of its reading (`{}`) besides: the forms a store
#: writes for less space, read back.
_AFTER = {
    (OpRecord, "result"): "op_result_read({})",
    (StoredEvent, "data"): "expand(row['type'], {})",
}


def reader(cls: type[R]) -> Callable[[Row], R]:
    """The function that reads a `cls` from its row (see the module)."""
    got = _READERS.get(cls)
    if got is None:
        fields = []
        for name, how in _reading(cls):
            expr = _EXPRESSIONS[how].format(v=f"row[{name!r}]")
            fields.append(f"{name!r}: {_AFTER.get((cls, name), '{}').format(expr)}")
        scope: dict[str, Any] = {
            "cls": cls,
            "new": object.__new__,
            "json_out": json_out,
            "op_result_read": rules.op_result_read,
            "expand": rules.expand,
        }
        # The instance's fields set as `rules.replaced` sets them (a frozen dataclass's
        # `__init__` pays a call of `object.__setattr__` per field): every field given,
        # the records have no `__post_init__`.
        body = f"rec = new(cls)\n    rec.__dict__.update({{{', '.join(fields)}}})\n    return rec"
        exec(f"def read(row):\n    {body}\n", scope)
        got = _READERS[cls] = scope["read"]
    return got


_READERS: dict[type[Any], Callable[[Row], Any]] = {}


def record_json(records: Sequence[Any], dumps: Callable[[Any], str]) -> str:
    """Records (frozen dataclasses) as a JSON array of objects, one key per field, as
    `dataclasses.asdict` gives them: their own fields, not deep copies, unless a value
    is itself a dataclass (JSON cannot hold it; asdict makes it a dict)."""
    try:
        return dumps([vars(r) for r in records])
    except TypeError:
        return dumps([dataclasses.asdict(r) for r in records])
