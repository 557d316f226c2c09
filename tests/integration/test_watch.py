"""Nobody waits in silence: notices, reminders and escalation for tasks that wait for a
person, and stalled tasks whose worker went silent."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.loop import events_of, run_task, spec_of
from tests.support.notices import Recorder, webhook_receiver
from tether.clock import FakeClock
from tether.models.base import ModelResponse
from tether.models.scripted import ScriptedModel
from tether.retry import RetryPolicy
from tether.runtime.watch.sweep import WatchPolicy, WebhookNotifier, sweep
from tether.store.base import TaskPatch
from tether.store.memory import MemoryStore

HOUR = 3600.0


async def _waiting_task(tmp_path: Path) -> tuple[MemoryStore, FakeClock, str]:
    clock = FakeClock()
    store = await MemoryStore.open(clock=clock)
    model = ScriptedModel([ModelResponse("NEED_HELP: which folder?")])
    tid, result = await run_task(store, spec_of(1), tmp_path, model, clock=clock)
    assert result.status == "waiting"
    return store, clock, tid


async def test_a_waiting_task_is_notified_reminded_then_escalated(tmp_path: Path) -> None:
    store, clock, tid = await _waiting_task(tmp_path)
    rec = Recorder()
    report = await sweep(store, notifier=rec)
    assert report.notified == [tid] and [n.kind for n in rec.notices] == ["need_help"]
    assert "NEED_HELP" in rec.notices[0].text
    assert (await sweep(store, notifier=rec)).notified == []  # once
    clock.advance(6 * HOUR + 1)
    assert (await sweep(store, notifier=rec)).reminded == [tid]
    clock.advance(HOUR)
    assert (await sweep(store, notifier=rec)).reminded == []
    clock.advance(18 * HOUR)
    report = await sweep(store, notifier=rec)
    assert report.escalated == [tid]
    task = await store.get_task(tid)
    assert task.status == "suspended" and task.waiting is not None
    assert [n.kind for n in rec.notices] == ["need_help", "reminder", "escalation"]
    sent = await events_of(store, tid, "notice.sent")
    assert [(e["kind"], e["channel"]) for e in sent] == [
        ("need_help", "recorder"),
        ("reminder", "recorder"),
        ("escalation", "recorder"),
    ]
    assert (await sweep(store, notifier=rec)).escalated == []  # suspended: nothing more


async def test_many_sweepers_send_each_notice_once(tmp_path: Path) -> None:
    store, _clock, _tid = await _waiting_task(tmp_path)
    rec = Recorder()
    reports = await asyncio.gather(*(sweep(store, notifier=rec) for _ in range(5)))
    assert sum(len(r.notified) for r in reports) == 1 and len(rec.notices) == 1


async def test_a_silent_running_task_is_marked_stalled_and_claimable(tmp_path: Path) -> None:
    clock = FakeClock()
    store = await MemoryStore.open(clock=clock)
    tid, _ = await run_task(
        store,
        spec_of(2),
        tmp_path,
        ScriptedModel(policy=lambda r: ModelResponse("hm")),
        clock=clock,
        max_rounds_this_run=1,
    )
    lease = await store.claim("gone-worker", 30, task_id=tid)
    assert lease is not None
    await store.commit(tid, lease.token, [], task=TaskPatch(status="running"))
    rec = Recorder()
    clock.advance(60)  # the lease expired, but the heartbeat is recent enough
    assert (await sweep(store, notifier=rec, policy=WatchPolicy(stalled_after=300))).stalled == []
    clock.advance(300)
    report = await sweep(store, notifier=rec, policy=WatchPolicy(stalled_after=300))
    assert report.stalled == [tid] and rec.notices[-1].kind == "stalled"
    assert (await store.get_task(tid)).status == "stalled"
    taken = await store.claim("new-worker", 30)
    assert taken is not None and taken.task_id == tid


@pytest.fixture
def hook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A receiver on 127.0.0.1 that fails the first request (503) and records the rest
    with their headers."""
    with webhook_receiver(fail_first=1) as found:
        yield found


async def test_the_webhook_gets_a_signed_notice_after_a_retry(
    tmp_path: Path, hook: tuple[str, list[Any]]
) -> None:
    url, got = hook
    store, _clock, tid = await _waiting_task(tmp_path)
    notifier = WebhookNotifier(url, secret="shh-its-a-secret", retry=RetryPolicy(base_delay=0.0))
    await sweep(store, notifier=notifier)
    (delivery,) = got  # the first attempt got a 503; the retry arrived once
    body = delivery["body"]
    assert (body["task_id"], body["kind"], body["status"]) == (tid, "need_help", "waiting")
    assert "NEED_HELP" in body["text"] and body["id"] == delivery["notice"] != ""
    expected = hmac.new(b"shh-its-a-secret", delivery["raw"], hashlib.sha256).hexdigest()
    assert delivery["signature"] == f"sha256={expected}"


async def test_a_dead_webhook_is_logged_not_raised(tmp_path: Path) -> None:
    store, _clock, tid = await _waiting_task(tmp_path)
    report = await sweep(store, notifier=WebhookNotifier("http://127.0.0.1:9/nothing", timeout=2))
    assert report.notified == [tid]
    (sent,) = await events_of(store, tid, "notice.sent")
    assert sent["channel"].startswith("webhook (failed")


async def test_the_contract_sets_how_long_silence_is_allowed(tmp_path: Path) -> None:
    clock = FakeClock()
    store = await MemoryStore.open(clock=clock)
    tid, _ = await run_task(
        store,
        spec_of(2, limits={"stall_after": 60}),
        tmp_path,
        ScriptedModel(policy=lambda r: ModelResponse("hm")),
        clock=clock,
        max_rounds_this_run=1,
    )
    lease = await store.claim("gone-worker", 30, task_id=tid)
    assert lease is not None
    await store.commit(tid, lease.token, [], task=TaskPatch(status="running"))
    rec = Recorder()
    policy = WatchPolicy(stalled_after=3600)  # the worker's default, overridden
    clock.advance(59)
    assert (await sweep(store, notifier=rec, policy=policy)).stalled == []
    clock.advance(2)
    assert (await sweep(store, notifier=rec, policy=policy)).stalled == [tid]
    assert [n.kind for n in rec.notices] == ["stalled"]
