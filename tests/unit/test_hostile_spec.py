"""Hostile specs and JSON arguments (issue #12): every bad input is a `SpecError` /
`UserError` that says what is wrong and where, quickly, in little memory, and before
anything is written; never a traceback, a hang or a half-written task.

Covered: nesting deep enough to overflow the stack (YAML, JSON, JSON arguments), "billion
laughs" aliases and values that are huge only when expanded, recursive aliases, values
PyYAML cannot construct (dates, 5,000-digit numbers, unhashable keys), non-finite numbers,
text no database stores (NUL, unpaired surrogates), non-JSON `args`, `done_when` file
paths outside the workspace or of absurd length, workspaces that are the filesystem root
or the home folder, `_preexisting` on any path, and control characters on the terminal
(`cli.views.clean`). Hypothesis feeds arbitrary text and bytes to `load_spec`.
"""

from __future__ import annotations

import math
import os
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether import approvals, errors
from tether.cli.views import clean, json_view
from tether.runtime.tasks import _preexisting, create_task, workspace_folder
from tether.spec import (
    MAX_ALIASES,
    MAX_DEPTH,
    MAX_NODES,
    MAX_PROBLEMS,
    MAX_SPEC_BYTES,
    Budget,
    ChecklistItem,
    FileRule,
    TaskSpec,
    data_problem,
    file_path_problem,
    load_spec,
    parse_spec,
)
from tether.store import open_store
from tether.store.base import ApprovalRecord

BASE = "objective: x\nitems:\n  - {id: a, title: A}\n"
ITEM = {"id": "a", "title": "A"}
OP_ITEM = (
    "objective: x\nitems: [{{id: a, title: A, done_when: {{kind: op, tool: t, args: {args}}}}}]\n"
)


def write(tmp_path: Path, text: str | bytes, name: str = "spec.yaml") -> Path:
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8")
    return p


def refused(path: Path, *fragments: str, seconds: float = 5.0) -> str:
    """`load_spec(path)` raises a short `SpecError` naming the file and `fragments`,
    within `seconds`."""
    t0 = time.monotonic()
    with pytest.raises(errors.SpecError) as info:
        load_spec(path)
    assert time.monotonic() - t0 < seconds
    return assert_clear(info.value, str(path), *fragments)


def assert_clear(exc: errors.UserError, source: str, *fragments: str) -> str:
    text = str(exc)
    assert text.startswith(f"{source}: "), text
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in {text!r}"
    assert "Traceback" not in text and 'File "' not in text, text
    assert len(text) < 1200, text
    assert exc.exit_code == 2
    assert exc.__cause__ is None
    return text


def laughs(levels: int = 9, width: int = 9) -> str:
    """The classic "billion laughs": `width ** levels` values once expanded."""
    lines = [BASE.rstrip("\n"), "lol0: &l0 [" + ", ".join(['"lol"'] * width) + "]"]
    for n in range(1, levels):
        lines.append(f"lol{n}: &l{n} [" + ", ".join([f"*l{n - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def nested_dag(levels: int, width: int = 10) -> list[Any]:
    """A Python value that is `width ** levels` values when walked, built in microseconds
    (every level shares one list)."""
    v: list[Any] = ["lol"] * width
    for _ in range(levels - 1):
        v = [v] * width
    return v


# --- nesting --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"objective": "x", "items": [{"id": "a", "title": "A"}], "budget": '
        + "[" * 5000
        + "]" * 5000
        + "}",
        BASE + "instructions: " + "[" * 100_000,
        BASE + "budget:\n" + "".join("  " * (n + 1) + "-\n" for n in range(400)),
        "objective: x\nitems:\n  - id: a\n    title: A\n    done_when: {kind: op, tool: t, "
        "args: {v: " + "{a: " * 3000 + "1" + "}" * 3000 + "}}\n",
    ],
    ids=["json-lists", "unclosed-flow", "block-sequences", "args-mappings"],
)
def test_deep_nesting_is_refused_not_a_recursion_error(tmp_path: Path, text: str) -> None:
    refused(write(tmp_path, text, "spec.json"), f"nested deeper than {MAX_DEPTH} levels", "line")


def test_nesting_within_the_bound_loads(tmp_path: Path) -> None:
    depth = MAX_DEPTH - 6  # the item, its rule and `args` take levels of their own
    args = "{v: " + "[" * depth + "1" + "]" * depth + "}"
    p = write(
        tmp_path,
        f"objective: x\nitems:\n  - {{id: a, title: A, done_when: {{kind: op, tool: t, "
        f"args: {args}}}}}\n",
    )
    rule = load_spec(p).items[0].done_when
    assert rule is not None and rule.kind == "op"


def test_deep_python_data_is_refused_by_parse_spec() -> None:
    deep: Any = 1
    for _ in range(5000):
        deep = [deep]
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    for value, fragment in ((deep, "nested deeper"), (cyclic, "nested deeper")):
        item = {**ITEM, "done_when": {"kind": "op", "tool": "t", "args": {"v": value}}}
        with pytest.raises(errors.SpecError) as info:
            parse_spec({"objective": "x", "items": [item]})
        assert_clear(info.value, "<spec>", "items.0.done_when.args", fragment)


# --- aliases ----------------------------------------------------------------------------


def test_billion_laughs_fails_fast_in_little_memory(tmp_path: Path) -> None:
    p = write(tmp_path, laughs())
    tracemalloc.start()
    try:
        text = refused(p, "line", seconds=2.0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "expands to more than" in text or "aliases" in text
    assert peak < 50 * 2**20, f"peak {peak / 2**20:.0f} MiB"


def test_wide_shallow_laughs_are_refused_by_size(tmp_path: Path) -> None:
    # Few aliases (4 x 40 = 160, under MAX_ALIASES), 40**4 = 2.5 million values.
    refused(write(tmp_path, laughs(levels=5, width=40)), f"more than {MAX_NODES:,} values")


def test_many_aliases_are_refused(tmp_path: Path) -> None:
    uses = ", ".join(["*t"] * (MAX_ALIASES + 1))
    p = write(tmp_path, BASE + f"x: &t one\ny: [{uses}]\n")
    refused(p, f"more than {MAX_ALIASES} aliases", "line 5")


def test_recursive_alias_is_refused(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "objective: x\nitems:\n  - {id: a, title: A, done_when: "
        "{kind: op, tool: t, args: &loop {again: *loop}}}\n",
    )
    refused(p, "*loop", "recursive", "line 3")


def test_a_few_aliases_are_fine(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "objective: x\nitems:\n"
        "  - {id: a, title: A, done_when: {kind: op, tool: t, args: &args {path: x.txt}}}\n"
        "  - {id: b, title: B, done_when: {kind: op, tool: u, args: *args}}\n",
    )
    spec = load_spec(p)
    assert [i.done_when.args for i in spec.items if i.done_when and i.done_when.kind == "op"] == [
        {"path": "x.txt"},
        {"path": "x.txt"},
    ]


def test_a_huge_value_in_an_error_is_cut_without_being_expanded() -> None:
    """The offending value of a type error is a 10**8-value DAG: its whole `repr` would
    take minutes and gigabytes; the message shows its first characters."""
    t0 = time.monotonic()
    with pytest.raises(errors.SpecError) as info:
        parse_spec({"objective": "x", "items": [ITEM], "limits": {"max_rounds": nested_dag(8)}})
    text = assert_clear(info.value, "<spec>", "limits.max_rounds", "[[[[")
    assert time.monotonic() - t0 < 2.0
    assert len(text) < 400


def test_huge_args_are_refused_by_size() -> None:
    item = {**ITEM, "done_when": {"kind": "op", "tool": "t", "args": {"v": nested_dag(8)}}}
    t0 = time.monotonic()
    with pytest.raises(errors.SpecError) as info:
        parse_spec({"objective": "x", "items": [item]})
    assert_clear(info.value, "<spec>", f"more than {MAX_NODES:,} values")
    assert time.monotonic() - t0 < 5.0


def test_a_very_long_key_is_cut_in_the_message() -> None:
    with pytest.raises(errors.SpecError) as info:
        parse_spec({"objective": "x", "items": [ITEM], "k" * 100_000 + "\n\x1b[2J": 1})
    text = assert_clear(info.value, "<spec>", "unknown field")
    assert "\x1b" not in text and "\n\n" not in text


def test_many_problems_are_capped() -> None:
    items = [{"id": f"i{n}", "title": "", "colour": 1} for n in range(500)]
    with pytest.raises(errors.SpecError) as info:
        parse_spec({"objective": "x", "items": items})
    assert len(info.value.problems) == MAX_PROBLEMS
    assert info.value.problems[-1].startswith("... and ")


def test_many_items_are_checked_in_linear_time() -> None:
    n = 20_000
    items = [{"id": f"i{k}", "title": "t", "milestone": "m"} for k in range(n)]
    items.append({"id": "i0", "title": "again", "milestone": "nowhere"})
    t0 = time.monotonic()
    with pytest.raises(errors.SpecError) as info:
        parse_spec({"objective": "x", "milestones": [{"id": "m", "title": "M"}], "items": items})
    assert time.monotonic() - t0 < 10.0
    assert_clear(info.value, "<spec>", "'i0' is used more than once", f"items.{n}.milestone")


def test_a_file_larger_than_the_bound_is_not_parsed(tmp_path: Path) -> None:
    p = write(tmp_path, BASE + "#" * MAX_SPEC_BYTES)
    refused(p, "larger than", seconds=2.0)


# --- values PyYAML cannot construct ----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        (BASE + "name: 2020-13-45\n", ["line 4", "2020-13-45"]),
        (BASE + "budget: {tokens: " + "1" * 5000 + "}\n", ["line 4", "digits"]),
        (BASE + "? [a, b]\n: c\n", ["line 4", "key"]),
        (BASE + "? {a: 1}\n: c\n", ["line 4", "key"]),
        (BASE + "budget: {tokens: 0x" + "f" * 40 + "}\n", ["budget.tokens", "64 bits"]),
        (BASE + "x: !!binary 'abc'\n", ["line 4"]),
        (BASE + "x: !!python/object/apply:os.system ['true']\n", ["line 4"]),
    ],
    ids=["bad-date", "huge-int", "list-key", "map-key", "64-bit", "binary", "python-tag"],
)
def test_unreadable_values_name_their_line(tmp_path: Path, text: str, fragments: list[str]) -> None:
    refused(write(tmp_path, text), *fragments)


# --- numbers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ("budget: {money_usd: .inf}\n", "budget.money_usd"),
        ("budget: {money_usd: .nan}\n", "budget.money_usd"),
        ("budget: {wall_seconds: .inf}\n", "budget.wall_seconds"),
        ("limits: {breaker_failure_rate: .nan}\n", "limits.breaker_failure_rate"),
        ("limits: {breaker_cooldown_seconds: .inf}\n", "limits.breaker_cooldown_seconds"),
        ("context: {cache_ttl_seconds: .inf}\n", "context.cache_ttl_seconds"),
        ("services: {svc: {window_seconds: .inf}}\n", "services.svc.window_seconds"),
        ("milestones: [{id: m, title: M, budget: {money_usd: .inf}}]\n", "milestones.0.budget"),
    ],
)
def test_non_finite_numbers_are_refused(tmp_path: Path, extra: str, where: str) -> None:
    refused(write(tmp_path, BASE + extra), where, "finite")


def test_non_finite_numbers_are_refused_in_args_and_checks(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "objective: x\nitems:\n  - {id: a, title: A, done_when: "
        "{kind: op, tool: t, args: {limit: .nan}}}\n",
    )
    refused(p, "items.0.done_when.args", "nan", "limit")
    p = write(
        tmp_path,
        "objective: x\nacceptance:\n  - {id: c, description: d, check: "
        "{command: 'true', timeout: .inf}}\n" + BASE.split("\n", 1)[1],
    )
    refused(p, "acceptance.0.check.timeout", "finite")


def test_python_built_specs_refuse_non_finite_numbers() -> None:
    with pytest.raises(ValueError, match="finite"):
        Budget(money_usd=math.inf)
    with pytest.raises(ValueError, match="NaN"):
        ChecklistItem(
            id="a",
            title="A",
            done_when={"kind": "op", "tool": "t", "args": {"x": math.nan}},
        )


# --- text -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('objective: "a\\0b"\nitems: [{id: a, title: A}]\n', "objective"),
        ('objective: x\nitems: [{id: a, title: "A\\0"}]\n', "items.0.title"),
        (BASE + 'tools: ["write_file\\0"]\n', "tools"),
        (BASE + 'mcp_servers: [{name: s, command: c, env: {"K\\0": v}}]\n', "mcp_servers.0.env"),
        (
            OP_ITEM.format(args='{"\\0": 1}'),
            "items.0.done_when.args",
        ),
        (
            OP_ITEM.format(args='{k: "\\ud800"}'),
            "surrogate",
        ),
    ],
)
def test_text_no_database_stores_is_refused(tmp_path: Path, text: str, where: str) -> None:
    refused(write(tmp_path, text), where)


@pytest.mark.parametrize(
    ("value", "kind"),
    [("2020-01-01", "date"), ("!!binary aGVsbG8=", "bytes"), ("!!set {a: null}", "set")],
)
def test_args_must_be_json_data(tmp_path: Path, value: str, kind: str) -> None:
    p = write(
        tmp_path,
        "objective: x\nitems:\n  - id: a\n    title: A\n    done_when: {kind: op, tool: t, "
        f"args: {{when: {value}}}}}\n",
    )
    refused(p, "items.0.done_when.args", kind, "when")


def test_terminal_escapes_in_text_are_accepted_as_text(tmp_path: Path) -> None:
    # Not the spec's business: the CLI escapes them when it prints (see below).
    spec = load_spec(write(tmp_path, 'name: "x\\e[2Jy"\n' + BASE))
    assert spec.name == "x\x1b[2Jy"


# --- done_when file paths ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("a" * 5000, "at most"),
        ("/etc/passwd", "absolute"),
        ("../../etc/passwd", "outside"),
        ("a/../../b", "outside"),
        ("", "empty"),
        ("   ", "empty"),
        (".", "workspace itself"),
        ("a/..", "workspace itself"),
        ("x" * 300 + "/f", "255 bytes"),
        ("a\x00b", "NUL"),
        ("C:/Windows/win.ini", "absolute"),
    ],
)
def test_file_rule_paths_must_stay_in_the_workspace(
    tmp_path: Path, path: str, fragment: str
) -> None:
    assert file_path_problem(path) is not None
    item = {**ITEM, "done_when": {"kind": "file", "path": path}}
    with pytest.raises(errors.SpecError) as info:
        parse_spec({"objective": "x", "items": [item]})
    text = assert_clear(info.value, "<spec>", "items.0.done_when.path", fragment)
    assert len(text) < 400


@pytest.mark.parametrize("path", ["out/report.md", "./a.txt", "a/../b.txt", "~x", "é/ü.txt"])
def test_ordinary_file_rule_paths_load(path: str) -> None:
    assert file_path_problem(path) is None
    item = {**ITEM, "done_when": {"kind": "file", "path": path}}
    assert parse_spec({"objective": "x", "items": [item]}).items[0].done_when == FileRule(path=path)


def _unchecked(path: str) -> TaskSpec:
    """A spec whose file rule skipped validation (as one stored before it existed)."""
    rule = FileRule.model_construct(kind="file", path=path, contains=None, fresh=True)
    item = ChecklistItem.model_construct(
        id="a", title="A", milestone=None, done_when=rule, max_attempts=None, optional=False
    )
    return TaskSpec.model_construct(name="t", objective="x", items=[item])


@pytest.mark.parametrize(
    "path", ["a" * 5000, "a\x00b", "x/" * 3000 + "f", "/etc/passwd", "../../../../etc/passwd"]
)
def test_preexisting_never_raises_and_never_reads_outside(tmp_path: Path, path: str) -> None:
    assert _preexisting(_unchecked(path), tmp_path) == {}


def test_preexisting_skips_a_symlink_out_of_the_workspace(tmp_path: Path) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("secret", encoding="utf-8")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "link.txt").symlink_to(outside)
    (ws / "mine.txt").write_text("mine", encoding="utf-8")
    (ws / "loop").symlink_to(ws / "loop")
    assert _preexisting(_unchecked("link.txt"), ws) == {}
    assert _preexisting(_unchecked("loop"), ws) == {}
    assert list(_preexisting(_unchecked("mine.txt"), ws)) == ["mine.txt"]


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
def test_preexisting_file_that_cannot_be_read_is_a_user_error(tmp_path: Path) -> None:
    f = tmp_path / "locked.txt"
    f.write_text("x", encoding="utf-8")
    f.chmod(0)
    try:
        with pytest.raises(errors.UserError, match=r"locked\.txt"):
            _preexisting(_unchecked("locked.txt"), tmp_path)
    finally:
        f.chmod(0o600)


# --- workspaces -------------------------------------------------------------------------


async def test_root_and_home_workspaces_are_refused_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    (tmp_path / "to-root").symlink_to("/")
    (tmp_path / "to-home").symlink_to(home)
    spec = parse_spec({"objective": "x", "items": [ITEM]})
    store = await open_store("memory://")
    cases: list[tuple[str | Path, str]] = [
        ("/", "filesystem root"),
        (tmp_path / "to-root", "filesystem root"),
        (home, "home folder"),
        (tmp_path / "to-home", "home folder"),
        (str(home) + "/sub/..", "home folder"),
        ("a\x00b", "not a usable path"),
        ("", "not a usable path"),
    ]
    try:
        for ws, fragment in cases:
            with pytest.raises(errors.UserError, match=fragment):
                await create_task(store, spec, workspace=ws)
        with pytest.raises(errors.UserError, match="filesystem root"):
            await create_task(store, spec.model_copy(update={"workspace": "/"}))
        assert await store.list_tasks() == []
        task = await create_task(store, spec, workspace=home / "project")
        assert task.workspace == str(home / "project")
    finally:
        await store.close()


def test_workspace_folder_must_exist_when_asked(tmp_path: Path) -> None:
    with pytest.raises(errors.UserError, match="not a folder"):
        workspace_folder(tmp_path / "nope", must_exist=True)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(errors.UserError, match="loop"):
        workspace_folder(tmp_path / "loop", must_exist=True)
    assert workspace_folder(tmp_path, must_exist=True) == tmp_path.resolve()


# --- JSON arguments (approve --modify / --done --result) ----------------------------------


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"a":' * 5000 + "1" + "}" * 5000, "nested deeper"),
        ("[" * 200 + "]" * 200, "nested deeper"),
        ('{"x": NaN}', "NaN"),
        ('{"x": -Infinity}', "Infinity"),
        ('{"x": ' + "9" * 5000 + "}", "digits"),
        ('{"x": ' + "9" * 30 + "}", "64 bits"),
        ('{"x": "a\\u0000b"}', "NUL"),
        ('{"x": "\\ud800"}', "surrogate"),
        ("{not json", "not valid JSON"),
    ],
)
def test_bad_json_arguments_are_user_errors(text: str, fragment: str) -> None:
    with pytest.raises(errors.UserError) as info:
        approvals.parse_json_argument(text, "--modify")
    assert fragment in str(info.value)
    assert str(info.value).startswith("--modify ")
    assert len(str(info.value)) < 300


def test_result_text_that_is_not_json_stays_text() -> None:
    assert approvals.parse_json_argument("done, id 42", "--result", text_fallback=True) == (
        "done, id 42"
    )
    assert approvals.parse_json_argument('{"id": 42}', "--result", text_fallback=True) == {"id": 42}
    with pytest.raises(errors.UserError, match="nested deeper"):
        approvals.parse_json_argument("[" * 5000 + "]" * 5000, "--result", text_fallback=True)


async def test_decide_refuses_unstorable_arguments_before_writing() -> None:
    store = await open_store("memory://")
    try:
        task = await create_task(store, parse_spec({"objective": "x", "items": [ITEM]}))
        pending = ApprovalRecord(
            "r1", task.task_id, "pending", {"kind": "approval", "options": ["modify"]}
        )
        await store.commit(task.task_id, None, [], approvals=[pending])
        before = (await store.get_task(task.task_id)).last_seq
        for bad in ({"x": math.nan}, {"x": math.inf}, {"x": "a\x00b"}, {"x": object()}):
            with pytest.raises(errors.UserError, match="modified_args"):
                await approvals.decide(store, task.task_id, "r1", "approve", modified_args=bad)
        deep: Any = 1
        for _ in range(MAX_DEPTH + 5):
            deep = [deep]
        with pytest.raises(errors.UserError, match="nested deeper"):
            await approvals.decide(store, task.task_id, "r1", "approve", modified_args={"d": deep})
        assert (await store.get_task(task.task_id)).last_seq == before
        assert [a.status for a in await store.get_approvals(task.task_id)] == ["pending"]
    finally:
        await store.close()


# --- the terminal -----------------------------------------------------------------------


def test_clean_escapes_what_would_act_on_a_terminal() -> None:
    hostile = "a\x1b[2J\x1b]0;pwned\x07b\x9b31m\rc\x08d\u202eevil\u2028e\ud800"
    shown = clean(hostile)
    assert shown == ("a\\x1b[2J\\x1b]0;pwned\\x07b\\x9b31m\\rc\\x08d\\u202eevil\\u2028e\\ud800")
    assert clean("one\ntwo\tthree") == "one\\ntwo\tthree"
    assert clean("one\ntwo", lines=True) == "one\ntwo"
    assert clean("café ✓ 日本 :smile: [bold]x[/bold]") == "café ✓ 日本 :smile: [bold]x[/bold]"


def test_json_view_is_the_same_json_without_raw_controls() -> None:
    import json

    doc = {"name": "x\x1b[2J\x9b\u202eé", "n": [1, 2.5, None]}
    text = json_view(doc).plain
    assert json.loads(text) == doc
    assert not any(c in text for c in "\x1b\x9b\u202e")
    assert "é" in text


_UNSAFE = {chr(c) for c in [*range(0x20), *range(0x7F, 0xA0)]} - {"\n", "\t"} | set(
    "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029"
)


@given(st.text())
@settings(max_examples=300)
def test_clean_output_has_nothing_that_acts_on_a_terminal(text: str) -> None:
    shown = clean(text, lines=True)
    assert not (set(shown) & _UNSAFE)
    assert not any("\ud800" <= c <= "\udfff" for c in shown)
    if not (set(text) & (_UNSAFE | {"\\"})) and text.isprintable():
        assert shown == text


# --- any input: an answer, never a traceback --------------------------------------------


def _answer(path: Path) -> None:
    try:
        load_spec(path)
    except errors.SpecError as exc:
        assert str(exc).startswith(f"{path}: ")
        assert exc.__cause__ is None


@given(st.text(max_size=400))
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_any_text_as_a_spec_gets_an_answer(tmp_path: Path, text: str) -> None:
    _answer(write(tmp_path, text.encode("utf-8", "surrogatepass")))


@given(st.binary(max_size=400))
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_any_bytes_as_a_spec_get_an_answer(tmp_path: Path, data: bytes) -> None:
    _answer(write(tmp_path, data))


_YAMLISH = st.sampled_from(
    [
        "objective: x\n",
        "items: [{id: a, title: A}]\n",
        "items:\n  - id: a\n    title: A\n",
        "budget: {money_usd: .inf}\n",
        "x: &a [1, 2]\n",
        "y: *a\n",
        "z: [*a, *a, *a]\n",
        "? [k]\n: v\n",
        "when: 2020-13-45\n",
        "n: 0x" + "f" * 30 + "\n",
        'q: "\\0\\e[2J\\ud800"\n',
        "<<: {objective: y}\n",
        "- 1\n",
        "[[[[[[[\n",
        "{a: {b: {c: {d: [1, {e: 2}]}}}}\n",
        "workspace: /\n",
        "items: [{id: a, title: A, done_when: {kind: file, path: ../x}}]\n",
        "items: [{id: a, title: A, done_when: {kind: op, tool: t, args: {v: .nan}}}]\n",
        "--- \n",
        "%YAML 1.1\n---\n",
        "\t\n",
        "!!python/name:os.system\n",
    ]
)


@given(st.lists(_YAMLISH, max_size=8), st.sampled_from(["", "  ", "- "]))
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_spliced_yaml_gets_an_answer(tmp_path: Path, pieces: list[str], indent: str) -> None:
    text = "".join(indent + p if n % 2 else p for n, p in enumerate(pieces))
    _answer(write(tmp_path, text))


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=10)
    | st.dates()
    | st.binary(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(_JSON)
@settings(max_examples=300, deadline=None)
def test_any_args_value_gets_an_answer(value: Any) -> None:
    item = {**ITEM, "done_when": {"kind": "op", "tool": "t", "args": {"v": value}}}
    try:
        spec = parse_spec({"objective": "x", "items": [item]})
    except errors.SpecError:
        assert data_problem({"v": value}) is not None
    else:
        assert data_problem({"v": value}) is None
        yaml.safe_dump(spec.model_dump(mode="json"))  # storable and printable


@given(st.text(max_size=60))
@settings(max_examples=300, deadline=None)
def test_any_json_argument_text_gets_an_answer(text: str) -> None:
    try:
        value = approvals.parse_json_argument(text, "--modify")
    except errors.UserError as exc:
        assert str(exc).startswith("--modify ")
    else:
        assert data_problem(value) is None
