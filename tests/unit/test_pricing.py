"""The price table: prefix matching, normalized usage, overrides."""

from __future__ import annotations

import pytest

from tether.models.base import Usage
from tether.models.pricing import DEFAULT_PRICES, Price, PriceTable, cost_usd, price_for


def test_prefix_matching_prefers_the_longest_prefix() -> None:
    assert price_for("gpt-4.1") == DEFAULT_PRICES["gpt-4.1"]
    assert price_for("gpt-4.1-mini-2025-04-14") == DEFAULT_PRICES["gpt-4.1-mini"]
    assert price_for("gpt-4.1-2025-04-14") == DEFAULT_PRICES["gpt-4.1"]
    assert price_for("gpt-4o-mini") == DEFAULT_PRICES["gpt-4o-mini"]
    assert price_for("claude-3-5-haiku-20241022") == DEFAULT_PRICES["claude-3-5-haiku"]
    assert price_for("claude-opus-4-1-20250805") == DEFAULT_PRICES["claude-opus-4-1"]
    assert price_for("claude-opus-4-20250514") == DEFAULT_PRICES["claude-opus-4-1"]


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
    price = price_for(model)
    assert price is not None
    assert 0 < price.cached_input <= price.input < price.output


def test_provider_prefixes_are_ignored() -> None:
    assert price_for("openai:gpt-4.1-mini") == DEFAULT_PRICES["gpt-4.1-mini"]
    assert price_for("anthropic:claude-sonnet-4-6") == DEFAULT_PRICES["claude-sonnet"]
    assert price_for("deepseek/deepseek-chat") == DEFAULT_PRICES["deepseek-chat"]
    assert (
        price_for("openai-compatible:http://127.0.0.1:8000/v1#deepseek-chat")
        == (DEFAULT_PRICES["deepseek-chat"])
    )
    assert price_for("GPT-4.1-MINI") == DEFAULT_PRICES["gpt-4.1-mini"]


def test_unknown_and_local_models_cost_nothing() -> None:
    usage = Usage(input_tokens=10_000, output_tokens=1_000)
    assert cost_usd("qwen3-8b", usage) == 0.0
    assert cost_usd("llama3.1:8b", usage) == 0.0
    assert cost_usd("openai-compatible:http://127.0.0.1:8000/v1#local", usage) == 0.0
    assert cost_usd("scripted", usage) == 0.0
    assert price_for("qwen3-8b") is None


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
    overrides = {"gpt-4.1-mini": (1.0, 0.5, 2.0), "qwen3": Price(0.1, 0.1, 0.2)}
    assert cost_usd("gpt-4.1-mini", usage, overrides) == pytest.approx(3.0)
    assert cost_usd("qwen3-8b", usage, overrides) == pytest.approx(0.3)
    assert cost_usd("gpt-4.1", usage, overrides) == pytest.approx(10.0)  # defaults kept
    only = PriceTable({"mine": (1, 1, 1, 2)}, include_defaults=False)
    assert only.lookup("gpt-4.1") is None
    mine = only.lookup("mine-v2")
    assert mine == Price(1, 1, 1, 2)
    assert mine is not None and mine.cache_write_price == 2


def test_bad_override_is_rejected() -> None:
    with pytest.raises(ValueError):
        PriceTable({"x": (1.0, 2.0)})  # type: ignore[dict-item]


def test_script_file_names_are_not_model_names() -> None:
    assert price_for("scripted:gpt-4.1.yaml") is None
