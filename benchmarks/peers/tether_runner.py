"""The tether side of the peer benchmark (kept in one module so API changes are one fix).

One task whose single checklist item never completes runs `limits.max_rounds` = N
rounds in one `Engine.run` and then stops, waiting (`max_rounds`). The actor is a
zero-latency `ScriptedModel` policy: one `do_step(step=k)` call per round; the judge
is rules only (`ModelSet(model)`, `models: {judge: rules}`), and the same policy
writes the compaction summary when the context outgrows its budget. `do_step` is a
`write` tool with a `reconcile` that looks its `ctx.op_id` up in the effect log, the
pattern the README's "Writing safe tools" describes. Tool outputs (1 KB) go into the
context whole (`preview_chars` 2,000), as in `benchmarks/loop_bench.py`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from harness import Probe, Setup, Storage, pg_params, tool_output

import tether
from tether.models.base import ModelRequest

SYSTEM = "tether"
#: Configuration key -> storage kind (None: nothing on disk).
CONFIGS: dict[str, str | None] = {
    "sqlite-full": "sqlite",
    "sqlite-normal": "sqlite",
    "postgres": "postgres",
    "memory": None,
}
CRASH_CONFIGS = ("sqlite-full", "postgres")
LABELS = {
    "sqlite-full": "SQLite WAL, synchronous=FULL (default)",
    "sqlite-normal": ("SQLite WAL, synchronous=NORMAL (sqlite:///path?synchronous=normal)"),
    "postgres": "PostgreSQL",
    "memory": "memory:// (no persistence)",
}


def problem(config: str | None = None) -> str | None:
    """Why this system (or one configuration) cannot run here (None: it can)."""
    return None


def versions() -> dict[str, str]:
    """Package versions to print beside the table."""
    return {"tether": tether.__version__}


def spec_for(n: int) -> tether.TaskSpec:
    """A task that runs exactly n rounds: its item never completes, nothing else stops it."""
    return tether.parse_spec(
        {
            "name": "peers-bench",
            "objective": "Process the records one step at a time with do_step",
            "items": [{"id": "work", "title": "Process every record"}],
            "tools": ["do_step"],
            "models": {"judge": "rules"},
            "limits": {
                "max_rounds": n,
                "no_progress_rounds": 10**9,
                "max_attempts_per_item": 10**9,
                "max_rounds_per_item": None,
            },
            "context": {"preview_chars": 2000, "cache_ttl_seconds": 1e9},
        }
    )


def _db_path(setup: Setup) -> Any:
    return setup.workdir / "tether.db"


def storage(setup: Setup) -> Storage | None:
    """Where this configuration keeps its data, with its settings."""
    if setup.config.startswith("sqlite"):
        sync = "NORMAL" if setup.config == "sqlite-normal" else "FULL"
        return Storage("sqlite", path=_db_path(setup), journal="wal", synchronous=sync)
    if setup.config == "postgres":
        return Storage("postgres", url=setup.pg_url, schema=setup.schema)
    return None


async def _open(setup: Setup) -> tether.Store:
    if setup.config == "sqlite-full":
        return await tether.open_store(f"sqlite:///{_db_path(setup)}")
    if setup.config == "sqlite-normal":
        return await tether.open_store(f"sqlite:///{_db_path(setup)}?synchronous=normal")
    if setup.config == "postgres":
        assert setup.schema is not None
        return await tether.open_store(pg_params(setup.pg_app_url(), schema=setup.schema))
    return await tether.open_store("memory://")


class _Policy:
    """The zero-latency model: one tool call per act request; a summary to compact."""

    def __init__(self, probe: Probe, first_step: int) -> None:
        self.probe = probe
        self.step = first_step

    def __call__(self, request: ModelRequest) -> tether.ModelResponse:
        # Cheap usage figures (the runtime keeps its own estimate for the budget).
        size = len(request.system) + sum(len(m.content) for m in request.messages)
        usage = tether.Usage(input_tokens=size // 4, output_tokens=20)
        if request.purpose == "act":
            self.step += 1
            call = tether.tool_call("do_step", step=self.step)
            return tether.ModelResponse(f"Step {self.step}.", (call,), usage, "peers", 0.0)
        return tether.ModelResponse(
            f"Steps 1 to {self.step} were done with do_step, one per round; keep going.",
            (),
            usage,
            "peers",
            0.0,
            "stop",
        )


class _TimedModel:
    """Times each call for the probe: an act call opens a step, others are model time."""

    def __init__(self, inner: tether.ScriptedModel, probe: Probe) -> None:
        self.inner = inner
        self.name = inner.name
        self.probe = probe

    async def complete(self, request: ModelRequest) -> tether.ModelResponse:
        act = request.purpose == "act"
        if act:
            t0 = self.probe.model_start()
        else:
            self.probe.model_cpu_start()
            t0 = time.perf_counter()
        try:
            return await self.inner.complete(request)
        finally:
            if act:
                self.probe.model_done(t0)
            else:
                self.probe.extra_model(t0)


def _tool(setup: Setup, probe: Probe) -> tether.Tool:
    effects = setup.effects

    async def reconcile(op: Any, ctx: tether.ToolContext) -> tether.Reconciliation:
        probe.touch()
        if effects.has_key(ctx.op_id):
            return tether.Reconciliation("done", "already done (found in the effect log)")
        return tether.Reconciliation("not_done")

    @tether.tool(effect="write", reconcile=reconcile)
    def do_step(step: int, ctx: tether.ToolContext) -> str:
        """Process one record (appends to the effect log; returns 1 KB)."""
        t0 = probe.tool_start()
        effects.append(step, ctx.op_id)
        setup.after_effect(step)
        out = tool_output(step)
        probe.tool_done(t0)
        return out

    return do_step  # type: ignore[no-any-return]


async def _run(setup: Setup, probe: Probe, ready: Any) -> dict[str, Any]:
    store: tether.Store | None = None
    try:
        if setup.resume:
            setup.resume_called_at = time.perf_counter()
            store = await _open(setup)
            task_id = (setup.workdir / "task_id").read_text().strip()
            # The decision of the killed round is journaled and is not asked again, so
            # the next act call is the step after the last effect.
            first = setup.effects.last_step()
        else:
            store = await _open(setup)
            task = await tether.create_task(store, spec_for(setup.n))
            task_id = task.task_id
            (setup.workdir / "task_id").write_text(task_id)
            first = 0
            ready()
        model = _TimedModel(
            tether.ScriptedModel(policy=_Policy(probe, first), name="peers", keep_requests=1),
            probe,
        )
        registry = tether.ToolRegistry([_tool(setup, probe)])
        engine = tether.Engine(store, tether.ModelSet(model), registry=registry)
        result = await engine.run(task_id)
        probe.finish()
        return {
            "status": result.status,
            "stop_reason": result.stop_reason,
            "rounds": result.rounds,
            "waiting": dict(result.waiting or {}).get("reason"),
        }
    finally:
        if store is not None:
            await store.close()


def run(setup: Setup, probe: Probe, ready: Any) -> dict[str, Any]:
    """Run (or resume) N steps; `ready()` is called once the database is set up."""
    return asyncio.run(_run(setup, probe, ready))
