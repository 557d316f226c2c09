"""The tool registry: what a tool declares and how the runtime finds it.

A tool declares its JSON-schema arguments, its `effect` (`read`, `write`, or a risky
one: `delete`, `send`, `pay`, `publish`), whether it is `idempotent`, and the async
function that runs it. The runtime journals every call as an op and passes the op id
as the idempotency key in `ToolContext`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from tether.models.base import ToolSchema

Effect = Literal["read", "write", "delete", "send", "pay", "publish"]
RISKY: Final[frozenset[str]] = frozenset({"delete", "send", "pay", "publish"})


@dataclass(frozen=True)
class ToolContext:
    """What a running tool may know about its call."""

    op_id: str
    task_id: str
    task_version: int
    fencing_token: int
    workspace: Path | None
    logger: logging.Logger
    services: Mapping[str, Any] = field(default_factory=dict)


ToolFn = Callable[[Mapping[str, Any], ToolContext], Awaitable[str]]


@dataclass(frozen=True)
class Tool:
    """A tool the model may call."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    fn: ToolFn
    effect: Effect = "read"
    idempotent: bool = True
    service: str | None = None
    timeout: float = 60.0

    def schema(self) -> ToolSchema:
        """The model-facing schema."""
        return ToolSchema(self.name, self.description, self.parameters)


class ToolRegistry:
    """Tools by name."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.add(t)

    def add(self, tool: Tool) -> None:
        """Register a tool (a later one with the same name replaces it)."""
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        """A tool by name, or None."""
        return self._tools.get(name)

    def names(self) -> list[str]:
        """All registered names, sorted."""
        return sorted(self._tools)

    def allowed(self, allowlist: Iterable[str]) -> list[Tool]:
        """The registered tools on an allowlist, in allowlist order."""
        out = []
        for name in allowlist:
            t = self._tools.get(name)
            if t is not None:
                out.append(t)
        return out
