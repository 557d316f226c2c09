"""Changing a task: `edit` (a new version of its contract) and `tell` (a message)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from tether import errors
from tether.cli import views
from tether.cli._app import (
    ByOpt,
    DbOpt,
    TaskArg,
    app,
    on_store,
    out,
    repeated,
    run_async,
    with_store,
)
from tether.runtime import hints


def _item_edits(
    adds: list[str], sets: list[str]
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """`--add-item ID=TITLE|JSON` and `--item ID.FIELD=VALUE` as new items and changes
    by id."""
    from tether.approvals import parse_json_argument

    added: list[dict[str, Any]] = []
    for entry in adds:
        if entry.lstrip().startswith("{"):
            doc = parse_json_argument(entry, "--add-item")
            if not isinstance(doc, dict):
                raise errors.UserError("--add-item: expected ID=TITLE or a JSON object")
            added.append(doc)
            continue
        item_id, sep, title = entry.partition("=")
        if not sep or not item_id.strip() or not title.strip():
            raise errors.UserError(
                f"--add-item {entry!r}: expected ID=TITLE, e.g. summary='Write the summary'"
            )
        added.append({"id": item_id.strip(), "title": title.strip()})
    changed: dict[str, dict[str, Any]] = {}
    for entry in sets:
        path, sep, raw = entry.partition("=")
        item_id, dot, field = path.strip().rpartition(".")
        if not sep or not dot or not item_id or not field:
            raise errors.UserError(
                f"--item {entry!r}: expected ID.FIELD=VALUE, e.g. report.title='Q3 report'"
            )
        value = parse_json_argument(raw, f"--item {path}", text_fallback=True)
        changed.setdefault(item_id, {})[field] = value
    return added, changed


def _changes(sets: list[str], file: Path | None, *, required: bool = True) -> dict[str, Any]:
    """The partial spec: a YAML file's fields, then each `--set PATH=VALUE` over them."""
    from tether.approvals import parse_json_argument
    from tether.spec import load_document

    changes: dict[str, Any] = {}
    if file is not None:
        doc = load_document(file)
        if not isinstance(doc, dict):
            raise errors.UserError(f"{file}: expected a mapping of spec fields to change")
        changes.update(doc)
    for entry in sets:
        path, sep, raw = entry.partition("=")
        keys = [k for k in path.strip().split(".") if k]
        if not sep or not keys:
            raise errors.UserError(
                f"--set {entry!r}: expected FIELD=VALUE, e.g. limits.max_rounds=300"
            )
        value = parse_json_argument(raw, f"--set {path}", text_fallback=True)
        node = changes
        for key in keys[:-1]:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise errors.UserError(f"--set {path}: {key} is not a group of fields")
            node = child
        node[keys[-1]] = value
    if not changes and required:
        raise errors.UserError(
            "nothing to change: give --set FIELD=VALUE, --file CHANGES.yaml, --objective, "
            "--add-item, --remove-item, --item or --source ID=VERSION"
        )
    return changes


@app.command()
def edit(
    task_id: TaskArg,
    sets: Annotated[
        list[str] | None,
        repeated(
            "--set",
            "FIELD=VALUE",
            "FIELD=VALUE, a dotted path into the spec (VALUE as JSON, or plain text), "
            "e.g. --set limits.max_rounds=300 --set budget.money_usd=5",
        ),
    ] = None,
    file: Annotated[
        Path | None,
        typer.Option("--file", metavar="FILE", help="A YAML file with the spec fields to change."),
    ] = None,
    objective: Annotated[
        str | None, typer.Option("--objective", metavar="TEXT", help="The new objective.")
    ] = None,
    add_item: Annotated[
        list[str] | None,
        repeated("--add-item", "ID=TITLE", "ID=TITLE, or a JSON item with its done_when."),
    ] = None,
    remove_item: Annotated[
        list[str] | None, repeated("--remove-item", "ID", "The id of an item to drop.")
    ] = None,
    item: Annotated[
        list[str] | None,
        repeated(
            "--item",
            "ID.FIELD=VALUE",
            "ID.FIELD=VALUE: change one item (VALUE as JSON, or plain text), e.g. "
            '--item report.title="Write the Q3 report" --item report.done_when=\'{"kind": '
            '"file", "path": "out/q3.md"}\'',
        ),
    ] = None,
    source: Annotated[
        list[str] | None,
        repeated(
            "--source",
            "ID=VERSION",
            "ID=VERSION: a new version of a declared source (ID=VERSION@LOCATION "
            "also moves it); what depended on the old version is invalidated",
        ),
    ] = None,
    reason: Annotated[str, typer.Option("--reason", help="Why (journaled).")] = "",
    by: ByOpt = "cli",
    db: DbOpt = None,
) -> None:
    """Change a task's goal or constraints: a new version; a stopped task goes on, a
    running one takes it at its next round."""
    from tether.artifacts import source_changes
    from tether.edits import edit_task

    async def main() -> str:
        items = _item_edits(list(add_item or []), list(item or []))
        extra = {"objective": objective} if objective is not None else {}
        changes = _changes(
            list(sets or []), file, required=not (extra or items or remove_item or source)
        )
        changes.update(extra)
        before: list[str] = []  # the items the task had

        async def apply(store: Any) -> Any:
            before[:] = _item_ids((await store.get_task(task_id)).spec.get("items"))
            if source:
                changes.update(source_changes((await store.get_task(task_id)).spec, source))
            return await edit_task(
                store,
                task_id,
                changes,
                add_items=items[0],
                remove_items=list(remove_item or []),
                update_items=items[1],
                by=by,
                reason=reason,
            )

        task = await with_store(db, apply, create=False)
        if task.status == "running":
            # Not applied yet: the items it will have, from the edit itself.
            after = _item_ids(changes["items"]) if "items" in changes else before
            added = [i for i in _item_ids(items[0]) if i not in after]
            after = [i for i in [*after, *added] if i not in (remove_item or [])]
            return (
                f"edit queued: worker {task.lease_owner} applies it at its next round "
                f"boundary (task {task_id} is at version {task.version} until then)"
                f"{_items_told(before, after, 'will be ')}"
            )
        after = _item_ids(task.spec.get("items"))
        return (
            f"task {task_id} is at version {task.version} ({task.status})"
            f"{_items_told(before, after)}; continue with: {hints.resume(task_id, db)}"
        )

    out.print(Text(views.clean(run_async(main))))


def _item_ids(items: Any) -> list[str]:
    """The ids of a contract's `items` (a list of mappings), in order."""
    if not isinstance(items, list):
        return []
    return [str(i["id"]) for i in items if isinstance(i, dict) and "id" in i]


def _items_told(before: list[str], after: list[str], tense: str = "") -> str:
    """`; items dropped: ..., added: ...`, what an edit did to the ledger's items (an
    `items:` list replaces them all: the ones it does not name go, with their
    evidence), or nothing when it kept them."""
    dropped = [i for i in before if i not in after]
    added = [i for i in after if i not in before]
    told = []
    if dropped:
        told.append(f"items {tense}dropped (with their evidence): {', '.join(dropped)}")
    if added:
        told.append(f"items {tense}added: {', '.join(added)}")
    return "".join(f"; {t}" for t in told)


@app.command()
def tell(
    task_id: TaskArg,
    message: Annotated[str, typer.Argument(help="What to tell the agent.")],
    by: ByOpt = "cli",
    db: DbOpt = None,
) -> None:
    """Send the agent a message (an answer to its NEED_HELP, a correction)."""
    from tether.edits import tell as tell_task

    task = on_store(db, lambda s: tell_task(s, task_id, message, by=by))
    told = f"told task {task_id} ({task.status})"
    if task.status == "queued":
        told += f"; continue with: {hints.resume(task_id, db)}"
    out.print(Text(views.clean(told)))
