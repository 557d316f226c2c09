"""Crash safety with real processes.

A child process claims a task and commits rounds in a loop, each round ONE commit of
three events (`round.started`, `op.result`, `round.committed`) plus the task and ledger
projections. The parent kills it with SIGKILL at random moments (and, to hit the inside
of a transaction for sure, with the `during_commit` fail point), then opens the store
and checks that every committed round is whole and nothing partial is visible.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tether.clock import SystemClock
from tether.store import Store

if TYPE_CHECKING:
    from conftest import Backend

CHILD = textwrap.dedent(
    """
    import asyncio, os, sys
    from tether import events as ev
    from tether import ledger as L
    from tether.store import LedgerWrite, TaskPatch, open_store

    PAD = "x" * 600

    async def main(url, task_id, progress):
        store = await open_store(url)
        lease = await store.claim(f"crasher-{os.getpid()}", 60, task_id=task_id)
        if lease is None:
            print("no lease", flush=True)
            sys.exit(3)
        task = await store.get_task(task_id)
        led = (await store.get_ledger(task_id)).to_ledger()
        r = int(task.usage.get("rounds", 0))
        with open(progress, "a", encoding="utf-8") as out:
            print("claimed", r, flush=True)
            while True:
                r += 1
                upd = L.record_attempt(led, "i1", note=f"round {r}")
                await store.commit(
                    task_id,
                    lease.token,
                    [
                        ev.RoundStarted(round=r, turn=1, item="i1"),
                        ev.OpResult(op_id=f"op-{r}", tool="echo", status="succeeded", summary=PAD),
                        ev.RoundCommitted(round=r, turn=1, ops=1),
                    ],
                    task=TaskPatch(status="running", usage={"rounds": r}),
                    ledger=LedgerWrite.of(upd.ledger, expected_version=led.version),
                )
                led = upd.ledger
                out.write(f"{r}\\n")
                out.flush()

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
    """
)

ROUND_TYPES = ["round.started", "op.result", "round.committed"]


def reported(progress: Path) -> int:
    """The last round the child saw committed (complete lines only)."""
    text = progress.read_text(encoding="utf-8") if progress.exists() else ""
    done = [int(x) for x in text.split("\n")[:-1] if x.strip()]
    return done[-1] if done else 0


async def check_whole(store: Store, task_id: str) -> int:
    """Assert that the task holds only whole rounds and matching projections; return R."""
    events = await store.read_events(task_id)
    assert events[0].type == "task.created"
    body = events[1:]
    assert len(body) % 3 == 0, [e.type for e in body[-3:]]
    rounds = len(body) // 3
    for k in range(rounds):
        triple = body[3 * k : 3 * k + 3]
        r = k + 1
        assert [e.type for e in triple] == ROUND_TYPES, (r, [e.type for e in triple])
        assert [e.seq for e in triple] == [2 + 3 * k, 3 + 3 * k, 4 + 3 * k]
        assert triple[0].data["round"] == r and triple[2].data["round"] == r
        assert triple[1].data["op_id"] == f"op-{r}"
        assert len({(e.fencing_token, e.at) for e in triple}) == 1  # one commit
    tokens = [e.fencing_token for e in body[::3]]
    assert tokens == sorted(tokens)
    task = await store.get_task(task_id)
    ledger = await store.get_ledger(task_id)
    assert task.last_seq == len(events)
    assert task.usage.get("rounds", 0) == rounds
    assert ledger.version == rounds
    assert ledger.state["i1"]["attempts"] == rounds
    if rounds:
        assert task.status == "running"
        assert ledger.state["i1"]["note"] == f"round {rounds}"
    return rounds


def start_child(
    script: Path, url: str, progress: Path, env: dict[str, str]
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(script), url, "t", str(progress)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def wait_backends_gone(url: str, timeout: float = 20.0) -> None:
    """Until no server backend of the killed child (same application_name) is left."""
    from urllib.parse import parse_qsl, urlsplit

    from tests.conftest import pg_connect

    app = dict(parse_qsl(urlsplit(url).query)).get("application_name")
    if not app:
        return
    deadline = time.monotonic() + timeout
    with pg_connect(url) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) AS n FROM pg_stat_activity"
                " WHERE application_name = %s AND pid <> pg_backend_pid()",
                (app,),
            ).fetchone()
            if row["n"] == 0 or time.monotonic() > deadline:
                return
            time.sleep(0.02)


def wait_claimed(proc: subprocess.Popen[str]) -> int:
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if not line or line[0] != "claimed":
        proc.kill()
        _, err = proc.communicate(timeout=30)
        raise AssertionError(f"child did not claim: {line} {err}")
    return int(line[1])


async def crash_many(
    backend: Backend, tmp_path: Path, add_task: Any, kills: int, failpoint_crashes: int
) -> None:
    seed = int(os.environ.get("TETHER_TEST_SEED") or time.time())
    rng = random.Random(seed)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    store = await backend.open(clock=SystemClock())
    try:
        await add_task(store, "t")
    finally:
        await store.close()

    rounds = 0
    total_kills = 0
    plan = ["kill"] * kills + ["failpoint"] * failpoint_crashes
    rng.shuffle(plan)
    for n, how in enumerate(plan):
        progress = tmp_path / f"progress-{n}.txt"
        env = dict(os.environ)
        env.pop("TETHER_FAILPOINTS", None)
        k = 0
        if how == "failpoint":
            k = rng.randint(1, 15)
            env["TETHER_FAILPOINTS"] = f"during_commit={k}"
        proc = start_child(script, backend.url, progress, env)
        try:
            start = await asyncio.to_thread(wait_claimed, proc)
            assert start == rounds, f"seed {seed}: child resumed at {start}, store had {rounds}"
            if how == "kill":
                await asyncio.sleep(rng.uniform(0.0, 0.25))
                assert proc.poll() is None, f"seed {seed}: child died early: {proc.stderr}"
                proc.send_signal(signal.SIGKILL)
                total_kills += 1
            _, err = await asyncio.to_thread(proc.communicate, None, 60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        if backend.kind == "postgres":
            # A COMMIT the child sent just before it died may still be running on the
            # server: the outcome is final only once its backend is gone.
            await asyncio.to_thread(wait_backends_gone, backend.url)
        if how == "kill":
            assert proc.returncode == -signal.SIGKILL, (seed, err)
        else:
            assert proc.returncode == 137 and "during_commit" in err, (seed, err)

        # The store opens, and holds whole rounds only.
        store = await backend.open(clock=SystemClock())
        try:
            now = await check_whole(store, "t")
            seen = max(reported(progress), start)
            # Every round the child saw committed is there; at most one more finished
            # between the commit and its note.
            assert seen <= now <= seen + 1, (seed, how, seen, now)
            if how == "failpoint":
                # Stopped inside the k-th commit: the first k-1 are in, the k-th is not.
                assert now == start + k - 1 == seen, (seed, k, start, now)
            rounds = now
            # Free the dead worker's lease, as the watchdog would.
            task = await store.get_task("t")
            await store.release("t", task.fencing_token)
        finally:
            await store.close()
    assert total_kills == kills
    # The children did real work between kills (not all killed while starting).
    assert rounds >= kills, f"seed {seed}: only {rounds} rounds over {kills} kills"


async def test_sqlite_survives_sigkill_at_random_moments(
    tmp_path: Path, backend_factory: Any, add_task: Any
) -> None:
    await crash_many(backend_factory("sqlite"), tmp_path, add_task, kills=25, failpoint_crashes=3)


@pytest.mark.postgres
async def test_postgres_survives_sigkill_at_random_moments(
    tmp_path: Path, backend_factory: Any, add_task: Any
) -> None:
    await crash_many(backend_factory("postgres"), tmp_path, add_task, kills=10, failpoint_crashes=2)
