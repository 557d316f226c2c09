"""Built-in post-conditions for `@tool(validate=...)`.

A validator gets the tool's raw result and returns None (fine) or a message saying what
is wrong; the runtime turns a message into a validation failure that goes back to the
model. Combine them with `all_of`.

```python
@tether.tool(effect="write", validate=all_of(status_is(200, 201), has_fields("id")))
def create_ticket(...) -> dict: ...
```
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

Check = Callable[[Any], "str | None"]


def _get(result: Any, key: str) -> Any:
    if isinstance(result, Mapping):
        return result.get(key)
    return getattr(result, key, None)


def status_is(*codes: int, key: str = "status") -> Check:
    """The result's HTTP status (`result["status"]`, or `.status_code`) is one of `codes`."""

    def check(result: Any) -> str | None:
        status = _get(result, key)
        if status is None:
            status = _get(result, "status_code")
        if status in codes:
            return None
        return f"expected HTTP status {' or '.join(map(str, codes))}, got {status!r}"

    return check


def has_fields(*fields: str, within: str | None = None) -> Check:
    """The result (or `result[within]`, e.g. the body) has every field, not empty."""

    def check(result: Any) -> str | None:
        target = _get(result, within) if within else result
        if not isinstance(target, Mapping):
            where = f"{within} of the result" if within else "the result"
            return f"{where} is not an object with fields {', '.join(fields)}"
        missing = [f for f in fields if target.get(f) in (None, "", [], {})]
        if missing:
            where = f" in {within}" if within else ""
            return f"the result has no {', '.join(missing)}{where}"
        return None

    return check


def file_nonempty(path_key: str = "path", *, base: Path | None = None) -> Check:
    """The file named by `result[path_key]` exists and is not empty (e.g. after a write)."""

    def check(result: Any) -> str | None:
        name = _get(result, path_key)
        if not isinstance(name, str) or not name:
            return f"the result names no file in {path_key!r}"
        path = (base / name) if base is not None else Path(name)
        if not path.is_file():
            return f"{name} does not exist after the call"
        if path.stat().st_size == 0:
            return f"{name} is empty after the call"
        return None

    return check


def all_of(*checks: Check) -> Check:
    """Every check passes; the first failure is reported."""

    def check(result: Any) -> str | None:
        for c in checks:
            problem = c(result)
            if problem:
                return problem
        return None

    return check
