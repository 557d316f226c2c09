"""Queue tasks with `tether submit` and let `tether worker --once` run them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from ._cli import cli_env, tether_command

POLICY = "scripted:tests.integration.loop_support:honest_actor"
ROOT = Path(__file__).resolve().parents[2]


def _tether(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*tether_command(), *args],
        cwd=cwd,
        env=cli_env(PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_submit_then_worker_runs_every_queued_task(tmp_path: Path) -> None:
    spec = {
        "objective": "write a file",
        "items": [{"id": "a", "title": "write out/a.txt",
                   "done_when": {"kind": "file", "path": "out/a.txt"}}],
        "tools": ["write_file"],
        "models": {"judge": "rules"},
    }  # fmt: skip
    ids = []
    for n in range(3):
        ws = tmp_path / f"ws{n}"
        ws.mkdir()
        (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
        res = _tether(
            "submit", str(tmp_path / "spec.yaml"), "--workspace", str(ws), "--json", cwd=tmp_path
        )
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        assert doc["status"] == "queued"
        ids.append(doc["task_id"])
    listed = json.loads(_tether("list", "--json", cwd=tmp_path).stdout)
    assert {t["task_id"] for t in listed} == set(ids) and {t["status"] for t in listed} == {
        "queued"
    }

    res = _tether("worker", "--once", "--model", POLICY, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "worker ran 3 task(s)" in res.stderr
    for n, tid in enumerate(ids):
        status = json.loads(_tether("status", tid, "--json", cwd=tmp_path).stdout)
        assert status["status"] == "satisfied" and status["lease"]["owner"] is None
        assert (tmp_path / f"ws{n}" / "out" / "a.txt").read_text() == "a"


def test_submit_refuses_a_bad_spec_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text("objective: x\nitems: [{id: a}]\n")
    res = _tether("submit", "spec.yaml", cwd=tmp_path)
    assert res.returncode == 2
    assert "items.0.title" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / ".tether").exists()
