"""OpenTelemetry spans and metrics (extra `otel`) per the GenAI semantic conventions: one
span per turn, round, round phase, model call and tool call, and the
`gen_ai.client.token.usage` and `gen_ai.client.operation.duration` histograms.

The runtime depends on `opentelemetry-api` only, and only when it is installed: without
it every span here is a no-op, and with it but no SDK configured the API's own no-op
tracer and meter answer. A process that configures a tracer provider (the SDK and an
exporter) gets the spans, nested as they happen:

    invoke_agent tether   INTERNAL  gen_ai.operation.name=invoke_agent, gen_ai.agent.name,
                                    gen_ai.agent.id and gen_ai.conversation.id (the task
                                    id), tether.task_id
      tether.round        INTERNAL  tether.task_id, tether.round, tether.item
        tether.phase.read / .assemble / .decide / .act
          chat MODEL      CLIENT    gen_ai.operation.name=chat, gen_ai.provider.name,
                                    gen_ai.request.model (without tether's `openai:`
                                    prefix), gen_ai.response.model, gen_ai.usage.*,
                                    tether.purpose, tether.task_id
          execute_tool T  INTERNAL  gen_ai.operation.name=execute_tool, gen_ai.tool.name,
                                    gen_ai.tool.call.id, tether.op_id, tether.round

A GenAI span that fails gets `error.type` (the exception's class) and an error status.
A configured meter provider gets, per model call, `gen_ai.client.token.usage` (unit
`{token}`, one record per `gen_ai.token.type`: `input` and `output`) and
`gen_ai.client.operation.duration` (seconds, with `error.type` when it failed).
tether's own attributes are under `tether.`.

Without OpenTelemetry too, two things follow the spans: the fields a log line of the
run carries (`log_fields()`: the task id inside a turn, the round inside a round), and
the process's `SpanListener`s (`add_listener`), told when a span starts and ends: a
worker's Prometheus counters (`tether.metrics.ProcessMetrics`) count rounds, calls and
in-flight turns that way, in the process, with no database query.
"""

from __future__ import annotations

import contextvars
import functools
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from types import MappingProxyType
from typing import Any, Protocol
from urllib.parse import urlsplit

#: The instrumentation scope of every span and metric.
TRACER_NAME = "tether"
#: The agent's name in `invoke_agent` spans.
AGENT_NAME = "tether"

#: The conventions' bucket boundaries for the two histograms.
TOKEN_BUCKETS = [4.0**n for n in range(14)]  # 1, 4, 16, ... 67108864
DURATION_BUCKETS = [0.01 * 2**n for n in range(14)]  # 0.01, 0.02, ... 81.92

#: tether's provider prefixes and the conventions' `gen_ai.provider.name` values.
_PROVIDERS = {
    "openai": "openai",
    "anthropic": "anthropic",
    "deepseek": "deepseek",
    "openai-compatible": "openai-compatible",
    "scripted": "tether.scripted",
}


class SpanLike(Protocol):
    """What the runtime does with a span: add attributes once it knows them."""

    def set_attribute(self, key: str, value: Any) -> None:
        """Set one attribute."""
        ...


class SpanListener(Protocol):
    """Told of every span of this process (see `add_listener`); must be quick and never
    raise."""

    def span_started(self, name: str, attributes: Mapping[str, Any]) -> None:
        """A span began, with the attributes known at its start."""
        ...

    def span_ended(
        self, name: str, attributes: Mapping[str, Any], seconds: float, error: str | None
    ) -> None:
        """A span ended: every attribute it got, how long it took, its `error.type`."""
        ...


_listeners: list[SpanListener] = []


def add_listener(listener: SpanListener) -> Callable[[], None]:
    """Tell `listener` of every span from now on; returns the call that stops it."""
    _listeners.append(listener)

    def remove() -> None:
        if listener in _listeners:
            _listeners.remove(listener)

    return remove


#: The fields of the run a log line carries (`task_id`, `round`), set by the spans.
_log_fields: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "tether_log_fields", default=MappingProxyType({})
)
#: The span attributes that become log fields, and the fields' names.
_LOG_KEYS = {"tether.task_id": "task_id", "tether.round": "round"}


def log_fields() -> Mapping[str, Any]:
    """What the current run is doing, for log lines: `task_id` inside a turn or round
    of a task, `round` inside a round (empty outside)."""
    return _log_fields.get()


class _Span:
    """The span the runtime holds: remembers its attributes (for the listeners, the
    log fields and the metrics at its end) and hands them to OpenTelemetry's span.
    `span` is one (the object its block gets); this class keeps the behaviour alone."""

    __slots__ = ("_token", "attributes", "otel")

    def __init__(self, attributes: Mapping[str, Any]) -> None:
        self.attributes = dict(attributes)
        self.otel: Any = None
        #: The log fields' token to reset at the span's end (None: not set by it).
        self._token: contextvars.Token[Mapping[str, Any]] | None = None

    def set_attribute(self, key: str, value: Any) -> None:
        """Set one attribute."""
        self.attributes[key] = value
        if key in _LOG_KEYS:
            token = _log_fields.set({**_log_fields.get(), _LOG_KEYS[key]: value})
            if self._token is None:
                # The first log field this span sets: it ends with the span.
                self._token = token
        if self.otel is not None:
            self.otel.set_attribute(key, value)


#: The tracer, obtained once (None: not yet; False: OpenTelemetry is not installed).
_tracer: Any = None
#: The two GenAI histograms (None: not yet; False: OpenTelemetry is not installed).
_instruments: Any = None


def _get_tracer() -> Any:
    global _tracer, _no_provider, _otel_trace
    if _tracer is None:
        try:
            from opentelemetry import trace
        except ImportError:
            _tracer = False
        else:
            # A proxy: it follows a tracer provider configured later (by the host).
            _tracer = trace.get_tracer(TRACER_NAME)
            _no_provider = (trace.get_tracer_provider, _unset_providers(trace))
            # OpenTelemetry's `get_tracer_provider` looks the environment up on every
            # call while no provider is set (a microsecond, a dozen times a round): the
            # variable naming a provider is read once, here, and otherwise its module's
            # provider is looked at directly (see `_tracing`).
            if _PROVIDER_ENV not in os.environ and hasattr(trace, "_TRACER_PROVIDER"):
                _otel_trace = trace
    return _tracer


#: (OpenTelemetry's `get_tracer_provider`, the provider types that record nothing).
_no_provider: Any = None
#: OpenTelemetry's trace module when its provider can be read without a call (no
#: provider named in the environment), else None.
_otel_trace: Any = None
#: The environment variable that names a tracer provider to OpenTelemetry.
_PROVIDER_ENV = "OTEL_PYTHON_TRACER_PROVIDER"


def _unset_providers(trace: Any) -> tuple[type, ...]:
    return (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def _tracing() -> Any:
    """The tracer when a host configured a tracer provider, else None: with none, every
    span is a non-recording one, and building it costs more than the round's own work
    (the GenAI metrics are recorded either way, by `span`)."""
    tracer = _tracer if _tracer is not None else _get_tracer()
    if not tracer:
        return None
    if _no_provider is None:  # a tracer handed in directly (tests): use it
        return tracer
    get_provider, unset = _no_provider
    if (
        _otel_trace is not None
        and get_provider is _otel_trace.get_tracer_provider
        and _otel_trace._TRACER_PROVIDER is None
    ):
        return None  # what `get_provider()` answers: the proxy, which records nothing
    return None if isinstance(get_provider(), unset) else tracer


def make_instruments(meter: Any) -> tuple[Any, Any]:
    """The token-usage and operation-duration histograms of `meter`."""
    tokens = meter.create_histogram(
        "gen_ai.client.token.usage",
        unit="{token}",
        description="Number of input and output tokens used.",
        explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
    )
    duration = meter.create_histogram(
        "gen_ai.client.operation.duration",
        unit="s",
        description="GenAI operation duration.",
        explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
    )
    return tokens, duration


def _get_instruments() -> Any:
    global _instruments
    if _instruments is None:
        try:
            from opentelemetry import metrics
        except ImportError:
            _instruments = False
        else:
            # A proxy meter too: it follows a meter provider configured later.
            _instruments = make_instruments(metrics.get_meter(TRACER_NAME))
    return _instruments


@functools.lru_cache(maxsize=64)
def split_model(name: str) -> tuple[str | None, str, str | None]:
    """`(gen_ai.provider.name, model, server address)` of a tether model name:
    `openai:gpt-4.1` is `("openai", "gpt-4.1", None)`,
    `openai-compatible:http://host:8000/v1#qwen3` is
    `("openai-compatible", "qwen3", "host")`; a name without a known prefix has no
    provider. Cached: every model call of a run splits the same one or two names."""
    prefix, sep, rest = name.partition(":")
    provider = _PROVIDERS.get(prefix.strip().lower()) if sep else None
    if provider is None:
        return None, name, None
    server = None
    if provider == "openai-compatible":
        base, _, model = rest.rpartition("#")
        server = urlsplit(base.strip()).hostname
        rest = model or rest
    return provider, rest.strip(), server


#: The attribute types OpenTelemetry takes (a tuple: `isinstance` with a union is slower).
_PLAIN = (str, bool, int, float)


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """OpenTelemetry takes str, bool, int, float (or lists of them); None is left out."""
    return {
        k: v if isinstance(v, _PLAIN) else str(v) for k, v in attributes.items() if v is not None
    }


def _error_of(exc: BaseException | None) -> str | None:
    """A span's `error.type`: None for no exception, or one that carries a round's
    outcome (control flow, not an error)."""
    if exc is None or getattr(exc, "outcome", None) is not None:
        return None
    return _error_type(exc)


def _error_type(exc: BaseException) -> str:
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def _unset(instrument: Any) -> bool:
    """An OpenTelemetry proxy instrument with no meter provider behind it yet (one set
    later gives it its real instrument: it records from then on)."""
    return getattr(instrument, "_real_instrument", instrument) is None


def _metrics_off() -> bool:
    """True when a model call's metrics would be recorded nowhere: no OpenTelemetry, or
    only its proxy instruments with no meter provider behind them yet."""
    instruments = _instruments if _instruments is not None else _get_instruments()
    return not instruments or (_unset(instruments[0]) and _unset(instruments[1]))


def _record_metrics(attributes: Mapping[str, Any], seconds: float, error: str | None) -> None:
    """The GenAI client metrics of one finished model call."""
    instruments = _get_instruments()
    if not instruments:
        return
    tokens, duration = instruments
    if _unset(tokens) and _unset(duration):
        return  # no meter provider yet: OpenTelemetry's proxies would record nothing
    keys = (
        "gen_ai.operation.name",
        "gen_ai.provider.name",
        "gen_ai.request.model",
        "gen_ai.response.model",
        "server.address",
    )
    common = {k: attributes[k] for k in keys if attributes.get(k) is not None}
    duration.record(seconds, {**common, "error.type": error} if error else common)
    if error:
        return
    for kind in ("input", "output"):
        count = attributes.get(f"gen_ai.usage.{kind}_tokens")
        if isinstance(count, int) and not isinstance(count, bool):
            tokens.record(count, {**common, "gen_ai.token.type": kind})


#: `span._otel` of a span nobody is told of (no listener, no tracer, not a model call).
_QUIET: Any = object()


class span(_Span):
    """A span named `name`, current for the block (for OpenTelemetry when installed,
    and always for the log fields and the listeners).

    A span whose `gen_ai.operation.name` is `chat` is a CLIENT span named
    `chat {gen_ai.request.model}` and records the GenAI client metrics when it ends;
    any other is INTERNAL.

    A class rather than a generator context manager, and its own `SpanLike`: a round
    opens seven spans, and with no tracer provider and no listener a span is only its
    log fields (set only by a span that carries one), so the generator's machinery and
    a second object were most of its cost."""

    __slots__ = ("_chat", "_listeners", "_name", "_otel", "_t0")

    def __init__(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        self._name = name
        # As given until someone is told of the span (`__enter__` cleans them then): a
        # quiet span's attributes are only looked at for its log fields.
        self.attributes = dict(attributes) if attributes else {}
        self.otel = None
        self._token = None
        self._otel: Any = None

    def __enter__(self) -> SpanLike:
        attrs = self.attributes
        chat = False
        if attrs:
            task_id, round_no = attrs.get("tether.task_id"), attrs.get("tether.round")
            if task_id is not None or round_no is not None:
                # What the cleaned attributes would give (`_clean`): None left out,
                # a value of another type as its text.
                fields = {}
                if task_id is not None:
                    fields["task_id"] = task_id if isinstance(task_id, _PLAIN) else str(task_id)
                if round_no is not None:
                    fields["round"] = round_no if isinstance(round_no, _PLAIN) else str(round_no)
                self._token = _log_fields.set({**_log_fields.get(), **fields})
            chat = attrs.get("gen_ai.operation.name") == "chat"
        self._chat = chat
        self._otel = None
        if not _listeners:
            try:
                quiet = _tracing() is None and (not chat or _metrics_off())
            except BaseException:
                self._reset_log_fields()  # all its end would do
                raise
            if quiet:
                # Nobody is told of this span and nothing is recorded: at its end only
                # the log fields it set are reset (most spans of a round, no tracer),
                # and a model call's metrics recorded if a meter provider came meanwhile.
                self._otel = _QUIET
                if chat:
                    self._t0 = time.perf_counter()
                return self
        if attrs:
            self.attributes = attrs = _clean(attrs)
        listeners = self._listeners = tuple(_listeners) if _listeners else ()
        for listener in listeners:
            listener.span_started(self._name, attrs)
        self._t0 = time.perf_counter()
        try:
            tracer = _tracing()
            if tracer is not None:
                otel = _otel_span(tracer, self._name, self)
                self.otel = otel.__enter__()
                self._otel = otel
        except BaseException as exc:
            self._end(type(exc), exc, exc.__traceback__)
            raise
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if self._otel is _QUIET:
            if self._token is not None:
                self._reset_log_fields()
            if self._chat and not _metrics_off():
                # A meter provider configured while the call was in flight: its metrics.
                error = _error_of(exc)
                _record_metrics(_clean(self.attributes), time.perf_counter() - self._t0, error)
            return
        self._end(kind, exc, tb)

    def _reset_log_fields(self) -> None:
        if self._token is not None:
            _log_fields.reset(self._token)
            self._token = None

    def _end(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        error = _error_of(exc)
        try:
            if self._otel is not None:
                self._otel.__exit__(kind, exc, tb)
        finally:
            seconds = time.perf_counter() - self._t0
            self._reset_log_fields()
            if self._chat:
                _record_metrics(self.attributes, seconds, error)
            for listener in self._listeners:
                listener.span_ended(self._name, self.attributes, seconds, error)


@contextmanager
def _otel_span(tracer: Any, name: str, recorded: _Span) -> Iterator[Any]:
    """OpenTelemetry's span for `span`: kind, name, error status."""
    from opentelemetry.trace import SpanKind, Status, StatusCode

    attrs = recorded.attributes
    operation = attrs.get("gen_ai.operation.name")
    kind = SpanKind.INTERNAL
    if operation == "chat":
        kind = SpanKind.CLIENT
        if attrs.get("gen_ai.request.model"):
            name = f"chat {attrs['gen_ai.request.model']}"
    with tracer.start_as_current_span(
        name,
        kind=kind,
        attributes=dict(attrs),
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        try:
            yield current
        except BaseException as exc:
            stopped = getattr(exc, "outcome", None)
            if stopped is not None:
                # A round ending (a pause for a human, a model that is down) travels as
                # an exception that carries its outcome: control flow, not an error.
                current.set_attribute("tether.stopped", str(getattr(stopped, "status", "")))
            else:
                if operation:
                    current.set_attribute("error.type", _error_type(exc))
                current.record_exception(exc)
                current.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise


def quiet() -> bool:
    """True when a span would tell nobody (no listener, no tracer provider): one without
    attributes would then do nothing at all (see `span`)."""
    return not _listeners and _tracing() is None


#: What stands for a span without attributes that would tell nobody (`quiet`).
NO_SPAN: Any = nullcontext()


def set_attributes(target: SpanLike, attributes: Mapping[str, Any]) -> None:
    """Add attributes known only once the work is done (tokens, a round number)."""
    if type(target) is span and target._otel is _QUIET:
        # Nobody is told of the span: its attributes are kept as given (cleaned if a
        # model call's metrics are recorded after all), its log fields set as cleaned.
        own = target.attributes
        for key, value in attributes.items():
            if value is None:
                continue
            if key in _LOG_KEYS:
                target.set_attribute(key, value if isinstance(value, _PLAIN) else str(value))
            else:
                own[key] = value
        return
    for key, value in _clean(attributes).items():
        target.set_attribute(key, value)


def agent_attributes(task_id: str) -> dict[str, Any]:
    """The attributes of one turn of a task (an `invoke_agent` span)."""
    return {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": AGENT_NAME,
        "gen_ai.agent.id": task_id,
        "gen_ai.conversation.id": task_id,
        "tether.task_id": task_id,
    }


#: The name of a turn's span.
AGENT_SPAN = f"invoke_agent {AGENT_NAME}"
#: The name of a worker's claim (one `Store.claim`, whether it found a task or not).
CLAIM_SPAN = "tether.claim"


def model_call_attributes(purpose: str, model: str, task_id: str) -> dict[str, Any]:
    """The GenAI semantic-convention attributes of a model call, before it is sent:
    `model` is tether's name (`openai:gpt-4.1`), reported as provider and model."""
    provider, bare, server = split_model(model)
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": bare,
        "server.address": server,
        "tether.purpose": purpose,
        "tether.task_id": task_id,
    }


def usage_attributes(
    response_model: str, input_tokens: int, output_tokens: int, cached_tokens: int
) -> dict[str, Any]:
    """The GenAI semantic-convention attributes of a model call's answer."""
    return {
        "gen_ai.response.model": split_model(response_model)[1] if response_model else None,
        "gen_ai.usage.input_tokens": input_tokens,
        "gen_ai.usage.output_tokens": output_tokens,
        "gen_ai.usage.cache_read.input_tokens": cached_tokens,
    }


def tool_call_attributes(tool: str, op_id: str, task_id: str, round_no: int) -> dict[str, Any]:
    """The attributes of one tool call (one attempt of an op)."""
    return {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "gen_ai.tool.call.id": op_id,
        "tether.op_id": op_id,
        "tether.task_id": task_id,
        "tether.round": round_no,
    }
