"""Fail points for fault-injection tests.

`TETHER_FAILPOINTS="name[=count],..."` makes the process exit at once with
`os._exit(137)` the count-th time (default: first) it reaches the named point. Exiting
without cleanup is the point: it imitates a SIGKILL at exactly that step.
"""

from __future__ import annotations

import os
import sys
from typing import Final

KNOWN: Final[frozenset[str]] = frozenset(
    {
        "before_model_call",
        "after_model_response",
        "after_op_intent",
        "after_op_dispatch",
        "after_op_result",
        "after_round_commit",
        "before_ledger_write",
        "during_compaction",
        "during_commit",
    }
)

_config: dict[str, int] | None = None
_hits: dict[str, int] = {}


def _parse(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, _, count = part.partition("=")
        out[name.strip()] = int(count) if count.strip() else 1
    return out


def reset() -> None:
    """Re-read the environment (tests that change it in-process)."""
    global _config
    _config = None
    _hits.clear()


def hit(name: str) -> None:
    """Mark that the process reached `name`; exit if the fail point says so."""
    global _config
    if _config is None:
        _config = _parse(os.environ.get("TETHER_FAILPOINTS", ""))
    if not _config or name not in _config:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == _config[name]:
        sys.stderr.write(f"tether: fail point {name} reached, exiting\n")
        sys.stderr.flush()
        os._exit(137)
