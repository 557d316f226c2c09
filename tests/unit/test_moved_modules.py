"""Modules that moved keep their old public import path for one release, with a warning."""

from __future__ import annotations

import importlib
import sys

import pytest


def test_runtime_builtins_reexports_the_builtin_tools_with_a_deprecation_warning() -> None:
    sys.modules.pop("tether.runtime.builtins", None)
    with pytest.warns(DeprecationWarning, match=r"tether\.tools\.builtin\.files"):
        old = importlib.import_module("tether.runtime.builtins")
    new = importlib.import_module("tether.tools.builtin.files")
    assert old.default_registry is new.default_registry
    assert old.READ_ARTIFACT == "read_artifact"
    assert old.as_sent is new.as_sent
