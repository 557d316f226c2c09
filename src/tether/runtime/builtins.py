"""Built-in tools: workspace file tools and `read_artifact`.

`write_file` and `append_file` are `write`s, except a call that would change a file
which existed before the task started: that one is an `overwrite`, which needs a human's
approval unless the contract relaxes it (`tools: [{name: write_file, approval: false}]`).
A file counts as the task's own when an earlier op of the task made it: a succeeded
write whose output says `created ...`, or a write still in flight (this round's, or one
interrupted by a crash) that was let through as a plain `write`, i.e. found no file.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from tether import errors
from tether.store.base import Store
from tether.tools import files
from tether.tools.registry import Effect, Tool, ToolContext, ToolRegistry

READ_ARTIFACT = "read_artifact"

#: Extra tools for the CLI: `module:attr,module:attr`, each attr a `Tool` or a list of them.
TOOLS_ENV = "TETHER_TOOLS"


#: The file tools that change a file, and whose calls may be overwrites.
_WRITERS = ("write_file", "append_file")
#: Op states of a call that may have taken effect but has no stored result yet.
_IN_FLIGHT = ("intended", "dispatched", "unknown", "retry_wait")


async def _write_effect(args: Mapping[str, Any], ctx: ToolContext) -> Effect:
    """`overwrite` when this call would change a file that existed before the task
    started, else `write` (a new file, or one the task made itself)."""
    if ctx.workspace is None:
        return "write"  # the call fails: there is nothing to overwrite
    ws = files.Workspace(ctx.workspace)
    path = args.get("path")
    target = ws.existing_file(path) if isinstance(path, str) else None
    if target is None:
        return "write"
    if ctx.journal is None:
        return "overwrite"  # nobody can say the task made it: ask
    for op in await ctx.journal(_WRITERS, ("succeeded", *_IN_FLIGHT)):
        earlier = op.args.get("path")
        if not isinstance(earlier, str) or ws.existing_file(earlier) != target:
            continue
        if op.status == "succeeded":
            if files.says_created(str((op.result or {}).get("summary", ""))):
                return "write"
        elif op.effect == "write":
            return "write"
    return "overwrite"


def _file_tool(name: str) -> Tool:
    schema = next(s for s in files.FILE_TOOL_SCHEMAS if s.name == name)

    async def run(args: Mapping[str, Any], ctx: ToolContext) -> str:
        if ctx.workspace is None:
            raise errors.ToolFailed(f"{name}: this task has no workspace folder")
        return await files.run_file_tool(files.Workspace(ctx.workspace), name, args)

    effect = files.FILE_TOOL_EFFECTS[name]
    # Writing the same content twice leaves the same file; appending twice does not.
    return Tool(
        name=name,
        description=schema.description,
        parameters=schema.parameters,
        fn=run,
        effect=effect,
        idempotent=name != "append_file",
        service=None,  # local files need no breaker or concurrency limit
        effect_of=_write_effect if name in _WRITERS else None,
    )


def read_artifact_tool(store_getter: Callable[[], Store]) -> Tool:
    """`read_artifact(artifact_id, offset=0, limit=4000)`: a slice of a stored artifact."""

    async def run(args: Mapping[str, Any], ctx: ToolContext) -> str:
        aid = args.get("artifact_id")
        if not isinstance(aid, str) or not aid:
            raise errors.ToolFailed("read_artifact: artifact_id (a string) is required")
        offset = args.get("offset", 0)
        limit = args.get("limit", 4000)
        if not isinstance(offset, int) or offset < 0:
            raise errors.ToolFailed("read_artifact: offset must be a non-negative integer")
        if not isinstance(limit, int) or not 1 <= limit <= 20_000:
            raise errors.ToolFailed("read_artifact: limit must be an integer from 1 to 20000")
        extra = set(args) - {"artifact_id", "offset", "limit"}
        if extra:
            raise errors.ToolFailed(f"read_artifact: unknown arguments {sorted(extra)}")
        store = store_getter()
        try:
            art = await store.get_artifact(aid)
        except KeyError:
            raise errors.ToolFailed(f"read_artifact: no artifact {aid!r}") from None
        if art.task_id != ctx.task_id:
            raise errors.ToolFailed(f"read_artifact: no artifact {aid!r}")
        text = (await store.get_blob(art.blob_hash)).decode("utf-8", errors="replace")
        part = text[offset : offset + limit]
        rest = max(0, len(text) - offset - len(part))
        tail = f"\n[{rest} more characters after offset {offset + len(part)}]" if rest else ""
        return part + tail

    return Tool(
        name=READ_ARTIFACT,
        description="Read part of a stored artifact (a large tool output) by id.",
        parameters={
            "type": "object",
            "properties": {
                "artifact_id": {"type": "string"},
                "offset": {"type": "integer", "minimum": 0, "default": 0},
                "limit": {"type": "integer", "minimum": 1, "maximum": 20000, "default": 4000},
            },
            "required": ["artifact_id"],
            "additionalProperties": False,
        },
        fn=run,
        effect="read",
    )


def _import_tools(ref: str) -> list[Tool]:
    """The tools named by `module:attr` (a `Tool` or a list of them), imported with the
    working folder on `sys.path` like scripted policies."""
    module_name, sep, attr = ref.strip().partition(":")
    if not module_name or not sep or not attr:
        raise errors.UserError(f"{TOOLS_ENV}: {ref!r} is not a module:attr reference")
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise errors.UserError(
            f"{TOOLS_ENV}: cannot import the tool module {module_name!r}: {exc}"
        ) from None
    except Exception as exc:  # the user's module failed while loading: say where
        where = ""
        if isinstance(exc, SyntaxError):
            where = f" ({exc.filename}, line {exc.lineno}: {exc.msg})"
        raise errors.UserError(
            f"{TOOLS_ENV}: the tool module {module_name!r} failed to load: "
            f"{type(exc).__name__}{where or f': {exc}'}"
        ) from None
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(cwd)
    try:
        value = getattr(module, attr)
    except AttributeError:
        raise errors.UserError(f"{TOOLS_ENV}: module {module_name!r} has no {attr!r}") from None
    found = [value] if isinstance(value, Tool) else value
    if not isinstance(found, list | tuple) or not all(isinstance(t, Tool) for t in found):
        raise errors.UserError(
            f"{TOOLS_ENV}: {ref!r} is neither a Tool nor a list of Tools "
            f"(got {type(value).__name__})"
        )
    return list(found)


def default_registry(store_getter: Callable[[], Store]) -> ToolRegistry:
    """A registry with the workspace file tools, `read_artifact`, and the tools named by
    `TETHER_TOOLS` (`module:attr,...`)."""
    reg = ToolRegistry(_file_tool(s.name) for s in files.FILE_TOOL_SCHEMAS)
    reg.add(read_artifact_tool(store_getter))
    for ref in os.environ.get(TOOLS_ENV, "").split(","):
        if ref.strip():
            reg.extend(_import_tools(ref))
    return reg
