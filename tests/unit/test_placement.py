"""`tether.placement`: the workspace marker, host tags and why a worker passes a task over."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.loop import spec_of
from typer.testing import CliRunner

from tether import errors, placement
from tether.cli import app
from tether.spec import parse_spec


def test_the_marker_is_written_once_and_then_kept(tmp_path: Path) -> None:
    assert placement.read_marker(tmp_path) is None
    first = placement.mark(tmp_path)
    assert placement.read_marker(tmp_path) == first
    assert placement.mark(tmp_path) == first  # a second task in the folder: the same id
    (tmp_path / placement.MARKER).write_text("not json", encoding="utf-8")
    assert placement.read_marker(tmp_path) is None


def test_why_a_worker_may_not_run_a_task(tmp_path: Path) -> None:
    ws_id = placement.mark(tmp_path)
    assert placement.refusal(str(tmp_path), ws_id, [], []) is None
    assert placement.refusal(str(tmp_path), None, [], []) is None  # a task of before markers
    assert placement.refusal(None, None, ["gpu"], ["gpu", "eu"]) is None
    assert placement.refusal(None, None, ["gpu", "big"], ["eu"]) == (
        "waiting for a worker with host tag big or gpu"
    )
    missing = placement.refusal(str(tmp_path / "gone"), ws_id, [], [])
    assert missing is not None and "not on this machine" in missing
    other = placement.refusal(str(tmp_path), "another-id", [], [])
    assert other is not None and "the folder there is another one" in other


def test_host_tags_are_checked() -> None:
    assert placement.host_tags(["gpu", "eu-west.1", "gpu"]) == ("gpu", "eu-west.1")
    with pytest.raises(errors.UserError, match="host tag 'no spaces'"):
        placement.host_tags(["no spaces"])


def test_runs_on_in_a_contract_takes_host_tags_only() -> None:
    data = spec_of(1).model_dump(mode="json")
    assert parse_spec({**data, "runs_on": ["gpu"]}).runs_on == ["gpu"]
    with pytest.raises(errors.SpecError, match="runs_on"):
        parse_spec({**data, "runs_on": ["bad tag!"]})


def test_the_worker_refuses_a_bad_host_tag_with_exit_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["worker", "--once", "--db", str(tmp_path / "t.db"), "--host-tag", "a b"]
    )
    assert result.exit_code == 2
    assert "host tag 'a b'" in result.output
    assert not (tmp_path / "t.db").exists()  # refused before the database is opened
