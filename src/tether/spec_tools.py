"""What a contract says about one allowed tool (`tools: [{name: ..., ...}]`)."""

from __future__ import annotations

import functools
from typing import Annotated, Literal

from pydantic import Field

from tether._spec_model import _Strict

__all__ = ["ToolPermission"]


class ToolPermission(_Strict):
    """A tool on the allowlist, with what the contract says about it."""

    name: str = Field(min_length=1)
    approval: bool | None = Field(
        default=None,
        description="require a human's approval; default: only for risky effects "
        "(overwrite, delete, send, pay, publish)",
    )
    max_attempts: int | None = Field(default=None, gt=0, description="transient retries")
    on_exhausted: Literal["fail_item", "ask_human", "compensate"] | None = Field(
        default=None,
        description="when the retries are exhausted: fail_item (the failure goes back to "
        "the model), ask_human (the task waits for a person's decision on the call) or "
        "compensate (the item's applied ops are undone by their tools' compensate hooks, "
        "newest first, and the item is blocked); default: the tool's own retry policy",
    )
    secrets: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]] = Field(
        default_factory=list,
        max_length=64,
        description="environment variables this tool may read with `ctx.secret(NAME)`",
    )
    volatile: bool | None = Field(
        default=None,
        description="its answers change by themselves (a status, a queue, a shell used for "
        "status checks, an MCP tool that does not say): the same call answered the same "
        "again is waiting, not a loop, up to limits.max_rounds_per_item; false: it shows "
        "what only the task changes, so the same answer again is no progress; default: "
        "what the tool declares",
    )


@functools.lru_cache(maxsize=1024)
def _bare_permission(name: str) -> ToolPermission:
    """The permission of a tool allowed by name alone (the contract's defaults): one
    shared, frozen instance per name, since every call of the tool asks for it."""
    return ToolPermission(name=name)
