"""Looking back at a task from its event log.

- `timetravel`: the ledger and the task's state as of any event (`tether status --at`);
- `calls`: a stored model call, request and response (`tether show`);
- `figures`: the retrospective report's numbers (`tether report --format json`);
- `markdown`, `html`, `charts`: the report rendered for people (charts need the `report`
  or `web` extra, matplotlib).

Everything here reads the store and folds events; nothing writes.
"""

from __future__ import annotations

from tether.report.calls import show_call
from tether.report.figures import build_report
from tether.report.timetravel import status_at

__all__ = ["build_report", "show_call", "status_at"]
