"""A scripted model: a list of responses or a Python policy `f(request) -> response`.

For tests and the offline demo. It counts tokens with the same estimator as the
runtime, so budgets, reports and cache statistics behave as with a real provider. A
policy may be sync or async; it sees the whole `ModelRequest`, so an offline policy can
steer by the ledger the runtime puts into the prompt.
"""

from __future__ import annotations

import inspect
import itertools
import json
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from tether import errors, tokens
from tether.models.base import ModelRequest, ModelResponse, ToolCall, Usage

Policy = Callable[[ModelRequest], "ModelResponse | str | Mapping[str, Any] | Awaitable[Any]"]
_ids = itertools.count(1)
#: How many of the last requests a `ScriptedModel` keeps for inspection by default: a
#: bound, so a model serving a task of days does not hold every request it has seen.
KEEP_REQUESTS = 256
#: A response without usage gets estimated counts (compared with every response).
_NO_USAGE = Usage()


def tool_call(name: str, /, **arguments: Any) -> ToolCall:
    """A well-formed tool call with a fresh id."""
    return ToolCall(
        id=f"call_{next(_ids)}",
        name=name,
        arguments=arguments,
        raw_arguments=json.dumps(arguments, sort_keys=True),
    )


def _coerce(item: ModelResponse | str | Mapping[str, Any]) -> ModelResponse:
    if isinstance(item, ModelResponse):
        return item
    if isinstance(item, str):
        return ModelResponse(text=item)
    if isinstance(item, Mapping):
        calls = []
        for c in item.get("tool_calls", ()):
            args = c.get("arguments", {})
            raw = args if isinstance(args, str) else json.dumps(args, sort_keys=True)
            parsed: Any = None
            error = None
            try:
                parsed = json.loads(raw)
                if not isinstance(parsed, dict):
                    parsed, error = None, "tool arguments must be a JSON object"
            except json.JSONDecodeError as exc:
                error = f"tool arguments are not valid JSON: {exc}"
            calls.append(
                ToolCall(c.get("id") or f"call_{next(_ids)}", c["name"], parsed, raw, error)
            )
        return ModelResponse(text=str(item.get("text", "")), tool_calls=tuple(calls))
    raise TypeError(f"a scripted response must be a ModelResponse, str or dict, not {item!r}")


class ScriptedModel:
    """Answers from a script (consumed in order) or a policy function."""

    #: A script costs nothing: a money budget needs no price for it.
    costs_nothing = True

    def __init__(
        self,
        responses: Sequence[ModelResponse | str | Mapping[str, Any]] | None = None,
        policy: Policy | None = None,
        name: str = "scripted",
        keep_requests: int = KEEP_REQUESTS,
    ) -> None:
        if (responses is None) == (policy is None):
            raise errors.UserError("give ScriptedModel either responses or a policy, not both")
        self.name = name
        self._responses = list(responses or [])
        self._policy = policy
        # The last `keep_requests` requests seen, for tests; never all of them, so a
        # long run's memory stays flat.
        self.requests: deque[ModelRequest] = deque(maxlen=keep_requests)
        self.calls = 0
        self._last_prefix: list[str] = []

    def _cached_tokens(self, request: ModelRequest) -> int:
        # Imitate a provider's prefix cache: the unchanged leading part of the
        # serialized request (tools, system, then messages) counts as cached, measured
        # with the same estimator as the input tokens.
        parts = [json.dumps([t.to_dict() for t in request.tools], sort_keys=True), request.system]
        parts += [json.dumps(m.to_dict(), sort_keys=True) for m in request.messages]
        same = 0
        for n, part in enumerate(parts):
            if n < len(self._last_prefix) and self._last_prefix[n] == part:
                same += 1
            else:
                break
        self._last_prefix = parts
        if same < 2:
            return 0
        return (
            tokens.estimate_tools(request.tools)
            + tokens.estimate_text(request.system)
            + sum(tokens.estimate_message(m) for m in request.messages[: same - 2])
        )

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Answer the next scripted response, or ask the policy."""
        self.requests.append(request)
        self.calls += 1
        if self._policy is not None:
            out = self._policy(request)
            # A response is not awaitable: the ABC check is for the other answers.
            if type(out) is not ModelResponse and inspect.isawaitable(out):
                out = await out
            response = _coerce(out)
        else:
            if not self._responses:
                raise errors.ModelError(
                    f"scripted model {self.name!r} ran out of responses after "
                    f"{self.calls - 1} calls"
                )
            response = _coerce(self._responses.pop(0))
        if response.usage == _NO_USAGE:
            out_text = response.text + "".join(c.raw_arguments for c in response.tool_calls)
            response = ModelResponse(
                text=response.text,
                tool_calls=response.tool_calls,
                usage=Usage(
                    input_tokens=tokens.estimate_request(request),
                    cached_input_tokens=self._cached_tokens(request)
                    if request.purpose == "act"
                    else 0,
                    output_tokens=tokens.estimate_text(out_text),
                ),
                model=response.model or self.name,
                latency_ms=response.latency_ms,
                finish_reason=response.finish_reason
                or ("tool_calls" if response.tool_calls else "stop"),
            )
        elif not response.model:
            response = ModelResponse(
                response.text,
                response.tool_calls,
                response.usage,
                self.name,
                response.latency_ms,
                response.finish_reason,
            )
        return response
