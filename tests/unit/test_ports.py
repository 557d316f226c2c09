"""The ports of a run stay narrow: at most ten members each, and none hands out the
whole store (a part reads through `Records` and writes through `Journal`).

A member named `store` is allowed when its type is a narrow read protocol: a few
methods, each a read (`get_*`, `read_*`), like `ops.ports.OpsStore` and
`ports.JudgeStore` — what `ops`, `judge` and `recovery.deliverables` read, by name,
and no write, no lease, no other method of a `Store`. A member typed as the `Store`
itself, or a `store` of any other type, hands out the store.

Ports still wide would be listed in `WIDE`; the list may only shrink."""

from __future__ import annotations

import inspect
import sys
import typing
from typing import Any, Protocol

from tether.runtime.ops.ports import OpsStore
from tether.runtime.run import ports
from tether.store.base import Store

#: Still wide (more than ten members, or the store among them): none.
WIDE: set[str] = set()
MAX_MEMBERS = 10
READS = ("get_", "read_")


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
        names = {**vars(ports), **vars(sys.modules[base.__module__])}
        hints = typing.get_type_hints(base, names)
        for name in getattr(base, "__annotations__", {}):
            out[name] = hints[name]
        for name, value in vars(base).items():
            if name.startswith("_"):
                continue
            if isinstance(value, property) and value.fget is not None:
                out[name] = typing.get_type_hints(value.fget, names).get("return")
            elif callable(value):
                out[name] = value
    return out


def read_only(kind: Any) -> bool:
    """True when `kind` is a narrow read protocol of the store: a protocol of at most
    ten members, each a method whose name says it reads."""
    if not (inspect.isclass(kind) and getattr(kind, "_is_protocol", False)):
        return False
    found = {
        name: value
        for base in kind.__mro__
        if getattr(base, "_is_protocol", False) and base not in (Protocol, typing.Generic)
        for name, value in vars(base).items()
        if not name.startswith("_")
    }
    found.update(
        (name, None)
        for base in kind.__mro__
        if getattr(base, "_is_protocol", False) and base not in (Protocol, typing.Generic)
        for name in getattr(base, "__annotations__", {})
    )
    return 0 < len(found) <= MAX_MEMBERS and all(
        callable(v) and name.startswith(READS) for name, v in found.items()
    )


def hands_out_store(found: dict[str, Any]) -> list[str]:
    """The members that are the whole store: typed as `Store`, or a `store` that is
    not a narrow read protocol."""
    return [
        name
        for name, kind in found.items()
        if kind is Store or (name == "store" and not read_only(kind))
    ]


def reaches_store(cls: type, seen: frozenset[type] = frozenset()) -> bool:
    """True when the protocol hands out the store, or has a member whose type is a
    protocol of `ports` that does."""
    if cls in seen:
        return False
    found = members(cls)
    if hands_out_store(found):
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
        assert not hands_out_store(members(cls)), f"{name} hands out the store"
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
        "foreign",
        "scanned",
    }
    assert set(members(ports.ChecksHost)) == {"journal", "view", "records", "config", "flow"}
    assert not reaches_store(ports.ChecksHost)
    # A `store` is allowed only as a narrow read protocol: the `Store` itself, or a
    # protocol with a write among its methods, is the whole store.
    assert members(ports.JudgeHost)["store"] is ports.JudgeStore
    assert read_only(ports.JudgeStore) and read_only(OpsStore)
    assert not read_only(Store)
    assert hands_out_store({"store": Store}) == ["store"]
    assert hands_out_store({"backend": Store}) == ["backend"]

    class Writes(Protocol):
        async def get_ops(self) -> None: ...
        async def commit(self) -> None: ...

    assert not read_only(Writes)
    assert hands_out_store({"store": Writes}) == ["store"]

    class Host(Protocol):
        @property
        def parts(self) -> ports.ChecksHost: ...

    class Wide(Protocol):
        store: Store

    assert not reaches_store(Host)
    assert reaches_store(Wide)
