"""Prices of common models, in USD per million tokens, and the cost of one call.

A model name is matched by its longest known prefix, so dated versions
(`gpt-4.1-mini-2025-04-14`, `claude-sonnet-4-5-20250929`) find their family. Provider
prefixes (`openai:`, `anthropic:`, `openai/`) are ignored. Unknown models, local ones
included, cost 0.0. Prices change: pass your own table (a mapping of name prefix to
`Price` or to a tuple `(input, cached_input, output[, cache_write])`) to override or
extend the defaults.

Cost uses the normalized usage of `tether.models.base.Usage`: `input_tokens` is the
whole prompt, of which `cached_input_tokens` were read from the cache (charged at the
cached price) and `cache_write_tokens` were written to it (charged at the cache-write
price, which is the input price unless the provider charges extra, as Anthropic does).

The defaults were checked against the providers' public price pages in 2025; treat
them as estimates for budgets, not as invoices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tether.models.base import Usage


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: float
    cached_input: float
    output: float
    cache_write: float | None = None
    """Price of tokens written to the prompt cache; None means the input price."""

    @property
    def cache_write_price(self) -> float:
        """The effective cache-write price."""
        return self.input if self.cache_write is None else self.cache_write


PriceLike = Price | tuple[float, float, float] | tuple[float, float, float, float]

DEFAULT_PRICES: Mapping[str, Price] = {
    # OpenAI (cached input is read at a discount; writes cost the normal input price)
    "gpt-4.1": Price(2.00, 0.50, 8.00),
    "gpt-4.1-mini": Price(0.40, 0.10, 1.60),
    "gpt-4.1-nano": Price(0.10, 0.025, 0.40),
    "gpt-4o": Price(2.50, 1.25, 10.00),
    "gpt-4o-mini": Price(0.15, 0.075, 0.60),
    "gpt-5": Price(1.25, 0.125, 10.00),
    "gpt-5-mini": Price(0.25, 0.025, 2.00),
    "gpt-5-nano": Price(0.05, 0.005, 0.40),
    "o3": Price(2.00, 0.50, 8.00),
    "o4-mini": Price(1.10, 0.275, 4.40),
    # Anthropic (cache reads at 0.1x input, 5-minute cache writes at 1.25x input). The
    # bare family names price later versions at the family's latest known price.
    "claude-opus": Price(5.00, 0.50, 25.00, 6.25),
    "claude-opus-4-0": Price(15.00, 1.50, 75.00, 18.75),
    "claude-opus-4-1": Price(15.00, 1.50, 75.00, 18.75),
    "claude-opus-4-2025": Price(15.00, 1.50, 75.00, 18.75),  # claude-opus-4-20250514
    "claude-3-opus": Price(15.00, 1.50, 75.00, 18.75),
    "claude-sonnet": Price(3.00, 0.30, 15.00, 3.75),
    "claude-3-7-sonnet": Price(3.00, 0.30, 15.00, 3.75),
    "claude-3-5-sonnet": Price(3.00, 0.30, 15.00, 3.75),
    "claude-haiku": Price(1.00, 0.10, 5.00, 1.25),
    "claude-3-5-haiku": Price(0.80, 0.08, 4.00, 1.00),
    "claude-3-haiku": Price(0.25, 0.03, 1.25, 0.30),
    # DeepSeek (cache hits are cheap; no charge for cache writes)
    "deepseek-chat": Price(0.28, 0.028, 0.42),
    "deepseek-reasoner": Price(0.28, 0.028, 0.42),
}


def _coerce(value: PriceLike) -> Price:
    if isinstance(value, Price):
        return value
    if len(value) == 3:
        return Price(float(value[0]), float(value[1]), float(value[2]))
    if len(value) == 4:
        return Price(float(value[0]), float(value[1]), float(value[2]), float(value[3]))
    raise ValueError(f"a price is (input, cached_input, output[, cache_write]), not {value!r}")


def _bare(model: str) -> str:
    name = model.strip().lower()
    if name.startswith("scripted:"):
        return name  # a script's file name is not a model name
    if "#" in name:  # "openai-compatible:http://host/v1#model"
        name = name.rsplit("#", 1)[1]
    # "openai:gpt-4.1", "anthropic:claude-…", "openai/gpt-4.1", "deepseek/deepseek-chat"
    for sep in (":", "/"):
        if sep in name and not name.startswith(("http://", "https://")):
            name = name.rsplit(sep, 1)[1]
    return name


class PriceTable:
    """A table of prices with longest-prefix lookup.

    `PriceTable()` holds the defaults; `PriceTable(overrides)` adds or replaces
    entries; `PriceTable(overrides, include_defaults=False)` uses only yours.
    """

    def __init__(
        self,
        overrides: Mapping[str, PriceLike] | None = None,
        *,
        include_defaults: bool = True,
    ) -> None:
        self.prices: dict[str, Price] = dict(DEFAULT_PRICES) if include_defaults else {}
        for prefix, value in (overrides or {}).items():
            self.prices[prefix.strip().lower()] = _coerce(value)

    def lookup(self, model: str) -> Price | None:
        """The price of the longest known prefix of `model`, or None."""
        name = _bare(model)
        best: str | None = None
        for prefix in self.prices:
            if name.startswith(prefix) and (best is None or len(prefix) > len(best)):
                best = prefix
        return None if best is None else self.prices[best]

    def cost_usd(self, model: str, usage: Usage) -> float:
        """USD cost of one call's usage (0.0 for an unknown model)."""
        price = self.lookup(model)
        if price is None:
            return 0.0
        cached = max(0, min(usage.cached_input_tokens, usage.input_tokens))
        written = max(0, min(usage.cache_write_tokens, usage.input_tokens - cached))
        fresh = max(0, usage.input_tokens - cached - written)
        total = (
            fresh * price.input
            + cached * price.cached_input
            + written * price.cache_write_price
            + max(0, usage.output_tokens) * price.output
        )
        return total / 1_000_000


_DEFAULT_TABLE = PriceTable()


def price_for(model: str, prices: Mapping[str, PriceLike] | None = None) -> Price | None:
    """The price of a model (defaults, with `prices` overriding), or None if unknown."""
    table = _DEFAULT_TABLE if prices is None else PriceTable(prices)
    return table.lookup(model)


def cost_usd(model: str, usage: Usage, prices: Mapping[str, PriceLike] | None = None) -> float:
    """USD cost of one call: `model` is the model name (any known prefix matches),
    `usage` the normalized usage; `prices` overrides or extends the default table.
    Unknown models (local ones, for instance) cost 0.0."""
    table = _DEFAULT_TABLE if prices is None else PriceTable(prices)
    return table.cost_usd(model, usage)
