"""By default the workspace is the current folder and the SQLite database lives in its
`.tether/`: a model must not read it (every task's journal is in there) nor write into
it (a bogus journal or WAL file, or the database itself, would corrupt every task), by
any name."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from tether import errors
from tether.runtime.tasks import create_task
from tether.spec import parse_spec
from tether.store import open_store
from tether.tools.builtin.files import default_registry
from tether.tools.registry import ToolContext


async def test_file_tools_never_reach_tethers_own_state(tmp_path: Path) -> None:
    (tmp_path / ".tether").mkdir()
    db = tmp_path / ".tether" / "tether.db"
    store = await open_store(f"sqlite:///{db}")
    try:
        spec = parse_spec({"objective": "o", "items": [{"id": "i", "title": "t"}]})
        task = await create_task(store, spec, workspace=tmp_path)
        (tmp_path / "db").symlink_to(db)  # a link the user left there
        (tmp_path / "sub").mkdir()
        reg = default_registry(lambda: store)
        ctx = ToolContext(
            op_id=f"{task.task_id}.r1.c0",
            task_id=task.task_id,
            task_version=1,
            fencing_token=0,
            workspace=tmp_path,
            logger=logging.getLogger("test"),
        )

        async def call(name: str, **args: object) -> str:
            tool = reg.get(name)
            assert tool is not None
            return str(await tool.fn(tool.check_args(args), ctx))

        before = {p: p.stat().st_size for p in (tmp_path / ".tether").iterdir()}
        names = [".tether/tether.db", "./.tether//tether.db", "sub/../.tether/tether.db"]
        names += [str(db), "db"]
        for path in names:
            with pytest.raises(errors.ToolFailed, match="tether's own state"):
                await call("read_file", path=path)
        for path in [*names, ".tether/tether.db-journal", ".tether/x/new.md"]:
            for tool in ("write_file", "append_file"):
                with pytest.raises(errors.ToolFailed, match="tether's own state"):
                    await call(tool, path=path, content="x")
        for path in (".tether", "./.tether/"):
            with pytest.raises(errors.ToolFailed, match="tether's own state"):
                await call("list_files", path=path)
        assert sorted(os.listdir(tmp_path / ".tether")) == sorted(p.name for p in before)
        # The rest of the workspace works as before.
        assert "created notes.md" in await call("write_file", path="notes.md", content="n\n")
        assert "n" in await call("read_file", path="notes.md")
        assert (await store.get_task(task.task_id)).task_id == task.task_id
    finally:
        await store.close()
