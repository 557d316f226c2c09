"""The tool registry: what a tool declares and how the runtime finds it.

A tool declares its arguments (a JSON schema, derived from type hints by `@tool`), its
`effect` (`read`, `write`, or a risky one that needs a human's approval by default:
`overwrite`, `delete`, `send`, `pay`, `publish`), whether it is `idempotent`, its
`service` (for breakers and concurrency limits), a timeout and a retry policy, and
optionally `validate(result)` (a post-condition), `reconcile(op, ctx)` (asks the
outside world whether an op already happened) and `compensate(op, ctx)` (undoes an
applied op when its item cannot finish: a saga's compensation, run as a journaled op of
its own when the retry policy says `on_exhausted="compensate"`). The runtime journals
every call as an op and passes the op id as the idempotency key in `ToolContext`.

`overwrite` means changing something that existed before the task started (a file the
user had, say), as opposed to `write`, which adds something new or changes what the
task itself made.

A tool that does not declare its effect is a `write`: it is journaled as an op, not
sent again after an unknown outcome unless it is `idempotent` (or `reconcile` says it
did not happen), and under the approval policy like any write. Only `effect="read"`
makes a tool retried freely and never journaled, so a tool that sends mail and forgets
`effect=` is not taken for harmless (an MCP tool without annotations is a `write` too).

A tool whose effect depends on its arguments may also give `effect_of(args, ctx)`,
which refines the declared effect for one call before the approval policy looks at it
(the built-in `write_file` answers `overwrite` for a file the task did not create).

```python
@tether.tool(effect="write", service="tickets", reconcile=find_ticket)
async def create_ticket(title: str, body: str, ctx: tether.ToolContext) -> dict:
    return await api.post("/tickets", json=..., headers={"Idempotency-Key": ctx.op_id})
```
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import typing
import weakref
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, TypedDict, Unpack, overload

from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic.json_schema import GenerateJsonSchema

from tether import _validation, errors, redact
from tether.models.base import ToolSchema, direct_init
from tether.text import clean_text
from tether.tools._threads import run_sync, start_sync
from tether.tools.retry import FailureClass, RetryPolicy

if TYPE_CHECKING:
    from tether.store.base import OpRecord

Effect = Literal["read", "write", "overwrite", "delete", "send", "pay", "publish"]
EFFECTS: Final[tuple[str, ...]] = typing.get_args(Effect)
#: Effects that need a human's approval unless the contract says `approval: false`.
RISKY: Final[frozenset[str]] = frozenset({"overwrite", "delete", "send", "pay", "publish"})


class Journal(Protocol):
    """Read-only access to one task's op journal."""

    def __call__(
        self, tools: Collection[str], statuses: Collection[str] | None = None
    ) -> Awaitable[Sequence[OpRecord]]:
        """The task's ops of these tools (only these statuses, if given), oldest first."""
        ...


@direct_init
@dataclass(frozen=True)
class ToolContext:
    """What a running tool may know about its call.

    `op_id` is the idempotency key: send it to the service (an `Idempotency-Key`
    header, a unique column) so a re-sent call after a crash takes effect once.
    `fencing_token` rises at every takeover: pass it to a service that can refuse a
    stale writer. `await ctx.ensure_owner()` right before a side effect raises
    `StaleLease` if another worker took the task over meanwhile (this one was paused
    past its lease). `ctx.secret(NAME)` gives a secret the contract grants this tool
    (`tools: [{name: create_ticket, secrets: [TICKETS_TOKEN]}]`), read from the
    environment and masked in everything tether stores or prints.
    """

    op_id: str
    task_id: str
    task_version: int
    fencing_token: int
    workspace: Path | None
    logger: logging.Logger
    services: Mapping[str, Any] = field(default_factory=dict)
    attempt: int = 1
    #: Read-only access to this task's op journal: `await journal(tools, statuses)`.
    #: Given to `Tool.effect_of` hooks (None when a tool runs).
    journal: Journal | None = None
    #: The same for the earlier occurrences of the schedule this task is an occurrence
    #: of (they share its workspace: what they wrote is the series' own work), their
    #: succeeded ops only, newest occurrence first; None for a task of no schedule.
    #: Given to `Tool.effect_of` hooks.
    earlier: Journal | None = None
    #: True when a human approved this call (after the tool raised `ApprovalRequired`
    #: or its effect asked for approval): the tool may go ahead.
    approved: bool = False
    #: Raises `StaleLease` unless this run still holds the task (see `ensure_owner`).
    owner_check: Callable[[], Awaitable[None]] | None = None
    #: The secrets the contract grants this tool (names of environment variables).
    secret_names: frozenset[str] = frozenset()
    #: The round of the call and its index among the round's calls (None outside a
    #: round, e.g. a recovery check).
    round: int | None = None
    call_index: int | None = None
    #: Files inside the workspace that no tool may read or write: the store's own
    #: database and its companions (`tether.tools.files.database_files`), real paths.
    private_files: frozenset[Path] = frozenset()

    async def ensure_owner(self) -> None:
        """Raise `StaleLease` if another worker has taken the task over since this run
        claimed it. Call it right before a side effect: a worker paused past its lease
        then does nothing (a check, not a lock: pass `fencing_token` to a service
        that can refuse a stale writer itself)."""
        if self.owner_check is not None:
            await self.owner_check()

    def secret(self, name: str) -> str:
        """The value of the secret `name`, if the contract grants it to this tool
        (`ToolFailed` otherwise, or when it is not set). The value is masked from then
        on in everything this process journals or prints."""
        if name not in self.secret_names:
            granted = ", ".join(sorted(self.secret_names)) or "none"
            raise errors.ToolFailed(
                f"the secret {name!r} is not granted to this tool (granted: {granted}); "
                "the contract grants secrets per tool: tools: [{name: ..., secrets: [...]}]"
            )
        value = os.environ.get(name)
        if not value:
            raise errors.ToolFailed(f"the secret {name!r} is not set in tether's environment")
        redact.remember(value)
        return value


async def ensure_lease(store: Any, task_id: str, token: int) -> None:
    """`StaleLease` unless `token` is still the task's fencing token in `store` (what
    `ToolContext.ensure_owner` checks)."""
    # The SQL stores read the token alone (`fencing_token`); others give the task.
    light = getattr(store, "fencing_token", None)
    current = (
        await light(task_id) if light is not None else (await store.get_task(task_id)).fencing_token
    )
    if current != token:
        raise errors.StaleLease(task_id, token, current)


@dataclass(frozen=True)
class Reconciliation:
    """What the outside world says about an op whose outcome was unknown.

    `done`: it happened (`result` is backfilled); `not_done`: it did not (safe to send
    again with the same key); `unknown`: the service cannot tell.
    """

    outcome: Literal["done", "not_done", "unknown"]
    result: Any = None


ToolFn = Callable[[Mapping[str, Any], ToolContext], Awaitable[Any]]
Validator = Callable[[Any], "bool | str | None"]
Reconciler = Callable[[Any, ToolContext], Awaitable[Reconciliation]]
#: `compensate(op, ctx)`, sync or async: undo the applied op `op` (its `op_id`, `args`,
#: `result`); `ctx.op_id` is the compensation's own idempotency key, `<op_id>.compensate`.
Compensator = Callable[[Any, ToolContext], Any]


@dataclass(frozen=True)
class Compensation:
    """How a tool's applied op is undone (a saga's compensation).

    `fn(op, ctx)` (sync or async) receives the original op record (`op.op_id`,
    `op.args`, `op.result`) and a context whose `op_id` is the compensation's own op id
    and idempotency key, `<op_id>.compensate`. The compensation runs as an op of its
    own, exactly once across crashes like any other: its intent is committed before it
    is sent, and after a crash `reconcile(op, ctx)` (same arguments: the *original* op)
    says whether it already happened; without a reconcile, a compensation that is not
    `idempotent` and was in flight at a crash waits for a human. It is retried on the
    tool's schedule; when that is exhausted a human decides, it never loops.
    `tool(compensate=fn)` is `Compensation(fn)`.
    """

    fn: Compensator
    reconcile: Reconciler | None = None
    idempotent: bool = False
    timeout: float | None = None

    async def run(self, op: Any, ctx: ToolContext) -> Any:
        """Call `fn` (a sync one in a thread)."""
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(op, ctx)
        answer = await run_sync(self.fn, op, ctx)
        if inspect.isawaitable(answer):
            answer = await answer
        return answer


Classifier = Callable[[BaseException], "FailureClass | None"]
EffectHook = Callable[[Mapping[str, Any], ToolContext], "Awaitable[Effect] | Effect"]


@dataclass(frozen=True)
class Tool:
    """A tool the model may call.

    `effect` defaults to `write` and `idempotent` to False: a tool that does not say
    what it does is treated as having effects (journaled, not sent again blindly after
    an unknown outcome, under the approval policy). A `read` is always idempotent.
    `effect_of(args, ctx)` (optional, sync or async) refines `effect` for one call with
    checked arguments, before the approval policy decides; `ctx.journal` reads this
    task's earlier ops. A `ToolFailed` from it keeps the declared effect (the call will
    fail the same way when it runs).
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    fn: ToolFn
    effect: Effect = "write"
    idempotent: bool = False
    service: str | None = None
    timeout: float = 60.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    validate: Validator | None = None
    reconcile: Reconciler | None = None
    classify: Classifier | None = None
    args_model: type[BaseModel] | None = None
    effect_of: EffectHook | None = None
    #: Undoes an applied op of this tool (see `Compensation`).
    compensate: Compensation | None = None
    #: A large output becomes an artifact the model is shown a preview of; False for a
    #: tool that returns the slice the model asked for (`read_artifact`), which a
    #: preview would only send round in circles.
    previews: bool = True
    #: A tool whose answer can change with nothing done by this task (a build's status,
    #: a queue's length, a web page): the same call answered the same again is waiting,
    #: not a loop (see `runtime.round.progress`). None: True for a `read`, False for a
    #: tool with effects (True there: a shell whose calls are mostly status checks; the
    #: same effect repeated is then bounded by the item's rounds cap only); tether's
    #: reads of the workspace and of the task's own records say False.
    volatile: bool | None = None

    def __post_init__(self) -> None:
        if self.effect not in EFFECTS:
            raise errors.UserError(
                f"tool {self.name}: effect {self.effect!r} is not one of {', '.join(EFFECTS)}"
            )
        # A read is polled unless it says otherwise; a tool with effects only if it says so.
        object.__setattr__(
            self,
            "volatile",
            self.volatile is True or (self.effect == "read" and self.volatile is None),
        )
        if self.effect == "read" and not self.idempotent:
            # Looking twice changes nothing: a read needs no dispatch mark or reconcile.
            object.__setattr__(self, "idempotent", True)
        if self.compensate is not None and self.effect == "read":
            raise errors.UserError(
                f"tool {self.name}: a read tool has nothing to compensate; "
                "declare compensate on tools with effects"
            )

    def schema(self) -> ToolSchema:
        """The model-facing schema."""
        return ToolSchema(self.name, self.description, self.parameters)

    @property
    def risky(self) -> bool:
        """True when the declared effect needs approval by default (a call's effect,
        see `call_effect`, may be riskier)."""
        return self.effect in RISKY

    async def call_effect(self, args: Mapping[str, Any], ctx: ToolContext) -> Effect:
        """The effect of one call: the declared `effect`, refined by `effect_of`."""
        if self.effect_of is None:
            return self.effect
        try:
            answer = self.effect_of(args, ctx)
            if inspect.isawaitable(answer):
                answer = await answer
        except errors.ToolFailed:
            return self.effect
        if answer not in EFFECTS:
            raise errors.UserError(
                f"tool {self.name}: effect_of answered {answer!r}, not one of {', '.join(EFFECTS)}"
            )
        return answer

    def check_args(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Validate arguments; a clear deterministic `ToolFailed` when they are wrong."""
        if self.args_model is None:
            return dict(args)
        try:
            model = self.args_model.model_validate(dict(args))
        except ValidationError as exc:
            problems = _validation.describe(exc, noun="argument", root="(arguments)", limit=5)
            raise bad_arguments(self.name, problems) from None
        return model.model_dump()


def bad_arguments(tool: str, problems: Sequence[str]) -> errors.ToolFailed:
    """The deterministic failure of a call whose arguments break the tool's schema."""
    return errors.ToolFailed(f"bad arguments for {tool}: " + "; ".join(problems))


class _ToolJsonSchema(GenerateJsonSchema):
    """Schemas as models read them: no generated `title` on every field (pydantic's
    "Path" for `path` says nothing and costs tokens on every request)."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def arguments_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema of a tool's arguments model: an object with `properties`, a
    `required` list (empty too) and no titles."""
    schema = model.model_json_schema(schema_generator=_ToolJsonSchema)
    schema.pop("title", None)
    return {
        "type": schema.pop("type", "object"),
        "properties": schema.pop("properties", {}),
        "required": schema.pop("required", []),
        **schema,
    }


def render_result(result: Any) -> str:
    """A tool's return value as the text the model reads, lone surrogates replaced
    (`tether.text`: a tool's JSON may escape any UTF-16 unit; no store takes one)."""
    if isinstance(result, str):
        return clean_text(result)
    if result is None:
        return "ok"
    try:
        text = json.dumps(result, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError):
        text = _shown(result)
    except RecursionError:  # nested deeper than the encoder goes (or a cycle)
        text = f"(a value nested too deeply to show: {_validation.shown(result)})"
    return clean_text(text)


def _shown(result: Any) -> str:
    """`str(result)`, or a clipped `repr` when that fails or recurses too deep."""
    try:
        return str(result)
    except Exception:  # (a RecursionError too)
        return _validation.shown(result)


def _context_param(sig: inspect.Signature, hints: Mapping[str, Any]) -> str | None:
    for name, _ in sig.parameters.items():
        if hints.get(name) is ToolContext or name == "ctx":
            return name
    return None


@dataclass(frozen=True)
class _Sync:
    """The sync function behind a `fn` that `tool` made, and its context parameter."""

    fn: Callable[..., Any]
    ctx_name: str | None


#: The `fn` of every `tool` made from a sync function (a `fn` replaced later is not),
#: with the function it runs in a thread.
_THREADED: weakref.WeakKeyDictionary[Callable[..., Any], _Sync] = weakref.WeakKeyDictionary()


def runs_in_thread(t: Tool) -> bool:
    """True when `t.fn` only awaits a sync function run in a thread (`tool` made it):
    none of the tool's code runs in the awaiting task, so a deadline on it needs no
    task of its own."""
    try:
        return t.fn in _THREADED
    except TypeError:  # an unhashable callable object: not one `tool` made
        return False


def start_in_thread(
    t: Tool, args: Mapping[str, Any], ctx: ToolContext, timeout: float
) -> asyncio.Future[Any] | None:
    """`t.fn(args, ctx)` started as a future that fails with `TimeoutError` after
    `timeout` seconds, when `runs_in_thread(t)` (None otherwise: the caller awaits
    `t.fn` itself). The deadline is the future's: no task, no cancellation of the
    awaiting one (see `_threads.start_sync`)."""
    try:
        sync = _THREADED.get(t.fn)
    except TypeError:  # an unhashable callable object: not one `tool` made
        return None
    if sync is None:
        return None
    kwargs = dict(args)
    if sync.ctx_name is not None:
        kwargs[sync.ctx_name] = ctx
    return start_sync(timeout, sync.fn, **kwargs)


class ToolOptions(TypedDict, total=False):
    """The keyword arguments of `tool` (see there)."""

    name: str | None
    description: str | None
    effect: Effect
    idempotent: bool | None
    service: str | None
    timeout: float
    retry: RetryPolicy | None
    validate: Validator | None
    reconcile: Reconciler | None
    classify: Classifier | None
    effect_of: EffectHook | None
    compensate: Compensation | Compensator | None
    volatile: bool | None


@overload
def tool(fn: Callable[..., Any], /, **options: Unpack[ToolOptions]) -> Tool: ...


@overload
def tool(
    fn: None = None, /, **options: Unpack[ToolOptions]
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    effect: Effect = "write",
    idempotent: bool | None = None,
    service: str | None = None,
    timeout: float = 60.0,
    retry: RetryPolicy | None = None,
    validate: Validator | None = None,
    reconcile: Reconciler | None = None,
    classify: Classifier | None = None,
    effect_of: EffectHook | None = None,
    compensate: Compensation | Compensator | None = None,
    volatile: bool | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a `Tool` from a sync or async function; its type hints give the schema
    (`Annotated[int, Field(ge=0, description=...)]` constraints included).

    A parameter annotated `ToolContext` (or named `ctx`) receives the call's context.
    `effect` defaults to `write`: a tool that only looks must say `effect="read"`,
    else it is journaled, under the approval policy and not sent again blindly after
    an unknown outcome, like any tool with effects (MCP tools without annotations
    agree). `idempotent` defaults to True for reads and False for anything with effects.
    `effect_of` refines `effect` per call (see `Tool`). `compensate(op, ctx)` (or a
    `Compensation`) undoes an applied op when the retry policy's `on_exhausted` is
    `compensate` (see `Compensation`). `volatile` (default True for reads, False for
    the rest) says the answer can change by itself, so asking again and getting the same
    is waiting, not a loop; say False for a read of what only this task changes, True
    for a tool with effects whose calls are mostly status checks (see `Tool`).
    """
    if effect not in EFFECTS:
        raise errors.UserError(f"effect {effect!r} is not one of {', '.join(EFFECTS)}")

    def build(f: Callable[..., Any]) -> Tool:
        sig = inspect.signature(f)
        hints = typing.get_type_hints(f, include_extras=True)  # keep Field(...) constraints
        ctx_name = _context_param(sig, hints)
        fields: dict[str, Any] = {}
        for pname, param in sig.parameters.items():
            if pname == ctx_name:
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise errors.UserError(f"tool {f.__name__}: *args/**kwargs are not supported")
            ann = hints.get(pname, Any)
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[pname] = (ann, default)
        tname = name or f.__name__
        # Strict: the model was shown a JSON schema; `false` for an integer or "5" for a
        # number is a mistake to report, not to coerce silently.
        model = create_model(
            f"{tname}_arguments", __config__=ConfigDict(extra="forbid", strict=True), **fields
        )
        schema = arguments_schema(model)
        is_async = inspect.iscoroutinefunction(f)

        async def run(args: Mapping[str, Any], ctx: ToolContext) -> Any:
            kwargs = dict(args)
            if ctx_name is not None:
                kwargs[ctx_name] = ctx
            if is_async:
                return await f(**kwargs)
            return await run_sync(f, **kwargs)  # a daemon thread: see `_threads`

        if not is_async:
            _THREADED[run] = _Sync(f, ctx_name)
        doc = (description or inspect.getdoc(f) or tname).strip()
        return Tool(
            name=tname,
            description=doc,
            parameters=schema,
            fn=run,
            effect=effect,
            idempotent=(effect == "read") if idempotent is None else idempotent,
            service=service,
            timeout=timeout,
            retry=retry or RetryPolicy(),
            validate=validate,
            reconcile=reconcile,
            classify=classify,
            args_model=model,
            effect_of=effect_of,
            compensate=_compensation(compensate),
            volatile=volatile,
        )

    return build(fn) if fn is not None else build


def _compensation(value: Compensation | Compensator | None) -> Compensation | None:
    if value is None or isinstance(value, Compensation):
        return value
    return Compensation(value)


class ToolRegistry:
    """Tools by name."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.add(t)

    def add(self, tool: Tool) -> None:
        """Register a tool (a later one with the same name replaces it)."""
        self._tools[tool.name] = tool

    def extend(self, tools: Iterable[Tool]) -> None:
        """Register several tools."""
        for t in tools:
            self.add(t)

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
