"""Configuration a user gets wrong is refused at start, naming what is wrong and where
(the fixes behind tests/e2e/test_docs_walk.py, checked here without a subprocess)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tether import errors
from tether.store.base import Store
from tether.tools.builtin.files import default_registry

_TOOL = """
from tether import tool

@tool(effect="write")
def {name}(path: str, content: str) -> str:
    return "ok"

TOOLS = [{name}]
"""


def _no_store() -> Store:
    raise AssertionError("no store here")


def _module(folder: Path, module: str, tool_name: str, monkeypatch: pytest.MonkeyPatch) -> str:
    (folder / f"{module}.py").write_text(_TOOL.format(name=tool_name), "utf-8")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.chdir(folder)
    monkeypatch.delitem(sys.modules, module, raising=False)
    return f"{module}:TOOLS"


def test_a_tether_tools_tool_named_like_a_built_in_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = _module(tmp_path, "cfg_shadow", "write_file", monkeypatch)
    with pytest.raises(errors.UserError, match="'write_file' of 'cfg_shadow:TOOLS' clashes"):
        default_registry(_no_store, {"TETHER_TOOLS": ref})


def test_two_tether_tools_modules_with_one_name_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = _module(tmp_path, "cfg_one", "make_ticket", monkeypatch)
    two = _module(tmp_path, "cfg_two", "make_ticket", monkeypatch)
    with pytest.raises(errors.UserError, match=r"'cfg_two:TOOLS' clashes .* 'cfg_one:TOOLS'"):
        default_registry(_no_store, {"TETHER_TOOLS": f"{one},{two}"})


def test_the_same_tether_tools_reference_twice_is_not_a_clash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = _module(tmp_path, "cfg_twice", "make_note", monkeypatch)
    reg = default_registry(_no_store, {"TETHER_TOOLS": f"{ref}, {ref}"})
    assert reg.get("make_note") is not None
