"""A response with more calls than a round takes, killed in the middle of its calls: the
resumed round runs the same first `limits.max_calls_per_round` calls from the journaled
(shortened) response, never asks the model again for that round, and never runs a left
out call — through a real `tether run` killed at a fail point and a `tether resume`."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from tests.support.cli import cli_env, tether
from tests.support.loop import honest_actor

from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import tool_call

ROOT = Path(__file__).resolve().parents[2]
POLICY = "scripted:tests.reliability.test_many_calls_crash:flood_actor"
ITEMS = 70
ASKED = 100
LIMIT = 64


def flood_actor(request: ModelRequest) -> ModelResponse:
    """The first act request gets 100 writes at once; later ones, honest work."""
    if request.purpose == "act" and not any(m.role == "tool" for m in request.messages):
        calls = [
            tool_call("write_file", path=f"out/i{k}.txt", content=f"i{k}")
            for k in range(1, ASKED + 1)
        ]
        return ModelResponse("writing everything at once", tuple(calls))
    return honest_actor(request)


def _tether(args: list[str], db: str, **env: str) -> Any:
    return tether(*args, "--db", db, cwd=ROOT, env=cli_env(**env), timeout=120)


def test_a_flood_killed_mid_round_resumes_with_the_same_calls(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    db = f"sqlite:///{tmp_path / 't.db'}"
    spec = {
        "name": "flood",
        "objective": f"write {ITEMS} files",
        "items": [
            {"id": f"i{k}", "title": f"write out/i{k}.txt",
             "done_when": {"kind": "file", "path": f"out/i{k}.txt"}}
            for k in range(1, ITEMS + 1)
        ],
        "tools": ["write_file", "read_file"],
        "models": {"judge": "rules"},
    }  # fmt: skip
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    crashed = _tether(
        ["run", str(tmp_path / "spec.yaml"), "--model", POLICY, "--workspace", str(ws)],
        db,
        TETHER_FAILPOINTS="after_op_dispatch=30",
    )
    assert crashed.returncode == 137, crashed.stderr
    listed = _tether(["list", "--json"], db)
    tid = json.loads(listed.stdout)[0]["task_id"]
    resumed = _tether(["resume", tid, "--model", POLICY, "--json"], db)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "satisfied"
    events = json.loads(_tether(["events", tid, "--json"], db).stdout)
    acts = Counter(
        e["data"]["round"]
        for e in events
        if e["type"] == "model.called" and e["data"]["purpose"] == "act"
    )
    assert acts[1] == 1  # the killed round's decision was not asked for again
    (warning,) = [
        e["data"] for e in events if e["type"] == "audit.warning"
        and e["data"]["code"] == "too_many_calls"
    ]  # fmt: skip
    assert warning["details"]["run"] == LIMIT
    intended = Counter(e["data"]["args"]["path"] for e in events if e["type"] == "op.intended")
    # Every file the first round took was intended once; the left out ones never were,
    # except the items' own files, written by later rounds.
    assert all(n == 1 for n in intended.values()), intended
    assert set(intended) == {f"out/i{k}.txt" for k in range(1, ITEMS + 1)}
    for k in range(1, ITEMS + 1):
        assert (ws / "out" / f"i{k}.txt").read_text() == f"i{k}"
    assert not (ws / "out" / f"i{ITEMS + 1}.txt").exists()
