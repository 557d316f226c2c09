"""The run's model calls (`ports.ModelPort`): one call with its latency measured and
cancelled by a stop request, its record (request by reference, response inline in its
event, spend counted in the run state), and what a call that failed after its retries
means for the task (it waits, never dies silently)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Mapping
from dataclasses import MISSING, fields, replace
from typing import Any

from tether import errors, loop_hold, telemetry
from tether import events as ev
from tether.models.base import (
    Model,
    ModelRequest,
    ModelResponse,
    ToolCall,
    Usage,
    clean_response,
)
from tether.runtime import hints
from tether.runtime.round import history
from tether.runtime.run import outcome as out
from tether.runtime.run.journal import RunJournal
from tether.runtime.run.outcome import Stop
from tether.runtime.run.ports import ModelSet
from tether.runtime.run.state import RunView
from tether.text import exc_text


def _cost(configured: str, response: ModelResponse) -> float:
    """The call's cost by the current task's price table (`pricing.set_current` in
    `TaskRun.load`): the answering model's price, else the configured model's."""
    from tether.models import pricing

    return float(
        pricing.current_table().cost_usd(response.model, response.usage, configured=configured)
    )


#: `ModelResponse` keeps its fields in its `__dict__` and checks nothing at creation.
_PLAIN_RESPONSE = "__slots__" not in vars(ModelResponse) and not hasattr(
    ModelResponse, "__post_init__"
)


def _measured(resp: ModelResponse, model: str, latency_ms: float) -> ModelResponse:
    """`replace(resp, model=model, latency_ms=latency_ms)`. A `ModelResponse` itself (a
    frozen dataclass with no `__post_init__`) is copied field by field, several times
    faster than `dataclasses.replace` (a round makes one); a subclass is replaced."""
    if type(resp) is not ModelResponse or not _PLAIN_RESPONSE:
        return replace(resp, model=model, latency_ms=latency_ms)
    new = object.__new__(ModelResponse)
    new.__dict__.update(resp.__dict__, model=model, latency_ms=latency_ms)
    return new


def _defaults(cls: type[Any], doc: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON form (`doc`, a default instance's `to_dict`) of each field of `cls`
    that has a default: what its `from_dict` fills in for a key the document lacks."""
    names = {f.name for f in fields(cls) if f.default is not MISSING}
    names |= {f.name for f in fields(cls) if f.default_factory is not MISSING}
    return {k: v for k, v in doc.items() if k in names}


#: What `ModelResponse.from_dict` (with `ToolCall.from_dict` and `Usage(**usage)`) reads
#: a missing key as. A stored response leaves these out (`response_doc`): a round's
#: answer stored its null finish reason, its calls' null errors and its zero cache
#: counts, a third of its document.
_RESPONSE_DEFAULTS = _defaults(ModelResponse, ModelResponse("").to_dict())
_CALL_DEFAULTS = _defaults(ToolCall, ToolCall("", "", None).to_dict())
_USAGE_DEFAULTS = _defaults(Usage, Usage().to_dict())


def _call_doc(call: ToolCall) -> dict[str, Any]:
    """`call.to_dict()` without `raw_arguments` and `error` at their defaults."""
    doc: dict[str, Any] = {
        "id": call.id,
        "name": call.name,
        "arguments": None if call.arguments is None else dict(call.arguments),
    }
    if call.raw_arguments:
        doc["raw_arguments"] = call.raw_arguments
    if call.error is not None:
        doc["error"] = call.error
    return doc


def _answer(r: ModelResponse) -> dict[str, Any]:
    """What every stored form of a response holds the same: its text, its tool calls
    and its finish reason, each left out at its default."""
    doc: dict[str, Any] = {"text": r.text}
    if r.tool_calls:
        doc["tool_calls"] = [_call_doc(c) for c in r.tool_calls]
    if r.finish_reason is not None:
        doc["finish_reason"] = r.finish_reason
    if r.reasoning:
        doc["reasoning"] = [dict(b) for b in r.reasoning]
    return doc


def response_doc(response: ModelResponse) -> dict[str, Any]:
    """A response as stored: `to_dict()` without the fields at their defaults
    (`_RESPONSE_DEFAULTS`), which `ModelResponse.from_dict` reads back the same;
    responses written whole (blobs of an older tether) read as before. Built field by
    field rather than pruned from `to_dict()` (a round stores one; pruning cost more
    than the dict itself): tests hold it to `to_dict` for every field. Its event holds
    it less what the event's own fields say (`inline_response`)."""
    r, u = response, response.usage
    doc = _answer(r)
    usage = {
        k: v
        for k, v in (
            ("input_tokens", u.input_tokens),
            ("output_tokens", u.output_tokens),
            ("cached_input_tokens", u.cached_input_tokens),
            ("cache_write_tokens", u.cache_write_tokens),
        )
        if v
    }
    if usage:
        doc["usage"] = usage
    if r.model:
        doc["model"] = r.model
    if r.latency_ms:
        doc["latency_ms"] = r.latency_ms
    if r.attempts != 1:
        doc["attempts"] = r.attempts
    return doc


def inline_response(response: ModelResponse, model: str) -> dict[str, Any]:
    """The response as its `model.called` event holds it (`ModelCalled.response`):
    `response_doc` without what the event's own fields record — the usage (its token
    counts), the model (`model`: the event's), the latency (to the microsecond) and
    the attempts — each kept only if the event's field would not give it back the same
    (`history.called_response` puts them back): each byte of a round once."""
    r = response
    doc = _answer(r)
    if r.model != model:
        doc["model"] = r.model
    if type(ms := r.latency_ms) is float and round(ms, 3) != ms:
        doc["latency_ms"] = ms  # finer than the event's microsecond (`ev.Millis`)
    return doc


def response_in_full(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A stored response (`response_doc`, or whole) with every field, as `to_dict()`
    gives it: for people and API clients, who see the same keys whichever wrote it."""
    full = {**_RESPONSE_DEFAULTS, **doc}
    full["usage"] = {**_USAGE_DEFAULTS, **(doc.get("usage") or {})}
    full["tool_calls"] = [{**_CALL_DEFAULTS, **c} for c in doc.get("tool_calls") or ()]
    return full


def called_event(
    call_id: str,
    purpose: str,
    model: str,
    round_no: int | None,
    response: ModelResponse,
    cost: float,
    summary: str,
    **refs: Any,
) -> ev.ModelCalled:
    """A call's `model.called` event: the response inline (`inline_response`), its
    usage, latency and cost, with what `refs` carries (the request or its blob). Every
    call is recorded alike, the round's, the judge's, compaction's and the status
    probe's: a blob row keyed by its 71-character hash cost more than most answers
    themselves (a judge's or a probe's is a few dozen bytes), and the largest, a
    compaction's summary, is no longer inline than it was in its blob."""
    u = response.usage
    return ev.ModelCalled(
        call_id=call_id,
        purpose=purpose,
        model=model,
        round=round_no,
        response=inline_response(response, model),
        input_tokens=u.input_tokens,
        output_tokens=u.output_tokens,
        cached_tokens=u.cached_input_tokens,
        cache_write_tokens=u.cache_write_tokens,
        latency_ms=response.latency_ms,
        cost_usd=cost,
        summary=summary,
        tool_calls=len(response.tool_calls),
        attempts=response.attempts,
        **refs,
    )


class ModelCalls:
    """Model calls of one run, journaled and counted."""

    def __init__(
        self, models: ModelSet, view: RunView, journal: RunJournal, stop: asyncio.Event
    ) -> None:
        self.models = models
        self.view = view
        self.journal = journal
        self.stop = stop
        # One watcher of the stop request for every call (see `_unless_stopped`), and
        # the calls in flight it cancels: task -> [cancelled by it].
        self._watcher: asyncio.Future[Any] | None = None
        self._calling: dict[asyncio.Task[Any], list[bool]] = {}

    async def call_model(self, model: Model, request: ModelRequest) -> ModelResponse:
        """One model call with latency measured; errors become `ModelError`. A stop
        request (Ctrl-C, a worker's shutdown) cancels a call in flight at once: the
        round ends interrupted, and a resume asks the model again."""
        t0 = time.perf_counter()
        task_id = self.journal.task_id
        attrs = telemetry.model_call_attributes(request.purpose, model.name, task_id)
        with telemetry.span(f"chat {model.name}", attrs) as span:
            try:
                held = loop_hold.Held(model.complete(request), f"model {model.name}", task_id)
                try:
                    resp = await self._unless_stopped(held, request.purpose)
                finally:
                    self._told(held)
            except (errors.ModelError, Stop):
                raise
            except Exception as exc:
                raise errors.ModelError(
                    f"{type(exc).__name__}: {exc_text(exc)}", transient=False
                ) from exc
            resp = clean_response(resp)
            u = resp.usage
            telemetry.set_attributes(
                span,
                telemetry.usage_attributes(
                    resp.model, u.input_tokens, u.output_tokens, u.cached_input_tokens
                ),
            )
        if not resp.latency_ms:
            # To the microsecond: the clock's further digits are noise (and the event
            # keeps no more: `inline_response`).
            ms = round((time.perf_counter() - t0) * 1000, 3)
            resp = _measured(resp, resp.model or model.name, ms)
        return resp

    async def _unless_stopped(self, call: Awaitable[ModelResponse], purpose: str) -> ModelResponse:
        """`await call`, cancelled when a stop is requested meanwhile (in this task, so
        what the call raises, a `SystemExit` included, stays its own)."""
        if self.stop.is_set():
            if inspect.iscoroutine(call) or isinstance(call, loop_hold.Held):
                call.close()  # never sent: closed, so no "never awaited" warning
            raise Stop(out.interrupted("interrupted; resume to continue"))
        me = asyncio.current_task()
        flag = [False]
        if me is not None:
            # One watcher for the run's calls, not a task made and cancelled per call
            # (that cost the loop more than the rest of the call's bookkeeping).
            self._watch()
            self._calling[me] = flag
        try:
            return await call
        except BaseException:
            # An SDK may turn the cancellation into an error of its own: either way the
            # call was abandoned because of the stop.
            if not flag[0]:
                raise
        finally:
            if me is not None:
                self._calling.pop(me, None)
        if me is not None:
            me.uncancel()
        if purpose == "act":
            # The round never happened: its focus item's start is not kept.
            self.journal.staged_events = []
            self.journal.staged_ledger = None
        raise Stop(out.interrupted("interrupted during a model call; resume to continue"))

    def _told(self, held: loop_hold.Held[Any]) -> None:
        """A model call that held the event loop (`loop_hold`): journaled with the next
        commit as an `audit.warning`."""
        warning = loop_hold.warning(held)
        if warning is not None:
            self.journal.staged_events.append(warning)

    def _watch(self) -> None:
        """Start the watcher of the stop request unless it waits already."""
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.ensure_future(self.stop.wait())
            self._watcher.add_done_callback(self._interrupt)

    def _interrupt(self, watcher: asyncio.Future[Any]) -> None:
        """The stop was requested: cancel the calls in flight."""
        if watcher.cancelled():
            return
        for task, flag in self._calling.items():
            if not task.done():
                flag[0] = True
                task.cancel()

    def close(self) -> None:
        """The run is over: stop watching (a call made later watches again)."""
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    async def record_call(
        self,
        purpose: str,
        model: Model,
        request: ModelRequest,
        response: ModelResponse,
        round_no: int | None,
        ref: dict[str, Any] | None = None,
    ) -> ev.ModelCalled:
        """The request (by reference for the actor's calls: see `history`; `ref` when
        the caller gives it, else as a blob) and the response, in the event."""
        st, blobs = self.view.state, self.journal.blobs
        req_blob: str | None = None
        req_ref: dict[str, Any] | None = ref
        if ref is None and purpose == "act" and st.system_blob:
            epoch = history.epoch_doc(
                system_blob=st.system_blob,
                tools_blob=blobs.tools(request),
                snapshot=st.ctx_blob,
                after_seq=st.ctx_after_seq,
            )
            req_ref = history.request_ref(
                request, epoch_blob=blobs.epoch(epoch), upto_seq=st.last_seq
            )
        elif ref is None:
            req_blob = blobs.packed(request.to_dict())
        cost = _cost(model.name, response)
        st.count_call(purpose, response.usage, cost, self.view.ledger.current_milestone())
        st.last_call_at = self.view.clock.now()
        names = ", ".join(c.name for c in response.tool_calls)
        # A summary for the timeline's line (the response is in the event too).
        summary = (response.text[:100] + (f" [calls: {names}]" if names else "")).strip()
        return called_event(
            f"{self.journal.task_id}.{purpose}.{st.model_calls}",
            purpose,
            response.model or model.name,
            round_no,
            response,
            cost,
            summary,
            request_blob=req_blob,
            request=req_ref,
        )

    async def model_failed(self, purpose: str, model: Model, exc: Exception) -> None:
        """A model call failed after its retries: wait, never die silently."""
        task_id = self.journal.task_id
        transient = isinstance(exc, errors.ModelError) and exc.transient
        event = ev.ModelFailed(
            call_id=f"{task_id}.{purpose}.failed",
            purpose=purpose,
            model=model.name,
            error=str(exc),
            transient=transient,
            attempts=exc.attempts if isinstance(exc, errors.ModelError) else 1,
        )
        if transient:
            raise Stop(
                out.waiting(
                    "external",
                    f"model provider failed: {exc}; a worker tries again in a minute, or "
                    f"now: {hints.resume(task_id)}",
                    why="model provider unavailable",
                    until=self.view.clock.now() + 60.0,
                    events=[event],
                    # `tether run`/`resume` exit 4 on it: stopped on infrastructure.
                    unavailable="model provider",
                )
            )
        raise Stop(
            out.waiting(
                "human",
                f"model provider refused the call: {exc}; fix what it names (the key, the "
                f"model's name, the request's size), then: {hints.resume(task_id)} (its "
                "--model picks another model)",
                why="model provider error",
                events=[event],
            )
        )


__all__ = ["ModelCalls", "called_event", "inline_response", "response_doc", "response_in_full"]
