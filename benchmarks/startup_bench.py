"""Start-up benchmark: how long the `tether` command takes to answer, whole process.

Times, from outside, the wall time of complete runs of

- `tether --help`, `tether --version`;
- `tether status TASK` in the folder of a demo made for the run (`tether demo --dir`:
  its SQLite database, 40 items, ~900 events);
- beside them, in the same run, the floors: `python -c pass` (the interpreter alone)
  and `python -c "import pydantic"` (what every pydantic program pays first).

The commands run in turn, round after round (A B C D E, A B C D E, ...) so that a
machine whose speed drifts slows them alike; one warm-up round is not counted. Each
figure is min / median / max over the rounds: quote the median. The targets (issue 19)
are `tether --help` <= 0.15 s and `tether status` <= 0.3 s on the developers' machine;
this prints whether the medians meet them, it does not fail on them.

The runs see the installation as a user has it: Python may write its bytecode caches
(`PYTHONDONTWRITEBYTECODE` is dropped for them), so an editable install is timed with
its `.pyc` files as a wheel install would be.

    .venv/bin/python benchmarks/startup_bench.py            # 15 rounds
    .venv/bin/python benchmarks/startup_bench.py --quick    # 5 rounds, a smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Issue 19's targets for the medians, in seconds.
TARGETS = {"tether --help": 0.15, "tether status": 0.3}


def tether_command() -> list[str]:
    """The `tether` console script next to this Python (as a user runs it), else
    `python -m tether.cli`."""
    exe = Path(sys.executable).parent / "tether"
    if exe.is_file() and os.access(exe, os.X_OK):
        return [str(exe)]
    return [sys.executable, "-m", "tether.cli"]


def run_env() -> dict[str, str]:
    """The environment of the timed runs: no colour, a plain terminal, no TETHER_*
    settings, bytecode caches allowed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(NO_COLOR="1", TERM="dumb", COLUMNS="100")
    return env


def make_demo(folder: Path, env: dict[str, str]) -> str:
    """Run `tether demo --dir folder`; the id of its task."""
    cmd = [*tether_command(), "demo", "--dir", str(folder), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"`{' '.join(cmd)}` failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    listed = subprocess.run(
        [*tether_command(), "list", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=folder,
        check=True,
    )
    return str(json.loads(listed.stdout)[0]["task_id"])


def time_once(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    """Seconds from start to exit of one run; a failing run stops the benchmark."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False
    )
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"`{' '.join(cmd)}` exited {proc.returncode}: {proc.stderr[-1000:]!r}")
    return took


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="5 rounds (a smoke test)")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds (default 15)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    rounds = args.rounds or (5 if args.quick else 15)
    env = run_env()
    tmp = Path(tempfile.mkdtemp(prefix="tether-startup-"))
    try:
        demo = tmp / "demo"
        task = make_demo(demo, env)
        tether = tether_command()
        commands: dict[str, list[str]] = {
            "python -c pass": [sys.executable, "-c", "pass"],
            'python -c "import pydantic"': [sys.executable, "-c", "import pydantic"],
            "tether --version": [*tether, "--version"],
            "tether --help": [*tether, "--help"],
            "tether status": [*tether, "status", task],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for n in range(rounds + 1):  # round 0 warms up (and writes bytecode caches)
            for name, cmd in commands.items():
                took = time_once(cmd, demo, env)
                if n:
                    times[name].append(took)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"$ {' '.join(tether)}  ({rounds} interleaved rounds, wall seconds)")
    print(f"{'command':<30} {'min':>7} {'median':>7} {'max':>7} {'/pydantic':>9}  target")
    figures: dict[str, dict[str, float]] = {}
    yardstick = statistics.median(times['python -c "import pydantic"'])
    for name, values in times.items():
        med = statistics.median(values)
        figures[name] = {"min": min(values), "median": med, "max": max(values)}
        target = TARGETS.get(name)
        verdict = ""
        if target is not None:
            verdict = f"<= {target:g} s: {'met' if med <= target else 'NOT met'}"
        print(
            f"{name:<30} {min(values):7.3f} {med:7.3f} {max(values):7.3f} "
            f"{med / yardstick:8.2f}x  {verdict}"
        )
    print(
        '(/pydantic: the median over `python -c "import pydantic"`\'s, which a loaded '
        "machine slows alike)"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
