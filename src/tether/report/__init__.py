"""Looking back at a task from its event log.

- `timetravel`: the ledger and the task's state as of any event (`tether status --at`);
- `calls`: a stored model call, request and response (`tether show`);
- `figures`: the retrospective report's numbers (`tether report --format json`);
- `markdown`, `html`, `charts`: the report rendered for people (charts need the `report`
  or `web` extra, matplotlib).

Everything here reads the store and folds events; nothing writes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tether.report.calls import show_call
    from tether.report.figures import build_report
    from tether.report.timetravel import status_at

# Loaded on first use (PEP 562): `tether status --at` needs `timetravel` alone, not the
# model-call history `calls` brings in.
_WHERE = {
    "show_call": "tether.report.calls",
    "build_report": "tether.report.figures",
    "status_at": "tether.report.timetravel",
}


def __getattr__(name: str) -> Any:
    """Load a public name on first use."""
    if name not in _WHERE:
        raise AttributeError(f"module 'tether.report' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


__all__ = ["build_report", "show_call", "status_at"]
