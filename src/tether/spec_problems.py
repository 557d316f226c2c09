"""A contract's validation errors as the lines a person reads: where each one is (the
path without pydantic's own tags), what is wrong, and for an unknown field the allowed
one it likely misspells."""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Mapping, Sequence
from typing import Any, get_args

from pydantic import BaseModel

from tether import _validation
from tether._validation import cut as _cut
from tether.spec_values import location_part

#: Between the problems a validator raises in one `ValueError` (one per line).
SEP = "\n"
#: Union tags pydantic puts into error locations; the user never wrote them.
_TAGS = frozenset({"op", "file", "artifact", "command", "callable"})

_TOP = "(top level)"
_UNKNOWN_HINT = " (check the spelling; allowed fields are listed in the docs)"
#: The most problems one `SpecError` lists.
MAX_PROBLEMS = 20


def _loc(loc: tuple[int | str, ...]) -> str:
    """Where an error is, without the discriminator tags pydantic adds to the path."""
    kept = [
        location_part(p)
        for n, p in enumerate(loc)
        if not (n > 0 and loc[n - 1] in ("done_when", "check") and p in _TAGS)
        and not (n > 1 and loc[n - 2] == "tools" and p in ("str", "ToolPermission"))
        and not (n > 1 and loc[n - 2] in ("targets", "admin") and p == "WebhookTarget")
    ]
    return _validation.where(kept, root=_TOP)


def _describe(err: Any, root: type[BaseModel]) -> list[str]:
    """The lines of one pydantic error: a validator's own problems one per line, else
    the wording shared with tool arguments (`tether._validation`), the offending value
    cut cheaply before it is shown."""
    loc = _loc(tuple(err["loc"]))
    if err["type"] == "value_error":
        msg = str(err.get("ctx", {}).get("error", err["msg"]))
        lines = [ln for ln in msg.split(SEP) if ln.strip()]
        return lines if loc == _TOP else [f"{loc}: {ln}" for ln in lines]
    if "input" in err:
        err = {**err, "input": _validation.Shown(_cut(err["input"]))}
    hint = _UNKNOWN_HINT
    if err["type"] == "extra_forbidden":
        with contextlib.suppress(Exception):  # a nicety: never in the way of the error
            hint = _close_field(tuple(err["loc"]), root) or hint
    return [_validation.describe_error(err, loc, noun="field", unknown_hint=hint)]


def _close_field(loc: tuple[int | str, ...], root: type[BaseModel]) -> str | None:
    """ " (did you mean 'title'?)" for an unknown field that is a likely misspelling of
    a field allowed where it is; None when none is close or the place is ambiguous."""
    model: Any = root
    path = list(loc[:-1])
    while path:
        part = path.pop(0)
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return None
        models = _models_in(field.annotation)
        if len(models) > 1 and path and path[0] in _TAGS:
            # A rule's kinds: pydantic names the one it tried (`done_when.file.paht`).
            tag = path.pop(0)
            models = [m for m in models if tag in get_args(m.model_fields["kind"].annotation)]
        if len(models) != 1:
            return None  # a union of shapes with no one list of fields
        model = models[0]
    names = [n for name, f in model.model_fields.items() for n in (name, f.alias) if n]
    close = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else None


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The contract models an annotation holds (through lists, optionals, unions)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _named_wrongly(err: Any, errs: Sequence[Any]) -> bool:
    """A `tools` entry is a name or an object: an object that is wrong as a
    `ToolPermission` is not also reported as "not a string" (nor a wrong webhook target
    as "not 'log'")."""
    loc = tuple(err["loc"])
    if (
        len(loc) == 4
        and loc[:2] in (("notify", "targets"), ("notify", "admin"))
        and err["type"] == "literal_error"
        and isinstance(err.get("input"), Mapping)
    ):
        # A notify target is `log` or a webhook: a wrong webhook is not also "not 'log'".
        return any(tuple(o["loc"])[:4] == (*loc[:3], "WebhookTarget") for o in errs)
    if len(loc) != 3 or loc[0] != "tools" or loc[2] != "str" or err["type"] != "string_type":
        return False
    if not isinstance(err.get("input"), Mapping):
        return False
    return any(tuple(o["loc"])[:3] == (*loc[:2], "ToolPermission") for o in errs)


def problems(errs: Sequence[Any], root: type[BaseModel]) -> list[str]:
    """The lines of a contract's validation errors (`root`: the contract's model), at
    most `MAX_PROBLEMS` of them."""
    out = [p for e in errs if not _named_wrongly(e, errs) for p in _describe(e, root)]
    if len(out) > MAX_PROBLEMS:
        more = len(out) - MAX_PROBLEMS + 1
        out = [*out[: MAX_PROBLEMS - 1], f"... and {more} more problems"]
    return out
