"""Control-flow signals shared by the runtime modules."""

from __future__ import annotations


class Stop(Exception):
    """The loop must stop now (terminal, waiting, suspended or interrupted)."""
