"""Conformance of the shared-state primitive on every store: `update_shared` is an atomic
read-modify-write of a small JSON document by key, shared by all handles and processes
on one database; `get_shared` reads it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tether.clock import FakeClock
from tether.store import Store

if TYPE_CHECKING:
    from conftest import Backend


def incr(doc: dict[str, Any] | None, now: float) -> tuple[dict[str, Any], int]:
    """Add one to the counter; the value is the count before."""
    n = 0 if doc is None else int(doc["n"])
    return {"n": n + 1}, n


def cycle(doc: dict[str, Any] | None, now: float) -> tuple[dict[str, Any] | None, int]:
    """Count 0..4 and then delete the document, so that it starts again from absent."""
    n = 0 if doc is None else int(doc["n"])
    return (None if n + 1 == 5 else {"n": n + 1}), n


async def test_absent_created_read_and_deleted(store: Store, clock: FakeClock) -> None:
    assert await store.get_shared("k") is None
    seen: list[Any] = []

    def create(doc: dict[str, Any] | None, now: float) -> tuple[dict[str, Any], str]:
        seen.append((doc, now))
        return {"state": "open", "calls": [[now, False]], "nested": {"a": [1, None]}}, "made"

    assert await store.update_shared("k", create) == "made"
    # fn saw the absent document and the store's clock.
    assert seen == [(None, clock.now())]
    doc = await store.get_shared("k")
    assert doc == {"state": "open", "calls": [[clock.now(), False]], "nested": {"a": [1, None]}}

    clock.advance(5)
    got: list[Any] = []

    def look(d: dict[str, Any] | None, now: float) -> tuple[dict[str, Any] | None, None]:
        got.append((d, now))
        return d, None

    await store.update_shared("k", look)
    assert got == [(doc, clock.now())]
    assert await store.get_shared("k") == doc

    # None deletes; deleting an absent document is fine too.
    assert await store.update_shared("k", lambda d, now: (None, d)) == doc
    assert await store.get_shared("k") is None
    assert await store.update_shared("k", lambda d, now: (None, d)) is None
    assert await store.get_shared("k") is None


async def test_keys_are_independent_and_documents_are_copies(store: Store) -> None:
    await store.update_shared("a", lambda d, now: ({"x": [1]}, None))
    await store.update_shared("b", lambda d, now: ({"x": [2]}, None))
    doc = await store.get_shared("a")
    assert doc == {"x": [1]}
    assert doc is not None
    doc["x"].append(99)  # the caller's copy, not the store's
    assert await store.get_shared("a") == {"x": [1]}
    assert await store.get_shared("b") == {"x": [2]}

    def mutate(d: dict[str, Any] | None, now: float) -> tuple[None, None]:
        assert d is not None
        d["x"].append(3)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await store.update_shared("a", mutate)
    assert await store.get_shared("a") == {"x": [1]}


async def test_failing_update_writes_nothing(store: Store) -> None:
    def fail(doc: dict[str, Any] | None, now: float) -> tuple[dict[str, Any], None]:
        raise ValueError("no")

    with pytest.raises(ValueError):
        await store.update_shared("new", fail)
    assert await store.get_shared("new") is None
    await store.update_shared("new", incr)
    with pytest.raises(ValueError):
        await store.update_shared("new", fail)
    assert await store.get_shared("new") == {"n": 1}


async def test_concurrent_asyncio_updaters_are_serialized(backend: Backend, store: Store) -> None:
    handles = [store]
    if backend.durable:
        handles += [await backend.open(), await backend.open()]
    try:
        tasks, rounds = 12, 10

        async def worker(w: int) -> list[int]:
            return [
                await handles[(w + r) % len(handles)].update_shared("c", incr)
                for r in range(rounds)
            ]

        results = await asyncio.gather(*(worker(w) for w in range(tasks)))
        # Every updater saw a different count: each read-modify-write was alone.
        seen = sorted(v for vs in results for v in vs)
        assert seen == list(range(tasks * rounds))
        assert await store.get_shared("c") == {"n": tasks * rounds}

        # With deletions in the cycle: values as if the updates ran one by one.
        cyc = await asyncio.gather(
            *(handles[w % len(handles)].update_shared("cyc", cycle) for w in range(23))
        )
        assert Counter(cyc) == Counter(i % 5 for i in range(23))
        assert await store.get_shared("cyc") == {"n": 23 % 5}
    finally:
        for h in handles[1:]:
            await h.close()


UPDATER = textwrap.dedent(
    """
    import asyncio, sys
    from tether.store import open_store

    def incr(doc, now):
        n = 0 if doc is None else int(doc["n"])
        return {"n": n + 1}, n

    def cycle(doc, now):
        n = 0 if doc is None else int(doc["n"])
        return (None if n + 1 == 5 else {"n": n + 1}), n

    async def main(url, n):
        store = await open_store(url)
        try:
            print("ready", flush=True)
            sys.stdin.readline()
            seen = []
            for i in range(n):
                seen.append(await store.update_shared("c", incr))
                seen.append(await store.update_shared("cyc", cycle))
        finally:
            await store.close()
        print(" ".join(map(str, seen)), flush=True)

    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
    """
)


def run_processes(script: Path, args: list[list[str]], timeout: float = 90) -> list[str]:
    """Start one process per argument list, wait for "ready" from all, say go, collect
    their last output line; fails on a non-zero exit."""
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
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready", p.stderr.read() if p.stderr else ""
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        out = []
        for p in procs:
            o, e = p.communicate(timeout=timeout)
            assert p.returncode == 0, e
            out.append(o.strip().splitlines()[-1] if o.strip() else "")
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


async def test_concurrent_processes_are_serialized(sql_backend: Backend, tmp_path: Path) -> None:
    store = await sql_backend.open()
    try:
        script = tmp_path / "updater.py"
        script.write_text(UPDATER)
        nproc, n = 4, 30
        outs = await asyncio.to_thread(
            run_processes, script, [[sql_backend.url, str(n)] for _ in range(nproc)]
        )
        values = [[int(x) for x in o.split()] for o in outs]
        counts = [v for vs in values for v in vs[::2]]
        cycles = [v for vs in values for v in vs[1::2]]
        assert sorted(counts) == list(range(nproc * n))
        assert await store.get_shared("c") == {"n": nproc * n}
        assert Counter(cycles) == Counter(i % 5 for i in range(nproc * n))
        assert await store.get_shared("cyc") == (
            None if (nproc * n) % 5 == 0 else {"n": (nproc * n) % 5}
        )
    finally:
        await store.close()


async def test_shared_state_survives_reopening(sql_backend: Backend) -> None:
    store = await sql_backend.open()
    try:
        await store.update_shared("k", lambda d, now: ({"kept": True}, None))
    finally:
        await store.close()
    again = await sql_backend.open()
    try:
        assert await again.get_shared("k") == {"kept": True}
    finally:
        await again.close()
