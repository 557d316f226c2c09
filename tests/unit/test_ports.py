"""The ports of a run stay narrow: at most ten members each, and none hands out the
store (a part reads through `Records` and writes through `Journal`).

The flat hosts `ops`, `judge` and `recovery.deliverables` are still typed against are
listed in `WIDE`; their own rework narrows them, and the list may only shrink."""

from __future__ import annotations

import inspect
import typing
from typing import Any, Protocol

from tether.runtime.run import ports

#: Still wide (more than ten members, or the store among them), narrowed by the rework
#: of `judge/`. `TurnHost` and `RoundHost` reach the store only through `parts`, the
#: flat host they hand to `judge` and `recovery.deliverables`. `OpsHost` has ten members;
#: its `store` is `ops.ports.OpsStore`, the reads of `ops` only (the name is `ops`' own).
WIDE = {"SharedJournal", "OpsHost", "JudgeHost", "PartsHost", "TurnHost", "RoundHost"}
MAX_MEMBERS = 10


def protocols() -> dict[str, type]:
    return {
        name: cls
        for name, cls in vars(ports).items()
        if inspect.isclass(cls)
        and cls.__module__ == ports.__name__
        and getattr(cls, "_is_protocol", False)
    }


def members(cls: type) -> dict[str, Any]:
    """A protocol's members (its own and its protocol bases'), with their types."""
    out: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        if base in (object, Protocol, typing.Generic) or not getattr(base, "_is_protocol", False):
            continue
        hints = typing.get_type_hints(base, vars(ports))
        for name in getattr(base, "__annotations__", {}):
            out[name] = hints[name]
        for name, value in vars(base).items():
            if name.startswith("_"):
                continue
            if isinstance(value, property) and value.fget is not None:
                out[name] = typing.get_type_hints(value.fget, vars(ports)).get("return")
            elif callable(value):
                out[name] = value
    return out


def reaches_store(cls: type, seen: frozenset[type] = frozenset()) -> bool:
    """True when the protocol has a `store`, or a member whose type is a protocol of
    `ports` that reaches one."""
    if cls in seen:
        return False
    found = members(cls)
    if "store" in found:
        return True
    protos = set(protocols().values())
    return any(t in protos and reaches_store(t, seen | {cls}) for t in found.values())


def test_the_ports_are_narrow() -> None:
    found = protocols()
    assert set(found) >= WIDE, "a name in WIDE is gone: take it off the list"
    for name, cls in found.items():
        if name in WIDE:
            continue
        names = sorted(members(cls))
        assert len(names) <= MAX_MEMBERS, f"{name} has {len(names)} members: {names}"
        assert "store" not in names, f"{name} hands out the store"
        assert not reaches_store(cls), f"{name} reaches the store through a member"


def test_the_check_sees_members_and_the_store() -> None:
    # Guard against a check that cannot fail: it counts inherited members and
    # properties, and it sees the store where it is, directly or through a member.
    assert set(members(ports.RunFlow)) == {
        "token",
        "lease_lost",
        "rounds_this_run",
        "commit_flags",
        "stop_requested",
    }
    assert set(members(ports.ChecksHost)) == {"journal", "view", "records", "config", "flow"}
    assert "store" in members(ports.JudgeHost)
    assert len(members(ports.PartsHost)) > MAX_MEMBERS
    assert reaches_store(ports.RoundHost)
    assert not reaches_store(ports.ChecksHost)
