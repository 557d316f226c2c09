"""`read_file` refuses a declared source's location and names the `read_source` call to
make instead, so every read of a source records the version it saw (and pins it); any
other file reads as before. On every store."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from tether import artifacts as A
from tether import errors
from tether.edits import edit_task
from tether.runtime.tasks import create_task
from tether.spec import parse_spec
from tether.store.base import Store
from tether.tools.builtin import files as builtins
from tether.tools.builtin.files import default_registry
from tether.tools.registry import ToolContext


async def _setup(store: Store, ws: Path) -> tuple[str, ToolContext]:
    (ws / "docs").mkdir()
    (ws / "docs" / "b-2.0.md").write_text("B costs 35 euros.\n")
    (ws / "docs" / "b-3.0.md").write_text("B costs 40 euros.\n")
    (ws / "notes.md").write_text("my notes\n")
    spec = parse_spec(
        {
            "objective": "o",
            "items": [{"id": "i", "title": "t"}],
            "sources": [
                {"id": "B", "version": "2.0", "location": "docs/b-2.0.md"},
                {
                    "id": "U",
                    "kind": "url",
                    "version": "1",
                    "location": "http://127.0.0.1:9/notes.md",
                },
            ],
        }
    )
    task = await create_task(store, spec, workspace=ws)
    return task.task_id, _ctx(task.task_id, 1, ws)


def _ctx(task_id: str, version: int, ws: Path) -> ToolContext:
    return ToolContext(
        op_id=f"{task_id}.r1.c0",
        task_id=task_id,
        task_version=version,
        fencing_token=0,
        workspace=ws,
        logger=logging.getLogger("test"),
    )


async def test_read_file_refuses_a_declared_source_by_any_name(
    store: Store, tmp_path: Path
) -> None:
    tid, ctx = await _setup(store, tmp_path)
    read = default_registry(lambda: store).get("read_file")
    assert read is not None
    (tmp_path / "link.md").symlink_to(tmp_path / "docs" / "b-2.0.md")
    os.link(tmp_path / "docs" / "b-2.0.md", tmp_path / "hard.md")
    for path in (
        "docs/b-2.0.md",
        "./docs/../docs/b-2.0.md",
        str(tmp_path / "docs" / "b-2.0.md"),
        "link.md",
        "hard.md",
    ):
        with pytest.raises(errors.ToolFailed) as exc:
            await read.fn({"path": path}, ctx)
        assert 'read_source(source="B")' in str(exc.value), path
    # Anything else reads as before, a url source's path included.
    assert "my notes" in str(await read.fn({"path": "notes.md"}, ctx))
    assert "40 euros" in str(await read.fn({"path": "docs/b-3.0.md"}, ctx))
    with pytest.raises(errors.ToolFailed, match="no such file"):
        await read.fn({"path": "missing.md"}, ctx)
    with pytest.raises(errors.ToolFailed, match="not permitted"):
        await read.fn({"path": "../outside.md"}, ctx)

    # The contract moves B to 3.0: the new location is the source, the old one a file.
    task = await store.get_task(tid)
    await edit_task(store, tid, A.source_changes(task.spec, ["B=3.0@docs/b-3.0.md"]))
    ctx2 = _ctx(tid, 2, tmp_path)
    assert "35 euros" in str(await read.fn({"path": "docs/b-2.0.md"}, ctx2))
    with pytest.raises(errors.ToolFailed, match="is source B"):
        await read.fn({"path": "docs/b-3.0.md"}, ctx2)


async def test_without_sources_read_file_is_unchanged(store: Store, tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("hello\n")
    task = await create_task(
        store,
        parse_spec({"objective": "o", "items": [{"id": "i", "title": "t"}]}),
        workspace=tmp_path,
    )
    read = default_registry(lambda: store).get("read_file")
    assert read is not None
    assert "hello" in str(await read.fn({"path": "a.md"}, _ctx(task.task_id, 1, tmp_path)))


def test_the_guarded_read_file_shows_the_model_the_same_tool() -> None:
    guarded = default_registry(lambda: None).get("read_file")  # type: ignore[arg-type,return-value]
    assert guarded is not None and guarded is not builtins.read_file
    assert guarded.schema() == builtins.read_file.schema()
    assert (guarded.effect, guarded.idempotent) == (
        builtins.read_file.effect,
        builtins.read_file.idempotent,
    )
