"""`module:attr` references: the one loader for user code named in settings.

Used for `TETHER_TOOLS` (tools), `scripted:module:function` models (policies) and a
contract's `callable` acceptance checks. The working folder is importable while the
module loads (as with `python -m`), so `mypolicy:act` finds `./mypolicy.py` even
under the `tether` console script. Every failure is a `UserError` in one style:

- `<context>: 'x' is not a module:attr reference`
- `<context>: cannot import the <what> module 'm': No module named 'm'`
- `<context>: the <what> module 'm' failed to load: SyntaxError (m.py, line 3: ...)`
- `<context>: module 'm' has no 'attr'`
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

from tether.errors import UserError

#: A `module:attr` reference: a dotted module path, a colon, an attribute name.
REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def is_ref(text: str) -> bool:
    """Whether `text` has the form `module:attr`."""
    return REF.match(text) is not None


@contextlib.contextmanager
def _cwd_importable() -> Iterator[None]:
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(cwd)


def load_ref(ref: str, *, what: str, context: str = "") -> Any:
    """The object `ref` (`module:attr`) names.

    `what` names the kind of module in messages (`tool`, `policy`, `check`); `context`
    (a setting's name, say) starts every message. Raises `UserError` (see the module
    docstring); the module's own exception is not chained, its type and message are
    in the text.
    """
    prefix = f"{context}: " if context else ""
    module_name, sep, attr = ref.strip().partition(":")
    if not sep or not is_ref(f"{module_name}:{attr}"):
        raise UserError(f"{prefix}{ref!r} is not a module:attr reference")
    with _cwd_importable():
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise UserError(
                f"{prefix}cannot import the {what} module {module_name!r}: {exc}"
            ) from None
        except Exception as exc:  # the user's module failed while loading: say where
            raise UserError(
                f"{prefix}the {what} module {module_name!r} failed to load: {_why(exc)}"
            ) from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise UserError(f"{prefix}module {module_name!r} has no {attr!r}") from None


def _why(exc: Exception) -> str:
    if isinstance(exc, SyntaxError):
        return f"{type(exc).__name__} ({exc.filename}, line {exc.lineno}: {exc.msg})"
    return f"{type(exc).__name__}: {exc}"
