"""Retry schedules for tool calls: the one `tether.retry` policy, re-exported here.

Tool calls and model calls share `RetryPolicy`, `decide` and the HTTP status reading
(`tether.retry.classify_status`); see that module for the schedule and its defaults.
"""

from __future__ import annotations

from tether.retry import ON_EXHAUSTED, FailureClass, OnExhausted, RetryDecision, RetryPolicy, decide

__all__ = [
    "ON_EXHAUSTED",
    "FailureClass",
    "OnExhausted",
    "RetryDecision",
    "RetryPolicy",
    "decide",
]
