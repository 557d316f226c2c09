"""Recurring tasks on every store: occurrences started once each, at their times, by
any number of workers, with the missed and overlap policies, a count, and a cancel."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tether import errors
from tether.clock import FakeClock
from tether.runtime.tasks import cancel
from tether.runtime.watch import schedules as SCH
from tether.spec import parse_spec
from tether.store import Store

if TYPE_CHECKING:
    from conftest import Backend


def contract(**schedule: Any) -> Any:
    return parse_spec(
        {
            "name": "digest",
            "objective": "Digest the day's news",
            "items": [{"id": "d", "title": "Digest"}],
            "schedule": schedule,
        }
    )


async def finish(store: Store, task_id: str) -> None:
    """End a task so the next occurrence does not overlap it."""
    await cancel(store, task_id)
    assert (await store.get_task(task_id)).status == "cancelled"


async def test_each_occurrence_starts_once_at_its_time(store: Store, clock: FakeClock) -> None:
    view = await SCH.create_schedule(store, contract(every="1h", count=3), launch={"m": 1})
    assert view.next_n == 1 and view.state == "active"
    started = await SCH.start_due(store)
    assert started == [f"{view.schedule_id}-1"]
    assert await SCH.start_due(store) == []  # not again, and nothing else is due yet
    task = await store.get_task(started[0])
    assert task.name == "digest #1" and task.status == "queued"
    created = (await store.read_events(started[0]))[0]
    assert created.data["launch"]["schedule"] == {
        "id": view.schedule_id,
        "occurrence": 1,
        "at": pytest.approx(clock.now()),
    }
    assert created.data["launch"]["m"] == 1
    stored = parse_spec((await store.get_task(started[0])).spec)
    assert stored.schedule is None  # an occurrence is one task, not a schedule again

    await finish(store, started[0])
    clock.advance(3600)
    assert await SCH.start_due(store) == [f"{view.schedule_id}-2"]
    await finish(store, f"{view.schedule_id}-2")
    clock.advance(3600)
    assert await SCH.start_due(store) == [f"{view.schedule_id}-3"]
    clock.advance(3600 * 5)
    assert await SCH.start_due(store) == []  # the count is reached
    (listed,) = await SCH.list_schedules(store)
    assert listed.state == "ended" and listed.started == 3 and listed.next_at is None


async def test_two_workers_at_once_make_one_task(backend: Backend, clock: FakeClock) -> None:
    a = await backend.open()
    b = await backend.open()
    try:
        view = await SCH.create_schedule(a, contract(every="1h"))
        results = await asyncio.gather(SCH.start_due(a), SCH.start_due(b), SCH.start_due(a))
        made = [t for r in results for t in r]
        assert set(made) == {f"{view.schedule_id}-1"}
        tasks = [t for t in await a.list_tasks() if t.task_id.startswith(view.schedule_id)]
        assert len(tasks) == 1
        (listed,) = await SCH.list_schedules(b)
        assert listed.next_n == 2 and listed.started == 1
    finally:
        await b.close()
        if b is not a:
            await a.close()


async def test_a_crash_after_starting_an_occurrence_does_not_start_it_twice(
    store: Store, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    view = await SCH.create_schedule(store, contract(every="1h"))
    real = store.update_shared
    calls = 0

    async def crash_on_advance(key: str, fn: Any) -> Any:
        nonlocal calls
        if key == SCH.key(view.schedule_id):
            calls += 1
            if calls == 1:
                raise errors.StoreUnavailable("the database went away")
        return await real(key, fn)

    monkeypatch.setattr(store, "update_shared", crash_on_advance)
    with pytest.raises(errors.StoreUnavailable):
        await SCH.start_due(store)
    monkeypatch.setattr(store, "update_shared", real)
    # The task was made before the crash; the next look finds it and moves on.
    assert await SCH.start_due(store) == [f"{view.schedule_id}-1"]
    assert await SCH.start_due(store) == []
    (listed,) = await SCH.list_schedules(store)
    assert listed.started == 1 and listed.next_n == 2


async def test_missed_run_once_starts_only_the_latest_late(store: Store, clock: FakeClock) -> None:
    view = await SCH.create_schedule(store, contract(every="1h", missed="run_once"))
    clock.advance(3600 * 4 + 60)  # the workers were away for four periods
    assert await SCH.start_due(store) == [f"{view.schedule_id}-5"]
    (listed,) = await SCH.list_schedules(store)
    assert listed.started == 1 and listed.skipped == 4 and listed.next_n == 6


async def test_missed_skip_starts_none_that_is_too_late(store: Store, clock: FakeClock) -> None:
    view = await SCH.create_schedule(store, contract(every="1h", missed="skip", grace="5m"))
    clock.advance(600)  # ten minutes late: past the grace
    assert await SCH.start_due(store) == []
    clock.advance(3600 - 600 + 60)  # the next one, a minute late: on time enough
    assert await SCH.start_due(store) == [f"{view.schedule_id}-2"]


async def test_overlap_skip_waits_for_the_previous_occurrence(
    store: Store, clock: FakeClock
) -> None:
    view = await SCH.create_schedule(store, contract(every="1h"))
    assert await SCH.start_due(store) == [f"{view.schedule_id}-1"]
    clock.advance(3600)
    assert await SCH.start_due(store) == []  # #1 is still queued: #2 is skipped
    await finish(store, f"{view.schedule_id}-1")
    clock.advance(3600)
    assert await SCH.start_due(store) == [f"{view.schedule_id}-3"]
    (listed,) = await SCH.list_schedules(store)
    assert listed.skipped == 1


async def test_overlap_allow_starts_beside_the_previous(store: Store, clock: FakeClock) -> None:
    view = await SCH.create_schedule(store, contract(every="1h", overlap="allow"))
    await SCH.start_due(store)
    clock.advance(3600)
    assert await SCH.start_due(store) == [f"{view.schedule_id}-2"]


async def test_a_cancelled_schedule_starts_nothing_more(store: Store, clock: FakeClock) -> None:
    view = await SCH.create_schedule(store, contract(every="1h"))
    cancelled = await SCH.cancel_schedule(store, view.schedule_id)
    assert cancelled.state == "cancelled"
    clock.advance(3600 * 3)
    assert await SCH.start_due(store) == []
    with pytest.raises(errors.UserError, match="no schedule"):
        await SCH.cancel_schedule(store, "s-nope")


async def test_occurrences_share_the_workspace_and_a_leftover_is_not_their_work(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    spec = parse_spec(
        {
            "name": "digest",
            "objective": "Write today's digest",
            "items": [
                {"id": "d", "title": "Digest", "done_when": {"kind": "file", "path": "digest.md"}}
            ],
            "schedule": {"every": "1d", "overlap": "allow"},
        }
    )
    await SCH.create_schedule(store, spec, workspace=tmp_path)
    (first,) = await SCH.start_due(store)
    (tmp_path / "digest.md").write_text("Monday's digest")  # what occurrence 1 wrote
    clock.advance(86400)
    (second,) = await SCH.start_due(store)
    assert (await store.get_task(first)).workspace == str(tmp_path)
    assert (await store.get_task(second)).workspace == str(tmp_path)
    created = (await store.read_events(second))[0]
    assert "digest.md" in created.data["preexisting"]  # Monday's file is not Tuesday's work


async def test_a_contract_without_a_schedule_is_refused(store: Store) -> None:
    plain = parse_spec({"objective": "x", "items": [{"id": "a", "title": "A"}]})
    with pytest.raises(errors.UserError, match="no `schedule`"):
        await SCH.create_schedule(store, plain)


def _counting_reads(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The keys of the shared documents `store` reads from now on."""
    reads: list[str] = []
    real = store.get_shared

    async def counted(key: str) -> Any:
        reads.append(key)
        return await real(key)

    monkeypatch.setattr(store, "get_shared", counted)
    return reads


async def test_a_poll_reads_the_index_and_only_the_schedules_that_are_due(
    store: Store, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    daily = [
        await SCH.create_schedule(store, contract(every="1d", overlap="allow")) for _ in range(12)
    ]
    hourly = await SCH.create_schedule(store, contract(every="1h", overlap="allow"))
    assert len(await SCH.start_due(store)) == 13  # each one's first occurrence
    reads = _counting_reads(store, monkeypatch)
    assert await SCH.start_due(store) == []
    assert reads == [SCH.INDEX]  # nothing due: no schedule's document is read
    clock.advance(3600)
    reads.clear()
    assert await SCH.start_due(store) == [f"{hourly.schedule_id}-2"]
    assert reads.count(SCH.INDEX) == 1
    assert {k for k in reads if k != SCH.INDEX} == {SCH.key(hourly.schedule_id)}
    clock.advance(86400)
    started = await SCH.start_due(store)
    assert {f"{v.schedule_id}-2" for v in daily} <= set(started)


async def _index_entry(store: Store, sid: str) -> dict[str, Any]:
    ids = await store.get_shared(SCH.INDEX)
    assert ids is not None
    entry: dict[str, Any] = ids[sid]
    return entry


async def test_a_lagging_or_missing_hint_is_read_and_repaired(
    store: Store, clock: FakeClock
) -> None:
    view = await SCH.create_schedule(store, contract(every="1h", overlap="allow"))
    sid = view.schedule_id
    assert await SCH.start_due(store) == [f"{sid}-1"]
    doc = await store.get_shared(SCH.key(sid))
    assert doc is not None
    assert await _index_entry(store, sid) == {
        **(await _index_entry(store, sid)),
        "state": "active",
        "next_at": doc["next_at"],
    }

    # An index written before the hints (or a crash between a schedule's move and its
    # hint's): the entry says nothing, or an older time. The document decides.
    def strip(ids: dict[str, Any] | None, now: float) -> tuple[dict[str, Any] | None, None]:
        assert ids is not None
        return {**ids, sid: {"name": ids[sid]["name"], "at": ids[sid]["at"]}}, None

    await store.update_shared(SCH.INDEX, strip)
    assert await SCH.start_due(store) == []  # read, not due yet, hint written again
    assert (await _index_entry(store, sid))["next_at"] == doc["next_at"]

    def lag(ids: dict[str, Any] | None, now: float) -> tuple[dict[str, Any] | None, None]:
        assert ids is not None
        return {**ids, sid: {**ids[sid], "next_at": 0.0}}, None

    await store.update_shared(SCH.INDEX, lag)
    assert await SCH.start_due(store) == []
    assert (await _index_entry(store, sid))["next_at"] == doc["next_at"]
    clock.advance(3600)
    assert await SCH.start_due(store) == [f"{sid}-2"]  # on time, hints or not
    await SCH.cancel_schedule(store, sid)
    assert (await _index_entry(store, sid))["state"] == "cancelled"
    clock.advance(3600 * 3)
    assert await SCH.start_due(store) == []


def _writer(*paths: str) -> Any:
    """A model that writes `paths` in turn, then says it is done."""
    from tether.models.base import ModelRequest, ModelResponse
    from tether.models.scripted import ScriptedModel, tool_call

    def policy(request: ModelRequest) -> ModelResponse:
        done = sum(1 for m in request.messages if m.role == "tool")
        if done < len(paths):
            call = tool_call("write_file", path=paths[done], content=f"digest {done}\n")
            return ModelResponse(f"writing {paths[done]}", (call,))
        return ModelResponse("NEED_HELP: nothing left to do")

    return ScriptedModel(policy=policy)


async def test_a_file_an_earlier_occurrence_wrote_is_the_series_own_not_the_users(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    """Tuesday's digest replaces the `latest.md` Monday's wrote without asking anyone;
    a file of the user's (there before the schedule) still waits for a person, and so
    does the series' file for a task that is not one of its occurrences."""
    from tests.support.loop import run_task
    from tether.runtime.tasks import create_task

    spec = parse_spec(
        {
            "name": "digest",
            "objective": "Write today's digest",
            "items": [{"id": "d", "title": "Digest"}],
            "tools": ["write_file"],
            "models": {"judge": "rules"},
            "schedule": {"every": "1d", "overlap": "allow"},
        }
    )
    (tmp_path / "notes.md").write_text("the user's own notes\n")
    await SCH.create_schedule(store, spec, workspace=tmp_path)

    async def occurrence(*paths: str) -> Any:
        (tid,) = await SCH.start_due(store)
        clock.advance(86400)
        return (await run_task(store, spec, tmp_path, _writer(*paths), task_id=tid))[1]

    monday = await occurrence("latest.md")
    assert (monday.waiting or {}).get("kind") != "approval", monday.waiting
    tuesday = await occurrence("latest.md", "notes.md")
    assert (tuesday.waiting or {}).get("kind") == "approval", tuesday.waiting
    ops = {o.args["path"]: o.status for o in await store.get_ops(tuesday.task_id)}
    assert ops == {"latest.md": "succeeded", "notes.md": "awaiting_approval"}, ops
    assert (tmp_path / "latest.md").read_text() == "digest 0\n"
    assert (tmp_path / "notes.md").read_text() == "the user's own notes\n"
    plain = parse_spec({**spec.model_dump(mode="json", exclude_none=True), "schedule": None})
    other = (await create_task(store, plain, workspace=tmp_path)).task_id
    _, alone = await run_task(store, plain, tmp_path, _writer("latest.md"), task_id=other)
    assert (alone.waiting or {}).get("kind") == "approval", alone.waiting
