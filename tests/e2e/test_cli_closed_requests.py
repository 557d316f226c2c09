"""Decisions close with what they decide about, through the real CLI: abandoning or
cancelling a task closes its pending approval; waiving the item whose write awaits
approval, or removing it by an edit, closes that request and the write is never sent;
`approve`/`reject` of a closed request exits 2 naming what closed it; and an approve
racing an abandon never leaves an approved request on the ended task.

The setup: two items, `out/i1.txt` exists before the task starts, so i1's write is an
overwrite that waits for a person; i2's write (a new file) needs no one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import (
    DONE,
    assert_clean_error,
    assert_ok,
    json_out,
    tether,
    tether_many,
    write_spec,
)

ACTOR = DONE
OLD = "the file that was there before\n"


def _waiting_on_approval(tmp_path: Path) -> tuple[str, str, Path]:
    """A task waiting for the approval of i1's overwrite: (task id, request id, ws)."""
    spec = write_spec(tmp_path / "spec.yaml", 2)
    ws = tmp_path / "ws"
    (ws / "out").mkdir(parents=True)
    (ws / "out" / "i1.txt").write_text(OLD, "utf-8")
    doc = json_out(tether("run", spec, "--model", ACTOR, "--workspace", ws, "--json", cwd=tmp_path))
    assert doc["status"] == "waiting", doc
    assert doc["waiting"]["kind"] == "approval", doc["waiting"]
    rid = doc["waiting"]["request_id"]
    return doc["task_id"], rid, ws


def _requests(tmp_path: Path, task_id: str) -> dict[str, dict[str, Any]]:
    rows = json_out(tether("approvals", task_id, "--json", cwd=tmp_path))
    return {r["request_id"]: r for r in rows}


def _closed_events(tmp_path: Path, task_id: str) -> list[dict[str, Any]]:
    events = json_out(tether("events", task_id, "--json", cwd=tmp_path))
    return [e["data"] for e in events if e["type"] == "approval.closed"]


def _consistent(tmp_path: Path, task_id: str) -> None:
    doc = json_out(tether("rebuild", task_id, "--json", cwd=tmp_path))
    assert doc["consistent"], doc


@pytest.mark.parametrize("verb", ["abandon", "cancel"])
def test_ending_the_task_closes_its_pending_approval(tmp_path: Path, verb: str) -> None:
    task_id, rid, ws = _waiting_on_approval(tmp_path)
    args = (
        ("abandon", task_id, "--reason", "no longer needed")
        if verb == "abandon"
        else (
            "cancel",
            task_id,
        )
    )
    assert_ok(tether(*args, cwd=tmp_path))
    req = _requests(tmp_path, task_id)[rid]
    assert req["status"] == "closed"
    word = "abandoned" if verb == "abandon" else "cancelled"
    assert req["decision"]["reason"].startswith(f"task {word}")
    (closed,) = _closed_events(tmp_path, task_id)
    assert closed["request_id"] == rid and closed["reason"].startswith(f"task {word}")
    # Deciding it now is a clear error naming what closed it, and changes nothing.
    for decide in (("approve", task_id, rid), ("reject", task_id, rid, "--reason", "x")):
        proc = tether(*decide, cwd=tmp_path)
        assert_clean_error(proc, 2, f"{rid} was closed", f"task {word}")
    assert _requests(tmp_path, task_id)[rid]["status"] == "closed"
    doc = json_out(tether("status", task_id, "--json", cwd=tmp_path))
    assert doc["status"] == word and doc["waiting"] is None
    assert (ws / "out" / "i1.txt").read_text("utf-8") == OLD
    _consistent(tmp_path, task_id)


def test_waiving_the_item_whose_write_awaits_approval_finishes_without_asking(
    tmp_path: Path,
) -> None:
    task_id, rid, ws = _waiting_on_approval(tmp_path)
    assert_ok(tether("waive", task_id, "i1", "--reason", "keep the old file", cwd=tmp_path))
    req = _requests(tmp_path, task_id)[rid]
    assert req["status"] == "closed"
    assert "item i1 waived" in req["decision"]["reason"]
    assert_clean_error(tether("approve", task_id, rid, cwd=tmp_path), 2, "item i1 waived")
    done = json_out(tether("resume", task_id, "--model", ACTOR, "--json", cwd=tmp_path))
    assert (done["status"], done["stop_reason"]) == ("satisfied", "delivered_with_waivers")
    # The overwrite was never sent; i2 was written; nobody was asked again.
    assert (ws / "out" / "i1.txt").read_text("utf-8") == OLD
    assert (ws / "out" / "i2.txt").read_text("utf-8") == "i2 done\n"
    events = json_out(tether("events", task_id, "--json", cwd=tmp_path))
    asked = [e["data"]["request_id"] for e in events if e["type"] == "approval.requested"]
    assert asked == [rid]
    op = rid.removesuffix(".approval")
    results = [e["data"] for e in events if e["type"] == "op.result" and e["data"]["op_id"] == op]
    assert results and results[-1]["status"] == "failed", results
    _consistent(tmp_path, task_id)


def test_an_edit_removing_the_item_closes_its_request(tmp_path: Path) -> None:
    task_id, rid, ws = _waiting_on_approval(tmp_path)
    assert_ok(tether("edit", task_id, "--remove-item", "i1", "--by", "ana", cwd=tmp_path))
    req = _requests(tmp_path, task_id)[rid]
    assert req["status"] == "closed"
    assert req["decision"]["reason"] == "item removed by edit v2 (ana)"
    (closed,) = _closed_events(tmp_path, task_id)
    assert closed == {
        "request_id": rid,
        "reason": "item removed by edit v2 (ana)",
        "by": "ana",
        "op_id": rid.removesuffix(".approval"),
        "previous": "pending",
    }
    assert_clean_error(tether("approve", task_id, rid, cwd=tmp_path), 2, "removed by edit v2")
    done = json_out(tether("resume", task_id, "--model", ACTOR, "--json", cwd=tmp_path))
    assert (done["status"], done["stop_reason"]) == ("satisfied", "delivered")
    assert (ws / "out" / "i1.txt").read_text("utf-8") == OLD
    _consistent(tmp_path, task_id)


def test_approve_racing_abandon_never_leaves_an_approved_request_on_the_ended_task(
    tmp_path: Path,
) -> None:
    outcomes = set()
    for n in range(3):
        folder = tmp_path / f"race{n}"
        folder.mkdir()
        task_id, rid, _ = _waiting_on_approval(folder)
        approve, abandon = tether_many(
            [
                (("approve", task_id, rid), folder),
                (("abandon", task_id, "--reason", "racing"), folder),
            ]
        )
        assert_ok(abandon)
        if approve.returncode == 0:
            outcomes.add("approve first")
        else:
            assert_clean_error(approve, 2, rid)
            outcomes.add("abandon first")
        req = _requests(folder, task_id)[rid]
        # Either way the request ends closed: approved first, it was never sent.
        assert req["status"] == "closed", (approve.returncode, req)
        assert json_out(tether("status", task_id, "--json", cwd=folder))["status"] == "abandoned"
        _consistent(folder, task_id)
    assert outcomes
