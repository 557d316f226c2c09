"""Looking back: `show` (a stored model call) and `report` (the retrospective)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Group
from rich.rule import Rule
from rich.text import Text

from tether import errors
from tether.cli._app import DbOpt, JsonOpt, TaskArg, app, on_store, out, print_json
from tether.cli.views import FittedTable, clean, clean_json_text, fitted_table, shorten, ts

if TYPE_CHECKING:
    from tether.store import Store


def _args(arguments: Any) -> str:
    return json.dumps(arguments, ensure_ascii=False, sort_keys=True)


def _message(m: Mapping[str, Any]) -> Text:
    head = f"[{m['role']}" + (f" {m['name']}" if m.get("name") else "")
    head += f" {m['tool_call_id']}]" if m.get("tool_call_id") else "]"
    text = Text(clean(head), "bold")
    text.append("\n" + clean(m.get("content", ""), lines=True))
    for call in m.get("tool_calls", []):
        text.append(f"\n  → {clean(call['name'])}({clean(_args(call.get('arguments')))})", "cyan")
    return text


def call_view(doc: Mapping[str, Any]) -> Group:
    """`show TASK CALL_ID`: the call's figures, the request as sent, the response."""
    c, req, resp = doc["call"], doc["request"], doc["response"]
    head = Text.assemble(
        ("call ", "bold"),
        (clean(c["call_id"]), "bold cyan"),
        f"  {clean(c['purpose'])}  {clean(c['model'])}  round {c['round'] or '-'}  "
        f"{c['input_tokens']} in ({c['cached_tokens']} cached) / {c['output_tokens']} out  "
        f"${c['cost_usd']:.4f}  {ts(c['at'])}",
    )
    parts: list[Any] = [head, Rule("system"), Text(clean(req["system"], lines=True))]
    parts.append(Rule(f"messages ({len(req['messages'])})"))
    parts += [_message(m) for m in req["messages"]]
    if req.get("tools"):
        parts.append(Rule("tools"))
        parts.append(Text(clean(", ".join(t["name"] for t in req["tools"]))))
    parts.append(Rule("response"))
    parts.append(_message({"role": "assistant", **resp, "content": resp.get("text", "")}))
    return Group(*parts)


def calls_table(task_id: str, rows: list[dict[str, Any]]) -> FittedTable:
    """`show TASK`: every model call, one line each (ids without the task's, whole)."""
    cells = [
        (
            Text(clean(r["call_id"].removeprefix(f"{task_id}."))),
            Text(clean(r["purpose"])),
            str(r["round"] if r["round"] is not None else "-"),
            f"{r['input_tokens']}/{r['output_tokens']}",
            f"${r['cost_usd']:.4f}",
            Text(clean(shorten(r["summary"], 80))),
        )
        for r in rows
    ]
    kinds = ("id", "id", "id", "id", "id", "fold")
    heads = ("call", "purpose", "round", "tokens in/out", "cost", "summary")
    return fitted_table(list(zip(heads, kinds, strict=True)), cells)


@app.command()
def show(
    task_id: TaskArg,
    call_id: Annotated[
        str | None,
        typer.Argument(help="A model call (TASK.act.3, act.3 or 3); without it, list them."),
    ] = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Print a stored model call: the request as the model saw it and its response."""
    from tether.report.calls import list_calls, show_call

    doc: Any = on_store(
        db,
        lambda s: list_calls(s, task_id) if call_id is None else show_call(s, task_id, call_id),
        read_only=True,
    )
    if json_out:
        print_json(doc)
    elif call_id is None and not doc:
        out.print(f"task {clean(task_id)} has made no model call yet")
    elif call_id is None:
        out.print(calls_table(task_id, doc))
    else:
        out.print(call_view(doc))


FORMATS = ("md", "html", "json")
#: The format a report written to a file of this suffix takes, without --format.
SUFFIX_FORMATS = {".md": "md", ".markdown": "md", ".html": "html", ".htm": "html", ".json": "json"}


@app.command()
def report(
    task_id: TaskArg,
    fmt: Annotated[
        str | None,
        typer.Option(
            "--format",
            metavar="md|html|json",
            help="md (Markdown), html (one file that opens offline; its charts need the "
            "report extra) or json (as --json). Default: md, or with -o, the file's "
            "suffix (.html, .json, .md).",
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", metavar="FILE", help="Write to this file instead."),
    ] = None,
    db: DbOpt = None,
    execution: Annotated[
        bool,
        typer.Option(
            "--execution",
            help="The execution report: steps, evidence, waivers, deviations, cost.",
        ),
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """The retrospective report of a task: time, rounds, spending, failures, people (with
    --execution: what the run did to reach its goal, as a sign-off shows it)."""
    from tether.report import build_report
    from tether.report.render import render

    if fmt is None:
        suffix = output.suffix.lower() if output is not None and not execution else ""
        fmt = SUFFIX_FORMATS.get(suffix, "md")
    if fmt not in FORMATS:
        raise errors_exit(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if json_out:
        fmt = "json"
    if execution:
        _execution_report(task_id, db, fmt, output)
        return

    async def rendered(store: Store) -> str:
        return render(await build_report(store, task_id), fmt)

    text = on_store(db, rendered, read_only=True)
    if output is None:
        # On the terminal, nothing in the report (task names, model text) may act on
        # it: JSON keeps its escapes valid, md and html show controls escaped.
        text = clean_json_text(text) if fmt == "json" else clean(text, lines=True)
        out.file.write(text if text.endswith("\n") else text + "\n")
    else:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise errors_exit(f"cannot write {output}: {exc.strerror or exc}") from None
        out.print(Text(f"report written to {clean(output)}"))
    if fmt == "html":
        _say_when_charts_are_missing()


def _execution_report(task_id: str, db: str | None, fmt: str, output: Path | None) -> None:
    from tether.report.execution import build_execution, render_text

    if fmt == "html":
        raise errors_exit("--execution is text (the default) or json (--json)")
    if output is not None:
        raise errors_exit("--execution prints the report; redirect it to a file")

    doc = on_store(db, lambda s: build_execution(s, task_id), read_only=True)
    if fmt == "json":
        print_json(doc)
        return
    out.file.write(clean(render_text(doc, out.width), lines=True))


def _say_when_charts_are_missing() -> None:
    """The html report without matplotlib has a note where the charts go; the person who
    asked for it hears it too, in one line on stderr with the install command."""
    from tether._extras import install_hint
    from tether.cli._app import err
    from tether.report import charts

    if not charts.available():
        err.print(
            Text(
                "tether: the report's charts need the report extra (matplotlib is not "
                f"installed): {install_hint('report')}"
            )
        )


def errors_exit(message: str) -> typer.Exit:
    """A bad-input exit (2) with `message`."""
    from tether.cli._app import fail

    return fail(errors.UserError(message), 2)
