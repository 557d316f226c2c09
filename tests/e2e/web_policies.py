"""Scripted models and the spec of the dashboard tests (`test_web_*`).

`spec(n)`: items judged by `done_when` rules: p1..pn, i2 and i4 write their file (i2's
file is there before the task starts, so writing it is an overwrite that waits for
approval); i3 reads a file that does not exist until the runtime blocks it.
`act`/`slow_act` (0.3 s per call, so a browser sees progress arrive) play the model;
they work from the request alone and run in a `tether worker` process as
`scripted:tests.e2e.web_policies:slow_act`.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import tool_call

_NEXT = re.compile(r"^Next: (\S+)", re.M)
SLOW = "scripted:tests.e2e.web_policies:slow_act"


def spec(n_plain: int = 0) -> dict[str, Any]:
    """The dashboard tests' contract: `n_plain` items p1.. that are simply written first
    (a browser watches them arrive), i2 (an overwrite: approval), i3 (blocked), i4."""

    def write(i: str) -> dict[str, Any]:
        return {"id": i, "title": f"write out/{i}.txt",
                "done_when": {"kind": "file", "path": f"out/{i}.txt"}}  # fmt: skip

    items = [write(f"p{k}") for k in range(1, n_plain + 1)]
    items += [write("i2"), {**write("i3"), "title": "read the missing file"}, write("i4")]
    return {
        "name": "dashboard",
        "objective": "write the files, one needs approval, one cannot be done",
        "items": items,
        "tools": ["write_file", "read_file"],
        "models": {"judge": "rules"},
        "limits": {"no_progress_rounds": 2, "same_failure_repeats": 2, "max_rounds": 80},
        "budget": {"tokens": 2_000_000, "money_usd": 5},
    }


def prepare(workspace: Path) -> None:
    """The workspace as the user had it: i2's file exists (so writing it overwrites)."""
    (workspace / "out").mkdir(parents=True, exist_ok=True)
    (workspace / "out" / "i2.txt").write_text("the user's own file\n")


def _next(request: ModelRequest) -> str | None:
    for m in reversed(request.messages):
        if m.role == "user" and "GOAL LEDGER" in m.content:
            found = _NEXT.findall(m.content)
            break
    else:
        found = _NEXT.findall(request.system)
    return None if not found or found[-1] == "nothing" else found[-1]


def act(request: ModelRequest) -> ModelResponse | str:
    """Writes the Next item's file; i3 reads a file that is not there."""
    if request.purpose != "act":
        return '{"changes": [], "decision": "continue", "reason": "rules decide"}'
    item = _next(request)
    if item is None:
        return ModelResponse("All items are closed.")
    if item == "i3":
        return ModelResponse("Looking for i3.", (tool_call("read_file", path="missing.txt"),))
    return ModelResponse(
        f"Writing {item}.", (tool_call("write_file", path=f"out/{item}.txt", content=f"{item}\n"),)
    )


async def slow_act(request: ModelRequest) -> ModelResponse | str:
    """`act`, 0.3 s per call."""
    await asyncio.sleep(0.3)
    return act(request)
