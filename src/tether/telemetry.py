"""OpenTelemetry spans (extra `otel`): one per turn, round, round phase, model call and
tool call.

The runtime depends on `opentelemetry-api` only, and only when it is installed: without
it every span here is a no-op, and with it but no SDK configured the API's own no-op
tracer answers. A process that configures a tracer provider (the SDK and an exporter)
gets the spans, nested as they happen:

    tether.turn                      tether.task_id
      tether.round                   tether.task_id, tether.round, tether.item
        tether.phase.read / .assemble / .decide / .act
          chat MODEL                 gen_ai.* (operation, request/response model,
                                     input/output/cached tokens), tether.purpose
          execute_tool TOOL          gen_ai.operation.name, gen_ai.tool.name,
                                     tether.op_id, tether.round
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

#: The instrumentation scope of every span.
TRACER_NAME = "tether"


class SpanLike(Protocol):
    """What the runtime does with a span: add attributes once it knows them."""

    def set_attribute(self, key: str, value: Any) -> None:
        """Set one attribute."""
        ...


class _NoSpan:
    """The span when OpenTelemetry is not installed."""

    def set_attribute(self, key: str, value: Any) -> None:
        """Nothing to record."""


_NO_SPAN = _NoSpan()
#: The tracer, obtained once (None: not yet; False: OpenTelemetry is not installed).
_tracer: Any = None


def _get_tracer() -> Any:
    global _tracer
    if _tracer is None:
        try:
            from opentelemetry import trace
        except ImportError:
            _tracer = False
        else:
            # A proxy: it follows a tracer provider configured later (by the host).
            _tracer = trace.get_tracer(TRACER_NAME)
    return _tracer


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """OpenTelemetry takes str, bool, int, float (or lists of them); None is left out."""
    return {
        k: v if isinstance(v, str | bool | int | float) else str(v)
        for k, v in attributes.items()
        if v is not None
    }


@contextmanager
def span(name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[SpanLike]:
    """A span named `name`, current for the block (a no-op without OpenTelemetry)."""
    tracer = _get_tracer()
    if not tracer:
        yield _NO_SPAN
        return
    from opentelemetry.trace import Status, StatusCode

    with tracer.start_as_current_span(
        name,
        attributes=_clean(attributes or {}),
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
                current.record_exception(exc)
                current.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise


def set_attributes(target: SpanLike, attributes: Mapping[str, Any]) -> None:
    """Add attributes known only once the work is done (tokens, a round number)."""
    for key, value in _clean(attributes).items():
        target.set_attribute(key, value)


def model_call_attributes(purpose: str, model: str, task_id: str) -> dict[str, Any]:
    """The GenAI semantic-convention attributes of a model call, before it is sent."""
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": model,
        "tether.purpose": purpose,
        "tether.task_id": task_id,
    }


def usage_attributes(
    response_model: str, input_tokens: int, output_tokens: int, cached_tokens: int
) -> dict[str, Any]:
    """The GenAI semantic-convention attributes of a model call's answer."""
    return {
        "gen_ai.response.model": response_model or None,
        "gen_ai.usage.input_tokens": input_tokens,
        "gen_ai.usage.output_tokens": output_tokens,
        "gen_ai.usage.cache_read.input_tokens": cached_tokens,
    }


def tool_call_attributes(tool: str, op_id: str, task_id: str, round_no: int) -> dict[str, Any]:
    """The attributes of one tool call (one attempt of an op)."""
    return {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "tether.op_id": op_id,
        "tether.task_id": task_id,
        "tether.round": round_no,
    }
