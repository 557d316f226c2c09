"""Pydantic validation errors as short lines a person (or a model) can act on.

One wording everywhere: a contract's fields (`tether.spec`) and a tool's arguments
(`tether.tools.registry`) say the same things the same way:

- `items.0.colour: unknown field` / `colour: unknown argument`
- `items.0.title: required field is missing` / `path: required argument is missing`
- `limit: Input should be less than or equal to 20000 (got 99999)` (pydantic's message,
  with the offending value, clipped)
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping, Sequence
from itertools import islice
from typing import Any

from pydantic import ValidationError

from tether import errors

#: The longest shown form of an offending value.
MAX_SHOWN = 60

#: What a URL may not contain besides whitespace, and a label at all: the controls that
#: would act on a terminal (ESC, CR, BEL...), DEL and C1 controls, bidirectional
#: overrides, line separators.
CONTROLS = "\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_BAD_IN_URL = re.compile(f"[\\s{CONTROLS}]")


def http_url_problem(url: str) -> str | None:
    """Why `url` cannot be fetched or posted to, or None: an http(s) URL with a host, a
    valid port, and no whitespace or control characters (`ftp://`, `file://`,
    `http://` without a host and a broken IPv6 literal are refused where they are
    written, instead of failing every call that uses them)."""
    bad = _BAD_IN_URL.search(url)
    if bad:
        return f"contains whitespace or a control character ({bad.group()!r}); percent-encode it"
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # raises for a port out of range or not a number
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    if parts.scheme.lower() not in ("http", "https"):
        return f"must be an http(s):// URL, not {shown(url)}"
    if not parts.hostname:
        return f"has no host ({shown(url)})"
    if port == 0:
        return "has port 0"
    return None


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def free_text(text: str | None, what: str, *, limit: int, required: bool = False) -> str:
    """A person's free text (a message, a reason, a hint) as it is stored: stripped, and
    refused with a `UserError` — never cut short, which would lose its end — when it is
    longer than `limit` characters, holds a NUL or an unpaired surrogate (no database
    stores those as text), or is blank and `required`."""
    value = (text or "").strip()
    if required and not value:
        raise errors.UserError(f"{what} is empty")
    if len(value) > limit:
        raise errors.UserError(
            f"{what} is {len(value):,} characters long; at most {limit:,} (put a long text "
            "in a file in the workspace and say where it is)"
        )
    bad = _UNSTORABLE.search(value)
    if bad:
        kind = "a NUL character (\\0)" if bad.group() == "\x00" else "an unpaired surrogate"
        raise errors.UserError(f"{what} contains {kind}, which cannot be stored as text")
    return value


def where(loc: Sequence[int | str], *, root: str) -> str:
    """A dotted path for an error location (`items.0.title`), `root` when empty."""
    return ".".join(str(p) for p in loc) or root


def shown(value: Any, limit: int = MAX_SHOWN) -> str:
    """`repr(value)`, clipped to `limit` characters — built from a clipped copy, so a
    huge or deeply nested input never costs its whole `repr`."""
    text = repr(_clip(value, limit, 3))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _clip(value: Any, limit: int, depth: int) -> Any:
    """A small stand-in for `value`: strings cut, containers cut to a few items and a
    few levels."""
    if isinstance(value, str | bytes):
        return value[: limit + 1]
    if depth <= 0 and isinstance(value, dict | list | tuple | set):
        return ...
    if isinstance(value, dict):
        return {_clip(k, limit, 0): _clip(v, limit, depth - 1) for k, v in islice(value.items(), 8)}
    if isinstance(value, list | tuple):
        return [_clip(v, limit, depth - 1) for v in islice(value, 8)]
    if isinstance(value, set):
        return {_clip(v, limit, 0) for v in islice(value, 8) if not isinstance(v, dict | list)}
    if isinstance(value, int) and value.bit_length() > 4 * limit:
        return ...  # a number too long to print is not shown
    return value


def describe_error(err: Mapping[str, Any], at: str, *, noun: str, unknown_hint: str = "") -> str:
    """One error as a line: `at` is where (see `where`), `noun` what the keys are
    (`field`, `argument`); `unknown_hint` follows "unknown <noun>"."""
    kind = err["type"]
    if kind == "extra_forbidden":
        return f"{at}: unknown {noun}{unknown_hint}"
    if kind == "missing":
        return f"{at}: required {noun} is missing"
    return f"{at}: {err['msg']} (got {shown(err.get('input'))})"


def describe(
    exc: ValidationError,
    *,
    noun: str,
    root: str,
    limit: int | None = None,
    unknown_hint: str = "",
) -> list[str]:
    """The first `limit` errors of `exc` (all if None) as lines (see `describe_error`)."""
    errs = exc.errors()
    if limit is not None:
        errs = errs[:limit]
    return [
        describe_error(e, where(e["loc"], root=root), noun=noun, unknown_hint=unknown_hint)
        for e in errs
    ]


class Shown:
    """A value whose `repr` is text made already (see `cut`)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


class _Clip:
    """`repr` of a value, written only until `room` characters are used up."""

    def __init__(self, room: int) -> None:
        self.parts: list[str] = []
        self.room = room

    def put(self, text: str) -> bool:
        self.parts.append(text[: self.room])
        self.room -= len(text)
        return self.room > 0

    def seq(self, opening: str, values: Any, closing: str, pairs: bool = False) -> bool:
        if not self.put(opening):
            return False
        for n, v in enumerate(values):
            if n and not self.put(", "):
                return False
            if pairs:
                if not (self.walk(v[0]) and self.put(": ") and self.walk(v[1])):
                    return False
            elif not self.walk(v):
                return False
        return self.put(closing)

    def walk(self, v: Any) -> bool:
        if isinstance(v, str | bytes):
            return self.put(repr(v[: self.room]))
        if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 3000:
            return self.put(f"<a {v.bit_length()}-bit number>")  # repr() refuses it
        if isinstance(v, dict):
            return self.seq("{", v.items(), "}", pairs=True)
        if isinstance(v, list):
            return self.seq("[", v, "]")
        if isinstance(v, tuple):
            return self.seq("(", v, ",)" if len(v) == 1 else ")")
        if isinstance(v, set | frozenset) and v:
            return self.seq("{", v, "}")
        try:
            return self.put(repr(v))
        except Exception:  # a caller's object with a broken __repr__
            return self.put(f"<{type(v).__name__}>")


def cut(value: Any, limit: int = MAX_SHOWN) -> str:
    """`repr(value)` clipped to `limit` characters (`...` at the end when clipped), built
    only as far as it is shown: the whole repr of a hostile input can be gigabytes."""
    clip = _Clip(limit + 1)
    clip.walk(value)
    text = "".join(clip.parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."
