"""`tether replay` follows every run the recording holds, through the real CLI: a task
that stopped waiting for a person (a decision on a blocked item, an approval) and was
then resumed with nothing answered — once, three times, with `--force` — went back to
its wait each time, and each of those runs is in the log; so are an answered `tell`, a
worker's claim, an abandon and an edit. The replay matches (exit 0) over all of them
(an edit, which replay does not take, ends it there without a divergence)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e import web_policies
from tests.support.cli import (
    DONE,
    assert_clean_error,
    assert_ok,
    describe,
    json_out,
    tether,
    write_spec,
)

STUBBORN = "scripted:tests.e2e.decision_policies:stubborn"
ASKS = "scripted:tests.e2e.people_policies:asks_first"

#: What each case does after `tether run` stopped waiting: (command, args...) with
#: `{t}` for the task id and `{a}` for the approval request's id.
SHAPES: dict[str, list[tuple[str, ...]]] = {
    "resume_changing_nothing": [("resume", "{t}")],
    "three_resumes_in_a_row": [("resume", "{t}"), ("resume", "{t}"), ("resume", "{t}")],
    "resume_force": [("resume", "{t}", "--force")],
    "resume_after_an_answered_tell": [
        ("resume", "{t}"),
        ("tell", "{t}", "About item i2: write it like the others"),
        ("resume", "{t}"),
    ],
    "resume_then_waive_then_resume": [
        ("resume", "{t}"),
        ("waive", "{t}", "i2", "--reason", "not needed"),
        ("resume", "{t}"),
    ],
    "resume_then_waive_then_a_worker": [
        ("resume", "{t}"),
        ("waive", "{t}", "i2", "--reason", "not needed"),
        ("worker", "--once", "--quiet"),
    ],
    "resume_then_abandon": [("resume", "{t}"), ("abandon", "{t}", "--reason", "gone")],
    "resume_then_cancel": [("resume", "{t}"), ("cancel", "{t}")],
}
#: The same for a task waiting for an approval (an overwrite of the user's file).
APPROVAL_SHAPES: dict[str, list[tuple[str, ...]]] = {
    "resume_changing_nothing": [("resume", "{t}")],
    "two_resumes_then_approve_then_resume": [
        ("resume", "{t}"),
        ("resume", "{t}"),
        ("approve", "{t}", "{a}"),
        ("resume", "{t}"),
    ],
}


#: The same for a task whose model asked a question (NEED_HELP) nobody answered yet.
QUESTION_SHAPES: dict[str, list[tuple[str, ...]]] = {
    "resume_then_an_answering_tell_then_resume": [
        ("resume", "{t}"),
        ("tell", "{t}", "for ACME"),
        ("resume", "{t}"),
    ],
}
KINDS = {"decision": SHAPES, "approval": APPROVAL_SHAPES, "question": QUESTION_SHAPES}


def _waiting(tmp_path: Path, kind: str) -> tuple[str, Any]:
    ws = tmp_path / "ws"
    ws.mkdir()
    if kind == "decision":
        spec = write_spec(tmp_path / "spec.yaml", 3, limits={"no_progress_rounds": 2})
        model = STUBBORN
    elif kind == "question":
        spec = write_spec(tmp_path / "spec.yaml", 2)
        model = ASKS
    else:
        web_policies.prepare(ws)  # out/i2.txt exists: writing it waits for approval
        spec = write_spec(tmp_path / "spec.yaml", 3)
        model = DONE
    doc = json_out(tether("run", spec, "--model", model, "--workspace", ws, "--json", cwd=tmp_path))
    assert doc["status"] == "waiting", doc
    return doc["task_id"], doc


def _replay(task_id: str, cwd: Path) -> dict[str, Any]:
    proc = tether("replay", task_id, "--json", cwd=cwd)
    assert proc.returncode == 0, describe(proc)
    doc: dict[str, Any] = json_out(proc)
    return doc


def _play(tmp_path: Path, kind: str, steps: list[tuple[str, ...]]) -> str:
    task_id, doc = _waiting(tmp_path, kind)
    request = (doc.get("waiting") or {}).get("request_id", "")
    for step in steps:
        args = [a.format(t=task_id, a=request) for a in step]
        assert_ok(tether(*args, cwd=tmp_path, timeout=120))
    return task_id


def _events(task_id: str, cwd: Path) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = json_out(tether("events", task_id, "--json", cwd=cwd))
    return events


def _count(events: list[dict[str, Any]], type_: str) -> int:
    return sum(1 for e in events if e["type"] == type_)


def _compared(events: list[dict[str, Any]]) -> int:
    """The events replay compares: all but lease bookkeeping and notices sent."""
    return sum(
        1 for e in events if not e["type"].startswith("lease.") and e["type"] != "notice.sent"
    )


@pytest.mark.parametrize(
    ("kind", "shape"),
    [(kind, shape) for kind, shapes in KINDS.items() for shape in shapes],
)
def test_replay_matches_after_resumes(tmp_path: Path, kind: str, shape: str) -> None:
    steps = KINDS[kind][shape]
    task_id = _play(tmp_path, kind, steps)
    events = _events(task_id, tmp_path)
    # Every resume (and the worker's claim) is a run of its own in the log.
    runs = sum(1 for s in steps if s[0] in ("resume", "worker"))
    assert _count(events, "recovery.started") == runs
    doc = _replay(task_id, tmp_path)
    assert doc["ok"] and doc["divergence"] is None, doc
    assert doc["stopped_at"] is None, doc
    assert doc["until"] == events[-1]["seq"], doc
    assert doc["events_compared"] == _compared(events), doc
    assert doc["rounds_matched"] == _count(events, "round.committed") >= 1, doc


def _edited(tmp_path: Path, *change: str) -> str:
    """A waiting task resumed with nothing answered, edited (which queues it again) and
    resumed again."""
    task_id, _ = _waiting(tmp_path, "decision")
    assert_ok(tether("resume", task_id, cwd=tmp_path))
    assert_ok(tether("edit", task_id, *change, "--reason", "go on", cwd=tmp_path))
    assert json_out(tether("status", task_id, "--json", cwd=tmp_path))["status"] == "queued"
    assert_ok(tether("resume", task_id, cwd=tmp_path))
    return task_id


def test_replay_stops_before_an_edit_the_earlier_rounds_do_not_feel(tmp_path: Path) -> None:
    task_id = _edited(tmp_path, "--set", "limits.max_rounds=300")
    events = _events(task_id, tmp_path)
    edit = next(e["seq"] for e in events if e["type"] == "task.edited")
    doc = _replay(task_id, tmp_path)
    assert doc["ok"] and doc["divergence"] is None, doc
    assert doc["stopped_at"].startswith(f"event {edit}: task.edited"), doc
    assert doc["until"] == edit - 1, doc
    assert doc["events_compared"] == _compared([e for e in events if e["seq"] < edit]), doc


def test_replay_refuses_rounds_that_ran_under_a_contract_an_edit_replaced(
    tmp_path: Path,
) -> None:
    task_id = _edited(tmp_path, "--remove-item", "i2")
    # Only the edited contract (without i2) is stored: the first rounds cannot be run
    # again under the one they ran under. That is said, not passed off as a divergence.
    assert_clean_error(tether("replay", task_id, cwd=tmp_path), 2, "goal edit", "contract")
