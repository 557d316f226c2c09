"""How a task was started, remembered with it: its launch record.

`tether run spec.yaml --model openai:gpt-4.1-mini` chooses things the spec does not
say: the actor's model (`--model`, else `TETHER_MODEL`), the model request options
(`--model-timeout`, `--model-retries`) and the tools of `TETHER_TOOLS`. They are kept in
the task's `task.created` event as its launch record (an opaque JSON document to the
store), so that `tether resume T` and `tether worker` run the task as it was started,
with no flag repeated. A flag given again (to `resume` or `worker`) still wins.

Never a secret: model names and tool references only, and the *names* of the
environment variables the models read their keys from. A model name whose URL carries
a password is not remembered (it is named again on resume).

    {"version": 1,
     "models": {"actor": "openai:gpt-4.1-mini", "judge": "openai:gpt-4.1-mini",
                "compact": "openai:gpt-4.1-mini", "review": null},
     "actor_from": "--model",           # or "TETHER_MODEL", "spec", null (none)
     "spec_models": {...},              # the spec's `models` when it started
     "model_options": {"timeout": 60},  # the command line's, over the spec's
     "tools": ["mytools:TOOLS"],        # TETHER_TOOLS
     "mcp_servers": ["notes"],          # the spec's (kept in the spec itself)
     "mcp_config": "/home/me/.mcp.json", # --mcp-config, whose servers joined the spec's
     "workspace": "/home/me/work",
     "key_env": ["OPENAI_API_KEY"]}
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from tether.spec import TaskSpec
    from tether.store.base import OpsStore, Store, StoredEvent
    from tether.tools.registry import ToolRegistry

#: The launch record's format.
VERSION = 1
#: Where `TETHER_MODEL` names the actor's model.
MODEL_ENV = "TETHER_MODEL"
#: Where `TETHER_TOOLS` names tool modules (as `runtime.builtins.TOOLS_ENV`).
TOOLS_ENV = "TETHER_TOOLS"
#: The judge model that judges by `done_when` rules alone (as `wiring.RULES_ONLY`).
RULES_ONLY = "rules"
#: The environment variable each provider reads its key from (names only).
KEY_ENV = {
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "deepseek": "DEEPSEEK_API_KEY",
    "openai-compatible": "TETHER_OPENAI_COMPATIBLE_API_KEY",
}


def carries_password(model: str) -> bool:
    """Whether a model name holds a URL with a password (`https://u:p@host/v1#m`)."""
    _, _, rest = model.partition(":")
    try:
        return bool(urlsplit(rest.strip()).password)
    except ValueError:
        return False


def tool_refs(env: Mapping[str, str] | None = None) -> list[str]:
    """The `module:attr` references of `TETHER_TOOLS`."""
    environ = os.environ if env is None else env
    return [r.strip() for r in environ.get(TOOLS_ENV, "").split(",") if r.strip()]


def record(
    spec: TaskSpec,
    *,
    model: str | None = None,
    options: Mapping[str, float | int | None] | None = None,
    workspace: str | None = None,
    env: Mapping[str, str] | None = None,
    mcp_config: Path | None = None,
) -> dict[str, Any]:
    """The launch record of a task started from `spec` with `--model` `model`, the
    model `options` and the `--mcp-config` of the command line (see the module
    docstring)."""
    environ = os.environ if env is None else env
    actor_from: str | None = None
    actor = None
    if model:
        actor, actor_from = model, "--model"
    elif spec.models.actor:
        actor, actor_from = spec.models.actor, "spec"
    elif environ.get(MODEL_ENV):
        actor, actor_from = environ[MODEL_ENV], MODEL_ENV
    if actor is not None and carries_password(actor):
        actor, actor_from = None, None  # never stored: named again on resume
    m = spec.models
    judge = m.judge or actor
    models = {
        "actor": actor,
        "judge": judge,
        "compact": m.compact or actor,
        "review": (
            (spec.review.reviewer(m.review) or (None if judge == RULES_ONLY else judge))
            if spec.review.by_model
            else None
        ),
    }
    keys = sorted(
        {
            KEY_ENV[name.partition(":")[0].strip().lower()]
            for name in models.values()
            if name and name.partition(":")[0].strip().lower() in KEY_ENV
        }
    )
    return {
        "version": VERSION,
        "models": models,
        "actor_from": actor_from,
        "spec_models": m.model_dump(mode="json"),
        "model_options": {k: v for k, v in (options or {}).items() if v is not None},
        "tools": tool_refs(environ),
        "mcp_servers": [s.name for s in spec.mcp_servers],
        **({"mcp_config": str(mcp_config)} if mcp_config is not None else {}),
        "workspace": workspace,
        "key_env": keys,
    }


def with_mcp_config(spec: TaskSpec, path: Path) -> TaskSpec:
    """`spec` with the servers of an MCP client config file (`--mcp-config`: the
    `mcpServers` JSON of Claude Desktop, Cursor or `.mcp.json`, see
    `tether.mcp_config`) after its own. The task stores them as written (`${VAR}`
    unexpanded). A server that is not valid, or is named like one of the contract's, is
    a `SpecError` naming the file and the server."""
    from pydantic import ValidationError

    from tether import _validation, errors, mcp_config
    from tether.spec import McpServer, parse_spec, source_of

    source = str(path)
    theirs: list[McpServer] = []
    problems: list[str] = []
    for entry in mcp_config.load_file(path):
        name = entry["name"]
        try:
            theirs.append(McpServer.model_validate(entry))
        except ValidationError as exc:
            lines = _validation.describe(exc, noun="field", root="settings", limit=5)
            problems += [f"mcpServers.{name}: {ln.removeprefix('settings: ')}" for ln in lines]
    own = {s.name for s in spec.mcp_servers}
    problems += [
        f"mcpServers.{s.name}: the contract names a server {s.name!r} too; rename one"
        for s in theirs
        if s.name in own
    ]
    if problems:
        raise errors.SpecError("the MCP config is not valid", source=source, problems=problems)
    data = spec.model_dump(mode="json")
    data["mcp_servers"] += [s.model_dump(mode="json") for s in theirs]
    return parse_spec(data, source=source_of(spec))


async def read(store: OpsStore, task_id: str) -> dict[str, Any] | None:
    """The task's launch record, or None (a task stored before launch records, or
    created without one)."""
    return record_in(await created(store, task_id))


async def created(store: OpsStore, task_id: str) -> list[StoredEvent]:
    """The task's `task.created` event (none for a task without one), where its launch
    record is kept (`record_in`); it never changes once written."""
    return await store.read_events(task_id, limit=1, types={"task.created"})


#: How many earlier occurrences of its schedule a task looks back on (`earlier_occurrences`):
#: a schedule's document remembers as many (`watch.schedules.RECENT`).
LOOKBACK = 20


def occurrence_id(schedule_id: str, n: int) -> str:
    """The task of occurrence `n` of a schedule: fixed by the schedule, so it is made at
    most once."""
    return f"{schedule_id}-{n}"


def earlier_occurrences(record: Mapping[str, Any] | None) -> list[str]:
    """The tasks of the earlier occurrences of the schedule a task with this launch
    record is an occurrence of (`launch.schedule`), newest first, at most `LOOKBACK`; none
    for a task of no schedule. Some may not exist (a skipped occurrence)."""
    found = record.get("schedule") if record else None
    if not isinstance(found, dict):
        return []
    sid, n = found.get("id"), found.get("occurrence")
    if not isinstance(sid, str) or not isinstance(n, int) or isinstance(n, bool):
        return []
    return [occurrence_id(sid, k) for k in range(n - 1, max(0, n - 1 - LOOKBACK), -1)]


def workspace_id_in(created: Sequence[StoredEvent]) -> str | None:
    """The workspace id a task recorded from its folder's marker when it was created
    (`tether.placement`), in its `task.created` event (`created`); None: no folder there
    then, or a task stored before markers."""
    found = created[0].data.get("workspace_id") if created else None
    return found if isinstance(found, str) else None


async def workspace_here(
    store: OpsStore, task_id: str, workspace: str, done: str
) -> list[StoredEvent]:
    """Refuse (`placement.not_here`, saying `done`) a task whose workspace had its marker
    when it was created and is not here now (renamed, not mounted, another folder): its
    deliverables would all read as missing. A folder the task's first write makes is
    not refused. Its `task.created` event, read for this, is returned."""
    from tether import placement

    found = await created(store, task_id)
    known = workspace_id_in(found)
    problem = placement.workspace_problem(workspace, known) if known is not None else None
    if problem is not None:
        raise placement.not_here(task_id, workspace, problem, done)
    return found


def record_in(created: Sequence[StoredEvent]) -> dict[str, Any] | None:
    """The launch record in a task's `task.created` event (`created`), or None."""
    launch = created[0].data.get("launch") if created else None
    return launch if isinstance(launch, dict) else None


def apply(spec: TaskSpec, launch: Mapping[str, Any] | None) -> TaskSpec:
    """`spec` with what its launch record remembers: the actor's model given outside
    the spec (`--model`, `TETHER_MODEL`) and the command line's model options. An edit
    of the spec's `models` since the launch is newer than the record: then the spec's
    own models stand, and the remembered actor only fills in one the spec lacks."""
    if not launch:
        return spec
    models = launch.get("models")
    actor = models.get("actor") if isinstance(models, dict) else None
    options = launch.get("model_options")
    update: dict[str, Any] = {}
    unedited = launch.get("spec_models") == spec.models.model_dump(mode="json")
    if isinstance(actor, str) and actor and (unedited or not spec.models.actor):
        update["actor"] = actor
    if unedited and isinstance(options, dict):
        if isinstance(options.get("timeout"), int | float):
            update["timeout"] = float(options["timeout"])
        if isinstance(options.get("max_retries"), int):
            update["max_retries"] = options["max_retries"]
    if not update:
        return spec
    return spec.model_copy(update={"models": spec.models.model_copy(update=update)})


def remembered_tools(launch: Mapping[str, Any] | None) -> list[str]:
    """The `TETHER_TOOLS` references the task was started with."""
    refs = (launch or {}).get("tools")
    return [r for r in refs if isinstance(r, str) and r] if isinstance(refs, list) else []


def registry_for(
    store_getter: Callable[[], Store],
    launch: Mapping[str, Any] | None,
    env: Mapping[str, str] | None = None,
) -> ToolRegistry | None:
    """A tool registry with the tools the task was started with (its remembered
    `TETHER_TOOLS`), when this process sets no `TETHER_TOOLS` of its own (which wins,
    like a flag); None: the process's own registry serves."""
    refs = remembered_tools(launch)
    if not refs or tool_refs(env):
        return None
    from tether.tools.builtin.files import default_registry

    return default_registry(store_getter, {TOOLS_ENV: ",".join(refs)})


# --- the environment a task needs -----------------------------------------------------


def _tool_secrets(spec: TaskSpec) -> dict[str, list[str]]:
    needed: dict[str, list[str]] = {}
    for tool in spec.tools:
        if not isinstance(tool, str):
            for name in tool.secrets:
                needed.setdefault(name, []).append(f"tool {tool.name}")
    return needed


def _server_refs(spec: TaskSpec) -> dict[str, list[str]]:
    # The `${VAR}` (`${env:VAR}`) references `mcp_config.expand` fills in when a server
    # starts; one with a default (`${VAR:-default}`) needs nothing.
    from tether.mcp_config import _REF

    needed: dict[str, list[str]] = {}
    for server in spec.mcp_servers:
        texts = [server.command or "", *server.args, *server.env.values(), server.cwd or ""]
        texts += [server.url or "", *server.headers.values()]
        for m in (m for text in texts for m in _REF.finditer(text)):
            who = needed.setdefault(m.group(1), [])
            if m.group(2) is None and f"MCP server {server.name}" not in who:
                who.append(f"MCP server {server.name}")
    return {name: who for name, who in needed.items() if who}


def needed_env(spec: TaskSpec) -> dict[str, list[str]]:
    """The environment variables the contract's tools need, by name, with who needs
    each: every tool's granted `secrets` (read with `ctx.secret`) and every `${VAR}`
    without a default in its MCP servers' settings. The models' keys are checked when
    they are built."""
    needed = _tool_secrets(spec)
    for name, who in _server_refs(spec).items():
        needed.setdefault(name, []).extend(who)
    return needed


def missing_env(spec: TaskSpec, env: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    """The variables of `needed_env` that are not set in `env` (default: this process's
    environment; a tool's secret that is empty is not set either), with who needs each.
    Names only: never a value."""
    environ = os.environ if env is None else env
    missing = {name: who for name, who in _tool_secrets(spec).items() if not environ.get(name)}
    for name, who in _server_refs(spec).items():
        if name not in environ:
            missing.setdefault(name, []).extend(who)
    return missing


def check_env(spec: TaskSpec, env: Mapping[str, str] | None = None) -> None:
    """Refuse (`UserError`, exit 2) a task whose environment is not ready: a secret its
    tools need is not set. Checked before anything is written."""
    from tether import errors

    missing = missing_env(spec, env)
    if missing:
        raise errors.UserError(env_problem(missing) + "; set it and start the task again")


def env_problem(missing: Mapping[str, list[str]]) -> str:
    """One line naming the missing variables and who needs them (never a value)."""
    shown = [f"{name} (for {', '.join(who[:3])})" for name, who in sorted(missing.items())[:10]]
    verb = "is" if len(missing) == 1 else "are"
    return f"the environment is not ready: {', '.join(shown)} {verb} not set"
