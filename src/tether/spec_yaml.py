"""The YAML reader of contract files (`tether.spec.load_document`): a safe loader that
refuses what a contract never needs and an attacker would use.

A module of its own so that YAML loads only when a file is read: a task resumed from
its stored contract (JSON in the database) never parses YAML.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from tether._validation import cut as _cut


class YamlProblem(ValueError):
    """A contract file that is not YAML tether reads; the message says what and where."""


class _Refused(yaml.MarkedYAMLError):
    """The YAML is well formed but over one of the bounds (`max_depth`, `max_aliases`,
    `max_nodes`), or it aliases a node inside itself."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe loader that refuses a key given twice in one mapping (YAML allows it
    silently; in a contract it is always a mistake), unhashable keys, and values it
    cannot read (`2020-13-45`, a 5,000-digit number) with their line; and that bounds
    nesting and alias expansion (a "billion laughs" is refused after a few aliases,
    before anything is expanded)."""

    def __init__(self, stream: str, *, max_depth: int, max_aliases: int, max_nodes: int) -> None:
        super().__init__(stream)
        self.max_depth, self.max_aliases, self.max_nodes = max_depth, max_aliases, max_nodes
        self._depth = 0  # collections open around the node being composed
        self._reach = 0  # deepest level reached in the current subtree, aliases expanded
        self._values = 0  # values composed so far, aliases counted at their expanded size
        self._aliases = 0
        self._open: set[str] = set()  # anchors of the collections being composed
        self._shape: dict[str, tuple[int, int]] = {}  # anchor -> (values, height)

    def _refuse(self, problem: str, event: Any) -> _Refused:
        return _Refused(None, None, problem, event.start_mark)

    def _count(self, values: int, reach: int, event: Any) -> None:
        self._values += values
        self._reach = max(self._reach, reach)
        if self._values > self.max_nodes:
            raise self._refuse(
                f"the YAML expands to more than {self.max_nodes:,} values (aliases included)", event
            )
        if reach > self.max_depth:
            raise self._refuse(f"nested deeper than {self.max_depth} levels", event)

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            anchor = event.anchor
            if anchor in self._open:
                raise self._refuse(
                    f"the alias *{anchor} is used inside the value it names "
                    "(a recursive structure)",
                    event,
                )
            if anchor in self._shape:
                self._aliases += 1
                if self._aliases > self.max_aliases:
                    raise self._refuse(
                        f"more than {self.max_aliases} aliases (*name); a spec needs few, and "
                        'aliases of aliases can expand to billions of values ("billion laughs")',
                        event,
                    )
                values, height = self._shape[anchor]
                self._count(values, self._depth + height, event)
            return super().compose_node(parent, index)
        self._depth += 1
        before, outer_reach = self._values, self._reach
        self._reach = 0
        self._count(1, self._depth, event)
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self._open.add(anchor)
        node = super().compose_node(parent, index)
        if anchor is not None:
            self._open.discard(anchor)
            self._shape[anchor] = (self._values - before, self._reach - self._depth + 1)
        self._reach = max(outer_reach, self._reach)
        self._depth -= 1
        return node

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as exc:
            reason = str(exc)
            if "Exceeds the limit" in reason:  # int("1" * 5000)
                reason = f"a number of more than {sys.get_int_max_str_digits()} digits"
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"cannot read the value {_cut(node.value, 40)} ({reason[:100]})",
                node.start_mark,
            ) from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"a key cannot be a {type(key).__name__}",
                    key_node.start_mark,
                ) from None
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"the key {_cut(key, 60)} appears twice in one mapping",
                    key_node.start_mark,
                )
            seen[key] = True
        return super().construct_mapping(node, deep=deep)


def _where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""


def read(text: str, *, max_depth: int, max_aliases: int, max_nodes: int) -> Any:
    """The data of a YAML (or JSON) document, read within the bounds; a `YamlProblem`
    when it is malformed or over a bound (a `RecursionError` when it nests deeper than
    the interpreter goes)."""
    loader: _UniqueKeyLoader | None = None
    try:  # as `yaml.load` does with a loader class (whose reader checks the text)
        loader = _UniqueKeyLoader(
            text, max_depth=max_depth, max_aliases=max_aliases, max_nodes=max_nodes
        )
        return loader.get_single_data()
    except _Refused as exc:
        raise YamlProblem(f"cannot load the YAML{_where(exc)}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise YamlProblem(f"malformed YAML{_where(exc)}: {problem}") from None
    finally:
        if loader is not None:
            loader.dispose()
