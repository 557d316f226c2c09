"""A checklist of thousands of items, run the way a user would: `tether run` with a
scripted model that follows the ledger honestly (two calls per item, paging through the
open items with `ledger_items`), killed three times at different steps and resumed,
on SQLite and on PostgreSQL, at the default limits and context budget. It must end
`satisfied` with every file written, the log append-only and no round committed twice.

3,000 items by default (about a minute a store on a 2-core machine; the default
`max_rounds` follows the checklist's size); `TETHER_LONG_CHECKLIST_ITEMS=10000` runs
the bigger variant.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cli import cli_env, tether

MODEL = "scripted:tests.e2e.checklist_policies:paging_drafter"
ITEMS = int(os.environ.get("TETHER_LONG_CHECKLIST_ITEMS", "3000"))
#: Where each run is killed: (fail point, the how-many-th time it is reached).
#: The second one falls in the middle of a round of drafts or files (two calls per item
#: in all, so about a quarter of the checklist in).
CRASHES = [
    ("after_round_commit", 9),
    ("after_op_dispatch", ITEMS // 2),
    ("after_model_response", 5),
]


def _spec(folder: Path, n: int) -> Path:
    data = {
        "name": "migrate",
        "objective": f"Migrate {n} files: draft each one, then write it to out/",
        "items": [
            {
                "id": f"f-{k:05d}",
                "title": f"migrate file {k:05d}",
                "done_when": {"kind": "file", "path": f"out/f-{k:05d}.txt"},
            }
            for k in range(1, n + 1)
        ],
        "tools": ["write_file"],
        "models": {"judge": "rules"},
    }
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _json(proc: Any) -> Any:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    if request.param == "postgres":
        return cli_env(TETHER_DB=request.getfixturevalue("pg_url"))
    return cli_env(TETHER_DB=f"sqlite:///{tmp_path / 'tasks.db'}")


@pytest.mark.timeout(900 if ITEMS <= 3000 else 7200)
def test_a_long_checklist_with_crashes_ends_satisfied(tmp_path: Path, env: dict[str, str]) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    spec = _spec(tmp_path, ITEMS)
    timeout = 600.0 if ITEMS <= 3000 else 3600.0
    point, count = CRASHES[0]
    crashed = tether(
        "run", spec, "--model", MODEL, "--workspace", ws, "--json",
        cwd=tmp_path, env={**env, "TETHER_FAILPOINTS": f"{point}={count}"}, timeout=timeout,
    )  # fmt: skip
    assert crashed.returncode == 137, crashed.stderr[-3000:]
    (task,) = _json(tether("list", "--json", cwd=tmp_path, env=env))
    tid = task["task_id"]
    logs = [_json(tether("events", tid, "--json", cwd=tmp_path, env=env))]
    for point, count in CRASHES[1:]:
        crashed = tether(
            "resume", tid, "--model", MODEL, "--json",
            cwd=tmp_path, env={**env, "TETHER_FAILPOINTS": f"{point}={count}"}, timeout=timeout,
        )  # fmt: skip
        assert crashed.returncode == 137, (point, crashed.stderr[-3000:])
        assert f"fail point {point} reached" in crashed.stderr
        logs.append(_json(tether("events", tid, "--json", cwd=tmp_path, env=env)))
    doc = _json(
        tether("resume", tid, "--model", MODEL, "--json", cwd=tmp_path, env=env, timeout=timeout)
    )
    assert doc["status"] == "satisfied" and doc["stop_reason"] == "delivered", doc
    evs = _json(tether("events", tid, "--json", cwd=tmp_path, env=env))
    for before in logs:
        assert evs[: len(before)] == before  # the log is append-only
    rounds = [e["data"]["round"] for e in evs if e["type"] == "round.committed"]
    assert rounds == sorted(set(rounds)), "a round was committed twice"
    acts = Counter(
        e["data"]["round"]
        for e in evs
        if e["type"] == "model.called" and e["data"]["purpose"] == "act"
    )
    assert all(acts[r] == 1 for r in rounds), "a committed decision was paid for twice"
    # Default limits: max_rounds follows the checklist (10 per item, in the contract),
    # and the honest model, which pages through the open items, needs far fewer: about
    # two rounds per 40 items, and the rounds its crashes cost.
    assert len(rounds) <= ITEMS // 10
    for k in range(1, ITEMS + 1):
        assert (ws / "out" / f"f-{k:05d}.txt").read_text() == f"migrated f-{k:05d}"
    status = _json(tether("status", tid, "--json", cwd=tmp_path, env=env))
    assert status["ledger"]["progress"]["done"] == ITEMS
    assert status["limits"]["max_rounds"] == max(200, 10 * ITEMS)
