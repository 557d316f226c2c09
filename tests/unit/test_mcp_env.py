"""An MCP server's `env:` takes `${NAME}` from tether's environment (no secrets in specs)."""

from __future__ import annotations

import pytest

from tether import errors
from tether.tools.mcp import expand_env


def test_references_are_filled_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TICKETS_TOKEN", "s3cr3t-value")
    env = {"TOKEN": "${TICKETS_TOKEN}", "URL": "https://x/${TICKETS_TOKEN}/y", "PLAIN": "$HOME"}
    assert expand_env("tickets", env) == {
        "TOKEN": "s3cr3t-value",
        "URL": "https://x/s3cr3t-value/y",
        "PLAIN": "$HOME",  # only ${NAME} is a reference
    }


def test_an_unset_reference_names_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOPE_TOKEN", raising=False)
    with pytest.raises(errors.UserError, match=r"MCP server notes: env refers to \$\{NOPE_TOKEN\}"):
        expand_env("notes", {"K": "${NOPE_TOKEN}"})
