"""The markdown report of a peer benchmark run, from the raw results `run.py` collects.

Figures of the repetitions of one configuration and N are pooled: the per-step
overhead samples of a window (and the floor samples) of every repetition together
give one median and one p99; bytes per step, peak RSS and wall time are the median
over the repetitions.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from harness import med_p99


def _ms(pair: tuple[float, float]) -> str:
    med, p99 = pair
    if math.isnan(med):
        return "-"
    return f"{med:.2f} / {p99:.2f}"


def _size(n: float | None) -> str:
    if n is None:
        return "-"
    if abs(n) >= 10_000:
        return f"{n / 1024:,.0f} KiB"
    return f"{n:,.0f} B"


def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def summarize(blocks: list[Mapping[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """(config name, N) -> pooled figures over the repetitions that succeeded."""
    groups: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    failed: dict[tuple[str, int], int] = {}
    for b in blocks:
        key = (b["config"], b["n"])
        groups.setdefault(key, [])
        if b.get("ok"):
            groups[key].append(b["result"])
        else:
            failed[key] = failed.get(key, 0) + 1
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for key, results in groups.items():
        row: dict[str, Any] = {"reps": len(results), "failed": failed.get(key, 0)}
        for w in ("100", "1000", "end"):
            samples = [s for r in results for s in r["windows"].get(w, {}).get("samples", [])]
            row[f"w{w}"] = med_p99(samples)
            for kind in ("loop", "proc"):
                cpu = [
                    c for r in results for c in r["windows"].get(w, {}).get(f"cpu_{kind}_ms", [])
                ]
                row[f"cpu_{kind}{w}"] = _median(cpu)
        row["floor"] = med_p99([f for r in results for f in r["floor_ms"]])
        row["floor_kind"] = next((r["floor_kind"] for r in results if r["floor_kind"]), None)
        row["bytes_per_step"] = _median(r["bytes_per_step"] for r in results)
        row["peak_rss"] = _median(r["peak_rss"] for r in results)
        row["wall_s"] = _median(r["wall_s"] for r in results)
        row["repeated"] = sum(r["repeated"] for r in results)
        out[key] = row
    return out


def crash_summary(trials: list[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Config name -> trials, repeated side effects, missing steps, resume times."""
    out: dict[str, dict[str, Any]] = {}
    for t in trials:
        row = out.setdefault(
            t["config"],
            {"trials": 0, "ok": 0, "repeated": 0, "missing": 0, "resume": [], "spawn": []},
        )
        row["trials"] += 1
        if not t.get("ok"):
            continue
        row["ok"] += 1
        row["repeated"] += t["repeated"]
        row["missing"] += len(t["missing"])
        if t.get("resume_ms") is not None:
            row["resume"].append(t["resume_ms"])
        if t.get("spawn_to_resumed_ms") is not None:
            row["spawn"].append(t["spawn_to_resumed_ms"])
    return out


HEADER = (
    "| system | configuration | N | overhead/step ~100: median / p99 ms "
    "| ~1000: median / p99 ms | floor: median ms | ~100 / floor "
    "| bytes/step | peak RSS | crash: repeated effects (trials) "
    "| restart → resumed: median ms (incl. process start) "
    "| CPU/step ~100, ~1000: loop thread (process) ms |"
)


def _cpu(r: Mapping[str, Any]) -> str:
    parts = []
    for w in ("100", "1000"):
        loop, proc = r.get(f"cpu_loop{w}"), r.get(f"cpu_proc{w}")
        if loop is not None and proc is not None:
            parts.append(f"{loop:.2f} ({proc:.2f})")
    return ", ".join(parts) or "-"


def table(
    configs: list[Mapping[str, Any]],
    ns: list[int],
    blocks: list[Mapping[str, Any]],
    trials: list[Mapping[str, Any]],
) -> str:
    """The one markdown table: a row per configuration and N."""
    rows = summarize(blocks)
    crashes = crash_summary(trials)
    lines = [HEADER, "|" + "---|" * HEADER.count(" | ") + "---|"]
    for cfg in configs:
        name = cfg["name"]
        first = True
        for n in ns:
            r = rows.get((name, n))
            if r is None:
                continue
            crash = ""
            resumed = ""
            c = crashes.get(name)
            if first and c:
                bad = c["trials"] - c["ok"]
                crash = f"{c['repeated']} ({c['trials']})" + (f", {bad} failed" if bad else "")
                if c["missing"]:
                    crash += f", {c['missing']} steps lost"
                if c["resume"]:
                    resumed = (
                        f"{statistics.median(c['resume']):.0f} "
                        f"({statistics.median(c['spawn']):.0f})"
                    )
            first = False
            if not r["reps"]:
                cells = ["FAILED"] + [""] * 5
            else:
                ratio = "-"
                med100, floor = r["w100"][0], r["floor"][0]
                if not math.isnan(med100) and not math.isnan(floor) and floor > 0:
                    ratio = f"{med100 / floor:.1f}x"
                rss = f"{r['peak_rss'] / 2**20:.0f} MiB" if r["peak_rss"] else "-"
                fails = f" ({r['failed']} rep failed)" if r["failed"] else ""
                cells = [
                    _ms(r["w100"]) + fails,
                    _ms(r["w1000"]),
                    f"{r['floor'][0]:.3f}" if not math.isnan(r["floor"][0]) else "-",
                    ratio,
                    _size(r["bytes_per_step"]),
                    rss,
                ]
            cpu = _cpu(r) if r["reps"] else "-"
            cols = [cfg["system"], cfg["label"], str(n), *cells, crash, resumed, cpu]
            lines.append("| " + " | ".join(cols) + " |")
    return "\n".join(lines)


RATIO_HEADER = (
    "| tether configuration | N | steps | overhead/step: median ms | floor of 2 commits: ms "
    "| / floor | against the peers on the same store (their median ms: tether / peer) |"
)


def ratios(configs: list[Mapping[str, Any]], ns: list[int], blocks: list[Mapping[str, Any]]) -> str:
    """tether's overhead per step as a ratio to the floor of its round's two durable
    commits (twice its own bare-commit floor) and to each peer configuration on the
    same kind of store (SQLite, PostgreSQL, none), all from the same run."""
    rows = summarize(blocks)
    lines = [RATIO_HEADER, "|" + "---|" * RATIO_HEADER.count(" | ") + "---|"]
    for cfg in configs:
        if cfg["system"] != "tether":
            continue
        peers = [p for p in configs if p["system"] != "tether" and p["kind"] == cfg["kind"]]
        for n in ns:
            r = rows.get((cfg["name"], n))
            if r is None or not r["reps"]:
                continue
            for w, shown in (("100", "~100"), ("1000", "~1000")):
                med = r[f"w{w}"][0]
                if math.isnan(med):
                    continue
                floor = 2 * r["floor"][0]
                has_floor = not math.isnan(floor) and floor > 0
                against = []
                for p in peers:
                    pr = rows.get((p["name"], n))
                    pm = pr[f"w{w}"][0] if pr and pr["reps"] else math.nan
                    if not math.isnan(pm) and pm > 0:
                        against.append(f"{p['name']} {pm:.2f}: {med / pm:.2f}x")
                cols = [
                    cfg["name"],
                    str(n),
                    shown,
                    f"{med:.2f}",
                    f"{floor:.3f}" if has_floor else "-",
                    f"{med / floor:.1f}x" if has_floor else "-",
                    "; ".join(against) or "-",
                ]
                lines.append("| " + " | ".join(cols) + " |")
    return "\n".join(lines)


NOTES = """\
- **overhead/step**: a step is one model call and one tool call. Its interval runs from \
the start of its model call to the start of the next step's; overhead = interval − time \
inside the fake model − time inside the tool, i.e. what the system does per step \
(persisting, loading, bookkeeping). Windows of steps: {spans}; the last step is left \
out (its interval also holds the end of the run); samples of all repetitions pooled.
- **CPU/step**: CPU time of a step outside the model and tool functions, median over \
the same windows: of the thread that runs the loop (tether's event loop; a tool run in \
a worker thread is not counted there) and, in brackets, of the whole process.
- **floor**: one bare INSERT of 2 KB + COMMIT through the raw driver with the system's \
own settings (SQLite journal mode and synchronous level, or the same PostgreSQL \
server), measured inside each block (half before the run, half after).
- **bytes/step**: growth of the system's database during the run (SQLite: used pages; \
PostgreSQL: pg_total_relation_size of the block's schema after VACUUM) divided by N; \
median over repetitions. **peak RSS**: the block process's high-water mark (VmHWM; interpreter and \
imports included).
- **/ floor** (second table): a tether round makes two durable commits (the \
decision, then the round's result), so its floor is twice the bare commit's; each \
ratio to a peer divides tether's median by that peer's, same N and steps, same run.
- **crash**: a run of {crash_steps} steps is SIGKILLed right after the tool's side \
effect at a step k drawn per trial; a new process resumes it (tether: `Engine.run` of \
the same task; LangGraph: `invoke(None)` on the same thread_id; DBOS: `DBOS.launch()` \
recovers the same workflow id). Repeated effects = steps whose effect is in the log \
twice. restart → resumed: from opening the database in the new process (imports done) \
to its first model, tool or reconcile call; in brackets from spawning the process.
- tether's tool has a `reconcile` that finds its `op_id` in the effect log (the \
documented safe-tool pattern); LangGraph nodes and DBOS steps have no such hook, so \
the step cut short re-runs.
"""
