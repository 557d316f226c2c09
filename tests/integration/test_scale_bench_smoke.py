"""Smoke test of `benchmarks/scale_bench.py`: a tiny run completes and reports every
figure it claims, in the expected shape. Speed is reported by the benchmark, never
asserted here.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "scale_bench.py"


def test_scale_bench_quick_run(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    env = dict(os.environ)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--model-ms", "20", "--tool-ms", "2",
         "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "tether scale benchmark: benchmarks/scale_bench.py --quick" in proc.stdout

    doc = json.loads(out.read_text())
    assert (doc["rounds"], doc["waves"], doc["model_ms"], doc["tool_ms"]) == (3, 1, 20, 2)
    pg = bool(os.environ.get("TETHER_TEST_PG_URL"))
    labels = [r["config"] for r in doc["results"]]
    assert labels == ["sqlite 1x1", "sqlite 1x4", *(["postgres 1x4"] if pg else [])]
    assert doc["skipped"] == ([] if pg else ["postgres 1x4"])
    for row in doc["results"]:
        n = row["processes"] * row["concurrency"]
        # Every task ran once to the end; every round but each task's first was timed.
        assert row["tasks"] == n and row["satisfied"] == n and row["ran"] == n, row
        assert row["failed"] == 0 and row["statuses"] == {"satisfied": n}
        assert row["rounds_timed"] == n * (doc["rounds"] - 1)
        assert row["tasks_per_min"] > 0 and row["wall_s"] > 0
        assert 0 <= row["added_p50_ms"] <= row["added_p99_ms"]
        assert 1 <= row["inflight_max"] <= n
        assert math.isfinite(row["rss_mb_per_inflight"]) and row["rss_max_mb"] > 10
        assert row["worker_cpu_ms_per_round"] > 0
        if row["backend"] == "postgres":
            # A bounded pool: at least one connection, never more than its size.
            assert 1 <= row["db_connections"] <= 8
        else:
            assert row["db_connections"] == 1
