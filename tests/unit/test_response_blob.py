"""A model's response as stored (`model_calls.response_doc`): the fields at their
defaults are left out, and every reader builds the same response from what is left
(`ModelResponse.from_dict`) or shows it whole (`response_in_full`); blobs written whole,
by an older tether, read as before. Inline in its call's event (`inline_response`), it
leaves out what the event's own fields say too, and `history.called_response` puts it
back."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from tether import events as ev
from tether.models.base import ModelResponse, ToolCall, Usage
from tether.runtime.round import history
from tether.runtime.run.model_calls import called_event, response_doc, response_in_full
from tether.store import _rules

CALL = ToolCall("call_1", "do_step", {"step": 1}, '{"step": 1}')
RESPONSES = [
    ModelResponse(""),
    ModelResponse("Step 1.", (CALL,), Usage(input_tokens=10, output_tokens=2), "peers", 0.05),
    ModelResponse(
        "done",
        (
            ToolCall("c1", "bad", None, "{not json", "arguments are not a JSON object"),
            ToolCall("c2", "empty", {}),  # {} is not None: kept
            ToolCall("c3", "raw", {"a": [1, None]}, ""),
        ),
        Usage(input_tokens=4, output_tokens=7, cached_input_tokens=3, cache_write_tokens=1),
        "m",
        0.0,
        "stop",
        attempts=3,
    ),
    ModelResponse("x", usage=Usage(cache_write_tokens=5), finish_reason="", attempts=1),
]


def _json(doc: dict[str, Any]) -> dict[str, Any]:
    back: dict[str, Any] = json.loads(json.dumps(doc))
    return back


def _pruned(response: ModelResponse) -> dict[str, Any]:
    """The reference: `to_dict()` without each key whose value is its default's."""
    from tether.runtime.run import model_calls as mc

    def prune(doc: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
        return {
            k: v
            for k, v in doc.items()
            if k not in defaults or type(v) is not type(defaults[k]) or v != defaults[k]
        }

    doc = response.to_dict()
    doc["usage"] = prune(doc["usage"], mc._USAGE_DEFAULTS)
    doc["tool_calls"] = [prune(c, mc._CALL_DEFAULTS) for c in doc["tool_calls"]]
    return prune(doc, {**mc._RESPONSE_DEFAULTS, "usage": {}})


def _every_mix() -> list[ModelResponse]:
    """Each field with a default at it or not, in every combination."""
    other = {
        "tool_calls": (
            CALL,
            ToolCall("c2", "bad", None, "{x", "not JSON"),
            ToolCall("c3", "e", {}),
        ),
        "usage": Usage(input_tokens=4, cache_write_tokens=2),
        "model": "m",
        "latency_ms": 1.5,
        "finish_reason": "stop",
        "attempts": 2,
    }
    out = []
    for mask in range(2 ** len(other)):
        chosen = {k: v for i, (k, v) in enumerate(other.items()) if mask >> i & 1}
        out.append(ModelResponse("t" if mask % 3 else "", **chosen))
    return out


@pytest.mark.parametrize("response", RESPONSES + _every_mix())
def test_a_stored_response_reads_back_the_same(response: ModelResponse) -> None:
    doc = response_doc(response)
    assert doc == _pruned(response)
    assert ModelResponse.from_dict(_json(doc)) == response
    assert response_in_full(_json(doc)) == _json(response.to_dict())


def test_fields_at_their_defaults_are_left_out_and_the_others_kept() -> None:
    doc = response_doc(RESPONSES[1])
    assert doc == {
        "text": "Step 1.",
        "tool_calls": [
            {
                "id": "call_1",
                "name": "do_step",
                "arguments": {"step": 1},
                "raw_arguments": '{"step": 1}',
            }
        ],
        "usage": {"input_tokens": 10, "output_tokens": 2},
        "model": "peers",
        "latency_ms": 0.05,
    }
    assert response_doc(ModelResponse("")) == {"text": ""}
    # A response whose every field differs from its default is stored whole.
    whole = RESPONSES[2]
    assert response_doc(whole)["usage"] == whole.usage.to_dict()
    assert {"finish_reason", "attempts", "tool_calls", "model"} <= set(response_doc(whole))
    assert response_doc(whole)["tool_calls"][0]["error"] == "arguments are not a JSON object"
    assert response_doc(whole)["tool_calls"][1]["arguments"] == {}


def test_every_field_with_a_default_is_known() -> None:
    # A field added to these classes with a default is left out when at it only if its
    # reader fills the same in: the defaults are read from a default instance's
    # `to_dict`, and this holds them to the classes' fields.
    from tether.runtime.run import model_calls

    for cls, known in (
        (ModelResponse, {**model_calls._RESPONSE_DEFAULTS, "attempts": 1, "reasoning": ()}),
        (ToolCall, model_calls._CALL_DEFAULTS),
        (Usage, model_calls._USAGE_DEFAULTS),
    ):
        with_default = {
            f.name
            for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        }
        assert set(known) == with_default, cls


def test_blobs_written_whole_read_as_before() -> None:
    # A response blob as tether 8ec2ee8 wrote it (`to_dict()`, every field).
    old = json.loads(
        '{"finish_reason": null, "latency_ms": 0.121, "model": "peers", "text": "Step 25.",'
        ' "tool_calls": [{"arguments": {"step": 25}, "error": null, "id": "call_25", "name":'
        ' "do_step", "raw_arguments": "{\\"step\\": 25}"}], "usage": {"cache_write_tokens": 0,'
        ' "cached_input_tokens": 0, "input_tokens": 8272, "output_tokens": 20}}'
    )
    response = ModelResponse.from_dict(old)
    assert response == ModelResponse(
        "Step 25.",
        (ToolCall("call_25", "do_step", {"step": 25}, '{"step": 25}'),),
        Usage(input_tokens=8272, output_tokens=20),
        "peers",
        0.121,
    )
    assert response_in_full(old) == old
    assert ModelResponse.from_dict(response_doc(response)) == response


#: Latencies the event's microsecond would not keep, with and without a model name.
FINER = [
    ModelResponse("x", latency_ms=0.1234567),
    ModelResponse("y", (CALL,), Usage(output_tokens=1), "m", 2.0000004, "stop", attempts=4),
]


@pytest.mark.parametrize("configured", ["m", "configured"])
@pytest.mark.parametrize("response", RESPONSES + _every_mix() + FINER)
def test_a_response_inline_in_its_event_reads_back_the_same(
    response: ModelResponse, configured: str
) -> None:
    # The event names the answering model, else the configured one (`record_call`).
    event = called_event("t.act.1", "act", response.model or configured, 1, response, 0.1, "")
    data = _json(event.data())
    inline = data["response"]
    # Once: what the event's fields say is not in its response again.
    assert not {"usage", "attempts"} & set(inline)
    assert ("model" in inline) == (response.model == "")
    assert ("latency_ms" in inline) == (response in FINER)
    assert data["attempts"] == response.attempts
    assert data["tool_calls"] == len(response.tool_calls)
    # As an SQL store writes it (fields at their defaults left out), or whole.
    stored = _rules.compact("model.called", data)
    for form in (data, stored, _rules.expand("model.called", stored)):
        doc = history.called_response(form)
        assert doc == response_doc(response)
        assert ModelResponse.from_dict(_json(doc)) == response
        assert response_in_full(_json(doc)) == _json(response.to_dict())
    assert ev.decode("model.called", stored).response == inline


def test_an_event_naming_a_blob_has_no_inline_response() -> None:
    old = {"call_id": "c", "purpose": "act", "model": "m", "response_blob": "sha256:ab"}
    assert history.called_response(old) is None
    assert history.called_response(_rules.expand("model.called", old)) is None


def test_reasoning_blocks_are_stored_and_read_back() -> None:
    """An answer's reasoning blocks (extended thinking) are kept in every stored form of
    it, unchanged, and read back the same; an answer without them stores no key."""
    from tether.runtime.round.history import called_response
    from tether.runtime.run import model_calls

    blocks = ({"type": "thinking", "thinking": "plan", "signature": "sig=="},)
    resp = ModelResponse("ok", reasoning=blocks, model="m")
    assert ModelResponse.from_dict(model_calls.response_doc(resp)) == resp
    event = model_calls.called_event("c1", "act", "m", 1, resp, 0.0, "")
    back = called_response(event.data())
    assert back is not None and ModelResponse.from_dict(back) == resp
    assert "reasoning" not in model_calls.response_doc(ModelResponse("ok"))
