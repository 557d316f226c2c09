"""Kill a real `tether run` at each fail point, resume it, and check nothing was paid twice.

The model response of a round is committed before any tool runs, so a crash after that
point never asks the model again for the same round; the task then completes with
every round whole.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
POLICY = "scripted:tests.support.loop:honest_actor"


def _spec(folder: Path, items: int = 8) -> Path:
    data = {
        "name": "crashy",
        "objective": f"write {items} files",
        "items": [
            {"id": f"i{k}", "title": f"write out/i{k}.txt",
             "done_when": {"kind": "file", "path": f"out/i{k}.txt"}}
            for k in range(1, items + 1)
        ],
        "tools": ["write_file", "read_file"],
        "models": {"judge": "rules"},
        "context": {"input_budget_tokens": 1200, "preview_chars": 200},
    }  # fmt: skip
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _tether(
    args: list[str], db: str, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env.update(env_extra or {})
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "tether.cli", *args, "--db", db],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )


def _events(db: str, task_id: str) -> list[dict[str, Any]]:
    res = _tether(["events", task_id, "--json"], db)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _task_id(db: str) -> str:
    res = _tether(["list", "--json"], db)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)[0]["task_id"]


POINTS = [
    ("after_model_response", 2),
    ("after_op_intent", 2),
    ("after_op_dispatch", 3),
    ("after_op_result", 1),
    ("after_round_commit", 2),
    ("before_ledger_write", 3),
    ("during_compaction", 1),
    ("before_model_call", 3),
]


@pytest.mark.parametrize(("point", "count"), POINTS)
def test_crash_at_fail_point_then_resume(tmp_path: Path, point: str, count: int) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    db = f"sqlite:///{tmp_path / 't.db'}"
    spec = _spec(tmp_path)
    crashed = _tether(
        ["run", str(spec), "--model", POLICY, "--workspace", str(ws), "--json"],
        db,
        {"TETHER_FAILPOINTS": f"{point}={count}"},
    )
    assert crashed.returncode == 137, crashed.stderr
    assert f"fail point {point} reached" in crashed.stderr
    tid = _task_id(db)
    before = _events(db, tid)

    resumed = _tether(["resume", tid, "--model", POLICY, "--json"], db)
    assert resumed.returncode == 0, resumed.stderr
    doc = json.loads(resumed.stdout)
    assert doc["status"] == "satisfied" and doc["stop_reason"] == "delivered"
    evs = _events(db, tid)
    assert evs[: len(before)] == before  # the log is append-only
    # Recovery ran, in order, as events.
    steps = [e["data"]["step"] for e in evs if e["type"] == "recovery.step"]
    assert steps == ["version", "artifacts", "ops", "deliverables", "ledger", "context"]
    # One act call per committed round: a committed decision is never paid for twice.
    acts = Counter(
        e["data"]["round"]
        for e in evs
        if e["type"] == "model.called" and e["data"]["purpose"] == "act"
    )
    rounds = [e["data"]["round"] for e in evs if e["type"] == "round.committed"]
    assert rounds == sorted(set(rounds)), "a round was committed twice"
    assert all(acts[r] == 1 for r in rounds), acts
    # Every round is whole: started, committed and judged.
    started = [e["data"]["round"] for e in evs if e["type"] == "round.started"]
    judged = [e["data"]["round"] for e in evs if e["type"] == "judge.verdict"]
    assert sorted(set(started)) == rounds == sorted(set(judged))
    assert any(e["type"] == "context.compacted" for e in evs)
    for k in range(1, 9):
        assert (ws / "out" / f"i{k}.txt").read_text() == f"i{k}"


def test_the_loop_runs_on_postgres(tmp_path: Path, pg_url: str) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    spec = _spec(tmp_path, items=3)
    crashed = _tether(
        ["run", str(spec), "--model", POLICY, "--workspace", str(ws), "--json"],
        pg_url,
        {"TETHER_FAILPOINTS": "after_round_commit=2"},
    )
    assert crashed.returncode == 137, crashed.stderr
    tid = _task_id(pg_url)
    resumed = _tether(["resume", tid, "--model", POLICY, "--json"], pg_url)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "satisfied"
    evs = _events(pg_url, tid)
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
