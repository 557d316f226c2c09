"""SQLite's synchronous levels, read from a URL, an argument or the environment.

Its own module so that `tether.store` and `tether.store.sqlite` both use it without
importing each other."""

from __future__ import annotations

from tether import errors

SQLITE_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


def sqlite_synchronous(value: str, source: str = "synchronous") -> str:
    """The SQLite level for `value` (any case); `StoreConfigError` naming `source` if it is
    not one of OFF, NORMAL, FULL, EXTRA."""
    level = value.strip().upper()
    if level not in SQLITE_SYNCHRONOUS:
        raise errors.StoreConfigError(
            f"{source}={value!r} is not one of {', '.join(s.lower() for s in SQLITE_SYNCHRONOUS)}"
            " (SQLite's synchronous level; the default is full)"
        )
    return level
