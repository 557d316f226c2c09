"""The progress marks out of the task row (schema 8): what each open item's rounds did
(`RunState.seen`) is stored as rows of `task_marks`, written as a delta by the commit
that changes it, so the row every commit rewrites stays the same size however many
rounds the task has had; the marks read back whole (the same judgements after a crash
and a takeover), and a commit that does not know them rewrites them whole."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import tool_call
from tether.rebuild import rebuild
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.round.progress import MAX_SEEN
from tether.runtime.run.state import RunState
from tether.runtime.tasks import create_task
from tether.spec import TaskSpec, parse_spec
from tether.store.base import MarksWrite, Store, TaskPatch
from tether.tools.registry import ToolRegistry, tool

from ..conftest import Backend


@tool(effect="read")
def step(k: int) -> str:
    """Process record k (a different answer for every record)."""
    return f"record {k} processed: {k * 7919 % 1000} rows"


def spec_of(rounds: int, budget: int = 1_000_000) -> TaskSpec:
    """One item that never completes and makes progress every round (each call's answer
    is new): the task runs exactly `rounds` rounds, one new mark each (`budget`: the
    context's, past which it is compacted)."""
    return parse_spec(
        {
            "objective": "process the records one at a time with step",
            "items": [{"id": "work", "title": "Process every record"}],
            "tools": ["step"],
            "models": {"judge": "rules"},
            "limits": {
                "max_rounds": rounds,
                "no_progress_rounds": 10**6,
                "max_attempts_per_item": 10**6,
                "max_rounds_per_item": None,
            },
            # No compaction: it would leave only the marks of changes (this tool reads).
            "context": {"input_budget_tokens": budget},
        }
    )


class Stepper:
    """The actor: round r calls `step(k=r)` (the round number from the request's
    ledger-free count of calls answered), dying (SystemExit stands for a SIGKILL) at the
    given call numbers before it answers."""

    name = "stepper"

    def __init__(self, crash_at: frozenset[int] = frozenset()) -> None:
        self.crash_at = crash_at
        self.calls = 0
        self.k = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        if self.calls in self.crash_at:
            raise SystemExit("the worker died")
        if request.purpose != "act":
            return ModelResponse("records processed one per round so far; keep going")
        self.k += 1
        return ModelResponse(f"record {self.k}", (tool_call("step", k=self.k),))


async def run_task(backend: Backend, tid: str, actor: Stepper) -> Store:
    """Run the task to its end, taking it over on a fresh store handle after each crash."""
    for _ in range(10):
        store = await backend.open()
        engine = Engine(store, ModelSet(actor), registry=ToolRegistry([step]), lease_ttl=30)
        try:
            await engine.run(tid, force=True)
        except SystemExit:
            if backend.durable:
                await store.close()
            continue
        return store
    raise AssertionError("the task never finished a run")


def row_size(backend: Backend, tid: str) -> int:
    """Bytes of the task's row as stored (PostgreSQL: the whole row, TOAST included;
    SQLite: its run state, the only column that grows with the rounds)."""
    conn = backend.raw()
    try:
        if backend.kind == "sqlite":
            q = "SELECT length(usage) AS n FROM tasks WHERE task_id = ?"
        else:
            q = "SELECT pg_column_size(t.*) AS n FROM tasks t WHERE task_id = %s"
        return int(conn.execute(q, (tid,)).fetchone()["n"])
    finally:
        conn.close()


def mark_rows(backend: Backend, tid: str) -> int:
    conn = backend.raw()
    ph = "?" if backend.kind == "sqlite" else "%s"
    try:
        q = f"SELECT count(*) AS n FROM task_marks WHERE task_id = {ph}"
        return int(conn.execute(q, (tid,)).fetchone()["n"])
    finally:
        conn.close()


def verdicts(events: list[Any]) -> list[tuple[int, str, list[str]]]:
    return [
        (e.data["round"], e.data["decision"], e.data["marks"])
        for e in events
        if e.type == "judge.verdict"
    ]


async def test_the_task_row_does_not_grow_with_the_rounds(sql_backend: Backend) -> None:
    """After 10 rounds and after 200, the task's row is the same size but for counters
    (the 190 more marks, 19 bytes each, made it 3.6 KB larger when they were in it);
    all the marks are stored."""
    store = await sql_backend.open()
    short = (await create_task(store, spec_of(10))).task_id
    long = (await create_task(store, spec_of(200))).task_id
    await store.close()
    for tid in (short, long):
        await (await run_task(sql_backend, tid, Stepper())).close()
    store = await sql_backend.open()
    try:
        seen = RunState.from_dict((await store.get_task(long)).usage).seen
        assert len(seen["work"]) == 200 and len(set(seen["work"])) == 200
        assert mark_rows(sql_backend, long) == 200 and mark_rows(sql_backend, short) == 10
        assert RunState.from_dict((await store.get_task(short)).usage).seen["work"] == (
            [m for _, _, marks in verdicts(await store.read_events(short)) for m in marks]
        )
        grown = row_size(sql_backend, long) - row_size(sql_backend, short)
        assert grown < 400, (row_size(sql_backend, short), row_size(sql_backend, long))
        assert (await rebuild(store, long))["consistent"]
    finally:
        await store.close()


async def test_marks_across_compactions_fold_alike_in_rebuild(sql_backend: Backend) -> None:
    """Compactions key what is read anew (`progress.moves`) without rewriting the
    marks: every round's mark is kept, and the log folds to what is stored."""
    store = await sql_backend.open()
    tid = (await create_task(store, spec_of(120, budget=4_000))).task_id
    await store.close()
    store = await run_task(sql_backend, tid, Stepper())
    try:
        events = await store.read_events(tid)
        assert sum(1 for e in events if e.type == "context.compacted") >= 2
        seen = RunState.from_dict((await store.get_task(tid)).usage).seen
        want = [m for _, _, marks in verdicts(events) for m in marks]
        assert seen["work"] == want and len(want) == 120
        assert (await rebuild(store, tid))["consistent"]
    finally:
        await store.close()


async def test_the_marks_survive_a_crash_and_a_takeover(sql_backend: Backend) -> None:
    """A run killed twice and taken over each time ends with the same marks, and its
    rounds were judged the same way, as a run that was never killed."""
    store = await sql_backend.open()
    straight = (await create_task(store, spec_of(12))).task_id
    crashed = (await create_task(store, spec_of(12))).task_id
    await store.close()
    await (await run_task(sql_backend, straight, Stepper())).close()
    store = await run_task(sql_backend, crashed, Stepper(frozenset({4, 9})))
    try:
        want = RunState.from_dict((await store.get_task(straight)).usage).seen
        got = RunState.from_dict((await store.get_task(crashed)).usage).seen
        assert got == want and len(got["work"]) == 12
        assert verdicts(await store.read_events(crashed)) == verdicts(
            await store.read_events(straight)
        )
        assert (await rebuild(store, crashed))["consistent"]
    finally:
        await store.close()


async def test_a_commit_of_marks_that_fails_makes_the_next_one_write_them_whole(
    backend: Backend,
) -> None:
    """`marks_unsure` after a failed commit: the next `marks_write` is None (the store
    rewrites the marks from `usage`), and what it stores is what the state holds."""
    from tests.conftest import create_small_task

    store = await backend.open()
    try:
        await create_small_task(store, "t")
        state = RunState.from_dict({})
        state.seen["i1"] = ["a", "b"]
        await store.commit(
            "t", None, [], task=TaskPatch(usage=state.to_dict(), marks=state.marks_write())
        )
        state.seen["i1"] = ["a", "b", "c"]
        lost = state.marks_write()  # sent with a commit that failed
        assert lost is not None and lost.items == {"i1": (0, ("c",))}
        state.marks_unsure()
        state.seen["i2"] = ["x"]
        assert state.marks_write() is None
        await store.commit("t", None, [], task=TaskPatch(usage=state.to_dict(), marks=None))
        assert (await store.get_task("t")).usage["seen"] == {"i1": ["a", "b", "c"], "i2": ["x"]}
        assert state.marks_write() == MarksWrite({})
    finally:
        await store.close()


@pytest.mark.parametrize("rewrite", [False, True], ids=["delta", "whole"])
async def test_marks_written_as_deltas_read_back_as_the_state_holds_them(
    backend: Backend, rewrite: bool
) -> None:
    """Marks added, trimmed past the cap, an item forgotten and started again, an item
    rewritten: after each commit the task reads back the state's `seen`, on every store,
    whether the commit sent the change (`marks_write`) or not (the marks whole)."""
    from tests.conftest import create_small_task

    store = await backend.open()
    try:
        await create_small_task(store, "t")
        state = RunState.from_dict((await store.get_task("t")).usage)
        marks = [f"{n:016x}" for n in range(MAX_SEEN + 30)]
        steps: list[dict[str, list[str]]] = [
            {"i1": marks[:3]},
            {"i1": marks[:5], "i2": ["q"]},
            {"i1": marks[:MAX_SEEN]},
            {"i1": marks[10 : MAX_SEEN + 10], "i2": []},
            {"i1": marks[30 : MAX_SEEN + 30], "i2": ["r", "s"]},
            {"i2": ["s", "t"], "i3": ["u"]},
            {"i2": ["t"], "i1": ["v"]},
            {},
        ]
        for seen in steps:
            state.seen = {k: list(v) for k, v in seen.items()}
            write = None if rewrite else state.marks_write()
            await store.commit("t", None, [], task=TaskPatch(usage=state.to_dict(), marks=write))
            usage = (await store.get_task("t")).usage
            assert RunState.from_dict(usage).seen == seen
        if backend.durable:
            assert mark_rows(backend, "t") == 0
    finally:
        await store.close()


async def test_the_row_keeps_only_a_count_of_each_items_marks(sql_backend: Backend) -> None:
    from tests.conftest import create_small_task

    store = await sql_backend.open()
    try:
        await create_small_task(store, "t")
        usage = {"rounds": 2, "seen": {"i1": ["a", "b"], "i2": []}}
        await store.commit("t", None, [], task=TaskPatch(usage=usage))
        conn = sql_backend.raw()
        ph = "?" if sql_backend.kind == "sqlite" else "%s"
        try:
            row = conn.execute(f"SELECT usage FROM tasks WHERE task_id = {ph}", ("t",)).fetchone()
        finally:
            conn.close()
        held = json.loads(row["usage"]) if sql_backend.kind == "sqlite" else row["usage"]
        assert held == {"rounds": 2, "seen": {"i1": 2, "i2": 0}}
        assert (await store.get_task("t")).usage == usage
        assert [t.usage for t in await store.list_tasks()] == [usage]
    finally:
        await store.close()
