"""Every stop ends on purpose: `on_budget_exhausted` and `on_unanswered` end a parked
task `failed` after their deadline (the sweep, or a foreground run when the deadline is
zero), a foreground run sends its notices once, and `abandon` keeps its code. On every
backend, with the clock moved by the test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.loop import events_of, run_task, spec_of
from tests.support.notices import Recorder
from tether import errors, lifecycle
from tether.clock import FakeClock
from tether.decisions import abandon_task
from tether.models.base import ModelResponse
from tether.models.scripted import ScriptedModel
from tether.runtime.watch.sweep import after_run, sweep
from tether.store import Store

HOUR = 3600.0


def _idle() -> ScriptedModel:
    return ScriptedModel(policy=lambda r: ModelResponse("thinking it over"))


async def _over_budget(store: Store, tmp_path: Path, **policy: Any) -> str:
    spec = spec_of(1, budget={"rounds": 1}, **policy)
    tid, result = await run_task(store, spec, tmp_path, _idle())
    assert (result.status, (result.waiting or {}).get("kind")) == ("suspended", "budget")
    return tid


async def _asks(store: Store, tmp_path: Path, **policy: Any) -> str:
    model = ScriptedModel([ModelResponse("NEED_HELP: which folder?")])
    tid, result = await run_task(store, spec_of(1, **policy), tmp_path, model)
    assert result.status == "waiting"
    return tid


async def test_budget_fail_ends_the_foreground_stop_at_once(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    tid = await _over_budget(store, tmp_path, on_budget_exhausted="fail")
    rec = Recorder()
    sent = await after_run(store, tid, notifier=rec)
    task = await store.get_task(tid)
    assert (task.status, task.stop_reason) == ("failed", "budget_exhausted")
    assert "on_budget_exhausted" in (await events_of(store, tid, "task.status"))[-1]["reason"]
    assert [n.kind for n in sent] == ["budget", "budget", "budget", "failed"]  # 50, 80, 100 %
    assert (await sweep(store, notifier=rec)).notices == []  # sent once, by the run


async def test_budget_fail_after_a_deadline_is_applied_by_the_sweep(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    tid = await _over_budget(store, tmp_path, on_budget_exhausted={"action": "fail", "after": "2h"})
    rec = Recorder()
    await after_run(store, tid, notifier=rec)
    assert (await store.get_task(tid)).status == "suspended"  # the deadline is ahead
    clock.advance(HOUR)
    assert (await sweep(store, notifier=rec)).failed == []
    clock.advance(HOUR)
    report = await sweep(store, notifier=rec)
    assert report.failed == [tid] and report.notices == [(tid, "failed")]
    task = await store.get_task(tid)
    assert (task.status, task.stop_reason) == ("failed", "budget_exhausted")


async def test_by_default_a_used_up_budget_waits_for_ever(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    tid = await _over_budget(store, tmp_path)
    clock.advance(1000 * HOUR)
    assert (await sweep(store, notifier=Recorder())).failed == []
    assert (await store.get_task(tid)).status == "suspended"


async def test_an_unanswered_question_fails_after_its_deadline_past_the_escalation(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    tid = await _asks(store, tmp_path, on_unanswered={"action": "fail", "after": "48h"})
    rec = Recorder()
    await sweep(store, notifier=rec)
    clock.advance(24 * HOUR)
    assert (await sweep(store, notifier=rec)).escalated == [tid]
    assert (await store.get_task(tid)).status == "suspended"
    clock.advance(23 * HOUR)
    assert (await sweep(store, notifier=rec)).failed == []
    clock.advance(HOUR)
    assert (await sweep(store, notifier=rec)).failed == [tid]
    task = await store.get_task(tid)
    assert (task.status, task.stop_reason) == ("failed", "needs_user_input")
    assert rec.kinds[-1] == "failed" and "on_unanswered" in rec.notices[-1].text


async def test_fail_without_a_deadline_fails_instead_of_escalating(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    tid = await _asks(store, tmp_path, on_unanswered="fail", notify={"suspend_after": 7200})
    rec = Recorder()
    await sweep(store, notifier=rec)
    clock.advance(7200)
    report = await sweep(store, notifier=rec)
    assert (report.failed, report.escalated) == ([tid], [])
    assert (await store.get_task(tid)).stop_reason == "needs_user_input"


async def test_a_round_limit_nobody_raises_fails_as_max_rounds(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    spec = spec_of(1, limits={"max_rounds": 1}, on_unanswered={"action": "fail", "after": 60})
    tid, result = await run_task(store, spec, tmp_path, _idle())
    assert result.status == "waiting"
    clock.advance(61)
    assert (await sweep(store, notifier=Recorder())).failed == [tid]
    task = await store.get_task(tid)
    assert (task.status, task.stop_reason) == ("failed", "max_rounds")


async def test_an_answer_before_the_deadline_keeps_the_task(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    from tether.edits import tell

    tid = await _asks(store, tmp_path, on_unanswered={"action": "fail", "after": "1h"})
    await tell(store, tid, "the folder is out/", by="ana")
    clock.advance(2 * HOUR)
    assert (await sweep(store, notifier=Recorder())).failed == []
    assert not lifecycle.is_terminal((await store.get_task(tid)).status)


async def test_a_foreground_run_sends_its_wait_notice_once(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    tid = await _asks(store, tmp_path)
    rec = Recorder()
    assert [n.kind for n in await after_run(store, tid, notifier=rec)] == ["need_help"]
    assert await after_run(store, tid, notifier=rec) == []
    report = await sweep(store, notifier=rec)  # a worker that sweeps later
    assert report.notified == [] and rec.kinds == ["need_help"]
    sent = await events_of(store, tid, "notice.sent")
    assert [(e["kind"], e["channel"]) for e in sent] == [("need_help", "recorder")]


async def test_abandon_keeps_its_reason_and_code(store: Store, tmp_path: Path) -> None:
    tid = await _asks(store, tmp_path)
    with pytest.raises(errors.UserError, match="not a reason to abandon"):
        await abandon_task(store, tid, reason="stuck", code="delivered")
    task = await abandon_task(
        store, tid, reason="the model keeps rewriting i1", by="ana", code="non_convergent"
    )
    assert (task.status, task.stop_reason) == ("abandoned", "non_convergent")
    last = (await events_of(store, tid, "task.status"))[-1]
    assert last["reason"] == "abandoned by ana: the model keeps rewriting i1"
