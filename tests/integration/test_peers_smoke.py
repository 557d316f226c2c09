"""Smoke test of `benchmarks/peers/run.py`: a `--smoke` run completes and prints its table.

The benchmark's figures are reported, not asserted (the machine may be loaded); this
checks that every configuration ran its steps in a fresh process, that the markdown
table has a row for each, and that the crash trials killed and resumed a run. tether's
tool reconciles by op_id, so its crash trials must show no repeated side effect.
PostgreSQL configurations run when `TETHER_TEST_PG_URL` is set; LangGraph and DBOS
when their packages are installed (`pip install -e '.[peers]'`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "peers" / "run.py"
PG = bool(os.environ.get("TETHER_TEST_PG_URL"))


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _smoke(tmp_path: Path, systems: list[str]) -> tuple[str, dict[str, Any]]:
    """Run the harness in smoke mode; (its stdout, its JSON results)."""
    cmd = [sys.executable, str(SCRIPT), "--smoke", "--systems", ",".join(systems)]
    cmd += ["--results", str(tmp_path)]
    if not PG:
        cmd.append("--no-pg")
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=840, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    files = list(tmp_path.glob("peers-*.json"))
    assert len(files) == 1, files
    return proc.stdout, json.loads(files[0].read_text())


def _rows(stdout: str, system: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith(f"| {system} |")]


def _check_blocks(doc: dict[str, Any], system: str, expected: set[str]) -> None:
    ran = {b["config"] for b in doc["blocks"] if b["config"].startswith(f"{system}/")}
    assert ran == expected
    for b in doc["blocks"]:
        assert b["ok"], b.get("error")
        assert b["result"]["steps"] == b["n"] == b["result"]["effects"]


@pytest.mark.timeout(900)
def test_tether_smoke(tmp_path: Path) -> None:
    stdout, doc = _smoke(tmp_path, ["tether"])
    assert "| system | configuration | N |" in stdout
    rows = _rows(stdout, "tether")
    expected = {"tether/sqlite-full", "tether/sqlite-normal", "tether/memory"}
    if PG:
        expected.add("tether/postgres")
    assert len(rows) == len(expected), rows
    _check_blocks(doc, "tether", expected)
    # The second table: each tether configuration against the floor of its two commits.
    ratio_rows = [line for line in stdout.splitlines() if line.startswith("| tether/")]
    assert {line.split(" | ")[0][2:] for line in ratio_rows} == expected, ratio_rows
    full = next(line for line in ratio_rows if line.startswith("| tether/sqlite-full |"))
    assert full.split(" | ")[5].endswith("x"), full  # a ratio to its floor
    assert doc["crash"], "no crash trial ran"
    for trial in doc["crash"]:
        assert trial["killed"] and trial["ok"], trial.get("error")
        assert trial["missing"] == []
        assert trial["repeated"] == 0, trial  # reconciled by op_id, never sent twice


@pytest.mark.timeout(900)
def test_peers_smoke(tmp_path: Path) -> None:
    peers = [p for p in ("langgraph", "dbos") if _installed(p)]
    if not peers:
        pytest.skip("langgraph and dbos are not installed (pip install -e '.[peers]')")
    stdout, doc = _smoke(tmp_path, ["tether", *peers])
    assert _rows(stdout, "tether")
    for peer in peers:
        assert _rows(stdout, peer), f"no {peer} row in:\n{stdout}"
        names = {c["name"] for c in doc["configs"] if c["system"] == peer}
        _check_blocks(doc, peer, names)
    if "dbos" in peers:
        # DBOS on SQLite both ways: its default rollback journal and WAL mode.
        assert {"dbos/sqlite", "dbos/sqlite-wal"} <= {c["name"] for c in doc["configs"]}
        modes = {b["config"]: b["result"].get("journal_mode") for b in doc["blocks"]}
        assert (modes["dbos/sqlite-wal"], modes["dbos/sqlite"]) == ("wal", "delete"), modes
        floors = {b["config"]: b["result"]["floor_kind"] for b in doc["blocks"]}
        assert "journal=wal" in floors["dbos/sqlite-wal"], floors
        full = next(ln for ln in stdout.splitlines() if ln.startswith("| tether/sqlite-full |"))
        assert "dbos/sqlite-wal " in full and "dbos/sqlite " in full, full
    for trial in doc["crash"]:
        assert trial["killed"] and trial["ok"], trial.get("error")
        assert trial["missing"] == []
