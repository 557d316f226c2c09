"""Hostile input, generated: never a traceback, never a write on a rejection.

Hypothesis draws specs (JSON-like trees around a valid one, and raw text as YAML), JSON
arguments as a person would type them (`--modify`, `--result`), and command-line
numbers. Every rejection must be tether's `UserError` (a `SpecError` for specs), which
the command line prints as one paragraph with exit 2; anything else escaping is a bug.
The command-line cases run the real CLI in-process (typer's runner) against a SQLite
file: a rejected `submit` leaves no database behind, and a read never changes one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tether import errors
from tether.approvals import parse_json_argument
from tether.spec import load_spec, parse_spec

FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
#: The command-line cases start a whole command each: fewer of them.
FUZZ_CLI = settings(FUZZ, max_examples=40)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["", "\x00", "\x1b[2J", "../../etc/passwd", "/", "a" * 5000, "\ud800"]),
)
trees = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(max_size=12), inner, max_size=4),
    ),
    max_leaves=30,
)
FIELDS = [
    "name",
    "objective",
    "items",
    "tools",
    "budget",
    "limits",
    "models",
    "workspace",
    "milestones",
    "acceptance",
    "services",
    "mcp_servers",
    "context",
    "review",
]
ITEM_FIELDS = ["id", "title", "done_when", "after", "optional", "milestone", "evidence_from"]


def valid_spec() -> dict[str, Any]:
    return {"objective": "x", "items": [{"id": "a", "title": "A"}]}


@st.composite
def mutated_specs(draw: st.DrawFn) -> Any:
    """A valid spec with some fields (top level or the item's) replaced by anything."""
    spec: dict[str, Any] = valid_spec()
    for field in draw(st.lists(st.sampled_from(FIELDS), max_size=3)):
        spec[field] = draw(trees)
    if isinstance(spec.get("items"), list) and spec["items"] and isinstance(spec["items"][0], dict):
        for field in draw(st.lists(st.sampled_from(ITEM_FIELDS), max_size=3)):
            spec["items"][0][field] = draw(trees)
    return spec


@FUZZ
@given(mutated_specs())
def test_any_spec_value_is_accepted_or_a_spec_error(spec: Any) -> None:
    try:
        parsed = parse_spec(spec)
    except errors.SpecError as exc:
        assert str(exc).strip()
        return
    # What was accepted is storable: finite numbers, text without NUL.
    json.dumps(parsed.model_dump(mode="json"), allow_nan=False)


@FUZZ
@given(st.one_of(trees, st.lists(trees)))
def test_any_document_is_accepted_or_a_spec_error(doc: Any) -> None:
    try:
        parsed = parse_spec(doc)
    except errors.SpecError as exc:
        assert str(exc).strip()
        return
    json.dumps(parsed.model_dump(mode="json"), allow_nan=False)


yaml_text = st.one_of(
    st.text(max_size=300),
    st.builds(
        lambda depth, key: key + ": " + "[" * depth + "]" * depth,
        st.integers(0, 3000),
        st.sampled_from(["objective", "items", "budget"]),
    ),
    st.builds(
        lambda n: (
            "a: &a [x]\n"
            + "".join(
                f"b{i}: &b{i} [{', '.join(['*a' if i == 0 else f'*b{i - 1}'] * 9)}]\n"
                for i in range(n)
            )
            + "objective: x\nitems: [{id: a, title: A}]\n"
        ),
        st.integers(0, 9),
    ),
)


@FUZZ
@given(yaml_text)
def test_any_yaml_file_loads_or_is_a_spec_error(tmp_path_factory: Any, text: str) -> None:
    path = tmp_path_factory.mktemp("spec") / "spec.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        load_spec(path)
    except errors.SpecError as exc:
        assert str(exc).strip()


json_like = st.one_of(
    st.text(max_size=200),
    trees.map(lambda v: json.dumps(v, allow_nan=True, default=str)),
    st.integers(0, 5000).map(lambda n: "[" * n + "]" * n),
    st.integers(0, 5000).map(lambda n: '{"a":' * n + "1" + "}" * n),
    st.sampled_from(["NaN", "Infinity", "-Infinity", '{"x": NaN}', "1" * 5000, '"\\u0000"']),
)


@FUZZ
@given(json_like, st.booleans())
def test_any_json_argument_is_usable_or_a_user_error(text: str, fallback: bool) -> None:
    try:
        value = parse_json_argument(text, "--modify", text_fallback=fallback)
    except errors.UserError as exc:
        assert str(exc).startswith("--modify")
        return
    # What was accepted is JSON tether can store.
    json.dumps(value, allow_nan=False)


# --- the command line, in-process ----------------------------------------------------------


@pytest.fixture(scope="module")
def cli() -> Any:
    from tether.cli import app

    return app


def invoke(app: Any, args: list[str], cwd: Path) -> Any:
    import os

    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(app, args, catch_exceptions=True)
    finally:
        os.chdir(old)


def assert_no_traceback(result: Any) -> None:
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"escaped: {result.exception!r}\n{result.output}")
    assert result.exit_code in (0, 2, 3), (result.exit_code, result.output)
    assert "Traceback" not in result.output


numbers = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", "-", "1e999", "0x10", "nan", "inf", "١٢", " 5 "]),
)


@FUZZ_CLI
@given(after=numbers, limit=numbers)
def test_events_options_never_escape(
    cli: Any, tmp_path_factory: Any, after: str, limit: str
) -> None:
    cwd = tmp_path_factory.mktemp("cli")
    result = invoke(cli, ["events", "t1", "--after", after, "--limit", limit], cwd)
    assert_no_traceback(result)
    # A read never creates a database.
    assert not (cwd / ".tether").exists()


@FUZZ_CLI
@given(spec=mutated_specs())
def test_a_rejected_submit_writes_nothing(cli: Any, tmp_path_factory: Any, spec: Any) -> None:
    cwd = tmp_path_factory.mktemp("submit")
    (cwd / "ws").mkdir()
    path = cwd / "spec.json"
    path.write_text(json.dumps(spec, allow_nan=True, default=str), errors="surrogatepass")
    result = invoke(cli, ["submit", str(path), "--workspace", str(cwd / "ws")], cwd)
    assert_no_traceback(result)
    if result.exit_code != 0:
        assert not (cwd / ".tether").exists(), result.output
    else:
        assert (cwd / ".tether" / "tether.db").is_file()


@FUZZ_CLI
@given(timeout=numbers, retries=numbers, reconnect=numbers)
def test_model_and_reconnect_options_never_escape(
    cli: Any, tmp_path_factory: Any, timeout: str, retries: str, reconnect: str
) -> None:
    cwd = tmp_path_factory.mktemp("resume")
    args = ["resume", "t1", "--model-timeout", timeout, "--model-retries", retries]
    result = invoke(cli, [*args, "--reconnect-for", reconnect], cwd)
    assert_no_traceback(result)
    # Bad values are refused, good ones find no database here: nothing is written.
    assert result.exit_code == 2, result.output
    assert not (cwd / ".tether").exists()
