"""`tether worker --concurrency N`, the real command in a subprocess, on SQLite and
PostgreSQL: it runs N tasks at once, and SIGTERM drains it — no new claim, every run
stops at its current step with its committed rounds kept and its lease handed back —
and the process exits 0 within the grace.

The tasks' model (`tests.e2e.concurrency_policies:gated`) holds each task in its second
round's model call until the test releases it; every wait is on a file, a process or
the database, never a sleep.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import cli_env, tether_command
from tests.support.procs import wait_for
from tests.support.workers import in_store
from tether.runtime.tasks import create_task
from tether.spec import parse_spec
from tether.store import Store

ROOT = Path(__file__).resolve().parents[2]
MODEL = "scripted:tests.e2e.concurrency_policies:gated"
#: What the documentation promises for a drain here: each run stops at its current
#: step (a model call in flight is abandoned at once), then the process exits.
GRACE = 30.0


def spec(key: str, items: int = 3) -> Any:
    return parse_spec(
        {
            "name": key,
            "objective": f"write {items} files (gate:{key})",
            "items": [
                {"id": f"i{k}", "title": f"write out/i{k}.txt",
                 "done_when": {"kind": "file", "path": f"out/i{k}.txt"}}
                for k in range(1, items + 1)
            ],
            "tools": ["write_file"],
            "models": {"judge": "rules"},
        }
    )  # fmt: skip


def queue(url: str, tmp_path: Path, keys: list[str]) -> list[str]:
    async def go(store: Store) -> list[str]:
        ids = []
        for key in keys:
            ws = tmp_path / key
            ws.mkdir()
            ids.append((await create_task(store, spec(key), workspace=ws)).task_id)
        return ids

    return in_store(url, go)


@pytest.mark.parametrize("kind", [pytest.param("postgres", marks=pytest.mark.postgres), "sqlite"])
def test_sigterm_drains_a_worker_running_several_tasks(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = _url(kind, tmp_path, request)
    gates = tmp_path / "gates"
    gates.mkdir()
    ids = queue(url, tmp_path, ["k0", "k1", "k2"])
    (late,) = queue(url, tmp_path, ["k3"])
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*tether_command(), "worker", "--concurrency", "3", "--poll", "0.1",
             "--model", MODEL, "--db", url],
            cwd=tmp_path, env=cli_env(PYTHONPATH=str(ROOT), CONC_GATE_DIR=str(gates)),
            stdin=subprocess.DEVNULL, stdout=out, stderr=out,
        )  # fmt: skip
    try:
        # All three in their second round at once: one process, three runs.
        wait_for(
            lambda: all((gates / f"k{n}.entered").exists() for n in range(3)) or None,
            "three tasks in their second round",
            timeout=120,
        )

        async def owners(store: Store) -> list[str | None]:
            return [(await store.get_task(t)).lease_owner for t in ids]

        held = in_store(url, owners)
        assert len(set(held)) == 1 and held[0] is not None and held[0].endswith(f":{proc.pid}")

        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=GRACE)  # drained within the grace, or the test fails here
    finally:
        (gates / "release").touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text(errors="replace")
    assert rc == 0, text[-3000:]
    assert "worker ran 3 task(s)" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]

    async def after(store: Store) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for tid in [*ids, late]:
            task = await store.get_task(tid)
            done = (await store.get_ledger(tid)).to_ledger().progress().done
            types = [e.type for e in await store.read_events(tid)]
            out[tid] = (task.status, task.lease_owner, done, types)
        return out

    state = in_store(url, after)
    for tid in ids:
        status, owner, done, types = state[tid]
        # Handed back (no lease), not finished, the first round kept.
        assert owner is None and status == "queued", state[tid]
        assert done == 1, state[tid]
        assert types.count("lease.claimed") == 1
    # The task queued behind them was never claimed: no claim after the signal.
    assert state[late][3] == ["task.created"] and state[late][1] is None


def _url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "postgres":
        return str(request.getfixturevalue("pg_schema_url")())
    return f"sqlite:///{tmp_path / 'tether.db'}"


def _worker(
    url: str, tmp_path: Path, gates: Path, log: Path, *flags: str
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [*tether_command(), "worker", "--poll", "0.1", "--model", MODEL, "--db", url, *flags],
            cwd=tmp_path, env=cli_env(PYTHONPATH=str(ROOT), CONC_GATE_DIR=str(gates)),
            stdin=subprocess.DEVNULL, stdout=out, stderr=out,
        )  # fmt: skip


def _done_and_owner(url: str, ids: list[str]) -> list[tuple[str, str | None, int]]:
    async def go(store: Store) -> list[tuple[str, str | None, int]]:
        out = []
        for tid in ids:
            task = await store.get_task(tid)
            done = (await store.get_ledger(tid)).to_ledger().progress().done
            out.append((task.status, task.lease_owner, done))
        return out

    return in_store(url, go)


@pytest.mark.parametrize("kind", [pytest.param("postgres", marks=pytest.mark.postgres), "sqlite"])
def test_sigterm_with_a_grace_lets_the_rounds_in_flight_finish_and_commit(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """`--grace`: SIGTERM claims nothing more, and each task's round under way — its
    model call included — finishes and commits before the task is handed back."""
    url = _url(kind, tmp_path, request)
    gates = tmp_path / "gates"
    gates.mkdir()
    ids = queue(url, tmp_path, ["k0", "k1"])
    (late,) = queue(url, tmp_path, ["k3"])
    log = tmp_path / "worker.log"
    proc = _worker(url, tmp_path, gates, log, "--concurrency", "2", "--grace", "600",
                   "--pool-size", "2")  # fmt: skip
    try:
        wait_for(
            lambda: all((gates / f"k{n}.entered").exists() for n in range(2)) or None,
            "two tasks in their second round",
            timeout=120,
        )
        proc.send_signal(signal.SIGTERM)
        wait_for(
            lambda: "finish their round" in log.read_text(errors="replace") or None,
            "the worker saying it drains",
            timeout=60,
        )
        assert proc.poll() is None  # waiting for the model calls, not abandoning them
        (gates / "release").touch()
        rc = proc.wait(timeout=GRACE)
    finally:
        (gates / "release").touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text(errors="replace")
    assert rc == 0 and "worker ran 2 task(s)" in text and "Traceback" not in text, text[-3000:]
    # Handed back with the second round committed; the task behind them never claimed.
    assert _done_and_owner(url, ids) == [("queued", None, 2)] * 2
    assert _done_and_owner(url, [late]) == [("queued", None, 0)]


@pytest.mark.parametrize("kind", [pytest.param("postgres", marks=pytest.mark.postgres), "sqlite"])
def test_after_the_grace_the_worker_hands_the_task_back_and_exits(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A model call that outlasts `--grace` is abandoned at its end: the task is handed
    back (its lease released for the next worker, its first round kept) and the process
    exits 0."""
    url = _url(kind, tmp_path, request)
    gates = tmp_path / "gates"
    gates.mkdir()
    ids = queue(url, tmp_path, ["k0"])
    log = tmp_path / "worker.log"
    proc = _worker(url, tmp_path, gates, log, "--grace", "1")
    try:
        wait_for(lambda: (gates / "k0.entered").exists() or None, "the second round", timeout=120)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=GRACE)  # the gate stays shut: only the grace ends it
    finally:
        (gates / "release").touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text(errors="replace")
    assert rc == 0 and "grace over: stopping 1 run(s)" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert _done_and_owner(url, ids) == [("queued", None, 1)]
