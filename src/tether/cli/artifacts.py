"""`tether artifacts TASK`: a task's artifacts and what each depends on."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.text import Text
from rich.tree import Tree

from tether.cli import views
from tether.cli._app import DbOpt, JsonOpt, TaskArg, app, on_store, out, print_json
from tether.cli.views import clean


def _label(node: dict[str, Any]) -> Text:
    # Built as Text, not markup: the console prints markup as-is, and ids, names and
    # reasons come from models and tools (`clean` escapes their control characters).
    label = Text(clean(node["artifact_id"]), overflow="fold")
    label.append(f" {clean(node['kind'])}", style="dim")
    label.append(f" {clean(node['name'])}")
    if not node["valid"]:
        label.append(f" invalid: {clean(node['invalid_reason'])}", style="red")
    return label


def _grow(branch: Tree, node: dict[str, Any]) -> None:
    for child in node["children"]:
        _grow(branch.add(_label(child)), child)


@app.command()
def artifacts(
    task_id: TaskArg,
    tree: Annotated[
        bool, typer.Option("--tree", help="Show the dependency graph as a tree.")
    ] = False,
    invalid: Annotated[
        bool, typer.Option("--invalid", help="Only invalidated artifacts (history).")
    ] = False,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """A task's artifacts (sources read, evidence, claims, report sections) with their
    dependencies; invalidated ones are history, never current."""
    from tether import artifacts as A

    async def read(store: Any) -> list[Any]:
        await store.get_task(task_id)  # an unknown task is exit 3
        return list(await store.get_artifacts(task_id))

    arts = on_store(db, read, read_only=True)
    if invalid:
        arts = [a for a in arts if not a.valid]
    if json_out:
        print_json(A.tree(arts) if tree else [A.describe(a) for a in arts])
        return
    if not arts:
        out.print("no artifacts" + (" are invalid" if invalid else ""))
        return
    if tree:
        root = Tree(Text(f"artifacts of {clean(task_id)}"))
        for node in A.tree(arts):
            _grow(root.add(_label(node)), node)
        out.print(root, soft_wrap=False)  # labels wrap under their branch, never cut
        return
    rows = [
        tuple(
            Text(clean(c))
            for c in (
                a.artifact_id,
                a.kind,
                a.name,
                ", ".join(a.deps),
                "yes" if a.valid else f"no: {A.describe(a)['invalid_reason']}",
            )
        )
        for a in arts
    ]
    columns = [("artifact", "id"), ("kind", "id"), ("name", "text"), ("depends on", "text")]
    out.print(views.fitted_table([*columns, ("valid", "text")], rows))
