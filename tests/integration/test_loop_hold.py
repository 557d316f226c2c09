"""Async code that holds the event loop is named: an `async def` tool, a reconcile or a
model adapter that blocks instead of awaiting is journaled (`audit.warning`
`loop_held`) on its own task only, logged when it ends, and logged with its stack while
it still holds the loop (`tether.loop_hold`)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.loop import events_of, next_item, run_task, spec_of
from tether import loop_hold
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.tasks import create_task
from tether.store.memory import MemoryStore
from tether.tools.builtin.files import FILE_TOOLS
from tether.tools.registry import ToolRegistry, tool

HOLD = 0.3  # seconds a blocking tool holds the loop in these tests


@pytest.fixture(autouse=True)
def quick_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop_hold, "WARN_SECONDS", 0.2)


@pytest.fixture
async def store() -> MemoryStore:
    return await MemoryStore.open()


@tool(effect="read")
async def blocking_fetch(url: str) -> str:
    """Fetch a page (with a sync client: it blocks the loop)."""
    time.sleep(HOLD)  # noqa: ASYNC251 (the blocking under test)
    return f"page {url}"


@tool(effect="read")
async def awaiting_fetch(url: str) -> str:
    """Fetch a page (awaiting: the loop runs meanwhile)."""
    await asyncio.sleep(HOLD)
    return f"page {url}"


def _fetch_then_write(tool_name: str) -> Any:
    """Round 1: fetch; then write the Next item's file."""

    def policy(request: ModelRequest) -> ModelResponse:
        if not any(m.role == "tool" for m in request.messages):
            return ModelResponse("fetching", (tool_call(tool_name, url="http://x"),))
        nxt = next_item(request)
        if nxt is None:
            return ModelResponse("done")
        return ModelResponse(
            "writing", (tool_call("write_file", path=f"out/{nxt}.txt", content="x"),)
        )

    return policy


def _registry(*extra: Any) -> ToolRegistry:
    return ToolRegistry([*FILE_TOOLS, *extra])


async def _warnings(store: MemoryStore, task_id: str) -> list[Any]:
    return [w for w in await events_of(store, task_id, "audit.warning") if w["code"] == "loop_held"]


async def test_a_blocking_async_tool_is_journaled_an_awaiting_one_is_not(
    store: MemoryStore, tmp_path: Path
) -> None:
    spec = spec_of(1, tools=["blocking_fetch", "awaiting_fetch", "write_file"])
    registry = _registry(blocking_fetch, awaiting_fetch)
    tid, result = await run_task(
        store, spec, tmp_path / "a", ScriptedModel(policy=_fetch_then_write("blocking_fetch")),
        registry=registry,
    )  # fmt: skip
    assert result.status == "satisfied"
    (warning,) = await _warnings(store, tid)
    assert warning["details"]["what"] == "tool blocking_fetch"
    assert warning["details"]["seconds"] >= HOLD * 0.9
    assert "held the event loop" in warning["message"]
    assert "plain `def` tool" in warning["message"]

    tid2, result2 = await run_task(
        store, spec, tmp_path / "b", ScriptedModel(policy=_fetch_then_write("awaiting_fetch")),
        registry=registry,
    )  # fmt: skip
    assert result2.status == "satisfied"
    assert await _warnings(store, tid2) == []


async def test_only_the_task_whose_tool_blocked_is_told(store: MemoryStore, tmp_path: Path) -> None:
    """Two runs on one loop: the other run waited through the stretch, but did not hold
    the loop, and its journal says nothing of it."""
    spec = spec_of(1, tools=["blocking_fetch", "awaiting_fetch", "write_file"])
    registry = _registry(blocking_fetch, awaiting_fetch)
    blocker = await create_task(store, spec, workspace=tmp_path / "blocker")
    waiter = await create_task(store, spec, workspace=tmp_path / "waiter")

    def engine(tool_name: str) -> Engine:
        model = ScriptedModel(policy=_fetch_then_write(tool_name))
        return Engine(store, ModelSet(actor=model), registry=registry, lease_ttl=30)

    results = await asyncio.gather(
        engine("blocking_fetch").run(blocker.task_id), engine("awaiting_fetch").run(waiter.task_id)
    )
    assert [r.status for r in results] == ["satisfied", "satisfied"]
    assert len(await _warnings(store, blocker.task_id)) == 1
    assert await _warnings(store, waiter.task_id) == []


async def test_a_blocking_model_adapter_is_journaled(store: MemoryStore, tmp_path: Path) -> None:
    calls = 0

    def slow_first(request: ModelRequest) -> ModelResponse:
        nonlocal calls
        calls += 1
        if calls == 1:
            time.sleep(HOLD)
        return _fetch_then_write("awaiting_fetch")(request)

    spec = spec_of(1, tools=["awaiting_fetch", "write_file"])
    tid, result = await run_task(
        store, spec, tmp_path, ScriptedModel(policy=slow_first, name="sync-client"),
        registry=_registry(awaiting_fetch),
    )  # fmt: skip
    assert result.status == "satisfied"
    (warning,) = await _warnings(store, tid)
    assert warning["details"]["what"] == "model sync-client"
    assert warning["details"]["seconds"] >= HOLD * 0.9


async def test_a_loop_held_for_long_is_logged_while_it_lasts(
    store: MemoryStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watchdog names the code and shows its stack before it lets go: the tool holds
    the loop until the log line is out (or 20 s, for a failing test to end)."""
    monkeypatch.setattr(loop_hold, "LOG_SECONDS", 0.2)
    monkeypatch.setattr(loop_hold, "WATCH_EVERY", 0.05)
    logged = threading.Event()
    lines: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            text = record.getMessage()
            lines.append(text)
            if "has held the event loop" in text:
                logged.set()

    handler = Catch()
    logging.getLogger("tether.loop").addHandler(handler)

    @tool(effect="read")
    async def stuck_fetch(url: str) -> str:
        """Fetch a page (blocks until the watchdog has spoken)."""
        logged.wait(20)
        return "page"

    try:
        spec = spec_of(1, tools=["stuck_fetch", "write_file"])
        tid, result = await run_task(
            store, spec, tmp_path, ScriptedModel(policy=_fetch_then_write("stuck_fetch")),
            registry=_registry(stuck_fetch),
        )  # fmt: skip
    finally:
        logging.getLogger("tether.loop").removeHandler(handler)
    assert logged.is_set() and result.status == "satisfied"
    live = next(t for t in lines if "has held the event loop" in t)
    assert f"task {tid}: tool stuck_fetch has held the event loop" in live
    assert "logged.wait(20)" in live  # the stack shows the line that holds the loop
    assert any(t.startswith(f"task {tid}: tool stuck_fetch held the event loop") for t in lines)
    assert len(await _warnings(store, tid)) == 1


async def test_held_passes_results_errors_and_cancellation_through() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    async def fails() -> None:
        await asyncio.sleep(0)
        raise ValueError("no")

    held = loop_hold.Held(answer(), "x", None)
    assert await held == 42 and 0 <= held.longest < 0.2
    with pytest.raises(ValueError, match="no"):
        await loop_hold.Held(fails(), "x", None)

    cleaned = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            cleaned.set()

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(loop_hold.Held(forever(), "x", None), 0.05)
    assert cleaned.is_set()  # the cancellation reached the coroutine inside
    quick = loop_hold.Held(answer(), "x", None)
    assert await quick == 42 and loop_hold.warning(quick) is None
    unsent = loop_hold.Held(answer(), "x", None)
    unsent.close()  # never awaited: closed without a warning


# Python 3.12 warns of any fork in a process with threads; the child here only reports.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_starts_a_watchdog_of_its_own() -> None:
    """The parent's watchdog thread does not survive a fork: the child's first `Held`
    starts its own (else a child's stuck loop would be logged by nobody)."""
    import os

    loop_hold.Held(asyncio.sleep(0), "x", None).close()  # the parent's is running
    assert loop_hold._watchdog and loop_hold._watchdog[0].is_alive()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave at once
        try:
            gone = not loop_hold._watchdog
            loop_hold.Held(asyncio.sleep(0), "x", None).close()
            own = bool(loop_hold._watchdog) and loop_hold._watchdog[0].is_alive()
            os.write(write, b"ok" if gone and own else b"no")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 2)
    os.close(read)
    os.waitpid(pid, 0)
    assert answer == b"ok"
