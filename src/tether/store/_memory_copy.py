"""The copies the memory store keeps of what callers give it (`tether.store.memory`).

A caller may change its objects after a commit, and the store must keep what was
committed, as a database would: plain JSON data is copied here (its atoms, immutable,
shared), anything else takes a JSON round trip, which converts or refuses it.
"""

from __future__ import annotations

import json
from typing import Any

from tether.store import _rules as rules
from tether.store import base as b
from tether.store.base import OpRecord

#: Values a JSON round trip returns unchanged (bool is an int; NaN and infinities
#: are floats json writes and reads back as such).
ATOMS: frozenset[type] = frozenset({str, int, float, bool, type(None)})


class NotPlain(Exception):
    """A value the quick copy does not handle (a tuple, a non-string key, an object)."""


def clone(value: Any) -> Any:
    """A copy of plain JSON data (dicts with string keys, lists, atoms), its atoms shared
    (immutable); `NotPlain` for anything else."""
    kind = type(value)
    if kind is dict:
        # Copied whole (in C), then its containers replaced by copies: most of the run
        # state's values are atoms, passed over.
        out = value.copy()
        for k, v in value.items():
            if type(k) is not str:
                raise NotPlain
            kind = type(v)
            if kind in ATOMS:
                continue
            if kind is dict:
                # An empty one, as most of the run state's are: no call for it.
                out[k] = clone(v) if v else {}
            elif kind is list:
                out[k] = (list(v) if ATOMS.issuperset(map(type, v)) else clone(v)) if v else []
            else:
                raise NotPlain
        return out
    if kind is list:
        if ATOMS.issuperset(map(type, value)):  # a list of strings: copied in C
            return list(value)
        return [v if type(v) in ATOMS else clone(v) for v in value]
    if kind in ATOMS:
        return value
    raise NotPlain


def copy_json(obj: Any) -> Any:
    """`obj` as a database would hand it back: callers never share the store's objects."""
    # Plain JSON
    # data (dicts with string keys, lists, atoms) is copied as is, several times faster
    # than a JSON round trip (the run's state is ~20 KB and is written every commit);
    # anything else takes the round trip, which converts or refuses it as before.
    try:
        return clone(obj)
    except (NotPlain, RecursionError):
        return json.loads(json.dumps(obj))


def stored_op(old: OpRecord | None, op: OpRecord, now: float) -> OpRecord:
    """`rules.merge_op` of `op` over `old` (None: its first write), with the caller's
    containers copied: only the JSON fields are containers, the rest is immutable (a
    deepcopy of the whole record costs more than the round's commit). The merged record
    is a new one nobody holds yet: its fields taken from `op` are copied into it, rather
    than into a copy of `op` made first (which the merge of a later write threw away)."""
    new = rules.merge_op(old, op, now)  # a new record (`rules.replaced`), always
    values = new.__dict__
    # A later write keeps the stored args (a copy already) and takes its outcome.
    for name in _OP_JSON if old is None else _OP_OUTCOME_JSON:
        value = values[name]
        if value is not None:
            values[name] = copy_json(value)
    return new


#: The fields of an op record that hold JSON containers, and those a later write of the
#: op takes from it (`rules.OP_OUTCOME`).
_OP_JSON = ("args", "result", "error")
_OP_OUTCOME_JSON = tuple(name for name in _OP_JSON if name in rules.OP_OUTCOME)


def copy_usage(usage: Any, marks: b.MarksWrite | None, held: Any) -> Any:
    """The run state a commit stores (`copy_json` of `usage`), its progress marks
    (`usage["seen"]`, up to a thousand per item) taken as the SQL stores take them: the
    items `marks` does not name keep the lists stored (`held`, never changed in place),
    the others drop their oldest marks and get the new ones, copied. Where that does not
    give a list of the given length (or `marks` is None), the given list is copied."""
    seen = usage.get("seen") if type(usage) is dict else None
    kept = held.get("seen") if type(held) is dict else None
    if marks is None or type(seen) is not dict or type(kept) is not dict:
        return copy_json(usage)
    changed = marks.items
    out_seen: dict[str, Any] = {}
    for item, given in seen.items():
        old = kept.get(item)
        if type(item) is not str:
            return copy_json(usage)  # the JSON round trip converts the key
        if type(given) is list and type(old) is list:
            change = changed.get(item)
            if change is None:
                if len(old) == len(given):
                    out_seen[item] = old
                    continue
            else:
                cut, added = change
                if cut is not None and len(old) - cut + len(added) == len(given):
                    out_seen[item] = old[cut:] + copy_json(list(added))
                    continue
        out_seen[item] = copy_json(given)
    out = copy_json({**usage, "seen": {}})
    out["seen"] = out_seen
    return out
