"""A human's decisions through the CLI: a task with a blocked item waits for one, then
`retry` (with a hint the model sees), `waive` or `abandon` decide how it ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import assert_clean_error, assert_ok, json_out, tether, write_spec

ACTOR = "scripted:tests.e2e.decision_policies:stubborn"


def _waiting_task(tmp_path: Path) -> tuple[str, Any]:
    spec = write_spec(tmp_path / "spec.yaml", 3, limits={"no_progress_rounds": 2})
    ws = tmp_path / "ws"
    ws.mkdir()
    doc = json_out(tether("run", spec, "--model", ACTOR, "--workspace", ws, "--json", cwd=tmp_path))
    return doc["task_id"], doc


def test_a_blocked_item_waits_for_a_decision_with_the_partial_record(tmp_path: Path) -> None:
    task_id, doc = _waiting_task(tmp_path)
    assert doc["status"] == "waiting" and doc["stop_reason"] is None
    waiting = doc["waiting"]
    assert waiting["kind"] == "decision"
    partial = waiting["partial"]
    assert [d["id"] for d in partial["done"]] == ["i1", "i3"]
    assert [b["id"] for b in partial["blocked"]] == ["i2"]
    assert "no progress" in partial["blocked"][0]["reason"]
    assert partial["remaining"] == []
    statuses = {i["id"]: i["status"] for i in doc["ledger"]["items"]}
    assert statuses == {"i1": "done", "i2": "blocked", "i3": "done"}
    text = tether("status", task_id, cwd=tmp_path)
    assert_ok(text)
    assert "partial completion: 2 done" in text.stdout
    assert "blocked i2" in text.stdout
    assert f"tether waive {task_id}" in text.stdout


def test_retry_with_a_hint_then_resume_delivers(tmp_path: Path) -> None:
    task_id, _ = _waiting_task(tmp_path)
    out = tether("retry", task_id, "i2", "--hint", "write out/i2.txt like the others", cwd=tmp_path)
    assert_ok(out)
    assert "pending again" in out.stdout
    doc = json_out(tether("status", task_id, "--json", cwd=tmp_path))
    assert doc["status"] == "queued"
    i2 = next(i for i in doc["ledger"]["items"] if i["id"] == "i2")
    assert (i2["status"], i2["attempts"], i2["breaker"]) == ("pending", 0, 0)
    done = json_out(tether("resume", task_id, "--model", ACTOR, "--json", cwd=tmp_path))
    assert (done["status"], done["stop_reason"]) == ("satisfied", "delivered")
    assert done["waivers"] == []
    events = json_out(tether("events", task_id, "--json", cwd=tmp_path))
    retried = [e["data"] for e in events if e["type"] == "item.retried"]
    assert retried == [
        {
            "item": "i2",
            "by": "cli",
            "hint": "write out/i2.txt like the others",
            "previous": "blocked",
        }
    ]


def test_waive_then_resume_delivers_with_waivers(tmp_path: Path) -> None:
    task_id, _ = _waiting_task(tmp_path)
    assert_ok(tether("waive", task_id, "i2", "--reason", "not needed", "--by", "ana", cwd=tmp_path))
    done = json_out(tether("resume", task_id, "--model", ACTOR, "--json", cwd=tmp_path))
    assert (done["status"], done["stop_reason"]) == ("satisfied", "delivered_with_waivers")
    assert [(w["id"], w["status"]) for w in done["waivers"]] == [("i2", "waived")]
    assert "ana" in done["waivers"][0]["reason"] and "not needed" in done["waivers"][0]["reason"]
    text = tether("status", task_id, cwd=tmp_path)
    assert "delivered_with_waivers: i2" in text.stdout


def test_abandon_ends_the_task(tmp_path: Path) -> None:
    task_id, _ = _waiting_task(tmp_path)
    assert_ok(tether("abandon", task_id, "--reason", "the source is gone", cwd=tmp_path))
    doc = json_out(tether("status", task_id, "--json", cwd=tmp_path))
    assert (doc["status"], doc["stop_reason"]) == ("abandoned", "abandoned_by_user")
    again = tether("abandon", task_id, "--reason", "twice", cwd=tmp_path)
    assert_clean_error(again, 2, "abandoned")


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (("waive", "{task}", "i2"), 2, "reason"),
        (("waive", "{task}", "nope", "--reason", "x"), 2, "no item"),
        (("retry", "{task}", "i1"), 2, "done"),
        (("abandon", "{task}"), 2, "reason"),
        (("retry", "t-unknown", "i1"), 3, "t-unknown"),
    ],
)
def test_bad_decisions_are_clear_errors_and_change_nothing(
    tmp_path: Path, args: tuple[str, ...], code: int, needle: str
) -> None:
    task_id, before = _waiting_task(tmp_path)
    proc = tether(*(a.format(task=task_id) for a in args), cwd=tmp_path)
    assert_clean_error(proc, code, needle)
    after = json_out(tether("status", task_id, "--json", cwd=tmp_path))
    assert after["ledger"] == before["ledger"] and after["status"] == before["status"]
