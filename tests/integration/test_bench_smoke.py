"""The store, tools and judge-rounds benchmarks stay runnable with one command (figures
are reported, not asserted; this only checks a short run completes and prints its
table)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("script", "args", "expect"),
    [
        ("store_bench.py", ["--quick", "--rounds", "300", "--events", "2000", "--no-pg"], "floor"),
        ("tools_bench.py", ["--quick", "--rounds", "30", "--no-pg"], "floor"),
        # A run shorter than the default windows compares windows that fit in it.
        ("judge_rounds.py", ["--items", "3", "--steps", "5"], '"late_over_early"'),
    ],
)
def test_benchmark_quick_run(script: str, args: list[str], expect: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert expect in proc.stdout
