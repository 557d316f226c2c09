"""The installed distribution's version, in a module of its own so that a part of the
package can name it without importing `tether` itself."""

from __future__ import annotations


def installed_version() -> str:
    """The installed distribution's version (package metadata)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tether")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0+unknown"
