"""`tether resume --force` against a real second process holding the lease: while that
worker renews, the takeover is refused and nothing changes; once it is frozen
(SIGSTOP), the lease is watched for one period, taken over and journaled, the task
finishes, and the frozen worker's writes are refused after SIGCONT."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import (
    DONE,
    assert_clean_error,
    assert_ok,
    cli_env,
    json_out,
    tether,
    write_spec,
)

OWNER = "other-host:4242"  # not a process of this machine: only --force takes it over
TTL = 8.0

#: A worker holding the task's lease: it claims, renews every TTL/8 and, once fenced
#: off, tries one more write and reports what the store said.
HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    from tether import errors
    from tether.store import open_store
    from tether.store.base import TaskPatch

    async def main(url, tid, owner, ttl):
        store = await open_store(url)
        try:
            lease = await store.claim(owner, ttl, task_id=tid)
            assert lease is not None
            await store.commit(tid, lease.token, [], task=TaskPatch(status="running"))
            print("held", flush=True)
            while True:
                await asyncio.sleep(ttl / 8)
                try:
                    await store.renew(tid, lease.token, ttl)
                except errors.StaleLease:
                    break
            print("fenced", flush=True)
            try:
                await store.commit(tid, lease.token, [], task=TaskPatch(status="running"))
                print("commit accepted", flush=True)
            except errors.StaleLease:
                print("commit refused", flush=True)
        finally:
            await store.close()

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])))
    """
)


@pytest.fixture
def stopped(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A task stopped at max_rounds whose limit was raised: ready to go on."""
    spec = write_spec(tmp_path / "spec.yaml", 3, limits={"max_rounds": 1})
    ws = tmp_path / "ws"
    ws.mkdir()
    doc = json_out(tether("run", spec, "--model", DONE, "--workspace", ws, "--json", cwd=tmp_path))
    tid = str(doc["task_id"])
    assert_ok(tether("edit", tid, "--set", "limits.max_rounds=20", cwd=tmp_path))
    yield tid, tmp_path / ".tether" / "tether.db"


def test_force_waits_out_a_live_holder_then_takes_over_a_frozen_one(
    tmp_path: Path, stopped: tuple[str, Path]
) -> None:
    tid, db = stopped
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, f"sqlite:///{db}", tid, OWNER, str(TTL)],
        stdout=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    assert holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "held"

        # Alive: it renews during the watch, so nothing is taken over.
        refused = tether("resume", tid, "--model", DONE, "--force", cwd=tmp_path)
        assert_clean_error(refused, 2, "renewed")
        assert OWNER in refused.stderr
        doc = json_out(tether("status", tid, "--json", cwd=tmp_path))
        assert doc["status"] == "running"

        # Frozen: no renewal for a lease period, so --force takes over and finishes.
        holder.send_signal(signal.SIGSTOP)
        res = tether("resume", tid, "--model", DONE, "--force", cwd=tmp_path)
        assert_ok(res)
        assert f"taking task {tid} over from {OWNER}" in res.stdout
        assert "watching its lease" in res.stderr
        doc = json_out(tether("status", tid, "--json", cwd=tmp_path))
        assert doc["status"] == "satisfied"
        events = json_out(tether("events", tid, "--json", cwd=tmp_path))
        taken = [
            e["data"]
            for e in events
            if e["type"] == "audit.warning" and e["data"]["code"] == "lease_taken_over"
        ]
        assert [t["details"]["previous_owner"] for t in taken] == [OWNER]
        started = [e["data"] for e in events if e["type"] == "recovery.started"]
        assert started[-1]["previous_owner"] == OWNER

        # Thawed: the old holder is fenced off; its write changes nothing.
        holder.send_signal(signal.SIGCONT)
        said, _ = holder.communicate(timeout=60)
        assert said.split() == ["fenced", "commit", "refused"]
        assert json_out(tether("status", tid, "--json", cwd=tmp_path))["status"] == "satisfied"
    finally:
        if holder.poll() is None:
            holder.send_signal(signal.SIGCONT)
            holder.kill()
            holder.wait(timeout=30)
        if holder.stdout is not None:
            holder.stdout.close()
