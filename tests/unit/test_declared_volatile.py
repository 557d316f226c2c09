"""A contract's `tools:` entry may say whether a tool's answers change by themselves
(`volatile`), over what the tool declares: the run's tools carry the contract's word."""

from __future__ import annotations

import pytest

from tether import errors
from tether.runtime.tasks import ledger_from_spec
from tether.spec import parse_spec
from tether.tools.allowlist import allowed_tools
from tether.tools.registry import ToolRegistry, tool


def _registry() -> ToolRegistry:
    reg = ToolRegistry()
    reg.add(tool(lambda: "running", name="status", effect="read"))
    reg.add(tool(lambda: "3 rows", name="query", effect="read", volatile=False))
    reg.add(tool(lambda: "ok", name="shell", effect="write"))
    return reg


def _tools(entries: list[object]) -> dict[str, bool]:
    spec = parse_spec({"objective": "o", "items": [{"id": "a", "title": "a"}], "tools": entries})
    tools, _ = allowed_tools(spec, _registry(), ledger_from_spec(spec))
    return {t.name: bool(t.volatile) for t in tools if t.name in ("status", "query", "shell")}


def test_the_tools_own_word_without_a_declaration() -> None:
    assert _tools(["status", "query", "shell"]) == {"status": True, "query": False, "shell": False}


def test_the_contract_says_otherwise() -> None:
    declared = _tools(
        [
            {"name": "status", "volatile": False},
            {"name": "query", "volatile": True},
            {"name": "shell", "volatile": True},
        ]
    )
    assert declared == {"status": False, "query": True, "shell": True}
    # The registry's tools are not changed: another task sees their own word.
    assert _tools(["status", "query", "shell"]) == {"status": True, "query": False, "shell": False}


def test_a_declaration_that_is_not_a_yes_or_no_is_refused_where_it_is() -> None:
    with pytest.raises(errors.SpecError, match="volatile"):
        _tools([{"name": "status", "volatile": "sometimes"}])
