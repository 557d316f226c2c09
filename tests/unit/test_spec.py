"""Loading task specs: valid ones in every shape, and clear errors for bad ones."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tether import errors
from tether.review import ReviewPolicy
from tether.spec import (
    ArtifactRule,
    CallableCheck,
    ChecklistItem,
    CommandCheck,
    CommandRule,
    FileRule,
    OpRule,
    TaskSpec,
    load_spec,
    parse_spec,
)

FULL = """\
name: catalogue
objective: Catalogue the documents in docs/ into catalog.csv
instructions: |
  Read each document once.
acceptance:
  - id: csv-exists
    description: catalog.csv has one row per document
    check:
      command: test -s catalog.csv
      exit_code: 0
      timeout: 5
  - id: summary-ok
    description: summary.md mentions every topic
    check:
      callable: mypkg.checks:summary_ok
  - id: notice
    description: a notice for the team exists
milestones:
  - id: m1
    title: Read
    budget: {tokens: 50000, rounds: 20}
  - id: m2
    title: Write
items:
  - id: read-01
    title: Read doc 01
    milestone: m1
    done_when: {kind: op, tool: read_file, args: {path: docs/01.txt}}
    max_attempts: 2
  - id: csv
    title: Write catalog.csv
    milestone: m2
    done_when: {kind: file, path: catalog.csv, contains: "title,date,topic"}
  - id: report
    title: Store the report artifact
    milestone: m2
    done_when: {kind: artifact, name: report, artifact_kind: summary}
  - id: lint
    title: The CSV parses
    done_when: {kind: command, command: python -c 'import csv', exit_code: 0, timeout: 10}
  - id: free
    title: An item without a rule
tools: [read_file, write_file]
budget:
  tokens: 1000000
  money_usd: 2.5
  wall_seconds: 3600
  rounds: 300
limits:
  max_rounds: 150
  max_rounds_per_milestone: 60
  max_attempts_per_item: 4
  no_progress_rounds: 2
  same_failure_repeats: 5
  breaker_failure_rate: 0.5
  breaker_min_calls: 20
  breaker_cooldown_seconds: 30
models:
  actor: openai:gpt-4.1-mini
  judge: anthropic:claude-x
context:
  input_budget_tokens: 12000
  preview_chars: 400
workspace: work
review: true
"""


def write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text), encoding="utf-8")
    return p


# --- valid specs -------------------------------------------------------------------------


def test_full_spec_loads(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, FULL))
    assert spec.name == "catalogue"
    assert spec.instructions == "Read each document once.\n"
    a1, a2, a3 = spec.acceptance
    assert a1.check == CommandCheck(command="test -s catalog.csv", exit_code=0, timeout=5)
    assert a2.check == CallableCheck(callable="mypkg.checks:summary_ok")
    assert a3.check is None
    assert [m.id for m in spec.milestones] == ["m1", "m2"]
    assert spec.milestones[0].budget.tokens == 50_000
    assert spec.milestones[0].budget.rounds == 20
    assert spec.milestones[1].budget.tokens is None
    rules = [i.done_when for i in spec.items]
    assert rules[0] == OpRule(tool="read_file", args={"path": "docs/01.txt"})
    assert rules[1] == FileRule(path="catalog.csv", contains="title,date,topic")
    assert rules[2] == ArtifactRule(name="report", artifact_kind="summary")
    assert rules[3] == CommandRule(command="python -c 'import csv'", timeout=10)
    assert rules[4] is None
    assert spec.items[0].max_attempts == 2
    assert spec.milestone_of("csv") == "m2"
    assert spec.milestone_of("lint") is None
    assert spec.milestone_of("nope") is None
    assert spec.tools == ["read_file", "write_file"]
    assert spec.budget.money_usd == 2.5 and spec.budget.wall_seconds == 3600
    assert spec.limits.max_rounds == 150 and spec.limits.breaker_failure_rate == 0.5
    assert spec.models.actor == "openai:gpt-4.1-mini"
    assert spec.models.compact is None
    assert spec.context.input_budget_tokens == 12_000
    assert spec.workspace == "work"
    assert spec.review == ReviewPolicy(model=True)


def test_minimal_spec_gets_defaults(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, "objective: x\nitems:\n  - {id: a, title: A}\n"))
    assert spec.name == "task"
    assert spec.acceptance == [] and spec.milestones == [] and spec.tools == []
    assert spec.budget.tokens is None
    assert spec.limits.max_rounds == 200
    assert spec.limits.max_attempts_per_item == 3
    assert spec.context.input_budget_tokens == 32_000
    assert spec.items[0].milestone is None and spec.items[0].done_when is None
    assert spec.review == ReviewPolicy()


def test_json_spec_loads(tmp_path: Path) -> None:
    data = {
        "objective": "x",
        "items": [{"id": "a", "title": "A", "done_when": {"kind": "file", "path": "f"}}],
    }
    spec = load_spec(write(tmp_path, json.dumps(data), "spec.json"))
    assert spec.items[0].done_when == FileRule(path="f")


def test_python_built_spec_equals_loaded(tmp_path: Path) -> None:
    built = TaskSpec(
        objective="x",
        items=[ChecklistItem(id="a", title="A", done_when=FileRule(path="out.txt"))],
    )
    loaded = load_spec(
        write(
            tmp_path,
            "objective: x\nitems:\n  - {id: a, title: A, done_when: {kind: file, path: out.txt}}\n",
        )
    )
    assert built == loaded
    assert parse_spec(built.model_dump()) == built


def test_spec_is_frozen(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, "objective: x\nitems:\n  - {id: a, title: A}\n"))
    with pytest.raises(Exception, match="frozen"):
        spec.objective = "y"  # type: ignore[misc]


# --- bad specs -------------------------------------------------------------------------


def assert_clear(exc: errors.SpecError, path: Path, *fragments: str, max_problems: int = 3) -> str:
    """A user-facing error: names the file and the fields, short, no traceback."""
    text = str(exc)
    assert text.startswith(f"{path}: "), text
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in {text!r}"
    assert "Traceback" not in text and 'File "' not in text, text
    assert "errors.pydantic.dev" not in text and "For further information" not in text, text
    assert "Value error," not in text, text
    assert len(exc.problems) <= max_problems, text
    assert len(text) < 800, text
    assert exc.exit_code == 2
    assert isinstance(exc, errors.UserError)
    # No chained driver exception for the CLI to print.
    assert exc.__cause__ is None
    assert exc.__context__ is None or exc.__suppress_context__
    return text


def load_bad(tmp_path: Path, text: str, name: str = "spec.yaml") -> tuple[errors.SpecError, Path]:
    p = write(tmp_path, text, name)
    with pytest.raises(errors.SpecError) as info:
        load_spec(p)
    return info.value, p


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("objective: x\nitems:\n  - id: a\n    title: [unclosed\n  - id: b\n", 5),
        ("objective: x\nitems:\n\t- id: a\n", 3),
        ("objective: 'unterminated\nitems: []\n", 3),
        ("objective: x\n  bad: indent\n", 2),
        ("objective: x\nitems: !!python/object:os.system {}\n", 2),
    ],
)
def test_malformed_yaml_names_file_and_line(tmp_path: Path, text: str, line: int) -> None:
    exc, p = load_bad(tmp_path, text)
    assert_clear(exc, p, "malformed YAML", f"line {line}", max_problems=0)
    assert "\n" not in str(exc)


def test_missing_file_and_unreadable_file(tmp_path: Path) -> None:
    p = tmp_path / "nope.yaml"
    with pytest.raises(errors.SpecError) as info:
        load_spec(p)
    assert_clear(info.value, p, "file not found", max_problems=0)
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"objective: caf\xe9\n")
    with pytest.raises(errors.SpecError) as info:
        load_spec(bad)
    assert_clear(info.value, bad, "cannot read", max_problems=0)
    with pytest.raises(errors.SpecError) as info:
        load_spec(tmp_path)
    assert_clear(info.value, tmp_path, "cannot read", max_problems=0)


@pytest.mark.parametrize(
    ("text", "got"),
    [
        ("- 1\n- 2\n", "expected a mapping at the top level (objective:, items:, ...), got a list"),
        ("", "the file is empty: a spec needs at least `objective:` and `items:`"),
        ("just a string\n", "got a line of text"),
    ],
)
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str, got: str) -> None:
    exc, p = load_bad(tmp_path, text)
    assert_clear(exc, p, got, max_problems=0)


BASE = "objective: x\nitems:\n  - {id: a, title: A}\n"


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("objectiv: x\nobjective: x\nitems:\n  - {id: a, title: A}\n", "objectiv"),
        (BASE + "limits: {max_round: 3}\n", "limits.max_round"),
        (BASE + "budget: {token: 3}\n", "budget.token"),
        ("objective: x\nitems:\n  - {id: a, title: A, milstone: m}\n", "items.0.milstone"),
        (
            BASE + "milestones:\n  - {id: m, title: M, budget: {round: 1}}\n",
            "milestones.0.budget.round",
        ),
        (BASE + "models: {actr: x}\n", "models.actr"),
    ],
)
def test_unknown_field_names_its_path(tmp_path: Path, text: str, where: str) -> None:
    exc, p = load_bad(tmp_path, text)
    assert_clear(exc, p, f"{where}: unknown field", max_problems=1)


def test_unknown_field_in_a_done_when_rule_names_its_real_path(tmp_path: Path) -> None:
    exc, p = load_bad(
        tmp_path,
        "objective: x\nitems:\n"
        "  - {id: a, title: A, done_when: {kind: file, path: p, contians: x}}\n",
    )
    # The YAML path is items.0.done_when.contians; the union tag is not a key the
    # user wrote.
    assert_clear(exc, p, "items.0.done_when.contians: unknown field", max_problems=1)


def test_unknown_field_in_an_acceptance_check_names_its_real_path(tmp_path: Path) -> None:
    exc, p = load_bad(
        tmp_path,
        BASE + "acceptance:\n  - id: c\n    description: d\n    check: {comand: 'true'}\n",
    )
    # One typo, one problem, at the path the user wrote (not `check.CommandCheck...`).
    text = assert_clear(exc, p, "acceptance.0.check", max_problems=2)
    assert "CommandCheck" not in text and "CallableCheck" not in text, text


def test_unknown_done_when_kind(tmp_path: Path) -> None:
    exc, p = load_bad(
        tmp_path, "objective: x\nitems:\n  - {id: a, title: A, done_when: {kind: magic}}\n"
    )
    assert_clear(exc, p, "items.0.done_when", "magic", "'file'", max_problems=1)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("objective: x\nitems: abc\n", "items:"),
        ("objective: [1, 2]\nitems:\n  - {id: a, title: A}\n", "objective:"),
        (BASE + "limits: {max_rounds: many}\n", "limits.max_rounds:"),
        (BASE + "limits: {max_rounds: 2.5}\n", "limits.max_rounds:"),
        (BASE + "limits: {max_rounds: 0}\n", "limits.max_rounds:"),
        (BASE + "limits: {breaker_failure_rate: 1.5}\n", "limits.breaker_failure_rate:"),
        (BASE + "budget: {money_usd: -1}\n", "budget.money_usd:"),
        (BASE + "budget: 100\n", "budget:"),
        (BASE + "tools: read_file\n", "tools:"),
        (BASE + "review: sometimes\n", "review:"),
        (BASE + "milestones: {m1: Read}\n", "milestones:"),
        (BASE + "context: {input_budget_tokens: 10}\n", "context.input_budget_tokens:"),
        ("objective: x\nitems:\n  - {id: 'has space', title: A}\n", "items.0.id:"),
        (
            "objective: x\nitems:\n  - {id: a, title: A, max_attempts: -2}\n",
            "items.0.max_attempts:",
        ),
        ("objective: x\nitems:\n  - {id: a, title: A, done_when: exists}\n", "items.0.done_when"),
        (
            "objective: x\nitems:\n  - {id: a, title: A, done_when: {kind: command, command: c, "
            "exit_code: zero}}\n",
            "items.0.done_when",
        ),
        (
            BASE
            + "acceptance:\n  - {id: c, description: d, check: {callable: 'not a callable'}}\n",
            "acceptance.0.check",
        ),
    ],
)
def test_wrong_types_name_their_path(tmp_path: Path, text: str, where: str) -> None:
    exc, p = load_bad(tmp_path, text)
    assert_clear(exc, p, where, max_problems=2)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("items:\n  - {id: a, title: A}\n", "objective: required field is missing"),
        ("objective: x\n", "items: required field is missing"),
        ("objective: x\nitems: []\n", "items:"),
        ("objective: x\nitems:\n  - {id: a}\n", "items.0.title: required field is missing"),
        ("objective: x\nitems:\n  - {title: A}\n", "items.0.id: required field is missing"),
        ("objective: ''\nitems:\n  - {id: a, title: A}\n", "objective:"),
        (
            BASE + "milestones:\n  - {id: m}\n",
            "milestones.0.title: required field is missing",
        ),
        (
            BASE + "acceptance:\n  - {id: c}\n",
            "acceptance.0.description: required field is missing",
        ),
        (
            "objective: x\nitems:\n  - {id: a, title: A, done_when: {kind: op}}\n",
            "items.0.done_when",
        ),
        (
            "objective: x\nitems:\n  - {id: a, title: A, done_when: {path: f}}\n",
            "items.0.done_when",
        ),
    ],
)
def test_missing_required_fields(tmp_path: Path, text: str, where: str) -> None:
    exc, p = load_bad(tmp_path, text)
    assert_clear(exc, p, where, max_problems=1)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("objective: x\nitems:\n  - {id: a, title: A}\n  - {id: a, title: B}\n", "items"),
        (
            BASE + "milestones:\n  - {id: m, title: M}\n  - {id: m, title: N}\n",
            "milestones",
        ),
        (
            BASE + "acceptance:\n  - {id: c, description: d}\n  - {id: c, description: e}\n",
            "acceptance",
        ),
    ],
)
def test_duplicate_ids(tmp_path: Path, text: str, where: str) -> None:
    exc, p = load_bad(tmp_path, text)
    text_ = assert_clear(exc, p, "used more than once", max_problems=1)
    # Each problem starts with the field path it is about.
    assert exc.problems[0].startswith(f"{where}"), text_


def test_item_with_unknown_milestone(tmp_path: Path) -> None:
    exc, p = load_bad(
        tmp_path,
        "objective: x\nmilestones:\n  - {id: m1, title: M}\n"
        "items:\n  - {id: a, title: A, milestone: m1}\n  - {id: b, title: B, milestone: m9}\n",
    )
    assert_clear(exc, p, "items.1.milestone", "'m9'", "m1", max_problems=1)
    assert exc.problems[0].startswith("items.1.milestone"), exc.problems


def test_several_reference_problems_are_listed_apart(tmp_path: Path) -> None:
    exc, p = load_bad(
        tmp_path,
        "objective: x\nmilestones:\n  - {id: m, title: M}\n  - {id: m, title: N}\n"
        "items:\n  - {id: a, title: A}\n  - {id: a, title: B, milestone: zz}\n",
    )
    assert_clear(exc, p, "milestones", "items", "items.1.milestone", max_problems=3)
    assert len(exc.problems) == 3, exc.problems


def test_parse_spec_names_its_source() -> None:
    with pytest.raises(errors.SpecError) as info:
        parse_spec({"objective": "x", "items": [{"id": "a", "title": "A", "extra": 1}]})
    assert str(info.value).startswith("<spec>: ")
    assert "items.0.extra: unknown field" in str(info.value)
    with pytest.raises(errors.SpecError) as info:
        parse_spec(["not", "a", "dict"], source="inline")
    assert str(info.value) == (
        "inline: expected a mapping at the top level (objective:, items:, ...), got a list"
    )


def test_nul_in_workspace_is_refused(tmp_path: Path) -> None:
    exc, p = load_bad(tmp_path, BASE + 'workspace: "a\\0b"\n')
    assert_clear(exc, p, "workspace", max_problems=0)


def test_long_input_is_truncated_in_the_message(tmp_path: Path) -> None:
    exc, p = load_bad(tmp_path, BASE + f"limits: {{max_rounds: '{'9x' * 500}'}}\n")
    text = assert_clear(exc, p, "limits.max_rounds", max_problems=1)
    assert "9x" * 50 not in text


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    # YAML itself forbids duplicate keys; PyYAML keeps the last silently, which would
    # let a second `limits:` block quietly replace the first.
    exc, p = load_bad(
        tmp_path,
        BASE + "limits: {max_rounds: 5}\nlimits: {max_attempts_per_item: 2}\n",
    )
    assert_clear(exc, p, "limits", "line 5", max_problems=1)


def _checklist(n: int, **fields: object) -> dict[str, object]:
    items = [{"id": f"i{k}", "title": f"item {k}"} for k in range(n)]
    return {"objective": "o", "items": items, **fields}


@pytest.mark.parametrize(("items", "rounds"), [(1, 200), (20, 200), (21, 210), (3000, 30000)])
def test_max_rounds_left_out_grows_with_the_checklist(items: int, rounds: int) -> None:
    # Ten rounds per item, never fewer than 200: a checklist of thousands of items does
    # not stop for a person at round 201 (the per-item guards catch a loop).
    assert parse_spec(_checklist(items)).limits.max_rounds == rounds
    # Written into the contract: the stored task keeps the number it started with.
    stored = parse_spec(_checklist(items)).model_dump(mode="json")
    assert parse_spec(stored, stored=True).limits.max_rounds == rounds


def test_max_rounds_written_in_the_contract_is_kept_whatever_the_checklist() -> None:
    spec = parse_spec(_checklist(3000, limits={"max_rounds": 7, "no_progress_rounds": 4}))
    assert (spec.limits.max_rounds, spec.limits.no_progress_rounds) == (7, 4)
    spec = parse_spec(_checklist(50, limits={"no_progress_rounds": 4}))
    assert (spec.limits.max_rounds, spec.limits.no_progress_rounds) == (500, 4)
    with pytest.raises(errors.SpecError, match="limits"):
        parse_spec(_checklist(50, limits=[1]))


def test_a_stored_spec_is_validated_once_per_content() -> None:
    """A stored contract met again (the same JSON data) is not validated again: an equal,
    distinct spec that names its own source; other data is validated (a tuple is not
    taken for a list)."""
    from tether import spec as spec_module

    data = parse_spec({"objective": "o", "items": [{"id": "a", "title": "A"}]}).model_dump(
        mode="json"
    )
    first = parse_spec(data, source="task one", stored=True)
    calls = []
    real = TaskSpec.model_validate

    def counted(*args: object, **kwargs: object) -> TaskSpec:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TaskSpec, "model_validate", counted)
        again = parse_spec(json.loads(json.dumps(data)), source="task two", stored=True)
        assert not calls
        assert again == first and again is not first
        assert spec_module.source_of(again) == "task two"
        assert spec_module.source_of(first) == "task one"
        edited = {**data, "objective": "another"}
        assert parse_spec(edited, source="task two", stored=True).objective == "another"
        assert len(calls) == 1
        # A tuple is not a list: not answered with the list's spec (validated once).
        odd = {**data, "items": tuple(data["items"])}
        parse_spec(odd, stored=True)
        parse_spec(odd, stored=True)
        assert len(calls) == 2
        # A spec given (not stored) is always validated in full.
        parse_spec(data)
        assert len(calls) == 3


def test_an_invalid_stored_spec_is_refused_every_time() -> None:
    """A refusal is not remembered as a spec: the same bad data raises again."""
    for _ in range(2):
        with pytest.raises(errors.SpecError):
            parse_spec({"objective": "o", "items": []}, stored=True)
