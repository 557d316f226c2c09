"""A SQLite database kept inside the workspace (`--db sqlite:///state.db` run from the
workspace folder) is out of the file tools' reach, as `.tether/` is: before the fix only
`.tether/` folders were refused, and the model could read every task's journal from
`state.db` (or write over it). The run itself goes on: only the tool call fails."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.support.loop import events_of, run_task
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.spec import parse_spec
from tether.store import open_store

SPEC: dict[str, Any] = {
    "objective": "look around",
    "items": [{"id": "i1", "title": "look"}],
    "tools": ["list_files", "read_file", "write_file", "append_file"],
    "models": {"judge": "rules"},
    "limits": {"no_progress_rounds": 50, "max_rounds": 4},
}

#: Names of the database the model may try: the file, its companions, a symlink and a
#: hard link the user left, and the absolute path.
ATTEMPTS = ["state.db", "./state.db", "state.db-wal", "state.db-shm", "link.db", "hard.db"]


async def test_the_file_tools_refuse_the_tasks_database_in_the_workspace(
    tmp_path: Path,
) -> None:
    db = tmp_path / "state.db"
    store = await open_store(f"sqlite:///{db}")
    try:
        (tmp_path / "link.db").symlink_to(db)
        os.link(db, tmp_path / "hard.db")
        (tmp_path / "notes.md").write_text("hello\n")
        names = [*ATTEMPTS, str(db)]
        calls = [tool_call("read_file", path=p) for p in names]
        calls += [tool_call("write_file", path=p, content="x") for p in names]
        calls += [tool_call("append_file", path="state.db-journal", content="x")]
        calls += [tool_call("list_files", path="."), tool_call("read_file", path="notes.md")]

        def policy(request: ModelRequest) -> ModelResponse:
            if any(m.role == "tool" for m in request.messages):
                return ModelResponse("NEED_HELP: done looking")
            return ModelResponse("look", tuple(calls))

        before = db.stat().st_ino
        tid, result = await run_task(
            store, parse_spec(SPEC), tmp_path, ScriptedModel(policy=policy)
        )

        assert result.status == "waiting"  # the run went on; the calls failed
        results = await events_of(store, tid, "op.result")
        # The error in full: the summary is cut at 200 characters, and a long temporary
        # folder (pytest-xdist adds one level) pushes the reason past the cut.
        by_call = [(r["tool"], r["status"], r.get("error") or r["summary"]) for r in results]
        refused = by_call[: len(calls) - 2]
        for tool, status, summary in refused:
            assert status != "succeeded", (tool, summary)
            assert "tether's own database" in summary, (tool, summary)
        listing, notes = by_call[-2:]
        assert listing[1] == "succeeded" and notes[1] == "succeeded"
        assert "notes.md" in listing[2] and "state.db" not in listing[2]
        assert "hello" in notes[2]
        assert not (tmp_path / "state.db-journal").exists()
        assert db.stat().st_ino == before  # never replaced
        assert (await store.get_task(tid)).task_id == tid
    finally:
        await store.close()
