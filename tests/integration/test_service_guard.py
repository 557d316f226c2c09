"""`ServiceGuard` on the real stores: a service's breaker and concurrency limit are one
state for every worker of a database (handles in one process, and OS processes against
a real HTTP service on 127.0.0.1 that counts the calls it sees)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tether.clock import FakeClock
from tether.store import Store
from tether.tools.breaker import BreakerPolicy, ServiceConfig, ServiceGuard, service_key

if TYPE_CHECKING:
    from conftest import Backend

SVC = "tickets"
CFG = ServiceConfig(BreakerPolicy(), max_concurrency=2, slot_ttl=30)


@pytest.fixture
async def handles(backend: Backend) -> AsyncIterator[list[Store]]:
    """Two handles on one database (two workers); memory has only one, shared."""
    a = await backend.open()
    b = await backend.open()
    try:
        yield [a, b]
    finally:
        await a.close()
        if b is not a:
            await b.close()


def guard(store: Store, clock: FakeClock, **kw: Any) -> ServiceGuard:
    return ServiceGuard(store, {SVC: CFG}, clock=clock, **kw)


async def test_breaker_opened_by_one_worker_is_seen_by_another(
    handles: list[Store], clock: FakeClock
) -> None:
    one, two = guard(handles[0], clock), guard(handles[1], clock)
    transitions = []
    for n in range(10):
        adm = await one.admit(SVC, f"c{n}")
        assert adm.allowed
        transitions += await one.record(SVC, n >= 3, f"c{n}")  # 3 of 10 fail
        await one.release(SVC, f"c{n}")
    assert [(t.service, t.src, t.dst) for t in transitions] == [(SVC, "closed", "open")]
    opened_at = clock.now()

    # The other worker fails fast, and is told when to come back.
    adm = await two.admit(SVC, "x")
    assert not adm.allowed and adm.cause == "open"
    assert adm.retry_at == opened_at + 60
    state = await two.state(SVC)
    assert state["state"] == "open" and state["until"] == opened_at + 60
    assert state["slots"] == {}

    # After the cooldown one probe goes, from whichever worker asks first.
    clock.advance(60)
    probe = await two.admit(SVC, "probe")
    assert probe.allowed and probe.cause == "probe"
    assert [(t.src, t.dst) for t in probe.transitions] == [("open", "half_open")]
    other = await one.admit(SVC, "y")
    assert not other.allowed and other.cause == "probing"
    closed = await two.record(SVC, True, "probe")
    await two.release(SVC, "probe")
    assert [(t.src, t.dst) for t in closed] == [("half_open", "closed")]
    assert (await one.admit(SVC, "y")).allowed
    await one.release(SVC, "y")
    # Back to pristine: nothing is left in the store.
    assert await handles[0].get_shared(service_key(SVC)) is None


async def test_services_are_separate(handles: list[Store], clock: FakeClock) -> None:
    g = ServiceGuard(handles[0], clock=clock, default=ServiceConfig(max_concurrency=1))
    assert (await g.admit("a", "h1")).allowed
    assert (await g.admit("b", "h1")).allowed
    for n in range(10):
        await g.record("a", False, f"f{n}")
    assert (await g.state("a"))["state"] == "open"
    assert (await g.state("b"))["state"] == "closed"


async def test_concurrency_limit_holds_across_workers(
    handles: list[Store], clock: FakeClock
) -> None:
    one = guard(handles[0], clock, max_wait=5, poll_interval=0.5, retry_delay=2)
    two = guard(handles[1], clock, max_wait=5, poll_interval=0.5, retry_delay=2)
    assert (await one.admit(SVC, "a")).allowed
    assert (await two.admit(SVC, "b")).allowed
    # Full: the third caller waits (on the fake clock) up to max_wait, then is refused.
    start = clock.now()
    adm = await two.admit(SVC, "c")
    assert not adm.allowed and adm.cause == "busy"
    assert clock.now() == pytest.approx(start + 5)
    assert adm.retry_at == pytest.approx(clock.now() + 2)
    assert set((await one.state(SVC))["slots"]) == {"a", "b"}

    # A waiting caller gets the slot once another worker releases one: its sleep
    # between polls lasts until the release is done.
    gate, polled = asyncio.Event(), asyncio.Event()
    sleeps: list[float] = []

    class GatedClock(FakeClock):
        async def sleep(self, seconds: float) -> None:
            sleeps.append(seconds)
            polled.set()
            await gate.wait()

    patient = ServiceGuard(handles[1], {SVC: CFG}, clock=GatedClock(), poll_interval=0.5)
    waiting = asyncio.create_task(patient.admit(SVC, "c"))
    await asyncio.wait_for(polled.wait(), 30)  # it found no slot and sleeps
    await one.release(SVC, "a")
    gate.set()
    adm = await waiting
    assert adm.allowed and sleeps == [0.5]
    assert set((await one.state(SVC))["slots"]) == {"b", "c"}


async def test_a_dead_workers_slots_expire(handles: list[Store], clock: FakeClock) -> None:
    dead = guard(handles[0], clock)
    live = guard(handles[1], clock, max_wait=0)
    assert (await dead.admit(SVC, "d1")).allowed
    assert (await dead.admit(SVC, "d2")).allowed
    # The dead worker never releases; its slots hold until their ttl (30 s) runs out.
    clock.advance(29)
    assert (await live.admit(SVC, "x")).cause == "busy"
    clock.advance(1)
    assert (await live.admit(SVC, "x")).allowed
    assert set((await live.state(SVC))["slots"]) == {"x"}


async def test_breaker_state_survives_a_restart(sql_backend: Backend, clock: FakeClock) -> None:
    store = await sql_backend.open()
    try:
        g = guard(store, clock)
        for n in range(10):
            await g.record(SVC, False, f"f{n}")
    finally:
        await store.close()
    store = await sql_backend.open()
    try:
        adm = await guard(store, clock).admit(SVC, "after-restart")
        assert not adm.allowed and adm.cause == "open"
    finally:
        await store.close()


# --- OS processes against a real service ---------------------------------------------------

COUNTER = textwrap.dedent(
    """
    import json, sys, threading, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    lock = threading.Lock()
    stats = {"current": 0, "max": 0, "ok": 0, "failed": 0}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def reply(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/stats":
                with lock:
                    return self.reply(200, dict(stats))
            with lock:
                stats["current"] += 1
                stats["max"] = max(stats["max"], stats["current"])
            time.sleep(0.01)
            with lock:
                stats["current"] -= 1
                stats["ok" if self.path == "/ok" else "failed"] += 1
            if self.path == "/ok":
                return self.reply(200, {"ok": True})
            return self.reply(503, {"ok": False})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()
    """
)

WORKER = textwrap.dedent(
    """
    import asyncio, json, sys, urllib.error, urllib.request
    from tether.store import open_store
    from tether.tools.breaker import ServiceConfig, ServiceGuard

    def call(url):
        try:
            with urllib.request.urlopen(url, timeout=20) as r:
                return r.status == 200
        except urllib.error.HTTPError:
            return False

    async def main(db, url, name, tasks, calls):
        store = await open_store(db)
        guard = ServiceGuard(
            store, {"counter": ServiceConfig(max_concurrency=2, slot_ttl=60)},
            max_wait=90, poll_interval=0.005,
        )
        out = {"dispatched": 0, "refused": [], "transitions": []}
        print("ready", flush=True)
        sys.stdin.readline()

        async def worker(t):
            for i in range(calls):
                holder = f"{name}:{t}:{i}"
                adm = await guard.admit("counter", holder)
                if not adm.allowed:
                    out["refused"].append(adm.cause)
                    continue
                out["dispatched"] += 1
                ok = False
                try:
                    ok = await asyncio.to_thread(call, url)
                finally:
                    ts = await guard.record("counter", ok, holder)
                    await guard.release("counter", holder)
                out["transitions"] += [[t.src, t.dst] for t in ts]

        try:
            await asyncio.gather(*(worker(t) for t in range(tasks)))
        finally:
            await store.close()
        print(json.dumps(out), flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])))
    """
)


@pytest.fixture
def counter_service(tmp_path: Path) -> Iterator[str]:
    """A real HTTP service on 127.0.0.1 that counts concurrent and total requests:
    `/ok` succeeds, `/fail` answers 503, `/stats` reports."""
    script = tmp_path / "counter.py"
    script.write_text(COUNTER)
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().strip())
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.communicate()  # reaps it and closes the pipes


def stats(base: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{base}/stats", timeout=10) as r:
        data: dict[str, int] = json.load(r)
        return data


def run_workers(script: Path, args: list[list[str]], timeout: float = 100) -> list[dict[str, Any]]:
    """Start the workers, release them at once, and collect their JSON reports."""
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), *a],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for a in args
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stderr is not None
            line = p.stdout.readline().strip()
            assert line == "ready", p.stderr.read()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        out = []
        for p in procs:
            o, e = p.communicate(timeout=timeout)
            assert p.returncode == 0, e
            out.append(json.loads(o.strip().splitlines()[-1]))
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


async def test_concurrency_limit_holds_across_processes(
    sql_backend: Backend, tmp_path: Path, counter_service: str
) -> None:
    store = await sql_backend.open()  # migrated before the workers start
    try:
        script = tmp_path / "worker.py"
        script.write_text(WORKER)
        nproc, tasks, calls = 2, 4, 10
        reports = await asyncio.to_thread(
            run_workers,
            script,
            [
                [sql_backend.url, f"{counter_service}/ok", f"p{k}", str(tasks), str(calls)]
                for k in range(nproc)
            ],
        )
        seen = stats(counter_service)
        # Counted by the service, not by tether: never more than two at once, all served.
        assert seen["max"] <= 2
        assert seen["max"] == 2  # the limit was actually contended
        assert seen["ok"] == nproc * tasks * calls
        assert [r["dispatched"] for r in reports] == [tasks * calls] * nproc
        assert all(not r["refused"] and not r["transitions"] for r in reports)
        # Every slot was given back; the breaker saw only successes.
        state = await store.get_shared(service_key("counter"))
        assert state is not None and state["slots"] == {} and state["state"] == "closed"
    finally:
        await store.close()


async def test_breaker_opened_by_one_process_stops_the_other(
    sql_backend: Backend, tmp_path: Path, counter_service: str
) -> None:
    store = await sql_backend.open()
    try:
        script = tmp_path / "worker.py"
        script.write_text(WORKER)
        fail = f"{counter_service}/fail"
        # The first worker meets a failing service: after 10 failed calls its breaker
        # opens and its remaining calls fail fast.
        [first] = await asyncio.to_thread(
            run_workers, script, [[sql_backend.url, fail, "p1", "1", "15"]]
        )
        assert first["dispatched"] == 10
        assert first["refused"] == ["open"] * 5
        assert first["transitions"] == [["closed", "open"]]
        # The second worker (another process) sends nothing: the breaker is shared.
        [second] = await asyncio.to_thread(
            run_workers, script, [[sql_backend.url, fail, "p2", "2", "5"]]
        )
        assert second["dispatched"] == 0 and second["refused"] == ["open"] * 10
        assert stats(counter_service)["failed"] == 10
        state = await store.get_shared(service_key("counter"))
        assert state is not None and state["state"] == "open"
    finally:
        await store.close()
