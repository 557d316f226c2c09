"""Scripted policies for `tests/e2e/test_worker_concurrency.py` (`--model
scripted:tests.e2e.concurrency_policies:<name>`).

`gated`: `done_policy`, except that a task's act call from its second round on first
drops a file `<key>.entered` into the folder `CONC_GATE_DIR` names (the key is the
`gate:<key>` word of the task's objective) and then answers only once a file `release`
exists there (at most 120 s): the test sees every task mid-round, and decides when the
rounds may go on.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

from tether.models.base import ModelRequest, ModelResponse

from .policies import done_policy

_KEY = re.compile(r"gate:(\w+)")


async def gated(request: ModelRequest) -> ModelResponse | str:
    folder = Path(os.environ["CONC_GATE_DIR"])
    key = _KEY.search(request.system)
    if request.purpose == "act" and key and "[x]" in _ledger(request):
        (folder / f"{key.group(1)}.entered").touch()
        for _ in range(2400):
            if (folder / "release").exists():
                break
            await asyncio.sleep(0.05)
    return done_policy(request)


def _ledger(request: ModelRequest) -> str:
    for m in reversed(request.messages):
        if m.role == "user" and "GOAL LEDGER" in m.content:
            return m.content
    return request.system
