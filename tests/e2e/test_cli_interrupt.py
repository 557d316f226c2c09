"""Ctrl-C during `tether run` stops cleanly between steps, and `tether resume` finishes.

`tether run` works through 30 items with a slow scripted policy (0.2 s per model call),
so it cannot finish for several seconds; once its first round has written a file the
test sends SIGINT. The run must exit 130 with the task `queued` (resumable, lease
released), the log ending on a whole round; `tether resume` with a fast policy then
delivers it without repeating any side effect.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import (
    FAST,
    SLOW,
    assert_ok,
    json_out,
    popen_tether,
    tether,
    tether_many,
    wait_for_file,
    write_spec,
)

N_ITEMS = 30
GATED = "scripted:tests.e2e.policies:gated_policy"


def _interrupt(folder: Path, *, presses: int) -> tuple[int, str, str]:
    """Start a slow run in `folder`, press Ctrl-C `presses` times after its first round
    wrote a file; (exit code, stdout, stderr)."""
    write_spec(folder / "spec.yaml", N_ITEMS, name="slow-thirty")
    proc = popen_tether("run", "spec.yaml", "--model", SLOW, cwd=folder)
    try:
        wait_for_file(folder / "out" / "i1.txt", proc)
        for n in range(presses):
            if n:
                time.sleep(0.02)
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


def _task_id(folder: Path) -> str:
    tasks = json_out(tether("list", "--json", cwd=folder))
    assert len(tasks) == 1
    return str(tasks[0]["task_id"])


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One Ctrl-C, the state right after it, then `tether resume` with a fast policy."""
    folder = tmp_path_factory.mktemp("interrupt")
    code, out, err = _interrupt(folder, presses=1)
    tid = _task_id(folder)
    status_p, events_p = tether_many(
        [(("status", tid, "--json"), folder), (("events", tid, "--json"), folder)]
    )
    files_then = sorted(p.name for p in (folder / "out").iterdir())
    resumed = tether("resume", tid, "--model", FAST, "--json", cwd=folder)
    final_p, all_events_p = tether_many(
        [(("status", tid, "--json"), folder), (("events", tid, "--json"), folder)]
    )
    return {
        "folder": folder,
        "task_id": tid,
        "code": code,
        "stdout": out,
        "stderr": err,
        "status": json_out(status_p),
        "events": json_out(events_p),
        "files_then": files_then,
        "resumed": resumed,
        "final": json_out(final_p),
        "all_events": json_out(all_events_p),
    }


def test_ctrl_c_exits_130_and_says_how_to_resume(interrupted: dict[str, Any]) -> None:
    assert interrupted["code"] == 130, interrupted["stderr"]
    assert "Traceback" not in interrupted["stderr"]
    assert f"tether resume {interrupted['task_id']}" in interrupted["stdout"]


def test_interrupted_task_is_queued_with_its_lease_released(interrupted: dict[str, Any]) -> None:
    doc = interrupted["status"]
    assert doc["status"] == "queued"
    assert doc["stop_reason"] is None
    assert doc["waiting"] is None
    if "lease" in doc:
        assert doc["lease"]["owner"] is None
    items = doc["ledger"]["items"]
    done = [i for i in items if i["status"] == "done"]
    assert 1 <= len(done) < N_ITEMS
    assert all(i["status"] in ("done", "pending") for i in items), "nothing left in progress"
    assert all(i["evidence"] for i in done)
    # The ledger agrees with the files on disk: every done item's file exists.
    assert {f"{i['id']}.txt" for i in done} <= set(interrupted["files_then"])


def test_log_ends_on_a_whole_round(interrupted: dict[str, Any]) -> None:
    evs = interrupted["events"]
    last = evs[-1]
    assert last["type"] == "task.status"
    assert (last["data"]["src"], last["data"]["dst"]) == ("running", "queued")
    seen_verdicts: set[int] = set()
    started: list[int] = []
    for e in evs:
        if e["type"] == "round.started":
            r = e["data"]["round"]
            if started:
                assert r - 1 in seen_verdicts, f"round {r} started before round {r - 1} was judged"
            started.append(r)
        elif e["type"] == "judge.verdict":
            seen_verdicts.add(e["data"]["round"])
    assert started == list(range(1, len(started) + 1))
    assert seen_verdicts == set(started), "the last round was judged: no half round"
    committed = [e["data"]["round"] for e in evs if e["type"] == "round.committed"]
    assert committed == started
    intended = {e["data"]["op_id"] for e in evs if e["type"] == "op.intended"}
    assert intended == {e["data"]["op_id"] for e in evs if e["type"] == "op.committed"}
    assert interrupted["status"]["budget"]["used"]["rounds"] == len(started)


def test_resume_delivers_without_repeating_side_effects(interrupted: dict[str, Any]) -> None:
    resumed = interrupted["resumed"]
    assert_ok(resumed)
    doc = interrupted["final"]
    assert (doc["status"], doc["stop_reason"]) == ("satisfied", "delivered")
    assert all(i["status"] == "done" and i["evidence"] for i in doc["ledger"]["items"])
    folder = interrupted["folder"]
    for n in range(1, N_ITEMS + 1):
        assert (folder / "out" / f"i{n}.txt").read_text() == f"i{n} done\n"
    evs = interrupted["all_events"]
    before = len(interrupted["events"])
    assert evs[:before] == interrupted["events"], "history is append-only"
    writes = Counter(e["data"]["args"]["path"] for e in evs if e["type"] == "op.intended")
    assert writes == Counter({f"out/i{n}.txt": 1 for n in range(1, N_ITEMS + 1)}), (
        "every file was written exactly once"
    )
    turns = [e["data"] for e in evs if e["type"] == "turn.started"]
    assert len(turns) == 2 and turns[1]["kind"] != turns[0]["kind"]


def test_recovery_names_the_previous_owner_not_the_new_one(interrupted: dict[str, Any]) -> None:
    """`recovery.started.previous_owner` is who held the task before this claim (nobody
    after a clean stop, or the crashed worker), never the worker that just claimed it."""
    evs = interrupted["all_events"]
    claims = [e["data"]["worker_id"] for e in evs if e["type"] == "lease.claimed"]
    assert len(claims) == 2 and claims[0] != claims[1]
    rec = [e["data"] for e in evs if e["type"] == "recovery.started"]
    assert len(rec) == 1
    assert rec[0]["worker_id"] == claims[1]
    assert rec[0]["previous_owner"] in (None, claims[0]), rec[0]


def test_second_ctrl_c_quits_at_once_and_the_task_still_resumes(tmp_path: Path) -> None:
    code, out, err = _interrupt(tmp_path, presses=2)
    # 130, or death by SIGINT (what a shell shows as 130 too): when the first press has
    # already wound the run down, the second lands while the interpreter shuts down,
    # which gives SIGINT back to the system's default action; it quits at once either way.
    assert code in (130, -signal.SIGINT), err
    assert "Traceback" not in err
    tid = _task_id(tmp_path)
    # Either way the person is told how to go on (quitting at once printed no hint).
    assert f"continue with: tether resume {tid}" in out + err, (out, err)
    doc = json_out(tether("status", tid, "--json", cwd=tmp_path))
    assert doc["status"] in ("queued", "running", "stalled")
    resumed = tether("resume", tid, "--model", FAST, "--json", cwd=tmp_path)
    final = json_out(resumed)
    assert (final["status"], final["stop_reason"]) == ("satisfied", "delivered")


def test_cancel_of_a_running_task_stops_it_between_rounds(tmp_path: Path) -> None:
    """`tether cancel` while `tether run` works: the run stops after its current round
    (exit 1: the task did not deliver), the task is cancelled by the user, the log ends
    on a whole round and the lease is released."""
    write_spec(tmp_path / "spec.yaml", N_ITEMS, name="slow-thirty")
    # The model holds its second answer until the cancel request is stored: the run
    # cannot finish first however slow `tether cancel` is to start.
    proc = popen_tether("run", "spec.yaml", "--model", GATED, cwd=tmp_path)
    try:
        wait_for_file(tmp_path / "out" / "i1.txt", proc)
        tid = _task_id(tmp_path)
        cancel = tether("cancel", tid, cwd=tmp_path)
        (tmp_path / "release").touch()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert_ok(cancel)
    assert "cancel requested" in cancel.stdout
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    doc_p, evs_p = tether_many(
        [(("status", tid, "--json"), tmp_path), (("events", tid, "--json"), tmp_path)]
    )
    doc = json_out(doc_p)
    assert (doc["status"], doc["stop_reason"]) == ("cancelled", "cancelled_by_user")
    if "lease" in doc:
        assert doc["lease"]["owner"] is None
    evs = json_out(evs_p)
    end = [e for e in evs if e["type"] != "notice.sent"][-1]  # then the run's own notice
    assert end["type"] == "task.status"
    assert (end["data"]["src"], end["data"]["dst"]) == ("running", "cancelled")
    assert any(e["type"] == "task.cancel_requested" for e in evs)
    started = [e["data"]["round"] for e in evs if e["type"] == "round.started"]
    judged = [e["data"]["round"] for e in evs if e["type"] == "judge.verdict"]
    assert started == judged
    done = [i for i in doc["ledger"]["items"] if i["status"] == "done"]
    assert len(done) == len(started) < N_ITEMS
