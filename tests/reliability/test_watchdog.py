"""The watchdog between real worker processes: a worker frozen with SIGSTOP in the
middle of a task stops renewing its lease; another worker's sweep marks the task
`stalled` (and announces it), claims it, recovers it and finishes it; after SIGCONT the
frozen worker's writes are refused and nothing it tried is stored."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from tests.support.cli import write_spec

import tether
from tether.clock import SystemClock
from tether.store import open_store

#: A worker process: `worker.py URL NAME LEASE_TTL`. Its model writes the next item's
#: file and takes 0.3 s per call (time enough to be frozen mid-task); it sweeps every
#: 0.2 s and calls a task stalled after 2 s without a heartbeat; it runs one task.
WORKER = textwrap.dedent(
    """
    import asyncio, logging, sys, time
    from tether.models.scripted import ScriptedModel
    from tether.runtime.engine import ModelSet
    from tether.runtime.watch.sweep import WatchPolicy
    from tether.runtime.worker import Worker
    from tether.store import open_store
    from tests.e2e.policies import done_policy

    def slow(request):
        time.sleep(0.3)
        return done_policy(request)

    async def main(url, name, ttl):
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        store = await open_store(url)
        try:
            models = ModelSet(ScriptedModel(policy=slow))
            worker = Worker(
                store, models, worker_id=name, lease_ttl=ttl, poll_interval=0.2,
                max_tasks=1, watch_every=0.2, watch_policy=WatchPolicy(stalled_after=2.0),
                on_result=lambda r: print("result", r.status, flush=True),
            )
            stats = await worker.run()
            print("ran", stats.ran, flush=True)
        finally:
            await store.close()

    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
    """
)
REPO = Path(__file__).resolve().parents[2]


def _spawn(script: Path, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def _until(check: object, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_a_frozen_worker_is_detected_its_task_recovered_and_its_writes_refused(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        request.getfixturevalue("pg_schema_url")()
        if kind == "postgres"
        else f"sqlite:///{tmp_path / 'tether.db'}"
    )
    store = await open_store(url, clock=SystemClock())
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    ws = tmp_path / "ws"
    ws.mkdir()
    spec = tether.load_spec(write_spec(tmp_path / "spec.yaml", 6))
    tid = (await tether.create_task(store, spec, workspace=ws)).task_id
    procs: list[subprocess.Popen[str]] = []
    try:
        a = _spawn(script, url, "A", "1.5")
        procs.append(a)

        async def a_is_working() -> bool:
            task = await store.get_task(tid)
            return task.lease_owner == "A" and task.status == "running" and task.last_seq > 8

        await _until(a_is_working, "worker A to be mid-task")
        a.send_signal(signal.SIGSTOP)
        token_a = (await store.get_task(tid)).fencing_token

        async def a_is_silent() -> bool:
            task = await store.get_task(tid)
            return time.time() - (task.heartbeat_at or 0.0) > 2.5

        # B starts once A is silent past the limit: its first sweep finds the task.
        await _until(a_is_silent, "worker A's heartbeat to age")
        b = _spawn(script, url, "B", "30")
        procs.append(b)
        out_b, err_b = await asyncio.to_thread(b.communicate, timeout=120)
        assert b.returncode == 0, err_b[-2000:]
        assert "result satisfied" in out_b

        task = await store.get_task(tid)
        assert task.status == "satisfied" and task.fencing_token > token_a
        events = await store.read_events(tid)
        stalled = [e for e in events if e.type == "task.status" and e.data["dst"] == "stalled"]
        assert len(stalled) == 1 and "from A" in stalled[0].data["reason"]
        sent = [e.data["kind"] for e in events if e.type == "notice.sent"]
        assert "stalled" in sent
        started = [e for e in events if e.type == "recovery.started"]
        assert started and started[-1].seq > stalled[0].seq
        before = (task, events)

        # Thawed: A finds its lease gone and stops; nothing it tried is stored.
        a.send_signal(signal.SIGCONT)
        _, err_a = await asyncio.to_thread(a.communicate, timeout=120)
        assert a.returncode == 0, err_a[-2000:]
        assert "lease lost, stopping" in err_a  # it noticed: fenced off, it wrote nothing
        assert (await store.get_task(tid), await store.read_events(tid)) == before
        assert all(e.fencing_token != token_a for e in before[1] if e.seq > stalled[0].seq)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.communicate(timeout=30)
        await store.close()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_many_workers_sweeping_at_once_mark_a_silent_task_stalled_once(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, add_task: Any
) -> None:
    """Every worker sweeps; six sweeps at once (each with its own store handle, as six
    worker processes have) find the same silent tasks. Each task is marked `stalled`
    once and announced once, not by every sweep, and then claimed by a worker as usual."""
    from tether import events as ev
    from tether.runtime.watch.sweep import WatchPolicy, sweep
    from tether.store.base import TaskPatch

    url = (
        request.getfixturevalue("pg_schema_url")()
        if kind == "postgres"
        else f"sqlite:///{tmp_path / 'tether.db'}"
    )
    stores = [await open_store(url, clock=SystemClock()) for _ in range(6)]
    try:
        first = stores[0]
        tids = []
        for _ in range(8):
            tid = (await add_task(first)).task_id
            lease = await first.claim("gone:1", 0.05, task_id=tid)
            assert lease is not None
            await first.commit(
                tid,
                lease.token,
                [ev.TaskStatusChanged(src="queued", dst="running", reason="started")],
                task=TaskPatch(status="running"),
            )
            tids.append(tid)

        async def silent() -> bool:
            tasks = [await first.get_task(tid) for tid in tids]
            return all(
                (t.lease_expiry or 0.0) < time.time()
                and time.time() - (t.heartbeat_at or 0.0) > 0.2
                for t in tasks
            )

        await _until(silent, "the leases to expire")
        policy = WatchPolicy(stalled_after=0.2)
        reports = await asyncio.gather(*(sweep(s, policy=policy) for s in stores))
        assert sorted(t for r in reports for t in r.stalled) == sorted(tids)
        for tid in tids:
            events = await first.read_events(tid)
            stalled = [e for e in events if e.type == "task.status" and e.data["dst"] == "stalled"]
            assert len(stalled) == 1, f"{tid} marked stalled {len(stalled)} times"
            notices = [e.data for e in events if e.type == "notice.sent"]
            assert [n["kind"] for n in notices] == ["stalled"], notices
            assert (await first.get_task(tid)).status == "stalled"
        # Claimable as a stalled task is: each goes to a worker.
        claimed = [await first.claim("w", 60) for _ in tids]
        assert {c.task_id for c in claimed if c is not None} == set(tids)
    finally:
        for s in stores:
            await s.close()


async def test_a_cancel_its_worker_never_saw_is_carried_out_once_the_lease_expires(
    store: Any, add_task: Any, clock: Any
) -> None:
    """`tether cancel` on a running task only asks its worker; if that worker dies
    before it sees the request, the task is neither claimable (a cancel was asked) nor
    cancelled. The sweep cancels it once the lease expired (as `tether cancel` does for
    a task nobody runs), once, and not while a worker still holds the lease."""
    from tether import events as ev
    from tether.runtime.tasks import cancel
    from tether.runtime.watch.sweep import WatchPolicy, sweep
    from tether.store.base import TaskPatch

    tid = (await add_task(store)).task_id
    lease = await store.claim("gone:1", 60, task_id=tid)
    await store.commit(
        tid,
        lease.token,
        [ev.TaskStatusChanged(src="queued", dst="running", reason="started")],
        task=TaskPatch(status="running"),
    )
    assert (await cancel(store, tid)).outcome == "requested"
    policy = WatchPolicy(stalled_after=600)
    await sweep(store, policy=policy)
    assert (await store.get_task(tid)).status == "running"  # its worker may yet see it
    clock.advance(61)
    report = await sweep(store, policy=policy)
    task = await store.get_task(tid)
    assert (task.status, task.stop_reason) == ("cancelled", "cancelled_by_user")
    assert report.cancelled == [tid] and report.stalled == []
    assert (await sweep(store, policy=policy)).cancelled == []
    assert await store.claim("w", 60) is None
