"""`tether demo`: catalogue 40 documents offline, then say what happened."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from tether import errors
from tether.cli import views
from tether.cli._app import JsonOpt, app, fail, out, print_json, run_async
from tether.cli.run import drive

if TYPE_CHECKING:
    from tether.runtime.engine import RunResult
    from tether.runtime.wiring import Runtime


def _demo_folder(path: Path) -> Path:
    """`--dir`, checked before anything is written: a folder that may be a workspace (not
    `/`, a system folder or the home folder), new, empty or an earlier demo's (the demo
    writes its documents, spec and database there and must not overwrite anyone's
    files); created when missing."""
    from tether.runtime.tasks import workspace_folder

    try:
        folder = workspace_folder(path)
    except errors.UserError as exc:  # the demo has no --allow-broad-workspace
        why = str(exc).split(": give the task")[0].split("; give the task")[0]
        raise errors.UserError(f"--dir: {why}; give the demo a folder of its own") from None
    try:
        if folder.exists():
            if not folder.is_dir():
                raise errors.UserError(f"--dir {path} is a file, not a folder")
            if any(folder.iterdir()) and not (folder / "demo-spec.yaml").is_file():
                raise errors.UserError(
                    f"--dir {path} is not empty; the demo writes docs/, demo-spec.yaml and "
                    "a database there: give a new or empty folder (or an earlier demo's)"
                )
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise errors.UserError(f"--dir {path}: cannot use it ({exc.strerror or exc})") from None
    return folder


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
    from tether.runtime.wiring import open_runtime
    from tether.spec import load_spec

    keep = dir_ is not None
    try:
        folder = (
            _demo_folder(dir_) if dir_ is not None else Path(tempfile.mkdtemp("", "tether-demo-"))
        )
    except errors.UserError as exc:
        raise fail(exc, 2) from None
    demo_mod.make_documents(folder)
    spec_path = demo_mod.write_spec(folder)
    model_name = model or "scripted:tether.demo:policy"
    db_url = f"sqlite:///{folder / '.tether' / 'tether.db'}"
    t0 = time.monotonic()

    async def main() -> tuple[dict[str, Any], list[Any]]:
        contract = load_spec(spec_path)
        async with open_runtime(db_url, model=model_name) as rt:
            task = await create_task(rt.store, contract, workspace=folder)
            if not json_out:
                out.print(
                    Text.assemble(
                        ("tether demo", "bold"),
                        f": cataloguing {demo_mod.N_DOCS} documents in {folder}\ntask ",
                        (task.task_id, "bold cyan"),
                        f", model {model_name}, store {db_url}",
                    )
                )
            await drive(rt, task.task_id, quiet=json_out)
            waiting = (await rt.store.get_task(task.task_id)).waiting or {}
            if waiting.get("kind") == "decision":
                # The demo plays the user: the corrupted scan is listed in summary.md, so
                # the team can be told; everything else must have been done.
                await _decide(rt, task.task_id, waiting, json_out)
            evs = await rt.store.read_events(task.task_id)
            return await status_dict(rt.store, task.task_id), evs

    doc, evs = run_async(main)
    wall = time.monotonic() - t0
    summary = demo_summary(doc, evs, wall, folder)
    if json_out:
        print_json({"status": doc, "summary": summary})
    else:
        out.print(views.status_view(doc) if not out.is_terminal else Text(""))
        out.print(views.summary_table(summary))
        out.print(
            f"\nSee it again: tether timeline {doc['task_id']} --db {db_url}"
            + ("" if keep else f"\n(the demo folder {folder} is temporary)")
        )
    if doc["status"] != "satisfied":
        raise typer.Exit(1)


async def _decide(
    rt: Runtime, task_id: str, waiting: Mapping[str, Any], quiet: bool
) -> RunResult | None:
    """Waive the corrupted scan as the user and run on, when that is the only gap."""
    from tether import demo as demo_mod
    from tether.decisions import waive_item

    partial = waiting.get("partial") or {}
    blocked = [b["id"] for b in partial.get("blocked", [])]
    if not quiet:
        out.print(Text(f"\nthe task waits for a decision: {waiting.get('reason', '')}", "yellow"))
        out.print(views.partial_view(partial))
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
    await waive_item(rt.store, task_id, demo_mod.BROKEN, reason=reason, by="demo user")
    return await drive(rt, task_id, quiet=quiet)


def demo_summary(
    doc: Mapping[str, Any], evs: Sequence[Any], wall: float, folder: Path
) -> dict[str, Any]:
    """What the demo run did, from its status document and its events."""
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
        "result": f"{doc['status']} ({views.stop_text(doc)})",
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
