"""Local token estimates, calibrated against what providers report.

No tokenizer files can be downloaded at run time, so tether estimates: about four
characters a token for Latin text, one token per CJK character, plus a small overhead
per message. `Calibrator` keeps a running ratio of reported to estimated input tokens
(per model) and scales later estimates by it, so budgets track the real tokenizer.
"""

from __future__ import annotations

import functools
import json
import math
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tether.models.base import Message, ModelRequest, ToolSchema

MESSAGE_OVERHEAD = 4


@functools.cache
def _wide() -> re.Pattern[str]:
    """CJK and other wide scripts: about one token per character. Compiled on first use
    (~3 ms: most texts are ASCII and never need it)."""
    return re.compile("[\u2e80-\U0010ffff]")


def estimate_text(text: str) -> int:
    """Estimated tokens of a text."""
    if not text:
        return 0
    if text.isascii():  # the common case, decided in C
        return -(-len(text) // 4)  # `math.ceil(len(text) / 4)`, in integers
    wide = len(_wide().findall(text))
    narrow = len(text) - wide
    return wide + math.ceil(narrow / 4)


def estimate_message(message: Message) -> int:
    """Estimated tokens of one message, tool calls included."""
    n = MESSAGE_OVERHEAD + estimate_text(message.content)
    for call in message.tool_calls:
        n += MESSAGE_OVERHEAD + estimate_text(call.name) + estimate_text(call.raw_arguments)
    return n


def estimate_tools(tools: tuple[ToolSchema, ...]) -> int:
    """Estimated tokens of the tool schemas."""
    return sum(estimate_text(json.dumps(t.to_dict(), sort_keys=True)) for t in tools)


def estimate_request(request: ModelRequest) -> int:
    """Estimated input tokens of a whole request."""
    return (
        estimate_text(request.system)
        + estimate_tools(request.tools)
        + sum(estimate_message(m) for m in request.messages)
    )


class Calibrator:
    """Scales raw estimates by the observed ratio of reported to estimated tokens."""

    def __init__(self, ratio: float = 1.0, weight: float = 0.2) -> None:
        self.ratio = ratio
        self.weight = weight
        self.samples = 0

    def observe(self, estimated: int, reported: int) -> None:
        """Feed one call's estimate and the provider's reported input tokens."""
        if estimated <= 0 or reported <= 0:
            return
        r = reported / estimated
        # Clamp outliers: one odd report should not make the budget useless.
        r = min(4.0, max(0.25, r))
        self.ratio = r if self.samples == 0 else (1 - self.weight) * self.ratio + self.weight * r
        self.samples += 1

    def scale(self, estimated: int) -> int:
        """A calibrated estimate (never below the raw one, to stay on the safe side)."""
        return max(estimated, math.ceil(estimated * self.ratio))
