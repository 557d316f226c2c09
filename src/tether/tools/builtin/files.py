"""Built-in tools: workspace file tools, `read_artifact`, and (in `source_tools`) the
source and artifact tools.

They are declared with the public `@tool`, as a user's tool would be: their signatures
give the model-facing schemas and the argument checks (`bad arguments for read_file:
...`), and the blocking IO of `tether.tools.files.Workspace` runs in a thread.

`write_file`, `append_file` and `write_report` are `write`s, except a call that would
change a file which existed before the task started: that one is an `overwrite`, which
needs a human's approval unless the contract relaxes it (`tools: [{name: write_file,
approval: false}]`).
A file counts as the task's own when an earlier op of the task made it: a succeeded
write, with the arguments it was sent with (after a human's `modify`), whose output says
`created <that file> ...`, or a write still in flight (this round's, or one
interrupted by a crash) that was let through as a plain `write`, i.e. found no file.

`read_file` (as `default_registry` makes it) refuses a file that is the location of a
source the contract declares, telling the model to call `read_source`: a source is read
only through the tool that records the version seen (and pins a snapshot), so nothing
is built on an unversioned read of it. `write_file`, `append_file` and `write_report`
refuse it too: a task that wrote its own sources could quote whatever it put there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from tether import _imports, errors
from tether import artifacts as A
from tether.store.base import ApprovalRecord, OpRecord, Store
from tether.tools import files
from tether.tools.builtin import ledger
from tether.tools.builtin.sources import source_tools
from tether.tools.registry import Effect, Tool, ToolContext, ToolRegistry, tool

READ_ARTIFACT = "read_artifact"
#: What a contract without a `tools:` list may use: the built-in tools that only read.
BUILTIN_READ_TOOLS = ("list_files", "read_file", READ_ARTIFACT)

#: Extra tools for the CLI: `module:attr,module:attr`, each attr a `Tool` or a list of them.
TOOLS_ENV = "TETHER_TOOLS"


#: The built-in tools that change a file, and whose calls may be overwrites.
_WRITERS = ("write_file", "append_file", "write_report")
#: Op states of a call that may have taken effect but has no stored result yet.
_IN_FLIGHT = ("intended", "dispatched", "unknown", "retry_wait")


async def _write_effect(args: Mapping[str, Any], ctx: ToolContext) -> Effect:
    """`overwrite` when this call would change a file that existed before the task
    started, else `write` (a new file, one the task made itself, or one an earlier
    occurrence of its schedule wrote: a daily digest's `latest.md`)."""
    if ctx.workspace is None:
        return "write"  # the call fails: there is nothing to overwrite
    ws = files.Workspace(ctx.workspace, ctx.private_files)
    path = args.get("path")
    target = ws.existing_file(path) if isinstance(path, str) else None
    if target is None:
        return "write"
    if ctx.journal is None:
        return "overwrite"  # nobody can say the task made it: ask
    # Outside a round (no position) every in-flight call counts as possibly earlier.
    me = (
        (ctx.round, ctx.call_index)
        if ctx.round is not None and ctx.call_index is not None
        else (1 << 62, 0)
    )
    # `ctx.journal` gives each op with the arguments actually sent (a human's `modify`
    # replaces the model's request; see `as_sent`): what the model asked for made nothing.
    for op in await ctx.journal(_WRITERS, ("succeeded", *_IN_FLIGHT)):
        earlier = op.args.get("path")
        if not isinstance(earlier, str) or ws.existing_file(earlier) != target:
            continue
        if op.status != "succeeded" and (op.round, op.call_index) > me:
            # A round's intents are journaled before any of its calls runs: a later
            # call cannot have made the file (this very call can, before a crash).
            continue
        if op.status == "succeeded":
            # Its own output must say it created this very file (not merely a file).
            if _created(str((op.result or {}).get("summary", "")), ws, target):
                return "write"
        elif op.effect == "write":
            return "write"
    if ctx.earlier is not None:
        # The series' own file: an earlier occurrence wrote it (made it, or replaced it
        # with a person's approval, or as its own), so it is not the user's.
        for op in await ctx.earlier(_WRITERS, ("succeeded",)):
            earlier = op.args.get("path")
            if isinstance(earlier, str) and ws.existing_file(earlier) == target:
                return "write"
    return "overwrite"


def _created(summary: str, ws: files.Workspace, target: Path) -> bool:
    """True if a writer's output says it created `target` (`created <path> with ...`)."""
    return files.says_created(summary) and summary.startswith(
        f"{files.CREATED_PREFIX}{ws.relative(target)} with "
    )


def as_sent(ops: Sequence[OpRecord], approvals: Iterable[ApprovalRecord]) -> list[OpRecord]:
    """`ops` with the arguments each was (or will be) sent with: a human's `approve
    --modify` replaces the model's arguments for the call, while the journal keeps the
    call as the model asked it (its identity). Whatever decides what an earlier op did
    (e.g. which files the task made) must read these, never the model's request."""
    modified = modified_args(approvals)
    return [
        dataclasses.replace(op, args=modified[op.op_id]) if op.op_id in modified else op
        for op in ops
    ]


def modified_args(approvals: Iterable[ApprovalRecord]) -> dict[str, dict[str, Any]]:
    """The arguments a human's `approve --modify` set, by op id (see `as_sent`)."""
    out: dict[str, dict[str, Any]] = {}
    for appr in approvals:
        args = (appr.decision or {}).get("modified_args")
        if (
            appr.status == "approved"
            and appr.op_id is not None
            and appr.request_id == f"{appr.op_id}.approval"
            and isinstance(args, Mapping)
        ):
            out[appr.op_id] = dict(args)
    return out


# --- the workspace file tools, declared like any user tool ---------------------------------

WorkspacePath = Annotated[str, Field(description="path relative to the workspace folder")]
Offset = Annotated[int, Field(ge=0)]
Limit = Annotated[int, Field(ge=1, le=files.MAX_READ_LIMIT)]


def _workspace(ctx: ToolContext, name: str) -> files.Workspace:
    if ctx.workspace is None:
        raise errors.ToolFailed(f"{name}: this task has no workspace folder")
    # The store's own database, if the workspace holds it, is out of every tool's reach.
    return files.Workspace(ctx.workspace, ctx.private_files)


@contextmanager
def _io(name: str) -> Iterator[None]:
    """An OS error of a file tool as a failure the model reads."""
    try:
        yield
    except OSError as exc:
        raise errors.ToolFailed(f"{name} failed: {exc.strerror or exc}") from None


# Local files need no service (no breaker, no concurrency limit); the blocking IO runs in
# a thread (`@tool` does that for plain functions).


@tool(
    name="list_files",
    effect="read",
    volatile=False,
    description="List the files and folders in a workspace folder (folders end in /).",
)
def list_files(ctx: ToolContext, path: WorkspacePath = ".") -> str:
    with _io("list_files"):
        return _workspace(ctx, "list_files").list_files(path)


@tool(
    name="read_file",
    effect="read",
    volatile=False,
    description=(
        f"Read a text file from the workspace: at most `limit` characters (default "
        f"{files.DEFAULT_READ_LIMIT}) from character `offset`; says how many remain."
    ),
)
def read_file(
    ctx: ToolContext,
    path: WorkspacePath,
    offset: Offset = 0,
    limit: Limit = files.DEFAULT_READ_LIMIT,
) -> str:
    with _io("read_file"):
        return _workspace(ctx, "read_file").read_file(path, offset, limit)


# Writing the same content twice leaves the same file (idempotent); appending twice does
# not. Either is an `overwrite` when it would change a file the task did not make.


def _writer(name: str, *, idempotent: bool, description: str) -> Tool:
    """`write_file` or `append_file`: one tool but for its name, whether sending it twice
    leaves the same file, and what the model is told."""

    @tool(
        name=name,
        effect="write",
        idempotent=idempotent,
        effect_of=_write_effect,
        description=description,
    )
    async def write(ctx: ToolContext, path: WorkspacePath, content: str) -> str:
        return await _write(ctx, name, path, content)

    return write


write_file = _writer(
    "write_file",
    idempotent=True,
    description="Create or replace a text file in the workspace (folders are created).",
)
append_file = _writer(
    "append_file",
    idempotent=False,
    description="Append text to a file in the workspace (created if it does not exist).",
)


async def _write(ctx: ToolContext, name: str, path: str, content: str) -> str:
    """`write_file` or `append_file` (`name`): the same call on the task's workspace,
    made only while this worker still owns the task."""
    ws = _workspace(ctx, name)
    await ctx.ensure_owner()  # a worker paused past its lease writes nothing
    with _io(name):
        change = ws.append_file if name == "append_file" else ws.write_file
        return change(path, content)


#: The workspace file tools, in the order the model sees them (`default_registry`
#: replaces `read_file` by one that refuses declared sources, see `source_aware_read_file`).
FILE_TOOLS: tuple[Tool, ...] = (list_files, read_file, write_file, append_file)


def _source_files(spec: Mapping[str, Any], workspace: Path) -> dict[Path, str]:
    """`{real path: source id}` of the contract's file sources (documents, datasets)."""
    out: dict[Path, str] = {}
    for src in spec.get("sources") or []:
        if src.get("kind", "document") not in ("document", "dataset"):
            continue
        loc = Path(str(src.get("location", "")))
        out[Path(os.path.realpath(loc if loc.is_absolute() else workspace / loc))] = str(
            src.get("id")
        )
    return out


def _source_at(real: Path, sources: Mapping[Path, str]) -> str | None:
    """The id of the source `real` is (the same path, or the same file by another name:
    a hard link), or None."""
    if real in sources:
        return sources[real]
    for where, sid in sources.items():
        try:
            if where.exists() and real.exists() and os.path.samefile(where, real):
                return sid
        except OSError:
            continue
    return None


SpecOf = Callable[[ToolContext], Awaitable[Mapping[str, Any]]]


def _spec_reader(store_getter: Callable[[], Store]) -> SpecOf:
    """`spec_of(ctx)`: the contract of the task a call belongs to, read once per task
    version (the sources a file tool must leave alone)."""
    cache: dict[tuple[str, int], Mapping[str, Any]] = {}

    async def spec_of(ctx: ToolContext) -> Mapping[str, Any]:
        key = (ctx.task_id, ctx.task_version)
        if key not in cache:
            # A registry whose store is not at hand (one made to check tool names, or a
            # test's) has no contract to read: nothing is a source there.
            try:
                store: Store | None = store_getter()
            except Exception:
                store = None
            task = await store.get_task(ctx.task_id) if store is not None else None
            cache.clear()  # one task version at a time: the cache stays small
            cache[key] = task.spec if task is not None else {}
        return cache[key]

    return spec_of


async def _source_of(ws: files.Workspace, real: Path, spec: Mapping[str, Any]) -> str | None:
    sources = _source_files(spec, Path(ws.root))
    return await asyncio.to_thread(_source_at, real, sources) if sources else None


def source_aware_read_file(store_getter: Callable[[], Store]) -> Tool:
    """`read_file`, refusing the location of any source the task's contract declares
    (with the `read_source` call to make instead). Its schema is `read_file`'s."""
    spec_of = _spec_reader(store_getter)

    @tool(
        name="read_file",
        effect="read",
        volatile=False,
        description=read_file.description,
    )
    async def guarded_read_file(
        ctx: ToolContext,
        path: WorkspacePath,
        offset: Offset = 0,
        limit: Limit = files.DEFAULT_READ_LIMIT,
    ) -> str:
        ws = _workspace(ctx, "read_file")
        with _io("read_file"):
            real = await asyncio.to_thread(ws.resolve, path)  # a path not permitted fails first
        sid = await _source_of(ws, real, await spec_of(ctx))
        if sid is not None:
            raise errors.ToolFailed(
                f"read_file: {path} is source {sid} of this task's contract; read it with "
                f'read_source(source="{sid}"), which records the version you read '
                "(read_file does not)"
            )
        with _io("read_file"):
            return await asyncio.to_thread(ws.read_file, path, offset, limit)

    return guarded_read_file


#: The built-in tools that write a workspace file named by their `path` argument.
SOURCE_GUARDED_WRITERS = ("write_file", "append_file", "write_report")


def source_guarded_writer(store_getter: Callable[[], Store], inner: Tool) -> Tool:
    """`inner` (a tool writing the workspace file `path`), refusing the location of any
    source the task's contract declares, by any name: a task that could write its own
    sources could quote in its evidence whatever it wrote there (a missing source is
    not the model's to create either)."""
    spec_of = _spec_reader(store_getter)

    async def fn(args: Mapping[str, Any], ctx: ToolContext) -> Any:
        path = args.get("path") if isinstance(args, Mapping) else None
        if isinstance(path, str) and ctx.workspace is not None:
            ws = files.Workspace(ctx.workspace, ctx.private_files)
            try:
                real = await asyncio.to_thread(ws.resolve, path)
            except (errors.ToolFailed, OSError):
                real = None  # not a usable path: the tool itself says so
            sid = await _source_of(ws, real, await spec_of(ctx)) if real is not None else None
            if sid is not None:
                raise errors.ToolFailed(
                    f"{inner.name}: {path} is source {sid} of this task's contract; a "
                    f'source is only read (read_source(source="{sid}")), never written'
                )
        return await inner.fn(args, ctx)

    # A report is a file write like any other: over a file the task did not make it is
    # an `overwrite` (approval), as for write_file.
    return dataclasses.replace(inner, fn=fn, effect_of=inner.effect_of or _write_effect)


# --- read_artifact ------------------------------------------------------------------------


def read_artifact_tool(store_getter: Callable[[], Store]) -> Tool:
    """`read_artifact(artifact_id, offset=0, limit=4000)`: a slice of a stored artifact."""

    @tool(
        name=READ_ARTIFACT,
        effect="read",
        volatile=False,
        description="Read part of a stored artifact (a large tool output) by id.",
    )
    async def read_artifact(
        ctx: ToolContext,
        artifact_id: str,
        offset: Annotated[int, Field(ge=0)] = 0,
        limit: Annotated[int, Field(ge=1, le=20_000)] = 4000,
    ) -> str:
        store = store_getter()
        try:
            if "\x00" in artifact_id:  # no id holds one (PostgreSQL's text cannot)
                raise KeyError(artifact_id)
            art = await store.get_artifact(artifact_id)
        except KeyError:
            raise errors.ToolFailed(f"read_artifact: no artifact {artifact_id!r}") from None
        if art.task_id != ctx.task_id:
            raise errors.ToolFailed(f"read_artifact: no artifact {artifact_id!r}")
        text = (await store.get_blob(art.blob_hash)).decode("utf-8", errors="replace")
        part = text[offset : offset + limit]
        rest = max(0, len(text) - offset - len(part))
        tail = f"\n[{rest} more characters after offset {offset + len(part)}]" if rest else ""
        head = ""
        if not art.valid:  # history: readable, but nothing may rest on it
            mark = art.meta.get(A.INVALIDATED)
            why = mark.get("reason") if isinstance(mark, dict) else None
            head = f"[artifact {artifact_id} is INVALID, history only, do not cite"
            head += f": {why}]\n" if why else "]\n"
        return head + part + tail

    # It returns the slice asked for: no preview of it as an artifact (see `Tool.previews`).
    return dataclasses.replace(read_artifact, previews=False)


# --- TETHER_TOOLS -------------------------------------------------------------------------


def _import_tools(ref: str) -> list[Tool]:
    """The tools named by `module:attr` (a `Tool` or a list of them), imported with the
    working folder on `sys.path` like scripted policies."""
    value = _imports.load_ref(ref, what="tool", context=TOOLS_ENV)
    found = [value] if isinstance(value, Tool) else value
    if not isinstance(found, list | tuple) or not all(isinstance(t, Tool) for t in found):
        raise errors.UserError(
            f"{TOOLS_ENV}: {ref!r} is neither a Tool nor a list of Tools "
            f"(got {type(value).__name__})"
        )
    return list(found)


def default_registry(
    store_getter: Callable[[], Store], env: Mapping[str, str] | None = None
) -> ToolRegistry:
    """A registry with the workspace file tools (`read_file` refusing the contract's
    sources), `read_artifact`, the source and
    artifact tools (`tether.tools.builtin.sources`), and the tools named by
    `TETHER_TOOLS` (`module:attr,...`; of `env` when given, else of `os.environ`)."""
    reg = ToolRegistry(
        source_aware_read_file(store_getter)
        if t is read_file
        else source_guarded_writer(store_getter, t)
        if t.name in SOURCE_GUARDED_WRITERS
        else t
        for t in FILE_TOOLS
    )
    reg.add(read_artifact_tool(store_getter))
    reg.add(ledger.ledger_items_tool(store_getter))
    reg.extend(
        source_guarded_writer(store_getter, t) if t.name in SOURCE_GUARDED_WRITERS else t
        for t in source_tools(store_getter)
    )
    builtins = set(reg.names())
    added: dict[str, str] = {}  # a TETHER_TOOLS tool's name -> the reference it came from
    for ref in (os.environ if env is None else env).get(TOOLS_ENV, "").split(","):
        if not ref.strip():
            continue
        for t in _import_tools(ref):
            if reg.get(t.name) is t:  # the same tool named twice (`a:TOOLS,a:TOOLS`)
                continue
            _refuse_a_clash(t.name, ref.strip(), builtins, added)
            added[t.name] = ref.strip()
            reg.add(t)
    return reg


def _refuse_a_clash(name: str, ref: str, builtins: set[str], added: Mapping[str, str]) -> None:
    """A `TETHER_TOOLS` tool never silently replaces a built-in (and its workspace
    confinement and approvals) or another module's tool: the clash is a `UserError`
    naming both."""
    if name in builtins:
        raise errors.UserError(
            f"{TOOLS_ENV}: the tool {name!r} of {ref!r} clashes with the built-in tool "
            f"{name!r}; give your tool another name"
        )
    if name in added:
        raise errors.UserError(
            f"{TOOLS_ENV}: the tool {name!r} of {ref!r} clashes with the tool {name!r} "
            f"of {added[name]!r}; give one of them another name"
        )
