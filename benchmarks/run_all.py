"""Run every `benchmarks/*_bench.py`, one after another, and report which failed.

Each benchmark runs as a subprocess with the same Python and its default arguments
(plus `--quick` when given here); its output streams through as it comes. The exit
status is non-zero when any benchmark failed (or none was found).

    .venv/bin/python benchmarks/run_all.py            # what `make bench` runs
    .venv/bin/python benchmarks/run_all.py --quick    # every benchmark's smoke size
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def find_benchmarks(folder: Path = HERE) -> list[Path]:
    """The benchmark scripts, in name order."""
    return sorted(p for p in folder.glob("*_bench.py") if p.is_file())


def run_one(script: Path, extra: list[str]) -> tuple[int, float]:
    """Run one benchmark, streaming its output; returns (exit code, seconds)."""
    cmd = [sys.executable, str(script), *extra]
    print(f"\n=== {script.name}: {' '.join(cmd)}", flush=True)
    t0 = time.monotonic()
    try:
        # Inherited stdout/stderr: the output streams straight through.
        code = subprocess.run(cmd, cwd=HERE.parent, check=False).returncode
    except OSError as exc:
        print(f"cannot start {script.name}: {exc}", file=sys.stderr, flush=True)
        code = 127
    return code, time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run every benchmarks/*_bench.py in turn.")
    ap.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    args = ap.parse_args(argv)
    scripts = find_benchmarks()
    if not scripts:
        print(f"no *_bench.py found in {HERE}", file=sys.stderr)
        return 1
    extra = ["--quick"] if args.quick else []
    results: list[tuple[str, int, float]] = []
    try:
        for script in scripts:
            code, secs = run_one(script, extra)
            results.append((script.name, code, secs))
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    print("\n=== summary", flush=True)
    for name, code, secs in results:
        status = "ok" if code == 0 else f"FAILED (exit {code})"
        print(f"  {name:<24} {status:<18} {secs:7.1f} s")
    failed = [name for name, code, _ in results if code != 0]
    if failed:
        print(f"{len(failed)} of {len(results)} benchmarks failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
