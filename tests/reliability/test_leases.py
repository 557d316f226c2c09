"""Leases between real processes, on SQLite and PostgreSQL.

- Two processes race to claim one task: exactly one wins, every time.
- A worker paused past its lease (SIGSTOP) while another process claims the task gets
  `StaleLease` on its next commit after SIGCONT, and nothing it tried is stored.

Real processes use the real clock, so the TTLs here are short (1 s).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tether import errors
from tether.clock import SystemClock

if TYPE_CHECKING:
    from conftest import Backend

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]

CLAIMER = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from tether.store import open_store

    async def main(url, task_id, worker):
        store = await open_store(url)
        print("ready", flush=True)
        loop = asyncio.get_running_loop()
        while True:
            line = (await loop.run_in_executor(None, sys.stdin.readline)).split()
            if not line or line[0] == "quit":
                break
            go_at, which = float(line[1]), line[2]
            while time.time() < go_at:  # start together
                pass
            lease = await store.claim(worker, 30, task_id=task_id if which == "one" else None)
            print(json.dumps(None if lease is None else [lease.task_id, lease.token]), flush=True)
        await store.close()

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
    """
)

WORKER = textwrap.dedent(
    """
    import asyncio, sys
    from tether import errors
    from tether import events as ev
    from tether import ledger as L
    from tether.store import LedgerWrite, OpRecord, TaskPatch, open_store

    async def round_(store, token, marker, led, expected):
        upd = L.record_attempt(led, "i1", note=marker)
        op = OpRecord(op_id=f"op-{marker}", task_id="t", round=1, call_index=0, tool="write",
                      args={"by": marker}, args_hash=marker, effect="write", status="succeeded")
        await store.commit(
            "t", token,
            [
                ev.RoundStarted(round=1, turn=1, item=marker),
                ev.RoundCommitted(round=1, turn=1, text=marker),
            ],
            task=TaskPatch(status="running", usage={"by": marker}),
            ledger=LedgerWrite.of(upd.ledger, expected_version=expected),
            ops=[op],
        )
        return upd.ledger

    async def main(url, worker, ttl):
        store = await open_store(url)
        lease = await store.claim(worker, ttl, task_id="t")
        if lease is None:
            print("no-lease", flush=True)
            return
        led = (await store.get_ledger("t")).to_ledger()
        led = await round_(store, lease.token, worker, led, led.version)
        print("committed", lease.token, flush=True)
        if worker != "A":
            await store.close()
            return
        # The parent stops us here, lets the lease expire and hands the task to B.
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        for name, attempt in (
            ("commit", lambda: round_(store, lease.token, "A-late", led, led.version)),
            ("renew", lambda: store.renew("t", lease.token, ttl)),
            ("release", lambda: store.release("t", lease.token)),
        ):
            try:
                await attempt()
                print(name, "ok", flush=True)
            except errors.StaleLease as exc:
                print(name, "stale", exc.current, flush=True)
        await store.close()

    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
    """
)


def spawn(script: Path, *args: str, stdin: bool = False) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def readline(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=30)
        err = proc.stderr.read() if proc.stderr else ""
        raise AssertionError(f"child exited ({proc.returncode}): {err}")
    return line.strip()


def stop_all(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
        p.wait()
        for f in (p.stdin, p.stdout, p.stderr):
            if f is not None:
                f.close()


def proc_state(pid: int) -> str:
    """The kernel's one-letter state of a process (`T` when stopped)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


@pytest.mark.parametrize("kind", BACKENDS)
async def test_two_processes_race_to_claim_and_one_wins(
    kind: str, backend_factory: Any, add_task: Any, tmp_path: Path
) -> None:
    backend: Backend = backend_factory(kind)
    store = await backend.open(clock=SystemClock())
    script = tmp_path / "claimer.py"
    script.write_text(CLAIMER)
    procs = [spawn(script, backend.url, "t", f"w{n}", stdin=True) for n in range(2)]
    try:
        await add_task(store, "t")
        for p in procs:
            assert await asyncio.to_thread(readline, p) == "ready"
        wins = {"w0": 0, "w1": 0}
        for race in range(6):
            expected_token = race + 1
            which = "one" if race % 2 == 0 else "any"
            go_at = time.time() + 0.2
            for p in procs:
                assert p.stdin is not None
                p.stdin.write(f"claim {go_at} {which}\n")
                p.stdin.flush()
            answers = [json.loads(await asyncio.to_thread(readline, p)) for p in procs]
            winners = [(f"w{n}", a) for n, a in enumerate(answers) if a is not None]
            assert len(winners) == 1, (race, answers)
            worker, (task_id, token) = winners[0]
            assert (task_id, token) == ("t", expected_token)
            wins[worker] += 1
            task = await store.get_task("t")
            assert (task.lease_owner, task.fencing_token) == (worker, token)
            await store.release("t", token)
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("quit\n")
            p.stdin.flush()
        for p in procs:
            await asyncio.to_thread(p.wait, 30)
            assert p.returncode == 0
        assert (await store.get_task("t")).fencing_token == 6
    finally:
        stop_all(procs)
        await store.close()


@pytest.mark.parametrize("kind", BACKENDS)
async def test_worker_paused_past_its_lease_gets_stale_lease(
    kind: str, backend_factory: Any, add_task: Any, tmp_path: Path
) -> None:
    backend: Backend = backend_factory(kind)
    store = await backend.open(clock=SystemClock())
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    ttl = 1.0
    procs: list[subprocess.Popen[str]] = []
    try:
        await add_task(store, "t")
        a = spawn(script, backend.url, "A", str(ttl), stdin=True)
        procs.append(a)
        assert await asyncio.to_thread(readline, a) == "committed 1"
        os.kill(a.pid, signal.SIGSTOP)
        for _ in range(500):
            if proc_state(a.pid) == "T":
                break
            await asyncio.sleep(0.01)
        assert proc_state(a.pid) == "T"

        # While A's lease is live nobody else gets the task.
        task = await store.get_task("t")
        assert (task.lease_owner, task.fencing_token) == ("A", 1)
        assert task.lease_expiry is not None
        assert await store.claim("someone", 30, task_id="t") is None
        # Past its expiry (real time), B claims and commits, while A is still stopped.
        await asyncio.sleep(max(0.0, task.lease_expiry - time.time()) + 0.2)
        b = spawn(script, backend.url, "B", "30")
        procs.append(b)
        assert await asyncio.to_thread(readline, b) == "committed 2"
        await asyncio.to_thread(b.wait, 30)
        assert b.returncode == 0
        assert proc_state(a.pid) == "T"
        before = {
            "task": await store.get_task("t"),
            "ledger": await store.get_ledger("t"),
            "events": await store.read_events("t"),
            "ops": await store.get_ops("t"),
        }

        os.kill(a.pid, signal.SIGCONT)
        assert a.stdin is not None
        a.stdin.write("go\n")
        a.stdin.flush()
        results = [await asyncio.to_thread(readline, a) for _ in range(3)]
        assert results == ["commit stale 2", "renew stale 2", "release stale 2"]
        await asyncio.to_thread(a.wait, 30)
        assert a.returncode == 0

        # Nothing A tried after the pause is stored; B's work stands.
        assert await store.get_task("t") == before["task"]
        assert await store.get_ledger("t") == before["ledger"]
        assert await store.read_events("t") == before["events"]
        assert await store.get_ops("t") == before["ops"]
        events = before["events"]
        assert [(e.data.get("item"), e.fencing_token) for e in events[1:] if e.seq % 2 == 0] == [
            ("A", 1),
            ("B", 2),
        ]
        assert all("A-late" not in json.dumps(e.data) for e in events)
        task = before["task"]
        assert (task.lease_owner, task.fencing_token, task.usage) == ("B", 2, {"by": "B"})
        ledger = before["ledger"]
        assert (ledger.version, ledger.state["i1"]["note"]) == (2, "B")
        assert sorted(o.op_id for o in before["ops"]) == ["op-A", "op-B"]
        with pytest.raises(errors.StaleLease):
            await store.commit("t", 1, [])
    finally:
        stop_all(procs)
        await store.close()


async def test_a_dead_lease_is_taken_over_only_while_it_stands(
    store: Any, make_task: Any, clock: Any
) -> None:
    """`claim(force=True, from_token=T)` takes the task only while T is its token (the
    lease found dead): of two workers taking over the same dead lease, one gets it;
    `live_leases` lists the live leases of an owner prefix on claimable tasks only."""
    await make_task("t")
    await make_task("u")
    dead = await store.claim("host:1", 60, task_id="t")
    other = await store.claim("elsewhere:2", 60, task_id="u")
    assert dead is not None and other is not None
    assert [(x.task_id, x.worker_id, x.token) for x in await store.live_leases("host:")] == [
        ("t", "host:1", dead.token)
    ]
    assert await store.live_leases("hos:") == []  # a prefix, not a pattern
    first = await store.claim("host:3", 60, task_id="t", force=True, from_token=dead.token)
    second = await store.claim("host:4", 60, task_id="t", force=True, from_token=dead.token)
    assert first is not None and first.token == dead.token + 1
    assert second is None
    task = await store.get_task("t")
    assert (task.lease_owner, task.fencing_token) == ("host:3", first.token)
    # An expired lease is no longer live (a plain claim takes it).
    clock.advance(61)
    assert await store.live_leases("") == []


async def test_a_claim_passes_over_excluded_tasks(store: Any, make_task: Any, clock: Any) -> None:
    """`claim(exclude=...)` takes the oldest claimable task not excluded (a worker's
    tasks it cannot run), and none when all are."""
    await make_task("a")
    clock.advance(1)
    await make_task("b")
    got = await store.claim("w", 60, exclude=["a"])
    assert got is not None and got.task_id == "b"
    assert await store.claim("w", 60, exclude=["a", "b"]) is None
    assert (await store.claim("w", 60)).task_id == "a"
