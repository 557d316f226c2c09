"""The start-up benchmark stays runnable with one command (figures are reported, not
asserted: this only checks that a short run completes and prints its table)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_startup_bench_quick_run(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "startup_bench.py"), "--rounds", "1",
         "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("tether --help", "tether --version", "tether status", "python -c pass"):
        assert name in proc.stdout
    figures = json.loads(out.read_text())
    assert set(figures) >= {"tether --help", "tether status", 'python -c "import pydantic"'}
    assert all(f["median"] > 0 for f in figures.values())
