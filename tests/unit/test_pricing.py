"""The price table: exact, dated and prefix matching, normalized usage, overrides, price
files, genai-prices, and the refusal of a money budget without prices."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tether import errors
from tether.models import pricing
from tether.models.base import Usage
from tether.models.pricing import (
    DEFAULT_PRICES,
    PRICES_ENV,
    Price,
    PriceTable,
    check_prices,
    cost_usd,
    price_for,
    table_for,
)
from tether.models.scripted import ScriptedModel
from tether.spec import TaskSpec, parse_spec

BUILT_IN = PriceTable()


def test_names_match_exactly_or_with_a_date() -> None:
    assert BUILT_IN.lookup("gpt-4.1") == DEFAULT_PRICES["gpt-4.1"]
    assert BUILT_IN.lookup("gpt-4.1-mini-2025-04-14") == DEFAULT_PRICES["gpt-4.1-mini"]
    assert BUILT_IN.lookup("gpt-4.1-2025-04-14") == DEFAULT_PRICES["gpt-4.1"]
    assert BUILT_IN.lookup("gpt-4o-mini") == DEFAULT_PRICES["gpt-4o-mini"]
    assert BUILT_IN.lookup("claude-3-5-haiku-20241022") == DEFAULT_PRICES["claude-3-5-haiku"]
    assert BUILT_IN.lookup("claude-opus-4-1-20250805") == DEFAULT_PRICES["claude-opus-4-1"]
    assert BUILT_IN.lookup("claude-opus-4-20250514") == DEFAULT_PRICES["claude-opus-4"]
    assert BUILT_IN.lookup("claude-3-7-sonnet-latest") == DEFAULT_PRICES["claude-3-7-sonnet"]
    assert BUILT_IN.lookup("gpt-5.2-2025-12-11") == DEFAULT_PRICES["gpt-5.2"]


@pytest.mark.parametrize(
    ("model", "input_", "output"),
    [
        # The models the 2025 prefix table priced ~10x too low or at $0.
        ("gpt-5.2-pro", 21.00, 168.00),
        ("o3-pro", 20.00, 80.00),
        ("o1", 15.00, 60.00),
        ("o1-pro", 150.00, 600.00),
        ("gpt-5-pro", 15.00, 120.00),
        ("deepseek-v3.2", 0.28, 0.42),
        ("gpt-5.2", 1.75, 14.00),
        ("o3", 2.00, 8.00),
        ("claude-opus-4-5-20251101", 5.00, 25.00),
    ],
)
def test_a_longer_name_is_never_priced_as_its_shorter_neighbour(
    model: str, input_: float, output: float
) -> None:
    price = BUILT_IN.lookup(model)
    assert price is not None and (price.input, price.output) == (input_, output)


def test_a_model_is_not_its_prefix_s_price() -> None:
    # o3 is not o3-deep-research, gpt-5 is not gpt-5.3: unknown, not silently cheap.
    for model in ("o3-deep-research", "gpt-5.3", "gpt-4o-realtime-preview", "o1-preview-x"):
        assert BUILT_IN.lookup(model) is None, model


def test_prefix_keys_end_with_a_star_and_the_longest_wins() -> None:
    assert BUILT_IN.lookup("claude-opus-4-6") == DEFAULT_PRICES["claude-opus-*"]
    table = PriceTable({"qwen*": (1, 1, 1), "qwen3-*": (2, 2, 2), "qwen3-8b": (3, 3, 3)})
    assert table.lookup("qwen2.5-7b") == Price(1, 1, 1)
    assert table.lookup("qwen3-32b") == Price(2, 2, 2)
    assert table.lookup("qwen3-8b") == Price(3, 3, 3)  # exact before prefixes


@pytest.mark.parametrize(
    "model",
    [
        "gpt-4.1",
        "gpt-4.1-mini",
        "gpt-4o-mini",
        "claude-sonnet-4-6",
        "claude-haiku-4-5-20251001",
        "claude-opus-4-6",
        "deepseek-chat",
    ],
)
def test_common_models_are_priced(model: str) -> None:
    price = BUILT_IN.lookup(model)
    assert price is not None
    assert 0 < price.cached_input <= price.input < price.output


def test_provider_prefixes_are_ignored() -> None:
    assert BUILT_IN.lookup("openai:gpt-4.1-mini") == DEFAULT_PRICES["gpt-4.1-mini"]
    assert BUILT_IN.lookup("anthropic:claude-sonnet-4-6") == DEFAULT_PRICES["claude-sonnet-*"]
    assert BUILT_IN.lookup("deepseek/deepseek-chat") == DEFAULT_PRICES["deepseek-chat"]
    assert (
        BUILT_IN.lookup("openai-compatible:http://127.0.0.1:8000/v1#deepseek-chat")
        == (DEFAULT_PRICES["deepseek-chat"])
    )
    assert BUILT_IN.lookup("GPT-4.1-MINI") == DEFAULT_PRICES["gpt-4.1-mini"]


def test_a_user_price_may_name_the_whole_tether_name() -> None:
    local = "openai-compatible:http://10.0.0.5:8000/v1#qwen3-8b"
    table = PriceTable({local: {"input": 0.1, "output": 0.3}})
    assert table.lookup(local) == Price(0.1, 0.1, 0.3)  # cached input: the input price
    assert table.lookup("openai-compatible:http://10.0.0.9:8000/v1#qwen3-8b") is None


def test_unknown_and_local_models_have_no_price() -> None:
    usage = Usage(input_tokens=10_000, output_tokens=1_000)
    assert BUILT_IN.cost_usd("qwen3-8b", usage) == 0.0
    assert BUILT_IN.cost_usd("llama3.1:8b", usage) == 0.0
    assert BUILT_IN.cost_usd("openai-compatible:http://127.0.0.1:8000/v1#local", usage) == 0.0
    assert BUILT_IN.cost_usd("scripted", usage) == 0.0
    assert BUILT_IN.lookup("qwen3-8b") is None


def test_openai_cost_with_cached_input() -> None:
    # gpt-4.1-mini: 0.40 in, 0.10 cached, 1.60 out per million.
    usage = Usage(input_tokens=2_000_000, cached_input_tokens=1_000_000, output_tokens=500_000)
    assert cost_usd("gpt-4.1-mini", usage) == pytest.approx(0.40 + 0.10 + 0.80)


def test_anthropic_cost_with_cache_reads_and_writes() -> None:
    # claude-sonnet: 3.00 in, 0.30 read, 3.75 write, 15.00 out per million.
    usage = Usage(
        input_tokens=1_000_000 + 2_000_000 + 400_000,  # normalized: fresh + read + written
        cached_input_tokens=2_000_000,
        cache_write_tokens=400_000,
        output_tokens=100_000,
    )
    assert cost_usd("claude-sonnet-4-6", usage) == pytest.approx(3.00 + 0.60 + 1.50 + 1.50)


def test_inconsistent_usage_never_goes_negative() -> None:
    usage = Usage(input_tokens=100, cached_input_tokens=500, cache_write_tokens=50)
    assert cost_usd("gpt-4.1", usage) == pytest.approx(100 * 0.50 / 1_000_000)


def test_overrides_replace_and_extend() -> None:
    usage = Usage(input_tokens=1_000_000, output_tokens=1_000_000)
    overrides = {"gpt-4.1-mini": (1.0, 0.5, 2.0), "qwen3*": Price(0.1, 0.1, 0.2)}
    assert cost_usd("gpt-4.1-mini", usage, overrides) == pytest.approx(3.0)
    assert cost_usd("qwen3-8b", usage, overrides) == pytest.approx(0.3)
    assert cost_usd("gpt-4.1", usage, overrides) == pytest.approx(10.0)  # defaults kept
    only = PriceTable({"mine*": (1, 1, 1, 2)}, include_defaults=False)
    assert only.lookup("gpt-4.1") is None
    mine = only.lookup("mine-v2")
    assert mine == Price(1, 1, 1, 2)
    assert mine is not None and mine.cache_write_price == 2


def test_bad_override_is_rejected() -> None:
    with pytest.raises(ValueError):
        PriceTable({"x": (1.0, 2.0)})  # type: ignore[dict-item]


def test_script_file_names_are_not_model_names() -> None:
    assert price_for("scripted:gpt-4.1.yaml", {}) is None


def test_the_answering_model_s_price_else_the_configured_one() -> None:
    table = PriceTable({"my-endpoint-model": {"input": 2.0, "output": 4.0}})
    usage = Usage(input_tokens=1_000_000, output_tokens=1_000_000)
    # An endpoint that answers with a name nobody prices: the configured name's price.
    assert table.cost_usd("Org/Weights-8B", usage, configured="my-endpoint-model") == 6.0
    assert table.cost_usd("gpt-4.1", usage, configured="my-endpoint-model") == 10.0
    assert table.cost_usd("", usage, configured="my-endpoint-model") == 6.0


def test_a_price_file_and_the_contract_override_the_built_in_table(tmp_path: Path) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text(
        "prices:\n"
        "  gpt-4.1: {input: 9, output: 9}\n"
        "  qwen3-8b: {input: 0.5, output: 1.5, cached_input: 0.05}\n",
        encoding="utf-8",
    )
    table = table_for(None, env={PRICES_ENV: str(path)})
    assert table.lookup("openai:gpt-4.1") == Price(9, 9, 9)
    assert table.lookup("openai-compatible:http://h:1/v1#qwen3-8b") == Price(0.5, 0.05, 1.5)
    assert table.lookup("gpt-4.1-mini") == DEFAULT_PRICES["gpt-4.1-mini"]
    contract = table_for({"gpt-4.1": {"input": 1, "output": 2}}, env={PRICES_ENV: str(path)})
    assert contract.lookup("gpt-4.1") == Price(1, 1, 2)  # the contract over the file
    (tmp_path / "p.json").write_text(json.dumps({"m1": {"input": 1, "output": 1}}), "utf-8")
    assert table_for(None, env={PRICES_ENV: str(tmp_path / "p.json")}).lookup("m1") is not None


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[1, 2]", "mapping of model name"),
        ("gpt-4.1: 3\n", "must be a mapping"),
        ("gpt-4.1: {input: 1}\n", "write input and output"),
        ("gpt-4.1: {input: 1, output: -2}\n", "0 or more"),
        ("gpt-4.1: {input: 1, output: 2, outptu: 3}\n", "outptu"),
        ("a: [\n", "not YAML"),
    ],
)
def test_a_bad_price_file_is_a_clear_error(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(errors.UserError, match=re.escape(needle)):
        table_for(None, env={PRICES_ENV: str(path)})
    with pytest.raises(errors.UserError, match="cannot read"):
        table_for(None, env={PRICES_ENV: str(tmp_path / "missing.yaml")})


def test_genai_prices_fills_in_what_the_table_does_not_know() -> None:
    import genai_prices  # noqa: F401  (optional for users; the dev group installs it)

    table = PriceTable(genai_prices=True)
    assert BUILT_IN.lookup("gemini-2.5-pro") is None
    found = table.source("gemini-2.5-pro")
    assert found is not None and found[1] == "genai-prices" and found[0].output > 0
    # The built-in table wins for the models it names.
    assert table.source("openai:gpt-5.2-pro") == (DEFAULT_PRICES["gpt-5.2-pro"], "built-in")
    assert table.lookup("openai-compatible:http://127.0.0.1:8000/v1#qwen3-8b") is None


def test_without_genai_prices_the_table_still_works(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_genai(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("genai_prices"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_genai)
    pricing._genai_price.cache_clear()
    try:
        assert not pricing.genai_prices_installed()
        table = PriceTable(genai_prices=True)
        assert table.lookup("gemini-2.5-pro") is None
        assert table.lookup("gpt-5.2") == DEFAULT_PRICES["gpt-5.2"]
    finally:
        pricing._genai_price.cache_clear()


def _capped(**extra: Any) -> TaskSpec:
    data: dict[str, Any] = {
        "objective": "o",
        "items": [{"id": "a", "title": "a"}],
        "budget": {"money_usd": 5},
    }
    data.update(extra)
    return parse_spec(data)


LOCAL = "openai-compatible:http://127.0.0.1:8000/v1#qwen3-8b"


def test_a_money_budget_with_an_unpriced_model_is_refused() -> None:
    with pytest.raises(errors.SpecError) as caught:
        check_prices(_capped(), [LOCAL, "openai:gpt-4.1"], PriceTable())
    text = str(caught.value)
    assert LOCAL in text and "'openai:gpt-4.1'" not in text
    assert "budget.money_usd" in text and "prices:" in text and "qwen3-8b:" in text
    assert "TETHER_PRICES" in text and "allow_unpriced: true" in text
    assert caught.value.exit_code == 2


def test_a_milestone_s_money_budget_needs_prices_too() -> None:
    spec = parse_spec(
        {
            "objective": "o",
            "milestones": [{"id": "m", "title": "m", "budget": {"money_usd": 1}}],
            "items": [{"id": "a", "title": "a", "milestone": "m"}],
        }
    )
    with pytest.raises(errors.SpecError, match=r"milestones\.0\.budget\.money_usd"):
        check_prices(spec, [LOCAL], PriceTable())


def test_a_price_allow_unpriced_or_no_money_budget_lets_it_run() -> None:
    check_prices(_capped(prices={"qwen3-8b": {"input": 0.1, "output": 0.2}}), [LOCAL])
    check_prices(_capped(budget={"money_usd": 5, "allow_unpriced": True}), [LOCAL])
    check_prices(parse_spec({"objective": "o", "items": [{"id": "a", "title": "a"}]}), [LOCAL])
    check_prices(_capped(), [None, ScriptedModel(["x"], name="m-1")])  # a script is free


def test_contract_prices_are_validated() -> None:
    with pytest.raises(errors.SpecError, match="prices"):
        _capped(prices={"m": {"input": -1, "output": 1}})
    with pytest.raises(errors.SpecError, match="prices"):
        _capped(prices={"m": {"input": 1, "output": 1, "cached": 1}})
