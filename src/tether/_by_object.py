"""Values kept per live object: caches keyed by an object's id while it lives.

The runtime keeps what it derives from an immutable object (a contract's rule index, a
ledger's open window, a checklist's names) for as long as that object lives: a worker
runs many tasks in turn, and a cache of the last few objects was rebuilt at every round
once more runs than it held took turns.
"""

from __future__ import annotations

import weakref
from typing import Any, TypeVar

_V = TypeVar("_V")


def _forget(table: dict[int, Any], key: int, value: object) -> None:
    """Drop `table[key]` if it is still `value` (the id may name a newer object by now)."""
    if table.get(key) is value:
        del table[key]


def keep(table: dict[int, _V], owner: object, value: _V) -> _V:
    """`table[id(owner)] = value` until `owner` is gone: an entry is found by the id of
    a live object only (its id names no other object meanwhile). An owner that cannot
    be watched (no weak reference to it) is not kept: its value is made again."""
    key = id(owner)
    try:
        weakref.finalize(owner, _forget, table, key, value)
    except TypeError:
        return value
    table[key] = value
    return value
