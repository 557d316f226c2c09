"""Walking JSON-like values (what `json.loads` makes, and tool arguments)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


def strings_in(value: Any) -> Iterator[str]:
    """Every string inside `value`, depth first: mapping values (not keys), list and
    tuple members, and `value` itself when it is a string."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from strings_in(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from strings_in(v)
