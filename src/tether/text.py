"""Text from outside made storable: unpaired UTF-16 surrogates replaced.

A JSON document may spell any UTF-16 code unit as an escape, and Python decodes
`"\\ud800"` to a string holding a lone surrogate. Such a string has no UTF-8 form, so no
database takes it as text, a file cannot be written with it, and hashing it raises
`UnicodeEncodeError`. A model's answer, a tool's result or error and an MCP server's
output can all carry one (a person's text is refused instead: `_validation.free_text`).
The runtime cleans what it is given where it comes in, and the stores clean what they
encode, so a stray escape never stops a run: each lone surrogate becomes U+FFFD, and a
surrogate pair written as two code points becomes the character it stands for.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import TypeVar

_SURROGATE = re.compile("[\ud800-\udfff]")

T = TypeVar("T")


def clean_text(text: str) -> str:
    """`text` with its lone surrogates as U+FFFD and its split pairs joined; `text`
    itself (the same object) when it has none."""
    if text.isascii() or _SURROGATE.search(text) is None:
        return text
    # UTF-16 holds a pair as the two units it is made of, and its decoder replaces a
    # unit without its partner: pairs joined, lone ones replaced, in one pass of C.
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def clean_data(value: T) -> T:
    """`value` with `clean_text` applied to every string in it: mapping keys and values,
    list and tuple members (a tuple stays a tuple). `value` itself (the same object) when
    nothing in it changes, so clean data costs one walk and no copy."""
    if isinstance(value, str):
        return clean_text(value)  # type: ignore[return-value]
    if isinstance(value, dict):
        pairs = [(clean_data(k), clean_data(v)) for k, v in value.items()]
        if all(ck is k and cv is v for (ck, cv), (k, v) in zip(pairs, value.items(), strict=True)):
            return value
        return dict(pairs)  # type: ignore[return-value]
    if isinstance(value, list | tuple):
        items = [clean_data(v) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return tuple(items) if isinstance(value, tuple) else items  # type: ignore[return-value]
    return value


def ts(t: float | None) -> str:
    """A unix time as `YYYY-MM-DD HH:MM:SS` (UTC), `-` for none."""
    if t is None:
        return "-"
    try:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):  # out of the calendar's range
        return str(t)


def counted(n: int, noun: str) -> str:
    """`n` and `noun`, plural unless `n` is 1 (`1 round`, `3 tool calls`): nouns that
    take an `s`."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def exc_text(exc: BaseException) -> str:
    """What an exception from outside code (a tool, a validator, a model adapter) says,
    cleaned: its `str`, or its class's name when that is empty or fails (a broken
    `__str__` must not turn a tool's failure into the run's)."""
    try:
        text = str(exc)
    except Exception:
        text = ""
    return clean_text(text) if text else type(exc).__name__


__all__ = ["clean_data", "clean_text", "exc_text"]
