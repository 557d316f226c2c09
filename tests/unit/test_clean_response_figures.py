"""A response's figures as the runtime takes them (`models.base.clean_response`): token
counts whole and from 0 up (a negative count must not lower a budget's spend), latency
a finite number, the finish reason text that any store takes."""

from __future__ import annotations

import math

from tether.models.base import ModelResponse, Usage, clean_response


def test_usual_figures_are_taken_as_they_are() -> None:
    resp = ModelResponse("hi", (), Usage(10, 5, 3, 1), "m", 12.5, "stop")
    assert clean_response(resp) is resp


def test_odd_figures_are_made_usable() -> None:
    resp = ModelResponse(
        "hi",
        (),
        Usage(-5, 10**30, 2.7, math.nan),
        "m",
        math.nan,
        "\ud800stop",
    )
    clean = clean_response(resp)
    assert clean.usage == Usage(0, 2**53 - 1, 2, 0)
    assert clean.latency_ms == 0.0
    assert clean.finish_reason == "\ufffdstop"
    for latency in (-1.0, math.inf, "slow"):
        odd = ModelResponse("hi", latency_ms=latency)
        assert clean_response(odd).latency_ms == 0.0
    assert clean_response(ModelResponse("hi", finish_reason=3)).finish_reason == "3"
