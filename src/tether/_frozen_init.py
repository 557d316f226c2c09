"""`direct_init`: a faster `__init__` for the frozen dataclasses made every round.

Kept apart from the modules that use it (the models' types, the stores' records and
commit rules, the runtime's values) because the stores may import nothing of the
runtime or the models (`tests/unit/test_import_graph.py`).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, TypeVar

_C = TypeVar("_C", bound=type)


def direct_init(cls: _C) -> _C:
    """A frozen dataclass whose `__init__` puts its fields straight into the instance's
    `__dict__`, with the same parameters, defaults, default factories and
    `__post_init__` call as the one `dataclass` made. That one sets each field through
    `object.__setattr__` (the class is frozen), which cost about as much as the rest of
    the round's work with the object: the classes made every round take this one.
    Refused (`TypeError`) for a class it cannot stand for: not a frozen dataclass, with
    `__slots__`, an `InitVar`, a field left out of `__init__` or keyword-only ones."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" in vars(cls):
        raise TypeError(f"{cls.__name__} is not a frozen dataclass with a __dict__")
    fields = dataclasses.fields(cls)
    made = inspect.signature(vars(cls)["__init__"]).parameters
    names = [f.name for f in fields]
    if list(made)[1:] != names or any(
        p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in list(made.values())[1:]
    ):
        raise TypeError(f"{cls.__name__}: its __init__ does not take its fields in order")
    scope: dict[str, Any] = {"_MISSING": dataclasses.MISSING}
    args: list[str] = []
    body = ["    _values = self.__dict__"]
    for f in fields:
        name = f.name
        if f.default is not dataclasses.MISSING:
            scope[f"_default_{name}"] = f.default
            args.append(f"{name}=_default_{name}")
        elif f.default_factory is not dataclasses.MISSING:
            scope[f"_factory_{name}"] = f.default_factory
            args.append(f"{name}=_MISSING")
            body.append(f"    if {name} is _MISSING:\n        {name} = _factory_{name}()")
        else:
            args.append(name)
        body.append(f"    _values[{name!r}] = {name}")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    source = f"def __init__(self, {', '.join(args)}):\n" + "\n".join(body) + "\n"
    exec(source, scope)
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = vars(cls)["__init__"].__doc__
    cls.__init__ = init  # type: ignore[misc]
    return cls
