"""One `module:attr` loader and one wording for validation errors, shared by the
contract, tool arguments, `TETHER_TOOLS`, scripted policies and callable checks."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import Field

from tether import _imports, errors, spec
from tether.runtime.judge.completion import _call_check
from tether.tools.registry import ToolContext, tool


@pytest.fixture
def mod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module `tether_test_refs_mod` in the working folder (not otherwise on sys.path)."""
    name = "tether_test_refs_mod"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """\
            VALUE = 42

            def check(workspace):
                return True, "fine"
            """
        )
    )
    (tmp_path / "tether_test_broken_mod.py").write_text("def oops(:\n")
    monkeypatch.chdir(tmp_path)
    for m in (name, "tether_test_broken_mod"):
        monkeypatch.delitem(sys.modules, m, raising=False)
    return name


def test_load_ref_imports_from_the_working_folder(mod: str, tmp_path: Path) -> None:
    assert _imports.load_ref(f"{mod}:VALUE", what="tool") == 42
    assert str(tmp_path) not in sys.path  # restored


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("no_colon", "CTX: 'no_colon' is not a module:attr reference"),
        ("a:b:c", "CTX: 'a:b:c' is not a module:attr reference"),
        ("mod:1x", "CTX: 'mod:1x' is not a module:attr reference"),
        ("tether_no_such_mod_xyz:f", "CTX: cannot import the tool module 'tether_no_such_mod_xyz'"),
        ("MOD:missing", "CTX: module 'MOD' has no 'missing'"),
        ("tether_test_broken_mod:f", "CTX: the tool module 'tether_test_broken_mod' failed to "
         "load: SyntaxError ("),
    ],
)  # fmt: skip
def test_load_ref_errors_have_one_style(mod: str, ref: str, message: str) -> None:
    with pytest.raises(errors.UserError) as info:
        _imports.load_ref(ref.replace("MOD", mod), what="tool", context="CTX")
    assert str(info.value).startswith(message.replace("MOD", mod))


def test_callable_checks_use_the_same_loader(mod: str, tmp_path: Path) -> None:
    assert _call_check(f"{mod}:check", tmp_path) == (True, "fine")
    ok, detail = _call_check(f"{mod}:nope", tmp_path)
    assert not ok and detail == f"check {mod}:nope: module {mod!r} has no 'nope'"
    ok, detail = _call_check("tether_test_broken_mod:f", tmp_path)
    assert not ok and "failed to load: SyntaxError" in detail  # a result, not a crash


# --- validation wording -------------------------------------------------------------------


@tool(effect="write")
def book(
    ctx: ToolContext,
    room: Annotated[str, Field(description="the room's name", min_length=1)],
    seats: Annotated[int, Field(ge=1, le=20)] = 2,
    note: str = "",
) -> str:
    """Book a room."""
    return room


def test_tool_schemas_keep_field_constraints_and_drop_titles() -> None:
    assert dict(book.parameters) == {
        "type": "object",
        "properties": {
            "room": {"type": "string", "description": "the room's name", "minLength": 1},
            "seats": {"type": "integer", "minimum": 1, "maximum": 20, "default": 2},
            "note": {"type": "string", "default": ""},
        },
        "required": ["room"],
        "additionalProperties": False,
    }
    assert list(book.parameters) == ["type", "properties", "required", "additionalProperties"]


def test_tool_argument_wording() -> None:
    with pytest.raises(errors.ToolFailed) as info:
        book.check_args({"seats": 99, "colour": "red", "note": "x" * 100})
    assert str(info.value) == (
        "bad arguments for book: room: required argument is missing; "
        "seats: Input should be less than or equal to 20 (got 99); colour: unknown argument"
    )
    assert book.check_args({"room": "a"}) == {"room": "a", "seats": 2, "note": ""}


def test_spec_uses_the_same_wording() -> None:
    data: dict[str, Any] = {
        "objective": "x",
        "items": [{"id": "a", "title": "A", "colour": 1}, {"id": "b"}],
        "limits": {"max_rounds": "x" * 100},
    }
    with pytest.raises(errors.SpecError) as info:
        spec.parse_spec(data)
    problems = info.value.problems
    assert "items.0.colour: unknown field (check the spelling; allowed fields are listed in " \
        "the docs)" in problems  # fmt: skip
    assert "items.1.title: required field is missing" in problems
    clipped = [p for p in problems if p.startswith("limits.max_rounds: ")]
    assert clipped and clipped[0].endswith("...)") and len(clipped[0]) < 160
