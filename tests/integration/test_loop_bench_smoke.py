"""Smoke test of `benchmarks/loop_bench.py`: it runs, and its figures are sane.

The benchmark's numbers are reported, not asserted (issue 3); this only checks that a
short run completes and measures what it claims: no act request above the input
budget, the default cache policy keeps more of the prefix than the naive one, and
every round got a timing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "loop_bench.py"


def test_loop_bench_quick_run(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--rounds", "120", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "tether loop benchmark" in proc.stdout
    assert "loop_bench.py --quick --rounds 120" in proc.stdout  # the command heads the table

    doc = json.loads(out.read_text())
    budget = doc["budget"]
    assert budget == 32_000
    default, naive = doc["results"]
    assert default["policy"] == "default"
    assert naive["policy"].startswith("naive")
    for res in (default, naive):
        assert res["rounds"] == 120
        assert res["act_calls"] == 120  # one act request per round, journaled
        assert res["tokens"]["over_budget"] == 0
        assert 0 < res["tokens"]["max"] <= budget
        assert res["compactions"] >= 1  # 120 rounds of 1 KB outputs outgrow 32k tokens
        assert res["turns"] >= 3  # 50 rounds per engine run: every run opens a turn
        for window in ("overhead_early", "overhead_late"):
            assert 0 < res[window]["median_ms"] < 5_000
        assert 0 <= res["prefix"]["mean"] <= 1
    # The default policy keeps the system prompt at a resume; the naive one re-renders it.
    assert default["prefix"]["mean"] > naive["prefix"]["mean"]
    assert default["prefix"]["mean_turn_start"] > 0.5 > naive["prefix"]["mean_turn_start"]
    # Within a turn only appends happen: the previous request is a prefix of the next.
    assert default["prefix"]["mean_in_turn"] > 0.8
