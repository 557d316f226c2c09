"""A money budget that could never trip is refused when a task starts, through the
Python API (`Engine.run`) and the CLI (`tether run`, exit 2); with a price it runs and
its calls are counted at that price."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cli import assert_clean_error, spec_dict, tether
from tests.support.loop import by_purpose, events_of, honest_actor, rules_judge, run_task, spec_of
from tests.support.probe import Actor, Beats, probe_answered, start_probed, until
from tether import errors
from tether.clock import FakeClock
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel
from tether.runtime.wiring import check_task
from tether.store.memory import MemoryStore

LOCAL = "openai-compatible:http://127.0.0.1:9/v1#qwen3-8b"


class LocalModel(ScriptedModel):
    """A scripted model posing as a real one: it costs money, as far as tether knows."""

    costs_nothing = False


def _local(policy: Any) -> LocalModel:
    return LocalModel(policy=policy, name=LOCAL)


async def test_the_python_api_refuses_a_money_budget_without_prices(tmp_path: Path) -> None:
    store = MemoryStore()
    model = _local(by_purpose(act=honest_actor, judge=rules_judge))
    with pytest.raises(errors.SpecError, match=r"no price is known for the model") as caught:
        await run_task(store, spec_of(1, budget={"money_usd": 1}), tmp_path, model)
    assert LOCAL in str(caught.value) and "allow_unpriced" in str(caught.value)
    assert model.calls == 0  # refused before any call


async def test_with_a_contract_price_it_runs_and_spends_at_that_price(tmp_path: Path) -> None:
    def answering_as_its_weights(request: ModelRequest) -> Any:
        # The endpoint names its own weights: the configured name's price applies.
        response = honest_actor(request)
        return ModelResponse(response.text, response.tool_calls, response.usage, "Org/Qwen3-8B")

    store = MemoryStore()
    model = _local(answering_as_its_weights)
    spec = spec_of(
        1,
        budget={"money_usd": 1},
        models={"judge": "rules"},
        prices={"qwen3-8b": {"input": 100_000, "output": 200_000}},
    )
    tid, result = await run_task(store, spec, tmp_path, model)
    assert result.status == "satisfied"
    (called, *_) = await events_of(store, tid, "model.called")
    expected = (called["input_tokens"] * 100_000 + called["output_tokens"] * 200_000) / 1e6
    assert called["input_tokens"] > 0 and called["cost_usd"] == pytest.approx(expected)


async def test_allow_unpriced_runs_at_zero(tmp_path: Path) -> None:
    store = MemoryStore()
    spec = spec_of(1, budget={"money_usd": 1, "allow_unpriced": True}, models={"judge": "rules"})
    tid, result = await run_task(store, spec, tmp_path, _local(honest_actor))
    assert result.status == "satisfied"
    assert all(c["cost_usd"] == 0 for c in await events_of(store, tid, "model.called"))


async def test_check_task_refuses_before_anything_is_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TETHER_PRICES", raising=False)
    spec = spec_of(1, budget={"money_usd": 1}, models={"actor": LOCAL, "judge": "rules"})
    with pytest.raises(errors.SpecError, match="qwen3-8b"):
        await check_task(spec)


async def test_a_price_file_from_the_environment_is_read_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text("qwen3-8b: {input: 0.1, output: 0.2}\n", encoding="utf-8")
    monkeypatch.setenv("TETHER_PRICES", str(path))
    spec = spec_of(1, budget={"money_usd": 1}, models={"actor": LOCAL, "judge": "rules"})
    await check_task(spec)  # priced by the file: accepted
    path.write_text("qwen3-8b: {input: 0.1}\n", encoding="utf-8")
    with pytest.raises(errors.UserError, match="TETHER_PRICES"):
        await check_task(spec)


def test_tether_run_refuses_with_exit_2(tmp_path: Path) -> None:
    spec = spec_dict(1, budget={"money_usd": 2})
    spec["models"] = {"actor": LOCAL}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    proc = tether("run", "spec.yaml", cwd=tmp_path)
    assert_clean_error(proc, 2, LOCAL, "budget.money_usd", "prices:", "allow_unpriced")
    assert not (tmp_path / ".tether" / "tether.db").exists()  # refused before it was written


async def test_a_status_probe_is_counted_at_the_contract_s_price(
    tmp_path: Path, clock: FakeClock
) -> None:
    """The probe starts from the heartbeat, which starts before the contract is read:
    it is counted by the same table as the round's calls."""
    store = await MemoryStore.open(clock=clock)
    beats = Beats(store)
    actor = Actor(["WORKING"])
    priced = {"prices": {"actor": {"input": 300_000, "output": 600_000}}}
    tid, run = await start_probed(store, tmp_path, actor, clock, spec=priced)
    await until(lambda: actor.hanging, "the round's model call")
    await beats.wait()
    clock.advance(301)
    await until(lambda: probe_answered(store, tid, 1), "the probe's answer")
    actor.release.set()
    assert (await asyncio.wait_for(run, 30)).status == "satisfied"
    calls = await events_of(store, tid, "model.called")
    assert {c["purpose"] for c in calls} >= {"probe", "act"}
    for call in calls:
        expected = (call["input_tokens"] * 300_000 + call["output_tokens"] * 600_000) / 1e6
        assert call["cost_usd"] == pytest.approx(expected) and expected > 0, call["purpose"]
