"""Sign-off before delivery through the CLI, on SQLite and PostgreSQL: a contract with
`review: human` waits after the completion check; `report --execution` shows what the
run did (80 columns in a pipe, and JSON); `reject --hint --reopen` sends an item back with
the hint for the model; `approve` signs off and `resume` delivers."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.cli import assert_clean_error, assert_ok, cli_env, json_out, tether, write_spec

ACTOR = "scripted:tests.e2e.signoff_policies:writer"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    if request.param == "sqlite":
        yield cli_env(TETHER_DB=f"sqlite:///{tmp_path / 'tether.db'}", COLUMNS=None)
        return
    make: Callable[[], str] = request.getfixturevalue("pg_schema_url")
    yield cli_env(TETHER_DB=make(), COLUMNS=None)


def test_sign_off_through_the_cli(tmp_path: Path, env: dict[str, str]) -> None:
    spec = write_spec(tmp_path / "spec.yaml", 2, review="human")
    ws = tmp_path / "ws"
    ws.mkdir()

    def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
        return tether(*args, cwd=tmp_path, env=env)

    doc = json_out(run("run", spec, "--model", ACTOR, "--workspace", ws, "--json"))
    tid = doc["task_id"]
    assert doc["status"] == "waiting" and doc["waiting"]["signoff"] is True
    assert f"tether approve {tid}" in doc["waiting"]["reason"]

    text = run("report", tid, "--execution")
    assert_ok(text)
    lines = text.stdout.splitlines()
    assert lines[0] == f"Execution report of {tid} (small)"
    assert "  i1: done - Write out/i1.txt" in lines
    assert "  i1: 1 round, 1 tool call (write_file x1)" in lines
    assert max(map(len, lines)) <= 80
    report = json_out(run("report", tid, "--execution", "--json"))
    assert report["signoff"] is True and report["steps"]["tool_calls"] == 2

    assert_clean_error(run("reject", tid), 2, "needs a hint")
    assert_clean_error(run("approve", tid, "--done"), 2, "need a REQUEST")
    bad = run("reject", tid, "--hint", "redo", "--reopen", "nope")
    assert_clean_error(bad, 2, "no item 'nope'")
    out = run(
        "reject", tid, "--hint", "the files must say checked", "--reopen", "i2", "--by", "ana"
    )
    assert_ok(out)
    assert "back to work on i2" in out.stdout
    again = json_out(run("resume", tid, "--model", ACTOR, "--json"))
    assert again["status"] == "waiting" and again["waiting"]["signoff"] is True
    assert (ws / "out" / "i2.txt").read_text() == "checked\n"
    assert (ws / "out" / "i1.txt").read_text() == "i1 done\n"

    assert_ok(run("approve", tid, "--by", "ana"))
    done = json_out(run("resume", tid, "--model", ACTOR, "--json"))
    assert (done["status"], done["stop_reason"]) == ("satisfied", "delivered")
    events = json_out(run("events", tid, "--json"))
    decided = [e["data"] for e in events if e["type"] == "signoff.decided"]
    assert [(d["decision"], d["by"], d["reopen"]) for d in decided] == [
        ("reject", "ana", ["i2"]),
        ("approve", "ana", []),
    ]
    assert_clean_error(run("approve", tid), 2, "nothing to approve")
