"""Prices of models, in USD per million tokens, the cost of one call, and the refusal of
a money budget that could never trip.

Where a price comes from, first found wins:

1. the contract's `prices:` (per model: `input`, `output`, `cached_input`,
   `cache_write`);
2. the file `TETHER_PRICES` names (YAML or JSON, the same mapping, optionally under a
   top-level `prices:` key);
3. the built-in table below (`DEFAULT_PRICES`);
4. the `genai-prices` package, when it is installed (it is not a dependency).

A key matches a model name:

- **exactly** (`gpt-5.2-pro`);
- **with a date or `-latest` after it**: `gpt-4.1-mini` prices `gpt-4.1-mini-2025-04-14`,
  `claude-sonnet-4-5` prices `claude-sonnet-4-5-20250929` and `claude-3-7-sonnet-latest`
  (never another model: `o3` does not price `o3-pro`, nor `gpt-5` `gpt-5.2`);
- **as a prefix** when it ends with `*` (`claude-opus-*`); the longest prefix wins.

Model names are tried as written (`openai-compatible:http://host/v1#qwen3`) and without
tether's provider prefix (`qwen3`; `openai:`, `anthropic:`, `openai/` ...). A model no
source prices has no price: its calls are counted at 0.0, so `check_prices` refuses a
contract with `budget.money_usd` (or a milestone's) whose model has no price, unless the
budget says `allow_unpriced: true`.

Cost uses the normalized usage of `tether.models.base.Usage`: `input_tokens` is the
whole prompt, of which `cached_input_tokens` were read from the cache (charged at the
cached price) and `cache_write_tokens` were written to it (charged at the cache-write
price, which is the input price unless the provider charges extra, as Anthropic does).

The built-in prices were checked against the providers' public price pages in December
2026; treat them as estimates for budgets, not as invoices.
"""

from __future__ import annotations

import contextvars
import functools
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tether import errors
from tether.models.base import Usage

if TYPE_CHECKING:
    from tether.spec import TaskSpec

#: The environment variable naming a price file.
PRICES_ENV = "TETHER_PRICES"


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


PriceLike = (
    Price
    | tuple[float, float, float]
    | tuple[float, float, float, float]
    | Mapping[str, float | None]
)

DEFAULT_PRICES: Mapping[str, Price] = {
    # OpenAI (cached input is read at a discount, none for the -pro models; writes cost
    # the normal input price)
    "gpt-5.2": Price(1.75, 0.175, 14.00),
    "gpt-5.2-chat-latest": Price(1.75, 0.175, 14.00),
    "gpt-5.2-pro": Price(21.00, 21.00, 168.00),
    "gpt-5.1": Price(1.25, 0.125, 10.00),
    "gpt-5.1-chat-latest": Price(1.25, 0.125, 10.00),
    "gpt-5.1-codex": Price(1.25, 0.125, 10.00),
    "gpt-5.1-codex-mini": Price(0.25, 0.025, 2.00),
    "gpt-5": Price(1.25, 0.125, 10.00),
    "gpt-5-chat-latest": Price(1.25, 0.125, 10.00),
    "gpt-5-codex": Price(1.25, 0.125, 10.00),
    "gpt-5-mini": Price(0.25, 0.025, 2.00),
    "gpt-5-nano": Price(0.05, 0.005, 0.40),
    "gpt-5-pro": Price(15.00, 15.00, 120.00),
    "gpt-4.1": Price(2.00, 0.50, 8.00),
    "gpt-4.1-mini": Price(0.40, 0.10, 1.60),
    "gpt-4.1-nano": Price(0.10, 0.025, 0.40),
    "gpt-4o": Price(2.50, 1.25, 10.00),
    "gpt-4o-mini": Price(0.15, 0.075, 0.60),
    "o1": Price(15.00, 7.50, 60.00),
    "o1-pro": Price(150.00, 150.00, 600.00),
    "o1-mini": Price(1.10, 0.55, 4.40),
    "o3": Price(2.00, 0.50, 8.00),
    "o3-pro": Price(20.00, 20.00, 80.00),
    "o3-mini": Price(1.10, 0.55, 4.40),
    "o4-mini": Price(1.10, 0.275, 4.40),
    # Anthropic (cache reads at 0.1x input, 5-minute cache writes at 1.25x input). A
    # family's prefix prices its later versions at the family's latest known price.
    "claude-opus-4-5": Price(5.00, 0.50, 25.00, 6.25),
    "claude-opus-4-1": Price(15.00, 1.50, 75.00, 18.75),
    "claude-opus-4-0": Price(15.00, 1.50, 75.00, 18.75),
    "claude-opus-4": Price(15.00, 1.50, 75.00, 18.75),  # claude-opus-4-20250514
    "claude-3-opus": Price(15.00, 1.50, 75.00, 18.75),
    "claude-opus-*": Price(5.00, 0.50, 25.00, 6.25),
    "claude-sonnet-4-5": Price(3.00, 0.30, 15.00, 3.75),
    "claude-sonnet-4-0": Price(3.00, 0.30, 15.00, 3.75),
    "claude-sonnet-4": Price(3.00, 0.30, 15.00, 3.75),
    "claude-3-7-sonnet": Price(3.00, 0.30, 15.00, 3.75),
    "claude-3-5-sonnet": Price(3.00, 0.30, 15.00, 3.75),
    "claude-sonnet-*": Price(3.00, 0.30, 15.00, 3.75),
    "claude-haiku-4-5": Price(1.00, 0.10, 5.00, 1.25),
    "claude-3-5-haiku": Price(0.80, 0.08, 4.00, 1.00),
    "claude-3-haiku": Price(0.25, 0.03, 1.25, 0.30),
    "claude-haiku-*": Price(1.00, 0.10, 5.00, 1.25),
    # DeepSeek V3.2 behind both API names (cache hits are cheap; no charge for writes)
    "deepseek-chat": Price(0.28, 0.028, 0.42),
    "deepseek-reasoner": Price(0.28, 0.028, 0.42),
    "deepseek-v3.2": Price(0.28, 0.028, 0.42),
    "deepseek-v3.2-exp": Price(0.28, 0.028, 0.42),
}

#: What may follow a key and still name the same model: a date (`-20250929`,
#: `-2025-04-14`, `@20240620`) or `-latest`.
_DATED = re.compile(r"(?:-\d{8}|-\d{4}-\d{2}-\d{2}|@\d{8}|-latest)")

_PRICE_FIELDS = ("input", "output", "cached_input", "cache_write")


def _coerce(value: PriceLike, where: str = "a price") -> Price:
    if isinstance(value, Price):
        return value
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(_PRICE_FIELDS))
        if unknown or "input" not in value or "output" not in value:
            raise ValueError(
                f"{where}: write input and output (USD per million tokens), optionally "
                f"cached_input and cache_write{'; not ' + ', '.join(unknown) if unknown else ''}"
            )
        numbers = {k: value.get(k) for k in _PRICE_FIELDS}
        for k, v in numbers.items():
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or v < 0):
                raise ValueError(f"{where}: {k} must be a number of USD, 0 or more, not {v!r}")
        inp = float(numbers["input"] or 0.0)
        cached = numbers["cached_input"]
        write = numbers["cache_write"]
        return Price(
            inp,
            inp if cached is None else float(cached),
            float(numbers["output"] or 0.0),
            None if write is None else float(write),
        )
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


def _names(model: str) -> list[str]:
    """The names a model is looked up by: as written, then without its prefixes."""
    full = model.strip().lower()
    bare = _bare(model)
    return [full] if bare == full else [full, bare]


def _match(prices: Mapping[str, Price], name: str) -> Price | None:
    """Exact, then dated, then the longest `*` prefix."""
    exact = prices.get(name)
    if exact is not None:
        return exact
    dated = [
        k
        for k in prices
        if not k.endswith("*") and name.startswith(k) and _DATED.fullmatch(name[len(k) :])
    ]
    if dated:
        return prices[max(dated, key=len)]
    prefixes = [k for k in prices if k.endswith("*") and name.startswith(k[:-1])]
    return prices[max(prefixes, key=len)] if prefixes else None


def genai_prices_installed() -> bool:
    """Whether the optional `genai-prices` package can be imported."""
    try:
        import genai_prices  # noqa: F401
    except ImportError:
        return False
    return True


_PROVIDER_IDS = {"openai": "openai", "anthropic": "anthropic", "deepseek": "deepseek"}


@functools.lru_cache(maxsize=256)
def _genai_price(model: str) -> Price | None:
    """The price `genai-prices` knows for `model` (at its lowest tier: the cost of a
    thousand tokens of each kind, times a thousand), or None."""
    text = model.strip()
    prefix, sep, rest = text.partition(":")
    if sep and prefix.lower() == "scripted":
        return None  # no price anywhere; said before the (slow) import
    try:
        from genai_prices import Usage as GUsage
        from genai_prices import calc_price
    except ImportError:
        return None
    kwargs: dict[str, Any] = {}
    ref = _bare(text)
    if sep and prefix.lower() in _PROVIDER_IDS:
        kwargs["provider_id"] = _PROVIDER_IDS[prefix.lower()]
    elif sep and prefix.lower() == "openai-compatible":
        kwargs["provider_api_url"] = rest.rpartition("#")[0].strip()

    def per_million(**tokens: int) -> float:
        return float(calc_price(GUsage(**tokens), model_ref=ref, **kwargs).total_price) * 1000

    try:
        inp = per_million(input_tokens=1000)
        out = per_million(output_tokens=1000)
        cached = per_million(input_tokens=1000, cache_read_tokens=1000)
        write = per_million(input_tokens=1000, cache_write_tokens=1000)
    except (LookupError, ValueError, TypeError):
        return None
    return Price(inp, cached, out, write)


class PriceTable:
    """A table of prices (see the module for how keys match).

    `PriceTable()` holds the built-in prices; `PriceTable(overrides)` adds or replaces
    entries (model name or `prefix*` to a `Price`, a tuple `(input, cached_input,
    output[, cache_write])` or a mapping with `input`, `output`, `cached_input`,
    `cache_write`); `include_defaults=False` uses only yours; `genai_prices=True` asks
    the `genai-prices` package (when installed) about models no entry prices.
    """

    def __init__(
        self,
        overrides: Mapping[str, PriceLike] | None = None,
        *,
        include_defaults: bool = True,
        genai_prices: bool = False,
    ) -> None:
        self.user: dict[str, Price] = {}
        for key, value in (overrides or {}).items():
            self.user[key.strip().lower()] = _coerce(value, f"the price of {key!r}")
        self.defaults: Mapping[str, Price] = DEFAULT_PRICES if include_defaults else {}
        self.genai_prices = genai_prices
        # `source` per model name: every model call of a run asks for the same names.
        self._found: dict[str, tuple[Price, str] | None] = {}

    @property
    def prices(self) -> dict[str, Price]:
        """Every entry, yours over the built-in ones."""
        return {**self.defaults, **self.user}

    def source(self, model: str) -> tuple[Price, str] | None:
        """The price of `model` and where it came from (`yours`, `built-in`,
        `genai-prices`), or None."""
        if model in self._found:
            return self._found[model]
        found = self._source(model)
        self._found[model] = found
        return found

    def _source(self, model: str) -> tuple[Price, str] | None:
        for layer, label in ((self.user, "yours"), (self.defaults, "built-in")):
            for name in _names(model):
                found = _match(layer, name)
                if found is not None:
                    return found, label
        if self.genai_prices:
            found = _genai_price(model)
            if found is not None:
                return found, "genai-prices"
        return None

    def lookup(self, model: str) -> Price | None:
        """The price of `model`, or None when no source prices it."""
        found = self.source(model)
        return None if found is None else found[0]

    def cost_usd(self, model: str, usage: Usage, *, configured: str | None = None) -> float:
        """USD cost of one call's usage (0.0 for a model without a price). `model` is
        the model that answered; `configured` the name the task asked for, used when the
        answering name has no price (an endpoint that reports its own model name)."""
        # `source`, not `lookup`: the names looked up are cached there.
        hit = self.source(model) if model else None
        if hit is None and configured:
            hit = self.source(configured)
        if hit is None:
            return 0.0
        price = hit[0]
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


def load_price_file(path: str | Path) -> dict[str, Price]:
    """The prices of a YAML or JSON file: a mapping of model name (or `prefix*`) to
    `{input, output, cached_input, cache_write}`, optionally under `prices:`."""
    import yaml

    where = f"{PRICES_ENV}={path}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise errors.UserError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    try:
        data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise errors.UserError(
            f"{where}: not JSON: line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    except (ValueError, yaml.YAMLError) as exc:
        # One line, as a malformed spec or script says it (not PyYAML's caret lines).
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [""])[0]
        raise errors.UserError(f"{where}: not YAML: {at}{problem}") from None
    if isinstance(data, Mapping) and set(data) == {"prices"}:
        data = data["prices"]
    if not isinstance(data, Mapping):
        raise errors.UserError(
            f"{where}: write a mapping of model name to {{input: USD, output: USD}} "
            "per million tokens"
        )
    out: dict[str, Price] = {}
    for key, value in data.items():
        if not isinstance(value, Mapping):
            raise errors.UserError(f"{where}: the price of {key!r} must be a mapping")
        try:
            out[str(key).strip().lower()] = _coerce(value, f"the price of {key!r}")
        except ValueError as exc:
            raise errors.UserError(f"{where}: {exc}") from None
    return out


def table_for(
    contract_prices: Mapping[str, PriceLike] | None = None,
    env: Mapping[str, str] | None = None,
) -> PriceTable:
    """The price table of a task: its contract's prices over `TETHER_PRICES`'s over the
    built-in ones, then `genai-prices` when installed."""
    environ = os.environ if env is None else env
    merged: dict[str, PriceLike] = {}
    path = environ.get(PRICES_ENV, "").strip()
    if path:
        merged.update(load_price_file(path))
    for key, value in (contract_prices or {}).items():
        merged[key.strip().lower()] = value
    # `genai-prices` is asked (and imported, ~0.1 s) only for a model no entry prices:
    # a task's start does not pay for it, and without the package the lookup is None.
    return PriceTable(merged, genai_prices=True)


def spec_prices(spec: TaskSpec) -> dict[str, PriceLike]:
    """A contract's `prices:` as a mapping for `PriceTable`."""
    return {name: p.model_dump() for name, p in spec.prices.items()}


def money_budgets(spec: TaskSpec) -> list[str]:
    """Where the contract caps money (`budget`, `milestones[N].budget`)."""
    where = ["budget.money_usd"] if spec.budget.money_usd is not None else []
    where += [
        f"milestones.{n}.budget.money_usd"
        for n, m in enumerate(spec.milestones)
        if m.budget.money_usd is not None
    ]
    return where


def check_prices(spec: TaskSpec, models: Iterable[Any], table: PriceTable | None = None) -> None:
    """Refuse a contract with a money budget whose models (`Model` objects or names)
    have no price: its spend would count as $0 and the budget would never trip. A model
    that costs nothing by nature (`ScriptedModel`) needs no price; `budget.allow_unpriced:
    true` lets the task run anyway."""
    capped = money_budgets(spec)
    if not capped or spec.budget.allow_unpriced:
        return
    from tether.spec import source_of

    table = table or table_for(spec_prices(spec))
    missing: list[str] = []
    for model in models:
        if model is None or getattr(model, "costs_nothing", False):
            continue
        name = model if isinstance(model, str) else str(getattr(model, "name", ""))
        if name and name not in missing and table.lookup(name) is None:
            missing.append(name)
    if not missing:
        return
    names = ", ".join(repr(m) for m in missing)
    example = _bare(missing[0]) or missing[0]
    raise errors.SpecError(
        f"{capped[0]} is set but no price is known for the model{'s' if len(missing) > 1 else ''} "
        f"{names}, so its spend would count as $0 and the budget would never trip. Set a "
        f"price (USD per million tokens) in the contract:\n"
        f"    prices:\n      {example}: {{input: 1.25, output: 10.0, cached_input: 0.125}}\n"
        f"or in a file named by {PRICES_ENV}, or install the genai-prices package; or run "
        f"it unpriced with budget.allow_unpriced: true",
        source=source_of(spec),
    )


class _Scope:
    """The price table of one task's run, shared by the tasks the run starts (its
    heartbeat and status probes start before the contract is read)."""

    def __init__(self, table: PriceTable | None = None) -> None:
        self.table = table


_CURRENT: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar(
    "tether_prices", default=None
)


def open_scope() -> None:
    """Start a run's price scope in this context: the tasks started from here on share
    the table `set_current` puts in it later."""
    _CURRENT.set(_Scope())


def set_current(table: PriceTable) -> None:
    """Make `table` the current one of this context's scope (a task's run)."""
    scope = _CURRENT.get()
    if scope is None:
        scope = _Scope()
        _CURRENT.set(scope)
    scope.table = table


@contextmanager
def using(table: PriceTable) -> Iterator[PriceTable]:
    """Make `table` the one `cost_usd` uses without `prices` (in this context and the
    tasks it starts), for the block."""
    token = _CURRENT.set(_Scope(table))
    try:
        yield table
    finally:
        _CURRENT.reset(token)


def current_table() -> PriceTable:
    """The table of the task running in this context, else the process's (built-in,
    `TETHER_PRICES`, `genai-prices`)."""
    scope = _CURRENT.get()
    if scope is not None and scope.table is not None:
        return scope.table
    return _process_table()


def _process_table() -> PriceTable:
    return _table_of_file(os.environ.get(PRICES_ENV, "").strip())


@functools.lru_cache(maxsize=8)
def _table_of_file(path: str) -> PriceTable:
    try:
        return table_for(env={PRICES_ENV: path})
    except errors.UserError:
        return table_for(env={})  # a bad file is refused at start (check_task), not here


def price_for(model: str, prices: Mapping[str, PriceLike] | None = None) -> Price | None:
    """The price of a model (the current table, with `prices` overriding), or None."""
    table = current_table() if prices is None else PriceTable(prices)
    return table.lookup(model)


def cost_usd(model: str, usage: Usage, prices: Mapping[str, PriceLike] | None = None) -> float:
    """USD cost of one call: `model` is the model name (see the module for matching),
    `usage` the normalized usage; `prices` overrides or extends the built-in table,
    else the current table is used. A model without a price costs 0.0."""
    table = current_table() if prices is None else PriceTable(prices)
    return table.cost_usd(model, usage)
