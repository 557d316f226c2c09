"""Peer benchmark: the same N-step agent loop on tether, LangGraph and DBOS, side by side.

Every configuration runs in a fresh subprocess (`child.py`), one block per
(configuration, N, repetition); the order of the configurations is rotated from one
repetition to the next. Each block measures its own bare-commit floor. A crash test
follows: per system, a run is SIGKILLed right after a tool's side effect and resumed by
a new process; repeated side effects and the time to resume are counted. One markdown
table is printed; the raw figures go to `benchmarks/peers/results/peers-*.json`.

    python benchmarks/peers/run.py                     # N=100,1000; 3 repetitions
    python benchmarks/peers/run.py --n 100,1000,2000 --reps 3
    python benchmarks/peers/run.py --smoke --systems tether --no-pg   # CI-sized

PostgreSQL: $TETHER_TEST_PG_URL (default postgresql://postgres@127.0.0.1:5432/test);
each block gets a schema of its own, dropped afterwards. A peer whose package is not
installed, or PostgreSQL when no server answers, is skipped with the reason printed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import random
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any

import report
from harness import EffectLog, drop_schema, pg_base_url, pg_problem, pg_version, redact, windows

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SYSTEMS = ("tether", "langgraph", "dbos")
RUNNERS = {"tether": "tether_runner", "langgraph": "langgraph_runner", "dbos": "dbos_runner"}


def log(text: str) -> None:
    """Progress goes to stderr; stdout holds the report only."""
    print(text, file=sys.stderr, flush=True)


def plan(
    systems: list[str], pg_reason: str | None, only: set[str] | None
) -> tuple[list[dict[str, Any]], list[str]]:
    """The configurations to run, and a line per one skipped (with why)."""
    configs: list[dict[str, Any]] = []
    skipped: list[str] = []
    for system in systems:
        mod = importlib.import_module(RUNNERS[system])
        reason = mod.problem()
        if reason:
            skipped.append(f"{system}: skipped, {reason}")
            continue
        for key, kind in mod.CONFIGS.items():
            name = f"{system}/{key}"
            if only and name not in only:
                continue
            why = mod.problem(key)
            if why is None and kind == "postgres" and pg_reason:
                why = pg_reason
            if why:
                skipped.append(f"{name}: skipped, {why}")
                continue
            configs.append(
                {
                    "name": name,
                    "system": system,
                    "key": key,
                    "kind": kind,
                    "label": mod.LABELS[key],
                    "crash": key in mod.CRASH_CONFIGS,
                }
            )
    return configs, skipped


class Runner:
    """Starts child processes, each in a fresh folder (and PostgreSQL schema)."""

    def __init__(self, root: Path, pg_url: str, timeout: float) -> None:
        self.root = root
        self.pg_url = pg_url
        self.timeout = timeout

    def child(
        self, cfg: dict[str, Any], n: int, workdir: Path, schema: str | None, extra: list[str]
    ) -> tuple[int, dict[str, Any] | None, str]:
        """Run child.py; (exit code, its JSON or None, the tail of its output)."""
        out = workdir / f"out-{uuid.uuid4().hex[:6]}.json"
        cmd = [
            sys.executable,
            str(HERE / "child.py"),
            f"--system={cfg['system']}",
            f"--config={cfg['key']}",
            f"--n={n}",
            f"--workdir={workdir}",
            f"--out={out}",
            *extra,
        ]
        if schema:
            cmd += [f"--pg={self.pg_url}", f"--schema={schema}"]
        cmd.append(f"--spawned-at={time.time()!r}")
        try:
            proc = subprocess.run(
                cmd, cwd=ROOT, capture_output=True, text=True, timeout=self.timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            tail = str(exc.stderr or "")[-2000:] if exc.stderr else ""
            return -1, None, f"timed out after {self.timeout:.0f} s\n{tail}"
        doc = json.loads(out.read_text()) if out.exists() else None
        return proc.returncode, doc, (proc.stdout[-1500:] + proc.stderr[-2500:])

    @contextlib.contextmanager
    def place(self, cfg: dict[str, Any]) -> Any:
        """A fresh folder and, for PostgreSQL configurations, a fresh schema name."""
        workdir = Path(tempfile.mkdtemp(prefix=f"{cfg['system']}-{cfg['key']}-", dir=self.root))
        schema = f"peers_{uuid.uuid4().hex[:12]}" if cfg["kind"] == "postgres" else None
        try:
            yield workdir, schema
        finally:
            if schema:
                try:
                    drop_schema(self.pg_url, schema)
                except Exception as exc:  # reported, not fatal: the next block has its own
                    log(f"  could not drop schema {schema}: {exc}")
            # LangGraph's checkpoints reach gigabytes at N=2000: free the disk at once.
            shutil.rmtree(workdir, ignore_errors=True)


def run_blocks(
    runner: Runner, configs: list[dict[str, Any]], ns: list[int], reps: int, floor: int
) -> list[dict[str, Any]]:
    """Every (configuration, N) once per repetition, the order rotated per repetition."""
    blocks = []
    total = reps * len(ns) * len(configs)
    done = 0
    for rep in range(reps):
        shift = rep % max(1, len(configs))
        order = configs[shift:] + configs[:shift]
        for n in ns:
            for pos, cfg in enumerate(order):
                done += 1
                with runner.place(cfg) as (workdir, schema):
                    t0 = time.monotonic()
                    rc, doc, tail = runner.child(cfg, n, workdir, schema, [f"--floor={floor}"])
                ok = rc == 0 and doc is not None and doc.get("steps") == n
                ok = ok and doc is not None and doc.get("effects") == n
                secs = time.monotonic() - t0
                log(
                    f"[{done}/{total}] rep {rep + 1} N={n} {cfg['name']}: "
                    + (f"ok, {secs:.1f} s" if ok else f"FAILED (exit {rc})")
                )
                if not ok:
                    log(tail)
                blocks.append(
                    {
                        "config": cfg["name"],
                        "n": n,
                        "rep": rep,
                        "position": pos,
                        "ok": ok,
                        "exit": rc,
                        "seconds": secs,
                        "result": doc,
                        "error": None if ok else tail,
                    }
                )
    return blocks


def crash_trials(
    runner: Runner, configs: list[dict[str, Any]], trials: int, steps: int, seed: int
) -> list[dict[str, Any]]:
    """Kill a run right after the side effect of step k, resume it, count repeats."""
    rng = random.Random(seed)
    out = []
    for cfg in [c for c in configs if c["crash"]]:
        for trial in range(trials):
            k = rng.randint(2, steps - 1)
            with runner.place(cfg) as (workdir, schema):
                rc1, _, tail1 = runner.child(
                    cfg, steps, workdir, schema, ["--mode=crash", f"--crash-at={k}"]
                )
                rc2, doc, tail2 = runner.child(cfg, steps, workdir, schema, ["--mode=resume"])
                counts = EffectLog(workdir / "effects.log").counts()
            killed = rc1 == -9
            ok = killed and rc2 == 0 and doc is not None
            rec = {
                "config": cfg["name"],
                "trial": trial,
                "crash_at": k,
                "killed": killed,
                "ok": ok,
                "repeated": sum(c - 1 for c in counts.values() if c > 1),
                "repeated_steps": sorted(s for s, c in counts.items() if c > 1),
                "missing": [s for s in range(1, steps + 1) if s not in counts],
                "resume_ms": (doc or {}).get("resume_ms"),
                "spawn_to_resumed_ms": (doc or {}).get("spawn_to_resumed_ms"),
                "resume_result": doc,
            }
            if not ok:
                rec["error"] = (tail1 if not killed else tail2)[-3000:]
            log(
                f"crash {cfg['name']} trial {trial + 1}/{trials} at step {k}: "
                + (
                    f"repeated {rec['repeated']}, resumed in {rec['resume_ms']:.0f} ms"
                    if ok and rec["resume_ms"] is not None
                    else f"FAILED (crash exit {rc1}, resume exit {rc2})"
                )
            )
            if not ok:
                log(rec["error"])
            out.append(rec)
    return out


def versions(systems: list[str], pg: str | None) -> dict[str, str]:
    """Python, SQLite, PostgreSQL and package versions."""
    out = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version}
    for system in systems:
        mod = importlib.import_module(RUNNERS[system])
        if not mod.problem():
            out.update(mod.versions())
    for pkg in ("langchain-core", "psycopg", "psutil"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[pkg] = metadata.version(pkg)
    if pg:
        with contextlib.suppress(Exception):
            out["postgresql"] = pg_version(pg)
    source = tether_source()
    if source:
        out["tether source"] = source
    return out


def tether_source() -> str | None:
    """The commit the measured tether comes from, flagged when src/tether has edits."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "src/tether"], cwd=ROOT, capture_output=True, text=True
        )
    except OSError:
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + (" + uncommitted edits" if dirty.stdout.strip() else "")


def command_line(argv: list[str]) -> str:
    """The command as typed from the repository root."""
    shown = []
    for path in (sys.executable, os.path.abspath(__file__)):
        rel = os.path.relpath(path)
        shown.append(path if rel.startswith("..") else rel)
    return " ".join(shlex.quote(x) for x in [*shown, *argv])


def render(doc: dict[str, Any], configs: list[dict[str, Any]], ns: list[int]) -> str:
    """The markdown report: context lines, the table, notes."""
    la, lb = doc["load_before"], doc["load_after"]
    vers = ", ".join(f"{k} {v}" for k, v in doc["versions"].items())
    lines = [
        "## Peer benchmark: tether, LangGraph and DBOS on the same agent loop",
        "",
        f"`$ {doc['command']}`",
        "",
        f"{doc['started']}; {doc['cpus']} CPUs; load average {la[0]:.2f} {la[1]:.2f} "
        f"{la[2]:.2f} before, {lb[0]:.2f} {lb[1]:.2f} {lb[2]:.2f} after; "
        f"{doc['reps']} repetition(s), configuration order rotated; "
        f"{doc['crash_trials']} crash trial(s) of {doc['crash_steps']} steps per system "
        f"and backend; PostgreSQL {doc['pg'] or 'not used'}.",
        "",
        f"Versions: {vers}.",
        "",
        report.table(configs, ns, doc["blocks"], doc["crash"]),
        "",
        "tether against the floor of its two commits and against the peers (same run):",
        "",
        report.ratios(configs, ns, doc["blocks"]),
        "",
    ]
    spans = []
    for n in ns:
        w = windows(n)
        parts = [f"{a}-{b}" for k, (a, b) in w.items() if k in ("100", "1000")]
        spans.append(f"N={n}: " + (" and ".join(dict.fromkeys(parts)) or "-"))
    lines.append(report.NOTES.format(spans="; ".join(spans), crash_steps=doc["crash_steps"]))
    for s in doc["skipped"]:
        lines.append(f"- {s}")
    failed = [b for b in doc["blocks"] if not b["ok"]] + [t for t in doc["crash"] if not t["ok"]]
    if failed:
        lines.append(f"- **{len(failed)} block(s) or trial(s) failed**; see the JSON for output.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--n", default=None, help="comma-separated step counts (100,1000)")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (3)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="tether,langgraph,dbos")
    ap.add_argument("--only", default=None, help="comma-separated names, e.g. tether/memory")
    ap.add_argument("--pg", default=None, help="PostgreSQL URL (default $TETHER_TEST_PG_URL)")
    ap.add_argument("--no-pg", action="store_true", help="skip the PostgreSQL configurations")
    ap.add_argument("--crash-trials", type=int, default=None, help="per system and backend (3)")
    ap.add_argument("--crash-steps", type=int, default=None, help="steps of a crash run (20)")
    ap.add_argument("--floor", type=int, default=None, help="floor samples per block (200)")
    ap.add_argument("--seed", type=int, default=13, help="seed of the crash steps")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per child (3600)")
    ap.add_argument(
        "--smoke", action="store_true", help="defaults N=12, 1 repetition, 1 crash trial of 8"
    )
    ap.add_argument("--results", type=Path, default=HERE / "results", help="JSON folder")
    args = ap.parse_args(args_list)
    # --smoke changes the defaults only: flags given explicitly still win.
    smoke = args.smoke

    def pick(value: Any, full: Any, small: Any) -> Any:
        return value if value is not None else (small if smoke else full)

    ns = [int(x) for x in pick(args.n, "100,1000", "12").split(",") if x.strip()]
    reps = pick(args.reps, 3, 1)
    trials = pick(args.crash_trials, 3, 1)
    crash_steps = pick(args.crash_steps, 20, 8)
    floor = pick(args.floor, 200, 20)
    timeout = pick(args.timeout, 3600.0, 600.0)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(systems) - set(SYSTEMS)
    if unknown or any(n < 4 for n in ns) or crash_steps < 4:
        ap.error(f"unknown systems {sorted(unknown)}" if unknown else "N and crash steps >= 4")
    pg = None if args.no_pg else (args.pg or pg_base_url())
    pg_reason = "--no-pg given" if pg is None else pg_problem(pg)
    only = {x.strip() for x in args.only.split(",")} if args.only else None
    configs, skipped = plan(systems, pg_reason, only)
    for s in skipped:
        log(s)
    if not configs:
        log("nothing to run")
        return 1
    doc: dict[str, Any] = {
        "command": command_line(args_list),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "cpus": os.cpu_count(),
        "load_before": os.getloadavg(),
        "reps": reps,
        "ns": ns,
        "crash_trials": trials,
        "crash_steps": crash_steps,
        "floor_samples": floor,
        "pg": redact(pg) if pg and not pg_reason else None,
        "versions": versions(systems, None if pg_reason else pg),
        "configs": configs,
        "skipped": skipped,
    }
    with tempfile.TemporaryDirectory(prefix="tether-peers-") as tmp:
        runner = Runner(Path(tmp), pg or "", timeout)
        doc["blocks"] = run_blocks(runner, configs, ns, reps, floor)
        doc["crash"] = crash_trials(runner, configs, trials, crash_steps, args.seed)
    doc["load_after"] = os.getloadavg()
    doc["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
    text = render(doc, configs, ns)
    print(text, flush=True)
    args.results.mkdir(parents=True, exist_ok=True)
    path = args.results / f"peers-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}.json"
    doc["report"] = text
    path.write_text(json.dumps(doc, indent=1, default=str))
    log(f"raw results: {path}")
    ok = all(b["ok"] for b in doc["blocks"]) and all(t["ok"] for t in doc["crash"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
