"""`tether demo`: catalogue 40 documents offline, then say what happened.

Everything is checked before anything is written: the model (a missing key, an unknown
provider), the tools, and the folder. `--dir` may be an earlier demo's folder: a new
demo starts clean there, its predecessor's outputs cleared first — only files the demo
recognises as its own (what it writes itself, or what an earlier demo's task wrote
there byte for byte, according to the folder's database); anything else it would
overwrite is refused, with the command to run instead.
"""

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

#: The offline model the demo runs without `--model`.
OFFLINE_MODEL = "scripted:tether.demo:policy"


def _demo_folder(path: Path) -> Path:
    """`--dir` resolved and checked, nothing written: a folder that may be a workspace
    (not `/`, a system folder or the home folder), and not a file."""
    from tether.runtime.tasks import workspace_folder

    try:
        folder = workspace_folder(path)
    except errors.UserError as exc:  # the demo has no --allow-broad-workspace
        why = str(exc).split(": give the task")[0].split("; give the task")[0]
        raise errors.UserError(f"--dir: {why}; give the demo a folder of its own") from None
    try:
        if folder.exists() and not folder.is_dir():
            raise errors.UserError(f"--dir {path} is a file, not a folder")
    except OSError as exc:
        raise errors.UserError(f"--dir {path}: cannot use it ({exc.strerror or exc})") from None
    return folder


def _new_folder_hint(path: Path) -> str:
    """`tether demo --dir PATH-2` (the first such folder that does not exist yet)."""
    n = 2
    while Path(f"{path}-{n}").exists():
        n += 1
    return f"tether demo --dir {path}-{n}"


async def _earlier_writes(folder: Path) -> tuple[dict[Path, set[str]], list[dict[str, Any]]]:
    """What earlier demos in `folder` wrote there, from its database: each file's
    contents as their `write_file` calls wrote them, and the specs they ran."""
    from tether import demo as demo_mod
    from tether.runtime.wiring import open_db

    db = folder / ".tether" / "tether.db"
    if not db.is_file():
        return {}, []
    url = f"sqlite:///{db}"
    try:
        store = await open_db(url, create=False, read_only=True)
    except errors.TetherError:  # an older schema: the demo migrates its own database
        store = await open_db(url, create=False)
    name = demo_mod.spec_dict()["name"]
    written: dict[Path, set[str]] = {}
    specs: list[dict[str, Any]] = []
    try:
        for task in await store.list_tasks(limit=10_000):
            if task.name != name or task.workspace != str(folder):
                continue
            specs.append(task.spec)
            for op in await store.get_ops(task.task_id, ["succeeded"], tools=["write_file"]):
                path, content = op.args.get("path"), op.args.get("content")
                if isinstance(path, str) and isinstance(content, str):
                    written.setdefault((folder / path).resolve(), set()).add(content)
    finally:
        await store.close()
    return written, specs


def _read(path: Path) -> str | None:
    """A regular file's text (not through a symlink), or None."""
    try:
        if path.is_symlink() or not path.is_file():
            return None
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _spec_is_the_demos(path: Path, specs: list[dict[str, Any]]) -> bool:
    """`demo-spec.yaml` as this demo writes it, or as an earlier demo here ran it."""
    from tether import demo as demo_mod
    from tether.spec import load_spec

    text = _read(path)
    if text is None:
        return False
    if text == demo_mod.spec_text():
        return True
    try:
        return load_spec(path).model_dump(mode="json") in specs
    except errors.TetherError:
        return False


async def earlier_demo_files(path: Path, folder: Path) -> list[Path]:
    """The files an earlier demo left in `folder` that a new demo would write again,
    to be cleared first (nothing is written here). A file is the demo's own when it is
    what the demo writes (the documents, `demo-spec.yaml`) or what an earlier demo's
    task wrote there, byte for byte, according to the folder's database. Anything
    else the demo would overwrite is a person's: `UserError`, with the command to run."""
    from tether import demo as demo_mod

    if not folder.exists() or not any(folder.iterdir()):
        return []
    spec_file = folder / demo_mod.SPEC_FILE
    hint = _new_folder_hint(path)
    if not spec_file.exists():
        raise errors.UserError(
            f"--dir {path} is not empty and not an earlier demo's folder; the demo writes "
            f"docs/, records/, {demo_mod.SPEC_FILE} and a database there: give it a new or "
            f"empty folder: {hint}"
        )
    written, specs = await _earlier_writes(folder)
    theirs = [] if _spec_is_the_demos(spec_file, specs) else [demo_mod.SPEC_FILE]
    theirs += [
        rel
        for rel, body in demo_mod.documents().items()
        if (folder / rel).exists() and _read(folder / rel) != body
    ]
    outputs = {(folder / rel).resolve(): rel for rel in demo_mod.output_paths()}
    clear: list[Path] = []
    for target in sorted(set(outputs) | set(written)):
        if not target.is_relative_to(folder) or not (target.exists() or target.is_symlink()):
            continue
        if _read(target) in written.get(target, set()):
            clear.append(target)
        elif target in outputs:
            theirs.append(outputs[target])
    if theirs:
        one = len(theirs) == 1
        it = "it" if one else "them"
        shown = ", ".join(theirs[:3]) + (f" and {len(theirs) - 3} more" if len(theirs) > 3 else "")
        raise errors.UserError(
            f"--dir {path} holds {shown}, which the demo would write but "
            f"{'is' if one else 'are'} not what an earlier demo wrote there (changed since, "
            f"or someone else's); the demo does not overwrite {it}: move {it} away, or run "
            f"the demo in a new folder: {hint}"
        )
    return clear


def _clear(folder: Path, files: list[Path]) -> None:
    """Remove an earlier demo's outputs (and `records/` once empty): the new demo
    starts clean instead of asking to approve overwriting each of them."""
    for f in files:
        f.unlink(missing_ok=True)
    records = folder / "records"
    if records.is_dir() and not records.is_symlink() and not any(records.iterdir()):
        records.rmdir()


@app.command()
def demo(
    dir_: Annotated[
        Path | None,
        typer.Option(
            "--dir",
            metavar="DIR",
            help="Folder for the demo (default: a temporary one): new, empty, or an earlier "
            "demo's, whose outputs are cleared first.",
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            metavar="MODEL",
            help="Run the same task with a real model instead of offline.",
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Catalogue 40 documents offline, on the embedded SQLite store, in under a minute."""
    from tether import demo as demo_mod
    from tether.runtime.tasks import create_task, status_dict
    from tether.runtime.wiring import check_task, open_runtime
    from tether.spec import load_spec, parse_spec

    keep = dir_ is not None
    model_name = model or OFFLINE_MODEL

    async def prepare() -> tuple[Path | None, list[Path]]:
        # Nothing is written before the model, the tools and the folder are checked.
        contract = parse_spec(demo_mod.spec_dict(), source=demo_mod.SPEC_FILE)
        await check_task(contract, model_name)
        if dir_ is None:
            return None, []
        folder = _demo_folder(dir_)
        try:
            return folder, await earlier_demo_files(dir_, folder)
        except OSError as exc:
            raise errors.UserError(f"--dir {dir_}: cannot use it ({exc.strerror or exc})") from None

    given, stale = run_async(prepare)
    try:
        if given is None:
            folder = Path(tempfile.mkdtemp("", "tether-demo-"))
        else:
            folder = given
            folder.mkdir(parents=True, exist_ok=True)
            _clear(folder, stale)
    except OSError as exc:
        raise fail(
            errors.UserError(f"--dir {dir_}: cannot use it ({exc.strerror or exc})"), 2
        ) from None
    demo_mod.make_documents(folder)
    spec_path = demo_mod.write_spec(folder)
    db_url = f"sqlite:///{folder / '.tether' / 'tether.db'}"
    t0 = time.monotonic()

    async def main() -> tuple[dict[str, Any], list[Any], bool]:
        contract = load_spec(spec_path)  # the file a person may run again with `tether run`
        async with open_runtime(db_url, model=model_name) as rt:
            task = await create_task(
                rt.store, contract, workspace=folder, launch=_launch(contract, model_name, folder)
            )
            if not json_out:
                out.print(
                    Text.assemble(
                        ("tether demo", "bold"),
                        f": cataloguing {demo_mod.N_DOCS} documents in {folder}\ntask ",
                        (task.task_id, "bold cyan"),
                        f", model {model_name}, store {db_url}",
                    )
                )
            result = await drive(rt, task.task_id, quiet=json_out, db=db_url)
            waiting = (await rt.store.get_task(task.task_id)).waiting or {}
            if not result.interrupted and waiting.get("kind") == "decision":
                # The demo plays the user: the corrupted scan is listed in summary.md, so
                # the team can be told; everything else must have been done.
                result = await _decide(rt, task.task_id, waiting, json_out, db_url) or result
            evs = await rt.store.read_events(task.task_id)
            return await status_dict(rt.store, task.task_id), evs, result.interrupted

    doc, evs, interrupted = run_async(main)
    wall = time.monotonic() - t0
    summary = demo_summary(doc, evs, wall, folder)
    if json_out:
        print_json({"status": doc, "summary": summary})
    elif interrupted:
        # Ctrl-C: the task is queued again, half done; a summary of "what happened"
        # would read as the demo's outcome. Say how to go on instead, as `run` does.
        out.print(views.status_view(doc, db_url) if not out.is_terminal else Text(""))
        out.print(Text(views.clean(_interrupted_hint(doc["task_id"], db_url)), "yellow"))
    else:
        out.print(views.status_view(doc) if not out.is_terminal else Text(""))
        out.print(views.summary_table(summary))
        out.print(
            f"\nSee it again: tether timeline {doc['task_id']} --db {db_url}"
            + ("" if keep else f"\n(the demo folder {folder} is temporary)")
        )
    if interrupted:
        raise typer.Exit(130)  # as `run`: the exit code the README gives an interruption
    if doc["status"] != "satisfied":
        raise typer.Exit(1)


def _interrupted_hint(task_id: str, db_url: str) -> str:
    """What a Ctrl-C'd demo says: how to go on (without the demo playing the user, the
    task then stops at the corrupted scan, waiting for a decision) or start again."""
    from tether import demo as demo_mod
    from tether.runtime import hints

    return (
        f"interrupted; continue with: {hints.resume(task_id, db_url)} (it then waits "
        f"for your decision on {demo_mod.BROKEN}), or run `tether demo` again"
    )


async def _decide(
    rt: Runtime, task_id: str, waiting: Mapping[str, Any], quiet: bool, db_url: str
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
    return await drive(rt, task_id, quiet=quiet, db=db_url)


def _launch(contract: Any, model_name: str, folder: Path) -> dict[str, Any]:
    """The demo task's launch record: `tether resume` runs it with the same model."""
    from tether.runtime import launch

    return launch.record(contract, model=model_name, workspace=str(folder))


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
        # A task stopped short of an end (Ctrl-C, a wait) has no stop reason to show.
        "result": f"{doc['status']} ({views.stop_text(doc)})"
        if doc.get("stop_reason")
        else str(doc["status"]),
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
