"""`tether replay`: run a task's rounds again from its recording and check the decisions."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.text import Text

from tether.cli._app import DbOpt, JsonOpt, TaskArg, app, on_store, out, print_json
from tether.cli.views import clean


def _side(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, indent=2)


def replay_view(doc: dict[str, Any]) -> Text:
    """The result of a replay: how many rounds matched, or the first divergence."""
    text = Text()
    d = doc["divergence"]
    if d is None:
        text.append("replay matched", "bold green")
        text.append(
            f": {doc['rounds_matched']} rounds, {doc['events_compared']} events "
            f"up to event {doc['until']}\n"
        )
    else:
        where = f"round {d['round']}" if d["round"] is not None else "the end"
        at = f", event {d['seq']}" if d["seq"] is not None else ""
        text.append(f"replay diverged at {where}{at}", "bold red")
        text.append(f": {clean(d['what'])}\n")
        text.append(f"after {doc['rounds_matched']} matching rounds\n")
        text.append("recorded:\n", "bold")
        text.append(clean(_side(d["recorded"]), lines=True) + "\n")
        text.append("replayed:\n", "bold")
        text.append(clean(_side(d["replayed"]), lines=True) + "\n")
    if doc["stopped_at"]:
        text.append(f"stopped before {clean(doc['stopped_at'])}\n", "yellow")
    text.append("not checked: " + "; ".join(doc["limits"]), "dim")
    return text


@app.command()
def replay(
    task_id: TaskArg,
    until: Annotated[
        int | None,
        typer.Option(
            "--until", metavar="SEQ", help="Replay up to this event SEQ (default: the whole log)."
        ),
    ] = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Re-run a task's rounds from the recorded model answers and tool results (no side
    effects) and check that the runtime makes the decisions it recorded; exits 1 at the
    first divergence."""
    from tether.report.replay import replay_task

    doc = on_store(db, lambda s: replay_task(s, task_id, until=until), read_only=True).to_dict()
    if json_out:
        print_json(doc)
    else:
        out.print(replay_view(doc))
    if doc["divergence"] is not None:
        raise typer.Exit(1)
