"""NEED_HELP through the CLI: `status` shows the model's question, `tether tell`
answers it, and the task continues with the answer in its next request."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.people_policies import QUESTION
from tests.support.cli import assert_ok, json_out, tether, write_spec

ASKS = "scripted:tests.e2e.people_policies:asks_first"


def test_need_help_is_shown_answered_and_the_answer_used(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "spec.yaml", 1)
    ws = tmp_path / "ws"
    ws.mkdir()
    doc = json_out(tether("run", spec, "--model", ASKS, "--workspace", ws, "--json", cwd=tmp_path))
    tid = str(doc["task_id"])
    assert doc["status"] == "waiting" and doc["waiting"]["kind"] == "human"
    shown = tether("status", tid, cwd=tmp_path)
    assert_ok(shown)
    assert QUESTION in " ".join(shown.stdout.split())  # the question, as the model asked

    assert_ok(tether("tell", tid, "It is for ACME Corp.", "--by", "ana", cwd=tmp_path))
    done = json_out(tether("resume", tid, "--model", ASKS, "--json", cwd=tmp_path))
    assert done["status"] == "satisfied"
    written = (ws / "out" / "i1.txt").read_text()
    assert "It is for ACME Corp." in written
