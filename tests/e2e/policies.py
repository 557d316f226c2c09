"""Scripted policies the CLI end-to-end tests run with `--model scripted:...`.

The tests put the repository root on `PYTHONPATH` of the `tether` subprocess, so these
import as `tests.e2e.policies:<name>`. Every policy works from the request alone: the
act policy reads `Next: <item>` from the newest goal ledger in the prompt and writes
`out/<item>.txt`; the specs the tests use judge by `done_when` op rules
(`models.judge: rules`), so no judge policy is needed.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from tests.support.loop import latest_ledger_text, next_item
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import tool_call

_OPEN = re.compile(r"^\s*\[[ ~]\] (\S+):", re.M)


def _write(item: str) -> Any:
    return tool_call("write_file", path=f"out/{item}.txt", content=f"{item} done\n")


def _other(request: ModelRequest) -> ModelResponse | str:
    if request.purpose == "compact":
        return "Earlier rounds wrote some files. Progress is whatever the ledger says."
    if request.purpose == "review":
        return '{"passed": true, "gaps": [], "reopen": []}'
    # judge (only when a spec does not say `models.judge: rules`): no opinion
    return '{"changes": [], "decision": "continue", "reason": "rules decide"}'


def done_policy(request: ModelRequest) -> ModelResponse | str:
    """One write per round for the ledger's next item; says done when nothing is open."""
    if request.purpose != "act":
        return _other(request)
    item = next_item(request)
    if item is None:
        return ModelResponse("All items are closed.")
    return ModelResponse(f"Writing {item}.", (_write(item),))


async def slow_policy(request: ModelRequest) -> ModelResponse | str:
    """`done_policy`, but every call takes 0.2 s (for the Ctrl-C test)."""
    await asyncio.sleep(0.2)
    return done_policy(request)


async def slow_demo_policy(request: ModelRequest) -> ModelResponse | str:
    """The demo's offline policy, but every call takes 0.05 s: `tether demo` runs long
    enough for a test to press Ctrl-C in the middle of it."""
    from tether.demo import policy

    await asyncio.sleep(0.05)
    return policy(request)


async def gated_policy(request: ModelRequest) -> ModelResponse | str:
    """`done_policy`, but from its second call on it answers only once a file named
    `release` exists in the working directory (at most 120 s): a test decides when the
    run may go on, instead of racing its speed."""
    from pathlib import Path

    if request.purpose == "act" and Path("out").is_dir() and any(Path("out").iterdir()):
        for _ in range(1200):
            if Path("release").exists():
                break
            await asyncio.sleep(0.1)
    return done_policy(request)


def fast_policy(request: ModelRequest) -> ModelResponse | str:
    """Writes the files of every open item in one round."""
    if request.purpose != "act":
        return _other(request)
    text = latest_ledger_text(request)
    items = list(dict.fromkeys(_OPEN.findall(text)))
    nxt = next_item(request)
    if nxt and nxt not in items:
        items.insert(0, nxt)
    if not items:
        return ModelResponse("All items are closed.")
    return ModelResponse(f"Writing {len(items)} files.", tuple(_write(i) for i in items))
