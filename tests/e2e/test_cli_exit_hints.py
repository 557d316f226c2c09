"""Exit codes and messages of the human loop: a run stopped because the model endpoint
does not answer exits 4 (infrastructure unavailable), naming the resume command."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cli import describe, tether, write_spec

UNREACHABLE = "scripted:tests.e2e.loop_policies:unreachable"


def test_an_unreachable_model_endpoint_exits_4(tmp_path: Path) -> None:
    import shlex

    spec = write_spec(tmp_path / "spec.yaml", 1)
    db = f"sqlite:///{tmp_path}/elsewhere.db"
    ran = tether(
        "run", spec, "--model", UNREACHABLE, "--model-retries", "0", "--db", db, cwd=tmp_path
    )
    assert ran.returncode == 4, describe(ran)
    assert "Traceback" not in ran.stderr
    assert "does not answer" in ran.stderr, describe(ran)
    # The printed command, as printed (with the --db the run was given), the remembered
    # model stops the same way.
    printed = shlex.split(" ".join(ran.stderr.split()).split("continue with: ")[-1])
    assert printed[:2] == ["tether", "resume"] and printed[3:] == ["--db", db], printed
    again = tether(*printed[1:], "--json", cwd=tmp_path)
    assert again.returncode == 4, describe(again)
    assert json.loads(again.stdout)["status"] == "waiting"


def test_a_refused_resume_tells_the_lease_end_as_a_time(tmp_path: Path) -> None:
    import asyncio
    import re

    from tether.store import open_store

    spec = write_spec(tmp_path / "spec.yaml", 1)
    queued = tether("submit", spec, cwd=tmp_path)
    assert queued.returncode == 0, describe(queued)
    tid = queued.stdout.strip()

    async def hold() -> None:
        store = await open_store(f"sqlite:///{tmp_path}/.tether/tether.db")
        try:
            assert await store.claim("other-host:4242", 300.0, task_id=tid) is not None
        finally:
            await store.close()

    asyncio.run(hold())
    refused = tether("resume", tid, "--model", UNREACHABLE, cwd=tmp_path)
    assert refused.returncode == 2, describe(refused)
    msg = " ".join(refused.stderr.split())
    assert re.search(r"lease until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, in \d+ s", msg), msg
    assert f"tether resume {tid} --force" in msg
    assert not re.search(r"\d{10}\.\d", msg), msg  # no raw epoch seconds


def test_an_unknown_tool_is_reported_in_the_spec_file(tmp_path: Path) -> None:
    from tests.support.cli import assert_clean_error

    spec = write_spec(tmp_path / "contract.yaml", 1, tools=["write_fil"])
    for args in (("run", spec, "--model", UNREACHABLE), ("submit", spec)):
        refused = tether(*args, cwd=tmp_path)
        msg = assert_clean_error(refused, 2, "write_fil")
        assert msg.startswith(f"tether: {spec}: "), msg
        assert "<spec>" not in msg
