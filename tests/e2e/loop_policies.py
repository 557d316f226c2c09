"""Scripted models for `test_cli_resume_remembers` and `test_cli_exit_hints`."""

from __future__ import annotations

from tether import errors
from tether.models.base import ModelRequest, ModelResponse


def unreachable(request: ModelRequest) -> ModelResponse | str:
    """An endpoint that never answers: every call fails as a lost connection does."""
    raise errors.ModelError("connection error: All connection attempts failed", transient=True)
