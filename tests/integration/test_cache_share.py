"""How much of each act request a provider's prompt cache can reuse, at the defaults.

Within an epoch every request re-sends the previous one whole and appends the last
round's messages; a compaction makes one request of which only the tools stay. So the
share is set by how big a round is next to the budget (`context.input_budget_tokens`,
32,000 by default) and by how far below the budget a compaction brings the request
(`compaction.KEEP_SHARE` of it as verbatim recent rounds). These figures are
deterministic (token estimates and message bytes, no clock): they are asserted.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.loop import events_of, run_task, spec_of
from tether import tokens
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.round.context import SUMMARY_PREFIX
from tether.store.memory import MemoryStore

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "loop_bench.py"


def test_the_loop_bench_reuses_at_least_95_percent_at_the_default_budget(tmp_path: Path) -> None:
    """`benchmarks/loop_bench.py` (1 KB tool outputs, the ledger in every round's
    progress update) at the default budget: the mean unchanged-prefix share is at least
    0.95, with one compaction per ~60 rounds (16,000 tokens and a third kept: 0.923)."""
    out = tmp_path / "figures.json"
    args = ["--rounds", "600", "--naive-rounds", "20", "--no-demo", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["budget"] == 32_000
    default = doc["results"][0]
    assert default["tokens"]["over_budget"] == 0
    assert 6 <= default["compactions"] <= 10
    assert default["prefix"]["mean"] >= 0.95
    # A round adds ~1.8 KB; within an epoch the previous request is re-sent whole.
    assert default["prefix"]["mean_in_turn"] >= 0.97
    assert default["prefix"]["mean_compaction"] < 0.1  # only the tools stay


@pytest.fixture
async def store() -> MemoryStore:
    return await MemoryStore.open()


async def test_a_compaction_keeps_a_quarter_of_the_budget_as_recent_rounds(
    store: MemoryStore, tmp_path: Path
) -> None:
    """After each compaction the request holds the tools, the system prompt, the summary
    and the most recent whole rounds that fit in a quarter of the budget (not a third):
    each compaction then buys more rounds before the next one."""
    budget = 8_000
    (tmp_path / "data.txt").write_text("abcdefghij" * 100)
    acts: list[ModelRequest] = []

    def policy(request: ModelRequest) -> object:
        if request.purpose == "act":
            acts.append(request)
            return ModelResponse("reading again", (tool_call("read_file", path="data.txt"),))
        if request.purpose == "compact":
            return "Read data.txt many times; nothing written yet."
        return "{}"

    spec = spec_of(
        2,
        context={"input_budget_tokens": budget, "preview_chars": 2000},
        limits={"max_rounds": 200, "no_progress_rounds": 10_000, "max_rounds_per_item": None},
    )
    model = ScriptedModel(policy=policy, keep_requests=1)
    tid, _ = await run_task(store, spec, tmp_path, model, compact=model)
    compactions = await events_of(store, tid, "context.compacted")
    assert len(compactions) >= 4
    # The first act request after each compaction is the one that is smaller than the
    # request before it.
    firsts = [
        cur
        for prev, cur in itertools.pairwise(acts)
        if tokens.estimate_request(cur) < tokens.estimate_request(prev)
    ]
    assert len(firsts) == len(compactions)
    # One round: the call, its result and the progress update.
    one = max(sum(tokens.estimate_message(m) for m in r.messages[-3:]) for r in acts[1:10])
    for req in firsts:
        assert req.messages[0].content.startswith(SUMMARY_PREFIX)
        recent = sum(tokens.estimate_message(m) for m in req.messages[1:])
        assert budget // 4 - 2 * one <= recent <= budget // 4 + one, (recent, one)
    # ...and each cycle lasts as many rounds as the rest of the budget holds.
    gaps = [b["upto_round"] - a["upto_round"] for a, b in itertools.pairwise(compactions)]
    assert min(gaps) >= (budget * 0.6) // one - 2
