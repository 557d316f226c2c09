"""Deprecated: the built-in tools moved to `tether.tools.builtin.files`.

This module re-exports that one for one release, so `from tether.runtime.builtins import
default_registry` keeps working; import from `tether.tools.builtin.files` instead.
"""

from __future__ import annotations

import warnings

from tether.tools.builtin.files import *  # noqa: F403

warnings.warn(
    "tether.runtime.builtins is deprecated; import from tether.tools.builtin.files",
    DeprecationWarning,
    stacklevel=2,
)
