"""The `tether` command line.

Interfaces hold no business logic: every command opens the store, calls the runtime or
reads projections, and prints. User mistakes print one paragraph and exit 2 (3 for an
unknown task); nothing is written on a bad input.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tether import errors, lifecycle
from tether.store import Store, default_url, open_store, sqlite_path

T = TypeVar("T")
app = typer.Typer(
    name="tether",
    help="tether: a durable runtime for long-running LLM agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Markup is off: task names, objectives and events are user text and must print as-is.
out = Console(highlight=False, soft_wrap=True, markup=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)

DbOpt = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="Database URL: sqlite:///path (default .tether/tether.db) or postgresql://...; "
        "also TETHER_DB.",
        show_default=False,
    ),
]
AfterOpt = Annotated[int, typer.Option("--after", help="Only events with seq > SEQ.")]
TypesOpt = Annotated[
    list[str] | None, typer.Option("--type", help="Only these event types (repeatable).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        help="Model for the task, e.g. openai:gpt-4.1-mini, anthropic:claude-sonnet-4-5, "
        "openai-compatible:http://127.0.0.1:8000/v1#model, scripted:module:function.",
    ),
]

_STATUS_STYLE = {
    "queued": "cyan",
    "running": "blue",
    "waiting": "yellow",
    "suspended": "yellow",
    "stalled": "red",
    "satisfied": "green",
    "abandoned": "magenta",
    "cancelled": "dim",
    "failed": "red",
}


def _fail(exc: BaseException, code: int) -> typer.Exit:
    err.print(Text(f"tether: {exc}", style="bold red"))
    return typer.Exit(code)


def _run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run an async command; user mistakes become one paragraph and an exit code."""
    try:
        return asyncio.run(main())
    except errors.UserError as exc:
        raise _fail(exc, getattr(exc, "exit_code", 2)) from None
    except errors.TetherError as exc:
        raise _fail(exc, 1) from None


async def _open(db: str | None, *, create: bool = True) -> Store:
    url = db or default_url()
    if not create and url.startswith("sqlite://") and not sqlite_path(url).exists():
        raise errors.StoreConfigError(
            f"no tether database at {sqlite_path(url)} (start a task with `tether run` or "
            "`tether demo`, or point --db / TETHER_DB at your database)"
        )
    return await open_store(url)


async def _with_store(db: str | None, fn: Callable[[Store], Awaitable[T]], *, create: bool) -> T:
    store = await _open(db, create=create)
    try:
        return await fn(store)
    finally:
        await store.close()


def _ts(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


# --------------------------------------------------------------------------- status


def _ledger_bar(progress: dict[str, Any], width: int = 40) -> Text:
    total = max(1, int(progress["total"]))
    parts = [
        ("done", "green", "█"),
        ("in_progress", "blue", "█"),
        ("blocked", "red", "█"),
        ("skipped", "magenta", "█"),
        ("waived", "magenta", "▓"),
        ("pending", "grey50", "░"),
    ]
    bar = Text()
    used = 0
    for key, style, ch in parts:
        n = round(width * int(progress.get(key, 0)) / total)
        n = min(n, width - used)
        bar.append(ch * n, style=style)
        used += n
    if used < width:
        bar.append("░" * (width - used), style="grey50")
    bar.append(
        f"  {progress['done']}/{progress['total']} done, {progress['blocked']} blocked, "
        f"{progress['pending'] + progress['in_progress']} open"
    )
    return bar


def _status_view(doc: dict[str, Any]) -> Group:
    style = _STATUS_STYLE.get(doc["status"], "white")
    head = Text.assemble(
        ("task ", "bold"),
        (doc["task_id"], "bold cyan"),
        f"  {doc['name']}  v{doc['version']}  ",
        (doc["status"], f"bold {style}"),
        (f" ({_stop_text(doc)})" if doc["stop_reason"] else "", style),
    )
    lines: list[Any] = [head, Text(f"goal: {doc['ledger']['objective']}")]
    lines.append(_ledger_bar(doc["ledger"]["progress"]))
    if doc.get("waiting"):
        lines.append(Text(f"waiting: {doc['waiting'].get('reason', doc['waiting'])}", "yellow"))
        partial = doc["waiting"].get("partial")
        if partial:
            lines.append(_partial_view(partial))
    if doc.get("waivers"):
        lines.append(
            Text(
                "waived: " + "; ".join(f"{w['id']} ({w['reason']})" for w in doc["waivers"]),
                "magenta",
            )
        )
    used = doc["budget"]["used"]
    lines.append(
        Text(
            f"rounds {used['rounds']}  model calls {used['model_calls']}  tokens {used['tokens']}"
            f" (cached {used['cached_tokens']})  cost ${used['money_usd']:.4f}  "
            f"wall {used['wall_seconds']:.1f}s"
        )
    )
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for col in ("item", "status", "attempts", "evidence / note"):
        table.add_column(col)
    for it in doc["ledger"]["items"]:
        st = it["status"]
        colour = {
            "done": "green",
            "blocked": "red",
            "in_progress": "blue",
            "skipped": "magenta",
            "waived": "magenta",
        }
        detail = ", ".join(it["evidence"][:2]) if st == "done" else it["note"]
        table.add_row(it["id"], Text(st, colour.get(st, "white")), str(it["attempts"]), detail)
    lines.append(table)
    return Group(*lines)


def _stop_text(doc: dict[str, Any]) -> str:
    """The stop reason, with what was waived when the task was delivered without it."""
    reason = str(doc["stop_reason"])
    if reason == "delivered_with_waivers" and doc.get("waivers"):
        reason += ": " + ", ".join(w["id"] for w in doc["waivers"])
    return reason


def _partial_view(partial: dict[str, Any]) -> Text:
    """The partial-completion record a human decides on."""
    text = Text("partial completion: ", "bold")
    text.append(f"{len(partial.get('done', []))} done")
    for key, style in (("blocked", "red"), ("waived", "magenta"), ("skipped", "magenta")):
        for it in partial.get(key, []):
            text.append(f"\n  {key} ", style)
            text.append(f"{it['id']}: {it.get('reason') or '-'}")
    remaining = [it["id"] for it in partial.get("remaining", [])]
    if remaining:
        text.append(f"\n  remaining: {', '.join(remaining)}")
    for item, prop in (partial.get("proposed") or {}).items():
        text.append(f"\n  the judge proposed {prop.get('status')} for {item}: {prop.get('note')}")
    return text


@app.command()
def status(task_id: str, db: DbOpt = None, json_out: JsonOpt = False) -> None:
    """Show a task: state, ledger, budget, what it waits for."""
    from tether.runtime.tasks import status_dict

    async def main() -> dict[str, Any]:
        return await _with_store(db, lambda s: status_dict(s, task_id), create=False)

    doc = _run(main)
    if json_out:
        out.print_json(json.dumps(doc))
    else:
        out.print(_status_view(doc))


@app.command("list")
def list_tasks(db: DbOpt = None, json_out: JsonOpt = False) -> None:
    """List tasks, newest first."""

    async def main() -> list[Any]:
        return await _with_store(db, lambda s: s.list_tasks(), create=False)

    tasks = _run(main)
    if json_out:
        out.print_json(
            json.dumps(
                [
                    {
                        "task_id": t.task_id,
                        "name": t.name,
                        "status": t.status,
                        "stop_reason": t.stop_reason,
                        "version": t.version,
                        "created_at": t.created_at,
                    }
                    for t in tasks
                ]
            )
        )
        return
    table = Table("task", "name", "status", "created", box=None, header_style="bold")
    for t in tasks:
        st = t.status + (f" ({t.stop_reason})" if t.stop_reason else "")
        table.add_row(
            t.task_id, t.name, Text(st, _STATUS_STYLE.get(t.status, "")), _ts(t.created_at)
        )
    out.print(table)


# --------------------------------------------------------------------------- events


@app.command()
def events(
    task_id: str,
    db: DbOpt = None,
    json_out: JsonOpt = False,
    after: AfterOpt = 0,
    limit: Annotated[int | None, typer.Option("--limit", help="At most this many.")] = None,
    type_: TypesOpt = None,
) -> None:
    """Print a task's events (append-only log)."""

    async def main() -> list[Any]:
        return await _with_store(
            db,
            lambda s: s.read_events(task_id, after=after, limit=limit, types=type_),
            create=False,
        )

    evs = _run(main)
    if json_out:
        out.print_json(json.dumps([e.to_dict() for e in evs]))
        return
    for e in evs:
        out.print(f"{e.seq:>6} {_ts(e.at)} {e.type:<22} {json.dumps(e.data, ensure_ascii=False)}")


def _describe_event(e: Any) -> tuple[str, str]:
    d = e.data
    t = e.type
    if t == "task.status":
        why = f" — {d.get('reason')}" if d.get("reason") else ""
        stop = f" ({d['stop_reason']})" if d.get("stop_reason") else ""
        return _STATUS_STYLE.get(d["dst"], "white"), f"{d['src']} → {d['dst']}{stop}{why}"
    if t == "model.called":
        return "cyan", (
            f"{d['purpose']} call to {d['model']}: {d['input_tokens']} in "
            f"({d['cached_tokens']} cached) / {d['output_tokens']} out, "
            f"{d['latency_ms']:.0f} ms — {d.get('summary', '')[:80]}"
        )
    if t == "op.result":
        style = "green" if d["status"] == "succeeded" else "red"
        msg = d.get("summary") or d.get("error") or ""
        return style, f"{d['tool']} {d['status']}: {msg[:100]}"
    if t == "op.intended":
        return "dim", f"intent {d['op_id']} {d['tool']}"
    if t == "judge.verdict":
        return "magenta", (
            f"round {d['round']} verdict {d['decision']}: {d['done']}/{d['total']} done "
            f"({d['percent']}%){' — ' + d['reason'] if d.get('reason') else ''}"
        )
    if t == "ledger.updated":
        changes = [
            f"{c.get('item')}.{c.get('field')}→{c.get('after')}"
            for c in d.get("diff", [])
            if c.get("field") in ("status", "breaker")
        ]
        return "green", f"ledger v{d['version']}: {', '.join(changes[:6]) or 'updated'}"
    if t == "audit.warning":
        return "bold yellow", f"AUDIT {d['code']}: {d['message']}"
    if t == "turn.started":
        return (
            "bold",
            f"turn {d['turn']} ({d['kind']}) epoch={d['epoch']} {d.get('epoch_reason', '')}",
        )
    if t == "round.started":
        return "bold blue", f"round {d['round']} on {d.get('item')}"
    if t == "context.compacted":
        return "yellow", (
            f"compacted {d['rounds_compacted']} rounds: {d['tokens_before']} → "
            f"{d['tokens_after']} tokens"
        )
    if t == "completion.checked":
        return ("green" if d["passed"] else "red"), (
            f"completion check {'passed' if d['passed'] else 'failed'}"
            + (f": {'; '.join(d['gaps'])[:120]}" if d.get("gaps") else "")
        )
    return "white", json.dumps(d, ensure_ascii=False)[:140]


@app.command()
def timeline(
    task_id: str,
    db: DbOpt = None,
    after: AfterOpt = 0,
    type_: TypesOpt = None,
) -> None:
    """A readable, coloured timeline of a task."""

    async def main() -> list[Any]:
        return await _with_store(
            db, lambda s: s.read_events(task_id, after=after, types=type_), create=False
        )

    evs = _run(main)
    for e in evs:
        style, text = _describe_event(e)
        line = Text.assemble(
            (f"{e.seq:>6} ", "dim"), (_ts(e.at)[11:] + " ", "dim"), (f"{e.type:<20} ", style), text
        )
        out.print(line)


# --------------------------------------------------------------------------- run


class _ProgressView:
    """Live progress: ledger bar, current item, round, tokens, cost, cache hit rate."""

    def __init__(self) -> None:
        self.snap: Any = None
        self.live: Live | None = None

    def __rich__(self) -> Any:
        s = self.snap
        if s is None:
            return Text("starting…")
        p = s.progress.to_dict()
        return Panel(
            Group(
                _ledger_bar(p),
                Text(
                    f"round {s.round}  status {s.status}  current item {s.focus or '-'}\n"
                    f"tokens {s.tokens}  cost ${s.cost_usd:.4f}  prompt cache hit (act) "
                    f"{100 * s.cache_hit_rate:.0f}%\n{s.message}"
                ),
            ),
            title=f"tether · {s.task_id}",
        )

    def update(self, snap: Any) -> None:
        self.snap = snap
        if self.live is not None:
            self.live.refresh()


async def _drive(
    store: Store,
    task_id: str,
    model: str | None,
    *,
    quiet: bool,
    services: dict[str, Any] | None = None,
) -> Any:
    from tether.runtime.engine import Engine
    from tether.runtime.wiring import build_models
    from tether.spec import parse_spec

    task = await store.get_task(task_id)
    spec = parse_spec(task.spec, source=f"task {task_id}")
    models = build_models(spec, model)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    presses = 0

    def on_sigint() -> None:
        nonlocal presses
        presses += 1
        if presses == 1:
            err.print(Text("stopping after the current step (Ctrl-C again to quit now)", "yellow"))
            stop.set()
        else:
            raise SystemExit(130)

    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, on_sigint)
    view = _ProgressView()
    engine = Engine(store, models, on_progress=view.update, stop=stop, services=services or {})
    try:
        if quiet or not out.is_terminal:
            return await engine.run(task_id)
        with Live(view, console=out, refresh_per_second=4, transient=False) as live:
            view.live = live
            return await engine.run(task_id)
    finally:
        await models.aclose()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)


def _finish(store_doc: dict[str, Any], result: Any, json_out: bool) -> None:
    if json_out:
        out.print_json(json.dumps(store_doc))
    else:
        out.print(_status_view(store_doc))
        if result.interrupted:
            out.print(Text(f"interrupted; continue with: tether resume {result.task_id}", "yellow"))
    if result.interrupted:
        raise typer.Exit(130)
    if result.status in ("abandoned", "failed", "cancelled"):
        raise typer.Exit(1)


@app.command()
def run(
    spec: Annotated[Path, typer.Argument(help="Task spec (YAML).")],
    model: ModelOpt = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
    workspace: Annotated[
        Path | None, typer.Option("--workspace", help="Folder the task works in (default: cwd).")
    ] = None,
) -> None:
    """Start a task from a spec and drive it to a terminal or waiting state."""
    from tether.runtime.tasks import create_task, status_dict
    from tether.runtime.wiring import build_models
    from tether.spec import load_spec

    async def main() -> tuple[dict[str, Any], Any]:
        contract = load_spec(spec)
        build_models(contract, model)  # refuse a bad model name before writing anything
        from tether.runtime.builtins import default_registry

        registry = default_registry(lambda: None)  # type: ignore[arg-type,return-value]
        from tether.runtime.engine import check_tools

        if not contract.mcp_servers:  # MCP tools are known once their servers run
            check_tools(contract, registry.names())
        ws = workspace or (Path(contract.workspace) if contract.workspace else Path.cwd())
        if not ws.is_dir():
            raise errors.UserError(f"workspace {ws} is not a folder")
        store = await _open(db)
        try:
            task = await create_task(store, contract, workspace=ws)
            if not json_out:
                out.print(
                    Text.assemble(
                        "task ",
                        (task.task_id, "bold cyan"),
                        f" created ({len(contract.items)} items)",
                    )
                )
            result = await _drive(store, task.task_id, model, quiet=json_out)
            return await status_dict(store, task.task_id), result
        finally:
            await store.close()

    doc, result = _run(main)
    _finish(doc, result, json_out)


@app.command()
def submit(
    spec: Annotated[Path, typer.Argument(help="Task spec (YAML).")],
    db: DbOpt = None,
    workspace: Annotated[
        Path | None, typer.Option("--workspace", help="Folder the task works in (default: cwd).")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Queue a task for `tether worker` processes without running it here."""
    from tether.runtime.tasks import create_task
    from tether.spec import load_spec

    async def main() -> str:
        contract = load_spec(spec)
        ws = workspace or (Path(contract.workspace) if contract.workspace else Path.cwd())
        if not ws.is_dir():
            raise errors.UserError(f"workspace {ws} is not a folder")
        store = await _open(db)
        try:
            task = await create_task(store, contract, workspace=ws)
            return task.task_id
        finally:
            await store.close()

    task_id = _run(main)
    if json_out:
        out.print_json(json.dumps({"task_id": task_id, "status": "queued"}))
    else:
        out.print(task_id)


@app.command()
def resume(
    task_id: str, model: ModelOpt = None, db: DbOpt = None, json_out: JsonOpt = False
) -> None:
    """Continue a task (after a crash, a Ctrl-C, an approval or a fix)."""
    from tether.runtime.tasks import status_dict

    async def main() -> tuple[dict[str, Any], Any]:
        store = await _open(db, create=False)
        try:
            task = await store.get_task(task_id)
            if lifecycle.is_terminal(task.status):
                raise errors.UserError(
                    f"task {task_id} is {task.status} ({task.stop_reason}); nothing to resume"
                )
            result = await _drive(store, task_id, model, quiet=json_out)
            return await status_dict(store, task_id), result
        finally:
            await store.close()

    doc, result = _run(main)
    _finish(doc, result, json_out)


@app.command()
def cancel(task_id: str, db: DbOpt = None) -> None:
    """Ask a task to stop; a running worker stops between steps."""
    from tether import events as ev
    from tether.store import TaskPatch

    async def main() -> str:
        store = await _open(db, create=False)
        try:
            task = await store.get_task(task_id)
            if lifecycle.is_terminal(task.status):
                return f"task {task_id} is already {task.status}"
            if task.lease_owner is None or (task.lease_expiry or 0) <= time.time():
                await store.commit(
                    task_id,
                    None,
                    [
                        ev.CancelRequested(by="cli"),
                        ev.TaskStatusChanged(
                            src=task.status,
                            dst="cancelled",
                            stop_reason="cancelled_by_user",
                            reason="cancelled",
                        ),
                    ],
                    task=TaskPatch(
                        status="cancelled",
                        stop_reason="cancelled_by_user",
                        cancel_requested=True,
                        waiting=None,
                    ),
                )
                return f"task {task_id} cancelled"
            await store.commit(
                task_id,
                None,
                [ev.CancelRequested(by="cli")],
                task=TaskPatch(cancel_requested=True),
            )
            return f"cancel requested; worker {task.lease_owner} stops between steps"
        finally:
            await store.close()

    out.print(_run(main))


@app.command()
def approve(
    task_id: str,
    request_id: str,
    db: DbOpt = None,
    modify: Annotated[
        str | None, typer.Option("--modify", help="Approve with these arguments (a JSON object).")
    ] = None,
    done: Annotated[
        bool,
        typer.Option("--done", help="For an op whose outcome was unknown: it did happen."),
    ] = False,
    result: Annotated[
        str | None, typer.Option("--result", help="With --done: what the service returned.")
    ] = None,
    by: Annotated[str, typer.Option("--by", help="Who decides (journaled).")] = "cli",
) -> None:
    """Approve a pending request (optionally with modified arguments, or --done)."""
    from tether import approvals

    args = None
    if modify is not None:
        try:
            args = json.loads(modify)
        except json.JSONDecodeError as exc:
            raise _fail(errors.UserError(f"--modify is not valid JSON: {exc}"), 2) from None
        if not isinstance(args, dict):
            raise _fail(errors.UserError("--modify must be a JSON object of tool arguments"), 2)

    async def main() -> Any:
        return await _with_store(
            db,
            lambda s: approvals.decide(
                s,
                task_id,
                request_id,
                "done" if done else "approve",
                by=by,
                modified_args=args,
                result=_maybe_json(result),
            ),
            create=False,
        )

    _run(main)
    what = "recorded as done" if done else "approved"
    out.print(f"{what} {request_id}; continue with: tether resume {task_id}")


def _maybe_json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


@app.command()
def reject(
    task_id: str,
    request_id: str,
    db: DbOpt = None,
    reason: Annotated[str, typer.Option("--reason", help="Why (the model is told).")] = "",
    by: Annotated[str, typer.Option("--by", help="Who decides (journaled).")] = "cli",
) -> None:
    """Reject a pending request; the model is told and the task goes on without it."""
    from tether import approvals

    async def main() -> Any:
        return await _with_store(
            db,
            lambda s: approvals.decide(s, task_id, request_id, "reject", by=by, reason=reason),
            create=False,
        )

    _run(main)
    out.print(f"rejected {request_id}; continue with: tether resume {task_id}")


ByOpt = Annotated[str, typer.Option("--by", help="Who decides (journaled).")]


def _decide(db: str | None, task_id: str, action: Callable[[Store], Awaitable[str]]) -> None:
    async def main() -> str:
        store = await _open(db, create=False)
        try:
            return await action(store)
        finally:
            await store.close()

    out.print(Text(_run(main)))


@app.command()
def retry(
    task_id: str,
    item: Annotated[str, typer.Argument(help="The item to work on again.")],
    hint: Annotated[
        str | None, typer.Option("--hint", help="A hint for the model about this item.")
    ] = None,
    by: ByOpt = "cli",
    db: DbOpt = None,
) -> None:
    """Send a blocked (or skipped, or waived) item back to work, its counters reset."""
    from tether.decisions import retry_item

    async def action(store: Store) -> str:
        await retry_item(store, task_id, item, hint=hint, by=by)
        return f"{item} is pending again; continue with: tether resume {task_id}"

    _decide(db, task_id, action)


@app.command()
def waive(
    task_id: str,
    item: Annotated[str, typer.Argument(help="The item to deliver without.")],
    reason: Annotated[str, typer.Option("--reason", help="Why it may stay undone.")] = "",
    by: ByOpt = "cli",
    db: DbOpt = None,
) -> None:
    """Let the task be delivered without an item (it ends delivered_with_waivers)."""
    from tether.decisions import waive_item

    async def action(store: Store) -> str:
        await waive_item(store, task_id, item, reason=reason, by=by)
        return f"{item} waived; continue with: tether resume {task_id}"

    _decide(db, task_id, action)


@app.command()
def abandon(
    task_id: str,
    reason: Annotated[str, typer.Option("--reason", help="Why the task is given up.")] = "",
    by: ByOpt = "cli",
    db: DbOpt = None,
) -> None:
    """End a task as abandoned (abandoned_by_user)."""
    from tether.decisions import abandon_task

    async def action(store: Store) -> str:
        await abandon_task(store, task_id, reason=reason, by=by)
        return f"task {task_id} abandoned"

    _decide(db, task_id, action)


@app.command()
def approvals(task_id: str, db: DbOpt = None, json_out: JsonOpt = False) -> None:
    """List a task's approval requests."""

    async def main() -> list[Any]:
        return await _with_store(db, lambda s: _all_approvals(s, task_id), create=False)

    items = _run(main)
    if json_out:
        out.print_json(json.dumps([a.__dict__ for a in items]))
        return
    table = Table("request", "status", "what", "decided by", box=None, header_style="bold")
    for a in items:
        table.add_row(
            a.request_id, a.status, str(a.request.get("what", ""))[:80], a.decided_by or ""
        )
    out.print(table)


async def _all_approvals(store: Store, task_id: str) -> list[Any]:
    await store.get_task(task_id)
    return await store.get_approvals(task_id)


@app.command()
def worker(
    db: DbOpt = None,
    model: ModelOpt = None,
    once: Annotated[bool, typer.Option("--once", help="Exit when no task is claimable.")] = False,
    poll: Annotated[float, typer.Option("--poll", help="Seconds between polls.")] = 2.0,
) -> None:
    """Claim and run tasks from the database until stopped."""
    from tether.runtime.engine import Engine
    from tether.runtime.wiring import build_models
    from tether.spec import parse_spec

    async def main() -> int:
        store = await _open(db)
        done = 0
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGINT, stop.set)
            loop.add_signal_handler(signal.SIGTERM, stop.set)
        try:
            while not stop.is_set():
                now = time.time()
                claimable = [
                    t
                    for t in await store.list_tasks(
                        statuses={"queued", "stalled", "running", "waiting"}, limit=1000
                    )
                    if t.status != "waiting" or (t.wake_at is not None and t.wake_at <= now)
                ]
                ran = False
                for t in reversed(claimable):
                    spec = parse_spec(t.spec, source=f"task {t.task_id}")
                    models = build_models(spec, model)
                    engine = Engine(store, models, stop=stop)
                    try:
                        res = await engine.run(t.task_id)
                    except errors.TaskBusy:
                        continue
                    finally:
                        await models.aclose()
                    ran = True
                    done += 1
                    err.print(f"task {res.task_id}: {res.status} {res.stop_reason or ''}")
                    break
                if not ran:
                    if once:
                        break
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), poll)
            return done
        finally:
            await store.close()

    n = _run(main)
    err.print(f"worker ran {n} task(s)")


# --------------------------------------------------------------------------- demo


@app.command()
def demo(
    dir_: Annotated[
        Path | None, typer.Option("--dir", help="Folder for the demo (default: a temporary one).")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Run the same task with a real model instead of offline."),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Catalogue 40 documents offline, on the embedded SQLite store, in under a minute."""
    from tether import demo as demo_mod
    from tether.runtime.tasks import create_task, status_dict
    from tether.spec import load_spec

    keep = dir_ is not None
    folder = dir_ or Path(tempfile.mkdtemp(prefix="tether-demo-"))
    folder.mkdir(parents=True, exist_ok=True)
    demo_mod.make_documents(folder)
    spec_path = demo_mod.write_spec(folder)
    model_name = model or "scripted:tether.demo:policy"
    db_url = f"sqlite:///{folder / '.tether' / 'tether.db'}"
    t0 = time.monotonic()

    async def main() -> tuple[dict[str, Any], Any, list[Any]]:
        contract = load_spec(spec_path)
        store = await open_store(db_url)
        try:
            task = await create_task(store, contract, workspace=folder)
            if not json_out:
                out.print(
                    Text.assemble(
                        ("tether demo", "bold"),
                        f": cataloguing {demo_mod.N_DOCS} documents in {folder}\ntask ",
                        (task.task_id, "bold cyan"),
                        f", model {model_name}, store {db_url}",
                    )
                )
            result = await _drive(store, task.task_id, model_name, quiet=json_out)
            waiting = (await store.get_task(task.task_id)).waiting or {}
            if waiting.get("kind") == "decision":
                # The demo plays the user: the corrupted scan is listed in summary.md, so
                # the team can be told; everything else must have been done.
                result = (
                    await _demo_decide(store, task.task_id, waiting, model_name, json_out) or result
                )
            evs = await store.read_events(task.task_id)
            return await status_dict(store, task.task_id), result, evs
        finally:
            await store.close()

    doc, _result, evs = _run(main)
    wall = time.monotonic() - t0
    summary = _demo_summary(doc, evs, wall, folder)
    if json_out:
        out.print_json(json.dumps({"status": doc, "summary": summary}))
    else:
        out.print(_status_view(doc) if not out.is_terminal else Text(""))
        table = Table(title="what happened", show_header=False, box=None)
        table.add_column(style="bold")
        table.add_column()
        for k, v in summary.items():
            table.add_row(k, str(v))
        out.print(table)
        out.print(
            f"\nSee it again: tether timeline {doc['task_id']} --db {db_url}"
            + ("" if keep else f"\n(the demo folder {folder} is temporary)")
        )
    if doc["status"] != "satisfied":
        raise typer.Exit(1)


async def _demo_decide(
    store: Store, task_id: str, waiting: dict[str, Any], model_name: str, quiet: bool
) -> Any:
    from tether import demo as demo_mod
    from tether.decisions import waive_item

    partial = waiting.get("partial") or {}
    blocked = [b["id"] for b in partial.get("blocked", [])]
    if not quiet:
        out.print(Text(f"\nthe task waits for a decision: {waiting.get('reason', '')}", "yellow"))
        out.print(_partial_view(partial))
    if blocked != [demo_mod.BROKEN] or partial.get("remaining"):
        return None  # not what the demo expects: leave the decision to the user
    reason = "corrupted scan, listed in summary.md"
    if not quiet:
        out.print(
            Text.assemble(
                ("\nas the user: ", "bold"),
                f'tether waive {task_id} {demo_mod.BROKEN} --reason "{reason}"\n',
            )
        )
    await waive_item(store, task_id, demo_mod.BROKEN, reason=reason, by="demo user")
    return await _drive(store, task_id, model_name, quiet=quiet)


def _demo_summary(doc: dict[str, Any], evs: list[Any], wall: float, folder: Path) -> dict[str, Any]:
    kinds: dict[str, int] = {}
    for e in evs:
        kinds[e.type] = kinds.get(e.type, 0) + 1
    calls = [e.data for e in evs if e.type == "model.called"]
    by_purpose: dict[str, int] = {}
    for c in calls:
        by_purpose[c["purpose"]] = by_purpose.get(c["purpose"], 0) + 1
    act_in = sum(c["input_tokens"] for c in calls if c["purpose"] == "act")
    act_cached = sum(c["cached_tokens"] for c in calls if c["purpose"] == "act")
    ops = [e.data for e in evs if e.type == "op.result"]
    warnings = [e.data["code"] for e in evs if e.type == "audit.warning"]
    checks = next((e.data for e in reversed(evs) if e.type == "completion.checked"), None)
    p = doc["ledger"]["progress"]
    blocked = [
        i["id"] + ": " + i["note"]
        for i in doc["ledger"]["items"]
        if i["status"] in ("blocked", "waived")
    ]
    return {
        "result": f"{doc['status']} ({_stop_text(doc)})",
        "ledger": f"{p['done']}/{p['total']} done, {p['blocked']} blocked, "
        f"{p.get('waived', 0)} waived",
        "blocked or waived": "; ".join(blocked) or "none",
        "rounds": doc["budget"]["used"]["rounds"],
        "model calls": ", ".join(f"{k} {v}" for k, v in sorted(by_purpose.items())),
        "tool calls": f"{len(ops)} ({sum(1 for o in ops if o['status'] != 'succeeded')} failed)",
        "compactions": kinds.get("context.compacted", 0),
        "audit warnings": ", ".join(sorted(set(warnings))) or "none",
        "prompt cache hit (act)": f"{100 * act_cached / act_in:.0f}%" if act_in else "-",
        "acceptance": ", ".join(
            f"{r['id']} {'ok' if r['passed'] else 'FAILED'}"
            for r in (checks or {}).get("results", [])
        )
        or "-",
        "events": len(evs),
        "outputs": ", ".join(
            n for n in ("catalog.csv", "summary.md", "notice.md") if (folder / n).is_file()
        ),
        "wall time": f"{wall:.1f}s",
    }


def main() -> None:
    """Console entry point."""
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover - interactive
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
