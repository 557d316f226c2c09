"""Running tasks here: `run`, `submit` (for a worker), `resume`."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.text import Text

from tether import errors, lifecycle
from tether.cli import views
from tether.cli._app import (
    DbOpt,
    JsonOpt,
    ModelOpt,
    ModelRetriesOpt,
    ModelTimeoutOpt,
    TaskArg,
    app,
    err,
    lasting_db,
    model_options,
    out,
    print_json,
    run_async,
)
from tether.runtime import hints

if TYPE_CHECKING:
    import asyncio

    from tether.runtime.engine import RunResult
    from tether.runtime.wiring import Runtime
    from tether.spec import TaskSpec
    from tether.store.base import TaskRecord

WorkspaceOpt = Annotated[
    Path | None, typer.Option("--workspace", help="Folder the task works in (default: cwd).")
]
BroadOpt = Annotated[
    bool,
    typer.Option(
        "--allow-broad-workspace",
        help="Accept a system or shared folder, or your home folder, as the workspace.",
    ),
]
McpConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--mcp-config",
        help="An MCP client config (JSON with an mcpServers map, as Claude Desktop, Cursor "
        "and .mcp.json write it): its servers join the contract's. ${VAR} in it is read "
        "from the environment when a server starts; the task stores it unexpanded.",
    ),
]
#: The exit code of a run stopped on infrastructure (the database or the model
#: endpoint does not answer), as `errors.StoreUnavailable`'s.
INFRASTRUCTURE_EXIT = 4
#: The most seconds `--reconnect-for` takes.
MAX_RECONNECT_FOR = 86400.0


def _reconnect_seconds(value: float) -> float:
    if not 0 <= value <= MAX_RECONNECT_FOR:  # also refuses NaN
        raise typer.BadParameter(
            f"{value} is not a number of seconds from 0 to {MAX_RECONNECT_FOR:g}"
        )
    return value


ReconnectOpt = Annotated[
    float,
    typer.Option(
        "--reconnect-for",
        metavar="SECONDS",
        envvar="TETHER_RECONNECT_FOR",
        help="When the database goes away during the run (a restart, a failover), wait "
        "this many seconds for it to come back, then go on from what it recorded; "
        "after that, exit 4. 0: exit 4 at once.",
        callback=_reconnect_seconds,
    ),
]


@contextlib.contextmanager
def _first_ctrl_c_stops(stop: asyncio.Event, resume_hint: str) -> Iterator[None]:
    """The first Ctrl-C sets `stop` (the engine parks the task after the current step);
    the second quits at once, saying how to go on (`resume_hint`: the task's `tether
    resume`; it takes the task up from its last commit)."""
    import asyncio  # in the functions that run tasks: `tether --help` needs no event loop

    loop = asyncio.get_running_loop()
    presses = 0
    quit_now = f"quit; continue with: {resume_hint}\n".encode()

    def on_sigint() -> None:
        nonlocal presses
        presses += 1
        if presses == 1:
            err.print(Text("stopping after the current step (Ctrl-C again to quit now)", "yellow"))
            stop.set()
        else:
            os.write(2, quit_now)
            raise SystemExit(130)

    def quit_quietly(*_: object) -> None:
        os.write(2, quit_now)
        os._exit(130)

    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)
        if presses:
            # After a first Ctrl-C the run is stopping: a second one that lands while it
            # winds down quits at once, quietly (Python's own handler would raise in
            # whatever runs then, a weakref callback for instance, and print a traceback).
            signal.signal(signal.SIGINT, quit_quietly)


async def drive(
    rt: Runtime,
    task_id: str,
    *,
    quiet: bool,
    force: bool = False,
    reconnect_for: float = 0.0,
    db: str | None = None,
) -> RunResult:
    """Run a task here until it is terminal, waiting or interrupted, showing progress
    live on a terminal (unless `quiet`). `force` takes the lease over from a live owner
    (a worker known to be gone); its fencing token then refuses the old owner's writes.
    `reconnect_for`: see `Engine.run`. `db`: the `--db` given, for the hint a second
    Ctrl-C prints."""
    import asyncio

    stop = asyncio.Event()
    view = views.ProgressView()
    async with rt.engine(task_id, on_progress=view.update, stop=stop) as engine:
        with _first_ctrl_c_stops(stop, views.clean(hints.resume(task_id, db))):
            if quiet or not out.is_terminal:
                return await engine.run(task_id, force=force, reconnect_for=reconnect_for)
            from rich.live import Live  # only on a terminal

            with Live(view, console=out, refresh_per_second=4, transient=False) as live:
                view.live = live
                return await engine.run(task_id, force=force, reconnect_for=reconnect_for)


async def _stopped(rt: Runtime, result: RunResult) -> None:
    """No worker may be around: end a stop the contract ends now, and send the task's
    notices here, once (see `watch.sweep.after_run`). Without a webhook, the person at
    the terminal is told by the status this command shows."""
    from tether.runtime.watch.sinks import LogNotifier, TerminalNotifier, default_notifier
    from tether.runtime.watch.sweep import after_run

    if result.interrupted:
        return  # back in the queue; a worker or the next run goes on
    try:
        base = default_notifier()
        notifier = TerminalNotifier() if isinstance(base, LogNotifier) else base
        await after_run(rt.store, result.task_id, notifier=notifier)
    except errors.TetherError as exc:  # never fatal to the run that just ended
        err.print(Text(views.clean(f"tether: notices not sent: {exc}"), "yellow"))


def _finish(
    store_doc: dict[str, Any], result: RunResult, json_out: bool, db: str | None = None
) -> None:
    if json_out:
        print_json(store_doc)
    else:
        out.print(views.status_view(store_doc, db))
        if result.interrupted and db:
            hint = f"interrupted; continue with: {hints.resume(result.task_id, db)}"
            out.print(Text(views.clean(hint), "yellow"))
        elif result.interrupted:
            out.print(views.interrupted(result.task_id))
        if not lifecycle.is_terminal(store_doc.get("status", result.status)):
            _nothing_kept(db)
    if result.interrupted:
        raise typer.Exit(130)
    if store_doc.get("status", result.status) in ("abandoned", "failed", "cancelled"):
        raise typer.Exit(1)
    unavailable = (result.waiting or {}).get("unavailable") if result.status == "waiting" else None
    if unavailable:
        # Stopped on infrastructure (the model endpoint does not answer), not done: a
        # script must not read it as success.
        err.print(
            Text(
                views.clean(
                    f"tether: task {result.task_id} stopped: the {unavailable} does not "
                    f"answer (exit 4); continue with: {hints.resume(result.task_id, db)}"
                ),
                "bold red",
            )
        )
        raise typer.Exit(INFRASTRUCTURE_EXIT)


def _nothing_kept(db: str | None) -> None:
    """On `memory://` the commands a stopped task's status shows cannot reach it: say
    so, instead of leaving a person to find out from `no task with id`."""
    from tether.store import default_url

    url = db or default_url()
    if url.startswith("memory://"):
        note = (
            f"{url} keeps nothing: the task is gone when this command ends, and the "
            "commands above cannot reach it; to go on later, run it on a database that "
            "lasts (the default .tether/tether.db, or --db sqlite:///PATH)"
        )
        out.print(Text(views.clean(note), "yellow"))


def _workspace(contract: TaskSpec, workspace: Path | None, broad: bool = False) -> Path:
    """The task's folder (`--workspace`, else the spec's, else the current one), resolved
    and checked before anything is written (see `runtime.tasks.workspace_folder`), and
    never one inside tether's own state folder (`_away_from_db`)."""
    from tether.runtime.tasks import workspace_folder

    ws = workspace or (Path(contract.workspace) if contract.workspace else Path.cwd())
    _exists(ws, "--workspace" if workspace else "the spec's workspace:")
    resolved = workspace_folder(ws, must_exist=True, allow_broad=broad)
    _away_from_db(ws, resolved)
    return resolved


def _exists(ws: Path, given_by: str) -> None:
    """A workspace that does not exist is named as such, with where it was given and
    the command that makes it (the task never creates its own folder)."""
    import shlex

    try:
        missing = not ws.exists() and not ws.is_symlink()
    except (OSError, ValueError):  # a name too long, a NUL: `workspace_folder` says it
        return
    if missing:
        raise errors.UserError(
            f"{given_by} {ws} does not exist: create the folder first (mkdir -p "
            f"{shlex.quote(str(ws))}), or give one that exists"
        )


def _away_from_db(shown: Path, ws: Path) -> None:
    """`UserError` when the workspace is in a `.tether/` folder: the file tools keep out
    of the `.tether/` folders inside their workspace, not of the one it is in, where the
    database of every task lives."""
    from tether.tools.files import STATE_DIR

    if STATE_DIR in ws.parts:
        raise errors.UserError(
            f"workspace {shown} is in a {STATE_DIR}/ folder, tether's own state (the "
            "database of every task): give the task a folder of its own"
        )


def _contract(spec: Path, mcp_config: Path | None) -> TaskSpec:
    """The contract of `spec`, with the servers of `--mcp-config` after its own."""
    from tether.runtime.launch import with_mcp_config
    from tether.spec import load_spec

    contract = load_spec(spec)
    return with_mcp_config(contract, mcp_config) if mcp_config is not None else contract


def _servers_kept_open(contract: TaskSpec) -> contextlib.AbstractAsyncContextManager[None]:
    """A contract's MCP servers start once: those its check starts stay open for the run
    (`tools.mcp_connect.kept_open`), and close when it ends."""
    if not contract.mcp_servers:
        return contextlib.nullcontext()
    from tether.tools.mcp_connect import kept_open

    return kept_open()


@app.command()
def run(
    spec: Annotated[Path, typer.Argument(help="Task spec (YAML).")],
    model: ModelOpt = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
    workspace: WorkspaceOpt = None,
    allow_broad_workspace: BroadOpt = False,
    model_timeout: ModelTimeoutOpt = None,
    model_retries: ModelRetriesOpt = None,
    reconnect_for: ReconnectOpt = 60.0,
    mcp_config: McpConfigOpt = None,
) -> None:
    """Start a task from a spec and drive it to a terminal or waiting state.

    The task remembers how it was started (the model of --model or TETHER_MODEL, the
    model options, TETHER_TOOLS; never a key): `tether resume` and `tether worker` run
    it the same way without repeating them. Its MCP servers start once: the run uses
    the sessions its check opened."""
    from tether.runtime import launch
    from tether.runtime.tasks import create_task, status_dict
    from tether.runtime.wiring import check_task, open_runtime

    created: list[str] = []  # the task, once it is written; then "driven" once run here

    async def main() -> tuple[dict[str, Any], RunResult]:
        contract = _contract(spec, mcp_config)
        if contract.schedule is not None:
            raise errors.UserError(
                f"{spec} has a schedule ({contract.schedule.describe()}): queue it with "
                "`tether submit`; workers start each occurrence as a task of its own"
            )
        launch.check_env(contract)  # a secret the tools need, before anything is written
        options = model_options(model_timeout, model_retries)
        async with _servers_kept_open(contract):
            await check_task(contract, model, options)  # refuse a bad model or tool first
            ws = _workspace(contract, workspace, allow_broad_workspace)
            record = launch.record(
                contract, model=model, options=options, workspace=str(ws), mcp_config=mcp_config
            )
            async with open_runtime(db, model=model, model_options=options) as rt:
                task = await create_task(
                    rt.store,
                    contract,
                    workspace=ws,
                    allow_broad_workspace=allow_broad_workspace,
                    reconnect_for=reconnect_for,
                    launch=record,
                )
                created.append(task.task_id)
                if not json_out:
                    out.print(views.task_created(task.task_id, len(contract.items)))
                result = await drive(
                    rt, task.task_id, quiet=json_out, reconnect_for=reconnect_for, db=db
                )
                created.append("driven")
                await _stopped(rt, result)
                return await status_dict(rt.store, task.task_id), result

    try:
        doc, result = run_async(main)
    except KeyboardInterrupt:
        if not created:
            raise  # nothing written: exit 130 (`tether.cli._main`)
        _interrupted_outside_the_run(created[0], db, driven=len(created) > 1)
    _finish(doc, result, json_out, db)


def _interrupted_outside_the_run(task_id: str, db: str | None, *, driven: bool) -> NoReturn:
    """A Ctrl-C that `drive` did not take (just after the task was created, or while
    its end is told): say where the task is and how to go on, then exit 130."""
    if driven:
        told = "interrupted after the run; see: " + views.with_db(f"tether status {task_id}", db)
    else:
        told = (
            f"interrupted before its first round; task {task_id} is queued; continue "
            f"with: {hints.resume(task_id, db)}"
        )
    err.print(Text(views.clean(told), "yellow"))
    raise typer.Exit(130)


@app.command()
def submit(
    spec: Annotated[Path, typer.Argument(help="Task spec (YAML).")],
    db: DbOpt = None,
    workspace: WorkspaceOpt = None,
    json_out: JsonOpt = False,
    allow_broad_workspace: BroadOpt = False,
    skip_tool_check: Annotated[
        bool,
        typer.Option(
            "--skip-tool-check",
            help="Queue it even if a tool it names is not registered here (the workers "
            "register it: their TETHER_TOOLS).",
        ),
    ] = False,
    mcp_config: McpConfigOpt = None,
    skip_env_check: Annotated[
        bool,
        typer.Option(
            "--skip-env-check",
            help="Queue it even if a secret its tools need is not set here (the workers "
            "have it in their environment).",
        ),
    ] = False,
) -> None:
    """Queue a task for `tether worker` processes without running it here.

    The workers run it with their own --model, else the spec's or TETHER_MODEL. A
    contract with a `schedule:` is stored as a schedule instead: workers start each
    occurrence as a task of its own (`tether schedule list` shows when)."""
    from tether.runtime import launch
    from tether.runtime.tasks import create_task
    from tether.runtime.watch.schedules import create_schedule
    from tether.runtime.wiring import check_task_tools, open_db

    scheduled: list[Any] = []

    async def main() -> str:
        lasting_db(db, "a task queued there is lost when this command ends")
        contract = _contract(spec, mcp_config)
        if not skip_env_check:
            launch.check_env(contract)  # before anything is written
        if not skip_tool_check:
            # A typo in a tool name is found now, not by a worker hours later.
            await check_task_tools(contract)
        ws = _workspace(contract, workspace, allow_broad_workspace)
        store = await open_db(db)
        try:
            # The models are the workers' choice: only the spec's are remembered.
            record = launch.record(contract, workspace=str(ws), env={}, mcp_config=mcp_config)
            record["tools"] = launch.tool_refs()
            if contract.schedule is not None:
                view = await create_schedule(store, contract, launch=record, workspace=ws)
                scheduled.append(view)
                return view.schedule_id
            task = await create_task(
                store,
                contract,
                workspace=ws,
                allow_broad_workspace=allow_broad_workspace,
                launch=record,
            )
            return task.task_id
        finally:
            await store.close()

    task_id = run_async(main)
    if scheduled:
        view = scheduled[0]
        if json_out:
            print_json(view.to_dict())
        else:
            nxt = views.ts(view.next_at)[:16] if view.next_at is not None else "none (ended)"
            out.print(f"{view.schedule_id}  {view.rule}; next occurrence {nxt}")
    elif json_out:
        print_json({"task_id": task_id, "status": "queued"})
    else:
        out.print(task_id)


async def _confirm_takeover(rt: Runtime, task_id: str, *, quiet: bool) -> None:
    """`--force`: watch a live lease for one lease period first (see
    `runtime.takeover`); refuses (exit 2) if its holder shows life."""
    from tether.runtime import takeover

    def watching(task: TaskRecord, seconds: float) -> None:
        if not quiet:
            err.print(
                Text(
                    views.clean(
                        f"task {task_id} is held by {task.lease_owner} (last renewed "
                        f"{views.ts(task.heartbeat_at)}); watching its lease for "
                        f"{seconds:.0f} s before taking over"
                    ),
                    "yellow",
                )
            )

    watched = await takeover.confirm_stopped(rt.store, task_id, on_watch=watching)
    if watched.previous_owner and not quiet:
        out.print(
            Text(
                views.clean(
                    f"taking task {task_id} over from {watched.previous_owner} "
                    f"(no renewal in {watched.watched:.0f} s)"
                ),
                "yellow",
            )
        )


@app.command()
def resume(
    task_id: TaskArg,
    model: ModelOpt = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Take the task over from the worker that holds its lease (one on a dead "
            "host, say), after watching the lease for one lease period: if that worker "
            "renews it, nothing is taken over; else its later writes are refused.",
        ),
    ] = False,
    model_timeout: ModelTimeoutOpt = None,
    model_retries: ModelRetriesOpt = None,
    reconnect_for: ReconnectOpt = 60.0,
) -> None:
    """Continue a task (after a crash, a Ctrl-C, an approval or a fix).

    It runs with the model, model options and TETHER_TOOLS it was started with; the
    model options given here override them."""
    from tether.runtime import launch
    from tether.runtime.tasks import status_dict
    from tether.runtime.wiring import open_runtime
    from tether.spec import parse_spec

    async def main() -> tuple[dict[str, Any], RunResult]:
        options = model_options(model_timeout, model_retries)
        lasting_db(db, "no task is there to resume")
        async with open_runtime(db, model=model, create=False, model_options=options) as rt:
            task = await rt.store.get_task(task_id)
            if lifecycle.is_terminal(task.status):
                raise errors.UserError(
                    f"task {task_id} is {task.status} ({task.stop_reason}); nothing to resume"
                )
            # A secret its tools need, before the run writes anything.
            launch.check_env(parse_spec(task.spec, source=f"task {task_id}", stored=True))
            if force:
                await _confirm_takeover(rt, task_id, quiet=json_out)
            result = await drive(
                rt, task_id, quiet=json_out, force=force, reconnect_for=reconnect_for, db=db
            )
            await _stopped(rt, result)
            return await status_dict(rt.store, task_id), result

    doc, result = run_async(main)
    _finish(doc, result, json_out, db)
