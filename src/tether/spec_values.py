"""What tether can store of a spec's values: text without NUL characters or unpaired
surrogates, numbers a 64-bit column holds, JSON data of bounded size and depth, and
file paths that stay inside a workspace. The checks `tether.spec` runs on every field of
a contract (and `tether.approvals` on tool arguments)."""

from __future__ import annotations

import datetime as _dt
import math
import re
from typing import Any

from pydantic import BaseModel

from tether._validation import cut as _cut

#: The deepest nesting of YAML collections (aliases expanded) and of JSON data.
MAX_DEPTH = 64
#: The most values a YAML file may expand to (aliases counted at their expanded size), and
#: the most values in one piece of JSON data.
MAX_NODES = 250_000
#: The largest integer (a signed 64-bit column holds it).
MAX_INT = 2**63 - 1
#: The longest `done_when` file path, and the longest part of one (in UTF-8 bytes).
MAX_PATH_CHARS = 1024
MAX_NAME_BYTES = 255

_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")


def _text_problem(text: str) -> str | None:
    """What makes `text` unstorable (databases refuse NUL characters, UTF-8 has no unpaired
    surrogates), or None."""
    bad = _BAD_TEXT.search(text)
    if bad is None:
        return None
    if bad.group() == "\x00":
        return "contains a NUL character (\\0)"
    return f"contains an unpaired surrogate ({bad.group()!r}), which is not valid Unicode text"


def _dotted(at: tuple[Any, ...]) -> str:
    text = ".".join(location_part(p) for p in at[:20])
    return text if len(text) <= 60 and len(at) <= 20 else text[:57] + "..."


def _scalar_problem(v: Any, json_only: bool) -> str | None:
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, str):
        return _text_problem(v)
    if isinstance(v, int):
        if -MAX_INT <= v <= MAX_INT:
            return None
        return f"has a number larger than 64 bits ({v.bit_length()} bits)"
    if isinstance(v, float):
        return (
            None
            if math.isfinite(v)
            else f"has the number {v!r}, but NaN and infinity are not allowed"
        )
    if not json_only:
        return None
    kind = "a date" if isinstance(v, _dt.date) else f"a {type(v).__name__}"
    return f"has {kind} ({_cut(v, 30)}), which is not JSON data (write it in quotes)"


def _key_problem(k: Any, json_only: bool) -> str | None:
    if isinstance(k, str):
        problem = _text_problem(k)
        return f"has a key that {problem}" if problem else None
    return f"has a key that is not text ({_cut(k, 30)})" if json_only else None


def data_problem(value: Any, *, json_only: bool = True) -> str | None:
    """The first thing in `value` that tether cannot store, with where it is, or None.

    Refused everywhere: text with a NUL character or an unpaired surrogate, NaN and
    infinite numbers (not JSON; PostgreSQL refuses them), integers beyond 64 bits, nesting
    deeper than `MAX_DEPTH` (or a cycle), more than `MAX_NODES` values. With `json_only`,
    also anything that is not JSON data (a date, bytes, a set, a key that is not text).
    The walk is iterative and bounded, so any input gets an answer quickly."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    seen = 0
    while stack:
        v, at = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            return f"holds more than {MAX_NODES:,} values"
        problem: str | None = None
        if len(at) > MAX_DEPTH:
            problem = f"is nested deeper than {MAX_DEPTH} levels"
        elif isinstance(v, dict):
            entries = list(v.items())
            problem = next((p for p in (_key_problem(k, json_only) for k, _ in entries) if p), None)
            stack.extend((x, (*at, k)) for k, x in reversed(entries))
        elif isinstance(v, list | tuple):
            stack.extend((x, (*at, n)) for n, x in reversed(list(enumerate(v))))
        else:
            problem = _scalar_problem(v, json_only)
        if problem:
            return f"{problem} (at {_dotted(at)})" if at else problem
    return None


def shape_problem(value: Any) -> str | None:
    """Why `value` is not JSON data tether can walk, or None: nesting deeper than
    `MAX_DEPTH` (or a cycle), more than `MAX_NODES` values, a key that is not text, a
    value of no JSON type. The shape checks of `data_problem` alone, for data whose text
    is cleaned rather than refused (a model's tool arguments, `tether.text`), made
    before any recursive walk of it could overflow the stack. Iterative and bounded."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    seen = 0
    while stack:
        v, depth = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            return f"hold more than {MAX_NODES:,} values"
        if depth > MAX_DEPTH:
            return f"are nested deeper than {MAX_DEPTH} levels"
        if isinstance(v, dict):
            if not all(type(k) is str for k in v):
                return "have a key that is not text"
            stack.extend((x, depth + 1) for x in v.values())
        elif isinstance(v, list | tuple):
            stack.extend((x, depth + 1) for x in v)
        elif not isinstance(v, str | int | float | bool | None):
            return f"hold a {type(v).__name__}, which is not JSON"
    return None


def storable(value: Any) -> Any:
    """`value` if tether can store it (see `data_problem`; any Python value, not only
    JSON data), else `ValueError` saying why."""
    # The common cases answered without the walk (this runs on every field of every
    # checklist item: with ten thousand items the walk was most of `parse_spec`'s time).
    if value is None or isinstance(value, bool | float):
        problem = _scalar_problem(value, False)
    elif isinstance(value, str):
        problem = _text_problem(value)
    elif isinstance(value, int):
        problem = _scalar_problem(value, False)
    elif (
        isinstance(value, list)
        and len(value) < MAX_NODES
        and all(isinstance(v, BaseModel) for v in value)
    ):
        problem = None  # a list of models: each has checked its own fields
    else:
        problem = data_problem(value, json_only=False)
    if problem:
        raise ValueError(problem)
    return value


#: A path that starts with a drive letter (`C:`): absolute on Windows.
_DRIVE = re.compile(r"^[A-Za-z]:")


def file_path_problem(path: str) -> str | None:
    """Why `path` cannot name a file inside a workspace, or None: it must be relative,
    stay inside (`..` may not climb out), name something below the workspace, and be of
    a sane length without NUL characters."""
    if not path.strip():
        return "is empty; give a file path relative to the workspace (e.g. out/report.md)"
    problem = _text_problem(path)
    if problem:
        return problem
    if len(path) > MAX_PATH_CHARS:
        return f"is {len(path):,} characters long; at most {MAX_PATH_CHARS}"
    if path.startswith(("/", "\\")) or _DRIVE.match(path):
        return (
            f"{_cut(path, 40)} is absolute; give a path relative to the workspace "
            "(e.g. out/report.md)"
        )
    depth = 0
    # `PurePosixPath(path).parts` without the object: no empty parts, no `.` (a leading
    # `/` was refused above); this runs once per item with a file rule.
    for part in path.split("/"):
        if not part or part == ".":
            continue
        if len(part.encode("utf-8")) > MAX_NAME_BYTES:
            return f"has a part longer than {MAX_NAME_BYTES} bytes"
        if part == "..":
            depth -= 1
            if depth < 0:
                return f"{_cut(path, 40)} leads outside the workspace"
        else:
            depth += 1
    if depth == 0:
        return f"{_cut(path, 40)} names the workspace itself, not a file in it"
    return None


def location_part(p: Any) -> str:
    """One step of an error location, short and printable (a key can be any text)."""
    text = str(p) if isinstance(p, str | int) else _cut(p, 40)
    if isinstance(p, str) and (len(p) > 40 or not p.isprintable()):
        text = _cut(p, 40)
    return text
