"""`on_exhausted` and `compensate`: what a contract and a tool may declare, and the
clear refusal of what they may not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import tether
from tether import errors
from tether.spec import parse_spec


def _spec(entry: object) -> dict[str, object]:
    return {"objective": "x", "items": [{"id": "a", "title": "a"}], "tools": [entry]}


@pytest.mark.parametrize("value", ["fail_item", "ask_human", "compensate"])
def test_the_three_policies_are_accepted(value: str) -> None:
    spec = parse_spec(_spec({"name": "create_ticket", "on_exhausted": value}))
    perm = spec.permission("create_ticket")
    assert perm is not None and perm.on_exhausted == value
    default = parse_spec(_spec("create_ticket")).permission("create_ticket")
    assert default is not None and default.on_exhausted is None


@pytest.mark.parametrize("value", ["retry_forever", "", 3, "Compensate", ["compensate"]])
def test_a_bad_policy_is_one_clear_line(value: object) -> None:
    entry = {"name": "create_ticket", "on_exhausted": value}
    with pytest.raises(errors.SpecError) as caught:
        parse_spec(_spec(entry))
    (line,) = caught.value.problems
    assert line.startswith("tools.0.on_exhausted: ")
    assert "'fail_item', 'ask_human' or 'compensate'" in line


def test_a_tool_entry_that_is_neither_name_nor_object_still_says_both() -> None:
    with pytest.raises(errors.SpecError) as caught:
        parse_spec(_spec(5))
    assert len(caught.value.problems) == 2


def test_the_cli_refuses_a_bad_policy_with_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_spec({"name": "write_file", "on_exhausted": "later"})))
    db = tmp_path / "t.db"
    res = subprocess.run(
        [sys.executable, "-m", "tether.cli", "run", str(spec), "--db", f"sqlite:///{db}",
         "--model", "scripted:tests.services.flaky_tools:actor"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert "tools.0.on_exhausted: Input should be 'fail_item', 'ask_human' or 'compensate'" in (
        res.stderr
    )
    assert "Traceback" not in res.stderr and "valid string" not in res.stderr
    assert not db.exists()


def test_retry_policy_checks_on_exhausted() -> None:
    assert tether.RetryPolicy().on_exhausted == "fail_item"
    assert tether.RetryPolicy(on_exhausted="compensate").on_exhausted == "compensate"
    with pytest.raises(ValueError, match="on_exhausted must be one of"):
        tether.RetryPolicy(on_exhausted="later")  # type: ignore[arg-type]


def test_compensate_is_declared_like_reconcile() -> None:
    def cancel(op: tether.OpRecord, ctx: tether.ToolContext) -> None:
        """Undo."""

    @tether.tool(effect="write", compensate=cancel)
    def create(title: str) -> str:
        """Create."""
        return title

    assert create.compensate == tether.Compensation(cancel)
    assert create.compensate.idempotent is False  # like any tool with effects

    full = tether.Compensation(cancel, idempotent=True, timeout=5.0)
    assert tether.tool(create_fn, effect="write", compensate=full).compensate is full


def create_fn(title: str) -> str:
    """Create."""
    return title


def test_a_read_tool_cannot_declare_compensate() -> None:
    with pytest.raises(errors.UserError, match="nothing to compensate"):
        tether.tool(create_fn, effect="read", compensate=lambda op, ctx: None)
