"""Workers on many machines (`tether.placement`): two `Worker`s on one database (SQLite,
and PostgreSQL with TETHER_TEST_PG_URL) that see different folders or carry different
host tags. The one that cannot run a task passes it over (never fails it) and the other
runs it; a task no worker can reach stays queued and `status` says why.

Both workers run in this process, on one filesystem: "a machine without the workspace"
is the time while the folder is moved away (or another folder stands at its path)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.integration.test_worker import Reports, honest, queue
from tests.support.loop import spec_of
from tether import placement
from tether.cli.views import status_view
from tether.clock import FakeClock
from tether.runtime.tasks import status_dict
from tether.runtime.worker import Worker
from tether.store import Store

#: The durable stores only (the `store` fixture's `backend`), as in test_worker.
pytestmark = pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)


def worker(store: Store, clock: FakeClock, reports: Reports, name: str, *tags: str) -> Worker:
    """Worker `name` with host tags `tags`, that returns once nothing is claimable."""
    return Worker(
        store,
        honest(),
        worker_id=name,
        lease_ttl=30,
        clock=clock,
        once=True,
        host_tags=tags,
        on_result=reports.on_result,
        on_error=reports.on_error,
    )


def shown(doc: dict[str, object]) -> str:
    """The `tether status` text of a status document."""
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(status_view(doc))
    return console.export_text()


async def test_the_worker_without_the_workspace_passes_it_over_and_the_other_runs_it(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    tid = await queue(store, tmp_path, "ws")
    ws = tmp_path / "ws"
    marker = placement.read_marker(ws)
    assert marker is not None  # create_task marked the folder
    created = (await store.read_events(tid, types={"task.created"}))[0]
    assert created.data["workspace_id"] == marker

    # Machine A: nothing at the workspace's path.
    ws.rename(tmp_path / "away")
    a_reports = Reports()
    a = worker(store, clock, a_reports, "a")
    stats = await a.run()
    assert (stats.ran, stats.failed) == (0, 0)
    task = await store.get_task(tid)
    assert (task.status, task.lease_owner) == ("queued", None)
    doc = await status_dict(store, tid)
    assert [p["worker"] for p in doc["passed_over"]] == ["a"]
    assert "waiting for a worker with workspace" in doc["passed_over"][0]["reason"]

    # Machine B: the workspace is there.
    (tmp_path / "away").rename(ws)
    b_reports = Reports()
    b = worker(store, clock, b_reports, "b")
    stats = await b.run()
    assert (stats.ran, stats.failed) == (1, 0)
    assert (await store.get_task(tid)).status == "satisfied"
    assert (ws / "out" / "i1.txt").is_file()
    assert (await status_dict(store, tid))["passed_over"] == []  # it ran: forgotten
    assert a_reports.errors.empty() and b_reports.errors.empty()


async def test_another_folder_at_the_same_path_is_not_the_workspace(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    tid = await queue(store, tmp_path, "ws")
    ws = tmp_path / "ws"
    # Machine A: a folder of the same path, but another one (no marker, or another's).
    ws.rename(tmp_path / "real")
    ws.mkdir()
    for other_marker in (None, '{"workspace_id": "someone-else"}\n'):
        if other_marker is not None:
            (ws / placement.MARKER).write_text(other_marker, encoding="utf-8")
        a = worker(store, clock, Reports(), "a")
        assert (await a.run()).ran == 0
        assert (await store.get_task(tid)).status == "queued"
        reason = (await status_dict(store, tid))["passed_over"][0]["reason"]
        assert "the folder there is another one" in reason
    assert not (ws / "out").exists()  # nothing ran in the wrong folder
    # Machine B: the real one.
    shutil.rmtree(ws)
    (tmp_path / "real").rename(ws)
    b = worker(store, clock, Reports(), "b")
    assert (await b.run()).ran == 1
    assert (await store.get_task(tid)).status == "satisfied"


async def test_a_task_pinned_to_a_host_tag_runs_only_on_a_worker_with_it(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    spec = spec_of(1).model_copy(update={"runs_on": ["gpu"]})
    tid = await queue(store, tmp_path, "ws", spec)
    a = worker(store, clock, Reports(), "a", "cpu")
    assert (await a.run()).ran == 0
    doc = await status_dict(store, tid)
    assert doc["status"] == "queued"
    assert doc["passed_over"][0]["reason"] == "waiting for a worker with host tag gpu"
    b = worker(store, clock, Reports(), "b", "gpu")
    assert (await b.run()).ran == 1
    assert (await store.get_task(tid)).status == "satisfied"


async def test_a_workspace_missing_everywhere_stays_queued_and_status_says_why(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    tid = await queue(store, tmp_path, "ws")
    shutil.rmtree(tmp_path / "ws")
    for name in ("a", "b"):
        w = worker(store, clock, Reports(), name)
        stats = await w.run()
        assert (stats.ran, stats.failed) == (0, 0)
    doc = await status_dict(store, tid)
    assert doc["status"] == "queued"
    assert sorted(p["worker"] for p in doc["passed_over"]) == ["a", "b"]
    text = shown(doc)
    assert f"not taken: waiting for a worker with workspace {tmp_path / 'ws'}" in text
    assert "(not on this machine)" in text


async def test_an_engine_refuses_a_workspace_that_is_not_here_and_changes_nothing(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    """`Engine.run` (what `tether resume` drives) of a task whose folder was renamed, or
    stands at its path as another folder, is refused before the claim: no deliverable is
    read as missing, no item reopened, nothing written at the old path. A workspace the
    task's first write makes (none there when it was created) runs as before."""
    from tether import errors
    from tether.runtime.engine import Engine

    tid = await queue(store, tmp_path, "ws")
    ws = tmp_path / "ws"
    ws.rename(tmp_path / "moved")
    before = await store.get_task(tid)
    with pytest.raises(errors.UserError, match=r"its workspace .*ws is not here \(not on"):
        await Engine(store, honest(), clock=clock).run(tid)
    ws.mkdir()  # another folder at the same path
    with pytest.raises(errors.UserError, match="the folder there is another one"):
        await Engine(store, honest(), clock=clock).run(tid)
    after = await store.get_task(tid)
    assert (after.status, after.version, after.lease_owner) == (
        before.status,
        before.version,
        None,
    )
    assert list(ws.iterdir()) == []
    shutil.rmtree(ws)
    (tmp_path / "moved").rename(ws)
    assert (await Engine(store, honest(), clock=clock).run(tid)).status == "satisfied"
    from tether.runtime.tasks import create_task

    fresh = await create_task(store, spec_of(1), workspace=tmp_path / "made-later")
    assert (await Engine(store, honest(), clock=clock).run(fresh.task_id)).status == "satisfied"
