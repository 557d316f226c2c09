"""The tools of a run: the contract's allowlist checked against what is registered, and
the tools of a source opened for the run (MCP) joined without shadowing anything."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any, Protocol, runtime_checkable

from tether import errors, ledger_view
from tether import ledger as L
from tether.spec import OpRule, TaskSpec, source_of
from tether.tools.builtin.files import BUILTIN_READ_TOOLS, READ_ARTIFACT
from tether.tools.builtin.ledger import LEDGER_ITEMS
from tether.tools.registry import Tool, ToolRegistry


@runtime_checkable
class RemoteTool(Protocol):
    """A tool served by another process (an MCP server's, `tether.tools.mcp.McpTool`):
    which server, and the tool's name there. A protocol, so that the run does not import
    the MCP client (an extra) to tell such a tool apart."""

    server: str
    remote_name: str


def check_tools(spec: TaskSpec, known: Sequence[str]) -> None:
    """Refuse a contract that names a tool nobody registered (a typo would otherwise
    leave the model without the tool it needs, silently)."""
    have = set(known)
    missing = [n for n in spec.tool_names() if n not in have]
    missing += [
        f"{t} (items.{n}.evidence_from)"
        for n, item in enumerate(spec.items)
        for t in item.evidence_from.tools
        if t not in have
    ]
    if missing:
        raise errors.SpecError(
            f"the contract names tools that are not registered: {', '.join(missing)} "
            f"(known: {', '.join(sorted(have)) or 'none'}); register them "
            "(TETHER_TOOLS, or the registry in Python) or fix the tools list",
            source=source_of(spec),
        )
    for n, item in enumerate(spec.items):
        rule = item.done_when
        if isinstance(rule, OpRule) and rule.tool not in have:
            raise errors.SpecError(
                f"items.{n}.done_when: the tool {rule.tool!r} is not registered, so item "
                f"{item.id!r} could never be done",
                source=source_of(spec),
            )


def allowed_tools(
    spec: TaskSpec, registry: ToolRegistry, ledger: L.Ledger
) -> tuple[list[Tool], dict[str, Tool]]:
    """The tools the contract allows (with `read_artifact` always, and `ledger_items`
    when the ledger is long enough to be shown as a view), and every registered tool by
    name. No allowlist permits the read-only tools only: anything that writes, or has a
    risky effect, must be named in the contract."""
    allow = spec.tool_names() if spec.tools else list(BUILTIN_READ_TOOLS)
    if not spec.mcp_servers:
        check_tools(spec, registry.names())
    if READ_ARTIFACT not in allow:
        allow.append(READ_ARTIFACT)
    if ledger_view.paged(ledger) and LEDGER_ITEMS not in allow:
        allow.append(LEDGER_ITEMS)  # a long ledger is shown as a view: page through it
    known = {n: t for n in registry.names() if (t := registry.get(n))}
    return [_as_declared(spec, t) for t in registry.allowed(allow)], known


def _as_declared(spec: TaskSpec, tool: Tool) -> Tool:
    """`tool` with what the contract says of it (`volatile`) over its own declaration."""
    perm = spec.permission(tool.name) if spec.tools else None
    if perm is None or perm.volatile is None or perm.volatile == tool.volatile:
        return tool
    return dataclasses.replace(tool, volatile=perm.volatile)


def _source_of(tool: Tool) -> str:
    if isinstance(tool, RemoteTool) and tool.server:
        return f"MCP server {tool.server!r}"
    return "a tool source"


def _by_name(tools: Sequence[Tool], registered: Collection[str], task_id: str) -> dict[str, Tool]:
    """The source's tools by name; a clash with a registered tool, or between two
    sources, is a `SpecError` naming both."""
    by_name: dict[str, Tool] = {}
    for t in tools:
        if t.name in registered:
            kind = "built-in" if t.name in BUILTIN_READ_TOOLS else "registered"
            raise errors.SpecError(
                f"the tool {t.name!r} of {_source_of(t)} clashes with the {kind} tool "
                f"{t.name!r}; give the server a prefix (do not set `prefix: ''`), or "
                "leave the tool out with the server's `tools:`",
                source=f"task {task_id}",
            )
        if t.name in by_name:
            raise errors.SpecError(
                f"the tool {t.name!r} of {_source_of(t)} clashes with the tool {t.name!r} "
                f"of {_source_of(by_name[t.name])}; give the servers different prefixes",
                source=f"task {task_id}",
            )
        by_name[t.name] = t
    return by_name


def _renamed(spec: TaskSpec, names: dict[str, str]) -> TaskSpec:
    """The spec with each `<prefix>.<tool>` of `names` read as `<prefix>__<tool>`."""

    def rename(name: str) -> str:
        return names.get(name, name)

    items = []
    for item in spec.items:
        update: dict[str, Any] = {}
        if any(n in names for n in item.evidence_from.tools):
            update["evidence_from"] = item.evidence_from.model_copy(
                update={"tools": [rename(n) for n in item.evidence_from.tools]}
            )
        rule = item.done_when
        if isinstance(rule, OpRule) and rule.tool in names:
            update["done_when"] = rule.model_copy(update={"tool": rename(rule.tool)})
        items.append(item.model_copy(update=update) if update else item)
    allow = [
        rename(t) if isinstance(t, str) else t.model_copy(update={"name": rename(t.name)})
        for t in spec.tools
    ]
    return spec.model_copy(update={"tools": allow, "items": items})


def source_tools(
    spec: TaskSpec, registered: Collection[str], tools: Sequence[Tool], task_id: str
) -> tuple[TaskSpec, list[Tool], dict[str, Tool]]:
    """Tools from a source opened for a run (MCP), filtered by the allowlist: the spec
    (names normalised), the tools it allows, and every one of the source's by name.

    Nothing shadows anything: a source's tool named like a built-in or registered
    tool, or like another source's, is a `SpecError` naming both. A contract may name
    an MCP tool `<prefix>.<tool>` as well as `<prefix>__<tool>` (the name the model
    sees); the run's spec is read with the former spelling normalised.
    """
    by_name = _by_name(tools, registered, task_id)
    names = {
        f"{t.name[: -len(remote) - 2]}.{remote}": t.name
        for t in by_name.values()
        if isinstance(t, RemoteTool)
        and (remote := t.remote_name)
        and t.name.endswith(f"__{remote}")
        and len(t.name) > len(remote) + 2
    }
    if names:
        spec = _renamed(spec, names)
    # Without an allowlist only the built-in read tools run: none of a source's.
    extra = [
        _as_declared(spec, by_name[n]) for n in dict.fromkeys(spec.tool_names()) if n in by_name
    ]
    check_tools(spec, [*registered, *by_name])
    return spec, extra, by_name


__all__ = ["allowed_tools", "check_tools", "source_tools"]
