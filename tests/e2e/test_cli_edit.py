"""`tether edit` and `tether tell` through the CLI."""

from __future__ import annotations

from pathlib import Path

from tests.support.cli import DONE, assert_clean_error, assert_ok, json_out, tether, write_spec


def _stopped(tmp_path: Path) -> str:
    spec = write_spec(tmp_path / "spec.yaml", 3, limits={"max_rounds": 1})
    ws = tmp_path / "ws"
    ws.mkdir()
    doc = json_out(tether("run", spec, "--model", DONE, "--workspace", ws, "--json", cwd=tmp_path))
    assert doc["status"] == "waiting" and "max_rounds" in doc["waiting"]["reason"]
    return str(doc["task_id"])


def test_edit_raises_a_limit_and_the_task_goes_on(tmp_path: Path) -> None:
    tid = _stopped(tmp_path)
    res = tether(
        "edit", tid, "--set", "limits.max_rounds=20", "--reason", "more room", cwd=tmp_path
    )
    assert_ok(res)
    assert "version 2" in res.stdout
    doc = json_out(tether("resume", tid, "--model", DONE, "--json", cwd=tmp_path))
    assert (doc["status"], doc["stop_reason"], doc["version"]) == ("satisfied", "delivered", 2)


def test_edit_from_a_file_and_bad_edits(tmp_path: Path) -> None:
    tid = _stopped(tmp_path)
    changes = tmp_path / "changes.yaml"
    changes.write_text("objective: Write the files, carefully\nlimits: {max_rounds: 30}\n")
    assert_ok(tether("edit", tid, "--file", changes, cwd=tmp_path))
    doc = json_out(tether("status", tid, "--json", cwd=tmp_path))
    assert doc["ledger"]["objective"] == "Write the files, carefully" and doc["version"] == 2
    before = doc
    for args in (
        ("--set", "limits.max_rounds=-3"),
        ("--set", "nonsense"),
        ("--set", "items=[]"),
        (),
    ):
        assert_clean_error(tether("edit", tid, *args, cwd=tmp_path), 2)
    after = json_out(tether("status", tid, "--json", cwd=tmp_path))
    assert after["version"] == before["version"] and after["ledger"] == before["ledger"]
    assert_clean_error(tether("edit", "t-nope", "--set", "limits.max_rounds=3", cwd=tmp_path), 3)


def test_tell_reaches_the_task(tmp_path: Path) -> None:
    tid = _stopped(tmp_path)
    assert_ok(tether("tell", tid, "the files go in out/", "--by", "ana", cwd=tmp_path))
    events = json_out(tether("events", tid, "--json", cwd=tmp_path))
    said = [e["data"] for e in events if e["type"] == "user.message"]
    assert said == [{"text": "the files go in out/", "by": "ana"}]
    assert_clean_error(tether("tell", tid, "   ", cwd=tmp_path), 2, "empty")


def test_edit_items_by_id_and_the_objective(tmp_path: Path) -> None:
    tid = _stopped(tmp_path)  # i1 done after its one round; i2, i3 open
    res = tether(
        "edit", tid,
        "--objective", "Write the files, and a summary",
        "--add-item", "summary=write out/summary.txt",
        "--remove-item", "i3",
        "--item", 'i1.done_when={"kind": "file", "path": "out/i1-again.txt"}',
        "--set", "limits.max_rounds=20",
        cwd=tmp_path,
    )  # fmt: skip
    assert_ok(res)
    doc = json_out(tether("status", tid, "--json", cwd=tmp_path))
    assert doc["version"] == 2 and doc["ledger"]["objective"] == "Write the files, and a summary"
    items = {i["id"]: i["status"] for i in doc["ledger"]["items"]}
    assert items == {"i1": "pending", "i2": "pending", "summary": "pending"}  # i1 changed
    events = json_out(tether("events", tid, "--json", cwd=tmp_path))
    (edited,) = [e["data"] for e in events if e["type"] == "task.edited"]
    assert edited["invalidated"] == ["i1"] and edited["by"] == "cli"
    for args in (("--remove-item", "nope"), ("--add-item", "no-title"), ("--item", "title=x")):
        assert_clean_error(tether("edit", tid, *args, cwd=tmp_path), 2)
    assert json_out(tether("status", tid, "--json", cwd=tmp_path))["version"] == 2
