"""The composition root: the store, the tool registry, the models and the engine of a
process, built in one place for every way of running tasks (`tether run`, `resume`,
`worker`, `demo`, or your own code).

    async with open_runtime("sqlite:///tether.db", model="openai:gpt-4.1-mini") as rt:
        async with rt.engine(task_id) as engine:   # the task's models, closed after
            await engine.run(task_id)
        await rt.worker(once=True).run()           # or claim and run tasks

`check_task` refuses a task that cannot run before anything is written.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from tether import errors
from tether.clock import Clock
from tether.models import pricing
from tether.models.base import Model
from tether.models.registry import resolve_model
from tether.runtime import launch
from tether.runtime.engine import Engine, ModelSet, check_tools, inline_wait_max_from_env
from tether.runtime.watch.sinks import default_notifier
from tether.spec import TaskSpec, parse_spec
from tether.store import Store

# Re-exported: `open_db` lives with the store so that reading commands need no runtime.
from tether.store.opening import open_db as open_db
from tether.tools.builtin.files import FILE_TOOLS, READ_ARTIFACT, default_registry
from tether.tools.registry import ToolRegistry

if TYPE_CHECKING:  # loaded by `Runtime.worker`: `run` and `resume` run no worker
    from tether.runtime.worker import Worker

RULES_ONLY = "rules"
#: Options for every model a process builds, over the spec's (`timeout` in seconds,
#: `max_retries`); a None value leaves the spec's or the environment's.
ModelOptions = dict[str, float | int | None]


def build_models(
    spec: TaskSpec, override: str | None = None, options: ModelOptions | None = None
) -> ModelSet:
    """Actor from `--model`, the spec or `TETHER_MODEL`; judge, compaction and review
    from the spec, defaulting to the actor's model. `models.judge: rules` judges by
    `done_when` rules alone.

    How long a request may take and how often a failed one is retried: `options`
    (`--model-timeout`, `--model-retries`), else the spec's `models: {timeout,
    max_retries}`, else `TETHER_MODEL_TIMEOUT` / `TETHER_MODEL_RETRIES`, else the
    adapter's defaults (300 s, 3 retries)."""
    actor_name = override or spec.models.actor or os.environ.get("TETHER_MODEL")
    if not actor_name:
        raise errors.UserError(
            "no model to run the task: pass --model (for example --model openai:gpt-4.1-mini) "
            "or set models.actor in the spec or TETHER_MODEL in the environment"
        )
    cache: dict[str, Model] = {}
    kwargs: dict[str, Any] = {}
    if spec.models.timeout is not None:
        kwargs["timeout"] = spec.models.timeout
    if spec.models.max_retries is not None:
        kwargs["max_retries"] = spec.models.max_retries
    # The command line is the operator's word for this process: it comes first.
    kwargs.update({k: v for k, v in (options or {}).items() if v is not None})

    def get(name: str) -> Model:
        if name not in cache:
            cache[name] = resolve_model(name, **kwargs)
        return cache[name]

    actor = get(actor_name)
    judge_name = spec.models.judge
    judge = None if judge_name == RULES_ONLY else get(judge_name) if judge_name else actor
    compact = get(spec.models.compact) if spec.models.compact else actor
    review = None
    if spec.review.by_model:
        named = spec.review.reviewer(spec.models.review)
        review = get(named) if named else (judge or actor)
    return ModelSet(actor=actor, judge=judge, compact=compact, review=review)


def _no_store() -> Store:
    raise errors.StoreError("this registry only names tools; it has no store")


async def check_task(
    spec: TaskSpec, model: str | None = None, options: ModelOptions | None = None
) -> None:
    """Refuse a task that cannot run, before anything is written: its models must
    resolve (they are built and closed again) and every tool its contract names must be
    registered (the built-ins and `TETHER_TOOLS`, and the tools of its MCP servers:
    they are started, listed and stopped again, so one that cannot start or whose tool
    clashes with another is refused here too), and a money budget needs a price for
    each of its models (`pricing.check_prices`)."""
    # The environment too: refused before the task is written.
    inline_wait_max_from_env()
    default_notifier()
    models = build_models(spec, model, options)
    await models.aclose()
    # A money budget needs a price for every model (TETHER_PRICES must read, too).
    pricing.check_prices(
        spec,
        [models.actor, models.judge, models.compact, models.review],
        pricing.table_for(pricing.spec_prices(spec)),
    )
    await check_task_tools(spec)


def check_tool_args(tool_name: str | None, args: dict[str, Any], what: str) -> None:
    """Refuse arguments a person gives for a call (`approve --modify`) that the tool's
    schema refuses, with the tool's own wording — checked here, not when the approved
    call fails rounds later. A tool this process does not register (an MCP server's)
    checks them itself when it is called."""
    tool = default_registry(_no_store).get(tool_name) if tool_name else None
    if tool is None:
        return
    try:
        tool.check_args(args)
    except errors.ToolFailed as exc:
        raise errors.UserError(f"{what}: {exc}") from None


async def check_task_tools(spec: TaskSpec) -> None:
    """The tool half of `check_task` (for `tether submit`, whose models are the
    workers'): every tool the contract names is registered here or offered by one of
    its MCP servers."""
    known = default_registry(_no_store).names()
    if spec.mcp_servers:
        from tether.tools.mcp import McpSources, contract_names

        async with McpSources(spec.mcp_servers) as sources:
            builtins = [*(t.name for t in FILE_TOOLS), READ_ARTIFACT]
            known = contract_names(sources.tools(), known, builtins)
    check_tools(spec, known)


class Runtime:
    """An open store with the tool registry and the model choice of this process.

    The registry (the built-in tools and `TETHER_TOOLS`) is built when an engine or a
    worker first needs it, unless one is given."""

    def __init__(
        self,
        store: Store,
        *,
        model: str | None = None,
        registry: ToolRegistry | None = None,
        model_options: ModelOptions | None = None,
    ) -> None:
        self.store = store
        #: `--model`: the actor for every task, instead of the spec's or `TETHER_MODEL`.
        self.model = model
        #: `--model-timeout` / `--model-retries`, over the spec's and the environment's.
        self.model_options: ModelOptions = dict(model_options or {})
        self._registry = registry

    @property
    def registry(self) -> ToolRegistry:
        """The tools every task of this process may use (as its contract allows)."""
        if self._registry is None:
            self._registry = default_registry(lambda: self.store)
        return self._registry

    def models_for(self, spec: TaskSpec) -> ModelSet:
        """The models a task with this spec runs with (see `build_models`)."""
        return build_models(spec, self.model, self.model_options)

    async def launched_spec(self, task_id: str) -> tuple[TaskSpec, dict[str, Any] | None]:
        """The task's spec with what its launch record remembers (`runtime.launch`:
        the model it was started with, ...), and the record."""
        task = await self.store.get_task(task_id)
        spec = parse_spec(task.spec, source=f"task {task_id}", stored=True)
        record = await launch.read(self.store, task_id)
        return launch.apply(spec, record), record

    @asynccontextmanager
    async def engine(self, task_id: str, **options: Any) -> AsyncIterator[Engine]:
        """An engine for `task_id` with the models its spec and launch record ask for
        (this process's `--model` first), closed on exit. `options` go to `Engine`
        (`stop`, `on_progress`, `worker_id`, ...)."""
        spec, record = await self.launched_spec(task_id)
        models = self.models_for(spec)
        registry = self._registry
        if registry is None:
            registry = launch.registry_for(lambda: self.store, record) or self.registry
        try:
            yield Engine(self.store, models, registry=registry, **options)
        finally:
            await models.aclose()

    def worker(self, **options: Any) -> Worker:
        """A `Worker` on this store that runs each task with its spec's models (and
        what its launch record remembers). `options` go to `Worker` (`once`,
        `poll_interval`, `stop`, `on_result`, ...)."""
        from tether.runtime.worker import Worker

        explicit = self._registry is not None
        return Worker(
            self.store,
            self.models_for,
            registry=self.registry,
            remembered_tools=not explicit,
            **options,
        )


@asynccontextmanager
async def open_runtime(
    db: str | None = None,
    *,
    model: str | None = None,
    create: bool = True,
    clock: Clock | None = None,
    registry: ToolRegistry | None = None,
    model_options: ModelOptions | None = None,
    migrate: bool = True,
) -> AsyncIterator[Runtime]:
    """Open the store at `db` (see `open_db`, and its `migrate`) as a `Runtime`; close
    it on exit. `model_options`: see `build_models`."""
    store = await open_db(db, create=create, clock=clock, migrate=migrate)
    try:
        yield Runtime(store, model=model, registry=registry, model_options=model_options)
    finally:
        await store.close()
