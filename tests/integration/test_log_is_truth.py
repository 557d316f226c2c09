"""The log is the truth: over random sequences of rounds — progress, read-only rounds,
failed tool calls, talk, compactions, edits, `tether verify`, crashes at fail points —
folding the event log (`tether rebuild`) gives the stored projections after every
round, and `status --at` the last event agrees with `status`. On SQLite and PostgreSQL.

A crash is a `SystemExit` raised at a fail point (what `TETHER_FAILPOINTS` does with a
real process, without ending this one); the next run recovers like a new worker."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.loop import by_purpose, next_item, spec_of
from tether import errors, failpoints
from tether.edits import edit_task
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.rebuild import rebuild
from tether.report.timetravel import status_at
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.recovery.verify import verify_task
from tether.runtime.run.state import RunState
from tether.runtime.tasks import create_task, status_dict
from tether.store.opening import open_db

ROUNDS = ["write", "write", "read", "fail", "talk", "big"]
BETWEEN = ["edit", "verify"]
CRASH_AT = [
    "after_model_response",
    "after_op_intent",
    "after_op_result",
    "before_ledger_write",
    "after_round_commit",
    "during_compaction",
]
STEP = st.one_of(
    st.sampled_from(ROUNDS),
    st.sampled_from(BETWEEN),
    st.tuples(st.sampled_from(ROUNDS), st.sampled_from(CRASH_AT)),
)


class Actor:
    """Does what the drawn step says, as a model would from its request."""

    def __init__(self) -> None:
        self.step = "talk"

    def act(self, request: ModelRequest) -> ModelResponse:
        nxt = next_item(request)
        if self.step == "write" and nxt is not None:
            call = tool_call("write_file", path=f"out/{nxt}.txt", content=nxt)
            return ModelResponse(f"writing {nxt}", (call,))
        if self.step == "read":
            return ModelResponse("looking", (tool_call("list_files", path="."),))
        if self.step == "fail":
            return ModelResponse("reading", (tool_call("read_file", path="missing.txt"),))
        if self.step == "big":
            return ModelResponse("reading", (tool_call("read_file", path="big.txt"),))
        return ModelResponse("Thinking about the ledger.")

    def model(self) -> ScriptedModel:
        return ScriptedModel(
            policy=by_purpose(
                act=self.act, judge=lambda r: "{}", compact=lambda r: "Summary: files written."
            )
        )


def _crash_at(point: str | None) -> Callable[[str], None]:
    """A fail point hook that ends the run (`SystemExit`) the first time `point` is hit."""
    armed = [point]

    def hit(name: str) -> None:
        if name == armed[0]:
            armed[0] = None
            raise SystemExit(f"fail point {name} reached")

    return hit


async def _agree(store: Any, tid: str, where: str) -> None:
    found = await rebuild(store, tid)
    assert found["consistent"], (where, found)
    task = await store.get_task(tid)
    now = await status_dict(store, tid)
    then = await status_at(store, tid, task.last_seq)
    for key in ("status", "stop_reason", "version"):
        assert then[key] == now[key], (where, key, then[key], now[key])
    items = {i["id"]: i["status"] for i in now["ledger"]["items"]}
    assert {i["id"]: i["status"] for i in then["ledger"]["items"]} == items, where
    # What the audits remember of each open item is what the log says it did.
    seen = RunState.from_dict(task.usage).seen
    assert set(seen) <= {i for i, s in items.items() if s in ("pending", "in_progress")}, where


async def _scenario(db: str, ws: Path, steps: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    (ws / "big.txt").write_text("x" * 700)
    store = await open_db(db, create=True)
    try:
        spec = spec_of(
            3,
            context={"input_budget_tokens": 1500, "preview_chars": 750},
            limits={"no_progress_rounds": 3, "max_rounds": 40},
        )
        tid = (await create_task(store, spec, workspace=ws)).task_id
        actor = Actor()
        for n, step in enumerate(steps):
            where = f"step {n}: {step!r} of {steps!r}"
            if step == "edit":
                with contextlib.suppress(errors.UserError):
                    await edit_task(store, tid, {"budget": {"rounds": 200 + n}}, reason="drawn")
                await _agree(store, tid, where)
                continue
            if step == "verify":
                # A crashed run's task is refused: its next claim recovers it.
                with contextlib.suppress(errors.UserError):
                    await verify_task(store, tid)
                await _agree(store, tid, where)
                continue
            kind, point = step if isinstance(step, tuple) else (step, None)
            actor.step = kind
            monkeypatch.setattr(failpoints, "hit", _crash_at(point))
            engine = Engine(
                store,
                ModelSet(actor.model(), compact=actor.model()),
                lease_ttl=30,
                max_rounds_this_run=1,
            )
            try:
                await engine.run(tid, force=True)
            except SystemExit:
                pass
            except errors.UserError:
                pass  # settled: nothing to run
            await _agree(store, tid, where)
    finally:
        await store.close()


SETTINGS = settings(
    max_examples=int(os.environ.get("TETHER_PROP_EXAMPLES", "8")),
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)


@SETTINGS
@given(steps=st.lists(STEP, min_size=3, max_size=7))
def test_rebuild_agrees_after_every_round_on_sqlite(
    steps: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        asyncio.run(_scenario(f"sqlite:///{tmp}/tether.db", ws, steps, monkeypatch))


@pytest.mark.postgres
@SETTINGS
@given(steps=st.lists(STEP, min_size=3, max_size=7))
def test_rebuild_agrees_after_every_round_on_postgres(
    steps: list[Any], monkeypatch: pytest.MonkeyPatch, pg_schema_url: Callable[[], str]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        asyncio.run(_scenario(pg_schema_url(), ws, steps, monkeypatch))


async def test_rebuild_folds_what_the_audits_remember_and_fix_restores_it(
    tmp_path: Path,
) -> None:
    """`RunState.seen` (each open item's progress marks, which decide whether a round
    brought something new) is in the log: rebuild folds it, finds a damaged one and
    `--fix` writes it back."""
    import json
    import sqlite3

    ws = tmp_path / "ws"
    ws.mkdir()
    db = tmp_path / "tether.db"
    store = await open_db(f"sqlite:///{db}", create=True)
    try:
        spec = spec_of(2, limits={"no_progress_rounds": 5, "max_rounds": 40})
        tid = (await create_task(store, spec, workspace=ws)).task_id
        actor = Actor()
        for step in ("write", "read", "fail"):
            actor.step = step
            await Engine(store, ModelSet(actor.model()), lease_ttl=30, max_rounds_this_run=1).run(
                tid, force=True
            )
        seen = RunState.from_dict((await store.get_task(tid)).usage).seen
        assert set(seen) == {"i2"} and len(seen["i2"]) >= 2, seen
        assert (await rebuild(store, tid))["consistent"]

        conn = sqlite3.connect(db)
        (usage,) = conn.execute("SELECT usage FROM tasks WHERE task_id = ?", (tid,)).fetchone()
        damaged = {**json.loads(usage), "seen": {}}
        conn.execute("UPDATE tasks SET usage = ? WHERE task_id = ?", (json.dumps(damaged), tid))
        # The marks themselves are rows of their own (schema 8): gone too.
        conn.execute("DELETE FROM task_marks WHERE task_id = ?", (tid,))
        conn.commit()
        conn.close()
        found = await rebuild(store, tid)
        assert not found["consistent"]
        assert found["state"] == [
            {"field": "seen", "item": "i2", "stored": None, "from_log": seen["i2"]}
        ]
        assert (await rebuild(store, tid, fix=True))["fixed"]
        assert RunState.from_dict((await store.get_task(tid)).usage).seen == seen
        assert (await rebuild(store, tid))["consistent"]
    finally:
        await store.close()
