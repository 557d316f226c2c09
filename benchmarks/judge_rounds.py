"""Rounds per second early and late in ONE long task whose items are judged by `op` rules.

Every round the scripted actor makes one side-effecting call, `file_ticket(title=<the
Next item>, step=<k>)`, and the item's `done_when` rule (`op`, `file_ticket` with
`title` and `step` = `--steps`) is met only by its last step: every round adds a
succeeded op of the rules' tool while items stay open, which is what made the rule
judge's work grow with the rounds already done (issue 27). The task runs in one process,
one `Engine.run`, on SQLite (synchronous NORMAL) in a temporary folder; no LLM judge.

Printed (JSON): rounds/s in an early window and in the last window, and their ratio.
The store calls a rule-judged round makes are pinned by a test, not measured here
(`tests/integration/test_store_calls_per_round.py`).

    .venv/bin/python benchmarks/judge_rounds.py                   # 30 items x 100 steps
    .venv/bin/python benchmarks/judge_rounds.py --items 10 --steps 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import tether
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.tasks import create_task
from tether.spec import parse_spec
from tether.store.sqlite import SQLiteStore
from tether.tools.builtin.files import default_registry


def _spec(items: int, steps: int) -> Any:
    return parse_spec(
        {
            "name": "tickets",
            "objective": "file the tickets",
            "items": [
                {
                    "id": f"t{k}",
                    "title": f"ticket t{k}",
                    "done_when": {
                        "kind": "op",
                        "tool": "file_ticket",
                        "args": {"title": f"t{k}", "step": steps},
                    },
                }
                for k in range(1, items + 1)
            ],
            "tools": ["file_ticket"],
            "limits": {
                "max_rounds": items * steps + 50,
                "no_progress_rounds": 1000,
                "max_attempts_per_item": 1000,
                "max_rounds_per_item": None,
            },
        }
    )


async def run(items: int, steps: int, window: int) -> dict[str, Any]:
    tickets: dict[str, str] = {}
    stamps: list[float] = []
    step_of: dict[str, int] = {}

    @tether.tool(effect="write", idempotent=True)
    def file_ticket(title: str, step: int, ctx: tether.ToolContext) -> str:
        """File one step of a ticket."""
        return tickets.setdefault(ctx.op_id, f"{title}#{step}")

    registry = default_registry(lambda: None)  # type: ignore[arg-type,return-value]
    registry.add(file_ticket)

    def actor(request: ModelRequest) -> ModelResponse:
        stamps.append(time.perf_counter())
        nxt = request.ledger["next"] if request.ledger else None
        if nxt is None:
            return ModelResponse("done")
        step_of[nxt] = step_of.get(nxt, 0) + 1
        return ModelResponse("filing", (tool_call("file_ticket", title=nxt, step=step_of[nxt]),))

    with tempfile.TemporaryDirectory() as tmp:
        store = await SQLiteStore.open(Path(tmp) / "t.db", synchronous="NORMAL")
        try:
            task = await create_task(store, _spec(items, steps), workspace=Path(tmp))
            engine = Engine(
                store,
                ModelSet(actor=ScriptedModel(policy=actor, keep_requests=1)),
                lease_ttl=60,
                registry=registry,
            )
            result = await engine.run(task.task_id)
        finally:
            await store.close()
    rounds = len(stamps) - 1
    # The windows fit in the run: at most a third of it each (a short run, `--items 3
    # --steps 5`, still compares its early rounds with its last ones).
    window = min(window, rounds // 3)
    if window < 1:
        raise SystemExit(f"judge_rounds: {rounds} rounds is too short to compare two windows")

    def rate(lo: int, hi: int) -> float:
        return (hi - lo) / (stamps[hi] - stamps[lo])

    early = rate(window // 2, window // 2 + window)
    late = rate(rounds - window, rounds)
    return {
        "rounds": rounds,
        "status": result.status,
        "early_rounds_per_s": round(early, 1),
        "late_rounds_per_s": round(late, 1),
        "late_over_early": round(late / early, 2),
        "window": window,
        "tickets": len(tickets),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=30)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--window", type=int, default=500)
    a = ap.parse_args()
    print(json.dumps(asyncio.run(run(a.items, a.steps, a.window)), indent=2))


if __name__ == "__main__":
    main()
