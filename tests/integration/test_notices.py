"""Every kind of notice people must get, sent once per event to the installation's and
the contract's targets, signed, re-sent and escalated on an injected clock; checked by a
real webhook receiver process on 127.0.0.1 (`tests/services/notice_receiver.py`) that
verifies each signature and drops repeats by notice id."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import tether
from tests.support.loop import events_of, honest_actor, run_task, spec_of
from tether import events as ev
from tether.clock import FakeClock
from tether.edits import tell
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel
from tether.runtime.watch import notices as nt
from tether.runtime.watch.sinks import LogNotifier, default_notifier
from tether.runtime.watch.sweep import sweep
from tether.store import Store
from tether.store.memory import MemoryStore

RECEIVER = Path(__file__).resolve().parents[1] / "services" / "notice_receiver.py"
SECRET = "correct horse battery staple"
HOUR = 3600.0


class Receiver:
    """A running receiver process: its URL and what it saw."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def url(self, path: str = "/hook") -> str:
        return self.base + path

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.base + "/stats", timeout=10) as resp:
            doc: dict[str, Any] = json.loads(resp.read())
        return doc

    def kinds(self, path: str = "/hook") -> list[str]:
        return [n["body"]["kind"] for n in self.stats()["notices"] if n["path"] == path]


@pytest.fixture
def receiver() -> Iterator[Callable[..., Receiver]]:
    """Start receivers: `receiver(fail_first=0, secret=SECRET)`."""
    procs: list[subprocess.Popen[str]] = []

    def start(*, fail_first: int = 0, secret: str | None = SECRET) -> Receiver:
        env = {k: v for k, v in os.environ.items() if k != "NOTICE_SECRET"}
        if secret is not None:
            env["NOTICE_SECRET"] = secret
        proc = subprocess.Popen(
            [sys.executable, str(RECEIVER), "--fail-first", str(fail_first)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until it listens (or dies: empty)
        assert line, "the receiver did not start"
        return Receiver(int(json.loads(line)["port"]))

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def _spec(notify: dict[str, Any]) -> tether.TaskSpec:
    return spec_of(1, notify=notify)


#: One journal event of every kind that must reach people, and the notice it makes.
EVENTS: list[tuple[ev.Event, str]] = [
    (ev.ApprovalRequested(request_id="x.r1.c0.approval", what="delete(a)"), "approval_requested"),
    (ev.ApprovalRequested(request_id="x.r1.c0.in_doubt", what="post(b)?"), "op_in_doubt"),
    (ev.DecisionRequested(reason="2 of 3 items done; decide the rest"), "decision_needed"),
    (ev.TaskStatusChanged(src="running", dst="waiting", reason="needs_user_input"), "need_help"),
    (ev.BudgetThreshold(scope="task", resource="tokens", percent=50, used=5, limit=10), "budget"),
    (ev.BudgetThreshold(scope="task", resource="tokens", percent=80, used=8, limit=10), "budget"),
    (ev.BudgetThreshold(scope="task", resource="tokens", percent=100, used=10, limit=10), "budget"),
    (ev.TaskStatusChanged(src="running", dst="stalled", reason="no heartbeat"), "stalled"),
    (ev.TaskStatusChanged(src="stalled", dst="failed", stop_reason="crash_loop"), "failed"),
    (ev.TaskStatusChanged(src="queued", dst="satisfied", stop_reason="delivered"), "finished"),
]


async def test_each_kind_is_sent_once_signed_to_the_contracts_webhook(
    store: Store,
    tmp_path: Path,
    receiver: Callable[..., Receiver],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hook = receiver(fail_first=1)  # the first POST fails: retried with the same id
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    spec = _spec({"targets": [{"webhook": hook.url(), "secret_env": "HOOK_SECRET"}]})
    tid = (await tether.create_task(store, spec, workspace=tmp_path)).task_id
    # Noise around them: events that call for no notice.
    quiet = ev.TaskStatusChanged(src="queued", dst="running")
    for event, _ in EVENTS:
        await store.commit(tid, None, [quiet, event])
    # Several workers sweep at once, then again: each event is sent once.
    await asyncio.gather(*(sweep(store, notifier=LogNotifier()) for _ in range(3)))
    await sweep(store, notifier=LogNotifier())
    stats = hook.stats()
    assert [n["body"]["kind"] for n in stats["notices"]] == [kind for _, kind in EVENTS]
    assert (stats["failed"], stats["rejected"], stats["repeats"]) == (1, 0, 0)
    budgets = [n["body"]["percent"] for n in stats["notices"] if n["body"]["kind"] == "budget"]
    assert budgets == [50, 80, 100]
    assert all(n["body"]["task_id"] == tid for n in stats["notices"])
    # Each notice carries what it is about: the request, or the question.
    by_kind = {n["body"]["kind"]: n["body"] for n in stats["notices"]}
    assert by_kind["approval_requested"]["what"] == "delete(a)"
    assert by_kind["op_in_doubt"]["what"] == "post(b)?"
    assert by_kind["decision_needed"]["question"] == "2 of 3 items done; decide the rest"
    sent = await events_of(store, tid, "notice.sent")
    assert [s["kind"] for s in sent] == [kind for _, kind in EVENTS]
    assert all(s["channel"] == "log, webhook" for s in sent)
    # A later wait for a decision is the only one announced by the next sweep, once
    # (its status change, the same kind of change as NEED_HELP's, is part of it).
    await store.commit(tid, None, [EVENTS[2][0], EVENTS[3][0]])
    report = await sweep(store, notifier=LogNotifier())
    assert report.notices == [(tid, "decision_needed")]
    assert len(hook.stats()["notices"]) == len(EVENTS) + 1


async def test_a_request_answered_before_the_sweep_pages_nobody(
    store: Store, tmp_path: Path, receiver: Callable[..., Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decision waived, an approval decided or closed, a question answered before any
    sweep ran (the demo does it in one process): no notice asks people to act on them.
    What is still open, and what only informs, is sent."""
    hook = receiver()
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    spec = _spec({"targets": [{"webhook": hook.url(), "secret_env": "HOOK_SECRET"}]})
    tid = (await tether.create_task(store, spec, workspace=tmp_path)).task_id
    waiting = ev.TaskStatusChanged(src="running", dst="waiting", reason="decision")
    resumed = ev.TaskStatusChanged(src="waiting", dst="queued", reason="waived")
    journal: list[ev.Event] = [
        ev.DecisionRequested(reason="1 of 1 items blocked; decide"), waiting, resumed,
        ev.ApprovalRequested(request_id="x.r2.c0.approval", what="delete(a)"),
        ev.ApprovalDecided(request_id="x.r2.c0.approval", decision="approve"),
        ev.ApprovalRequested(request_id="x.r3.c0.in_doubt", what="post(b)?"),
        ev.ApprovalClosed(request_id="x.r3.c0.in_doubt", reason="the task was cancelled"),
        ev.TaskStatusChanged(src="running", dst="waiting", reason="needs_user_input"),
        ev.TaskStatusChanged(src="waiting", dst="queued", reason="answered"),
        ev.BudgetThreshold(scope="task", resource="tokens", percent=50, used=5, limit=10),
        ev.ApprovalRequested(request_id="x.r4.c0.approval", what="deploy(c)"),
    ]  # fmt: skip
    await store.commit(tid, None, journal)
    report = await sweep(store, notifier=LogNotifier())
    assert report.notices == [(tid, "budget"), (tid, "approval_requested")]
    assert [n["body"].get("what") for n in hook.stats()["notices"]] == [None, "deploy(c)"]
    # The next wait for a decision, still open, is announced.
    await store.commit(tid, None, [EVENTS[2][0], EVENTS[3][0]])
    assert (await sweep(store, notifier=LogNotifier())).notices == [(tid, "decision_needed")]


async def test_a_wrong_secret_is_refused_by_the_receiver(
    tmp_path: Path, receiver: Callable[..., Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = receiver()
    monkeypatch.setenv("HOOK_SECRET", "not the secret")
    store = await MemoryStore.open()
    spec = _spec({"targets": [{"webhook": hook.url(), "secret_env": "HOOK_SECRET"}]})
    tid = (await tether.create_task(store, spec, workspace=tmp_path)).task_id
    await store.commit(tid, None, [EVENTS[0][0]])
    await sweep(store, notifier=LogNotifier())
    stats = hook.stats()
    # Refused (401): not retried, as no 4xx but 408, 409, 425 and 429 is.
    assert stats["notices"] == [] and stats["rejected"] == 1
    (sent,) = await events_of(store, tid, "notice.sent")
    assert "webhook (failed" in sent["channel"]


async def test_a_sender_that_died_after_taking_a_notice_leaves_it_to_the_next(
    tmp_path: Path, receiver: Callable[..., Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = receiver()
    monkeypatch.setenv("TETHER_WEBHOOK_URL", hook.url())
    monkeypatch.setenv("TETHER_WEBHOOK_SECRET", SECRET)
    clock = FakeClock()
    store = await MemoryStore.open(clock=clock)
    tid = (await tether.create_task(store, spec_of(1), workspace=tmp_path)).task_id
    await store.commit(tid, None, [EVENTS[3][0]])
    (event,) = await store.read_events(tid, types={"task.status"})
    # A sweeper took it, then died before sending.
    assert await store.update_shared(nt.key(tid), nt._take(event.seq))
    assert (await sweep(store)).notices == []
    clock.advance(nt.TAKE_TTL + 1)
    assert (await sweep(store)).notices == [(tid, "need_help")]
    assert (await sweep(store)).notices == []
    (notice,) = hook.stats()["notices"]
    assert notice["id"] == f"{tid}:{event.seq}" == notice["body"]["id"]


async def test_a_real_run_is_announced_need_help_then_finished(
    tmp_path: Path, receiver: Callable[..., Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = receiver()
    monkeypatch.setenv("TETHER_WEBHOOK_URL", hook.url())
    monkeypatch.setenv("TETHER_WEBHOOK_SECRET", SECRET)
    store = await MemoryStore.open()

    def actor(request: ModelRequest) -> ModelResponse:
        if not any("Message from the user" in m.content for m in request.messages):
            return ModelResponse("NEED_HELP: which folder do the files go in?")
        return honest_actor(request)

    tid, first = await run_task(store, spec_of(1), tmp_path, ScriptedModel(policy=actor))
    assert first.status == "waiting"
    await sweep(store, notifier=default_notifier())
    await tell(store, tid, "they go in out/")
    _, done = await run_task(store, spec_of(1), tmp_path, ScriptedModel(policy=actor), task_id=tid)
    assert done.status == "satisfied"
    await sweep(store, notifier=default_notifier())
    notices = hook.stats()["notices"]
    assert [n["body"]["kind"] for n in notices] == ["need_help", "finished"]
    assert "which folder" in notices[0]["body"]["text"]
    # The question alone, without the command that answers it.
    assert notices[0]["body"]["question"] == "NEED_HELP: which folder do the files go in?"
    assert notices[1]["body"]["status"] == "satisfied"


async def test_the_contract_sets_reminders_suspension_and_the_admin_target(
    tmp_path: Path, receiver: Callable[..., Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = receiver()
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    signed = {"secret_env": "HOOK_SECRET"}
    notify = {
        "targets": [{"webhook": hook.url("/team"), **signed}],
        "admin": [{"webhook": hook.url("/admin"), **signed}],
        "renotify_after": 600,
        "suspend_after": 2 * HOUR,
    }
    clock = FakeClock()
    store = await MemoryStore.open(clock=clock)
    model = ScriptedModel([ModelResponse("NEED_HELP: which folder?")])
    tid, result = await run_task(store, _spec(notify), tmp_path, model, clock=clock)
    assert result.status == "waiting"
    base = LogNotifier()
    assert (await sweep(store, notifier=base)).notices == [(tid, "need_help")]
    clock.advance(599)
    assert (await sweep(store, notifier=base)).reminded == []
    clock.advance(2)
    assert (await sweep(store, notifier=base)).reminded == [tid]
    assert (await sweep(store, notifier=base)).reminded == []  # once
    clock.advance(601)
    assert (await sweep(store, notifier=base)).reminded == [tid]
    clock.advance(2 * HOUR)
    assert (await sweep(store, notifier=base)).escalated == [tid]
    assert (await store.get_task(tid)).status == "suspended"
    assert hook.kinds("/team") == ["need_help", "reminder", "reminder", "escalation"]
    assert hook.kinds("/admin") == ["escalation"]
    assert hook.stats()["rejected"] == 0
    await sweep(store, notifier=base)
    assert len(hook.stats()["notices"]) == 5  # suspended: nothing more


async def test_a_task_stopped_at_max_rounds_is_announced_once(
    tmp_path: Path, receiver: Callable[..., Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = receiver()
    monkeypatch.setenv("TETHER_WEBHOOK_URL", hook.url())
    monkeypatch.setenv("TETHER_WEBHOOK_SECRET", SECRET)
    store = await MemoryStore.open()
    spec = spec_of(3, limits={"max_rounds": 1})
    tid, first = await run_task(store, spec, tmp_path, ScriptedModel(policy=honest_actor))
    assert first.status == "waiting" and (first.waiting or {}).get("kind") == "human"
    # Every worker sweeps, and again: one notice, and the later reminder is another kind.
    await asyncio.gather(*(sweep(store, notifier=default_notifier()) for _ in range(3)))
    await sweep(store, notifier=default_notifier())
    (notice,) = hook.stats()["notices"]
    assert notice["body"]["kind"] == "limit_reached"
    assert "max_rounds (1)" in notice["body"]["text"] and "raise" in notice["body"]["text"]
    assert [s["kind"] for s in await events_of(store, tid, "notice.sent")] == ["limit_reached"]


async def test_a_context_budget_too_small_is_announced(store: Store, tmp_path: Path) -> None:
    """A budget no compaction can fit waits for a person to raise it: announced like a
    round limit, with the command that raises it."""
    spec = spec_of(2, context={"input_budget_tokens": 1000}, instructions="Be careful here. " * 400)
    tid, first = await run_task(store, spec, tmp_path, ScriptedModel(policy=honest_actor))
    assert first.status == "waiting"
    report = await sweep(store, notifier=LogNotifier())
    assert report.notices == [(tid, "limit_reached")]
    (sent,) = await events_of(store, tid, "notice.sent")
    assert "the context budget of 1000 tokens is too small" in sent["text"]
    assert "--set context.input_budget_tokens=" in sent["text"]


async def test_a_milestone_round_limit_is_announced(store: Store, tmp_path: Path) -> None:
    items = [
        {"id": f"i{k}", "title": f"write out/i{k}.txt", "milestone": "m1"}
        | {"done_when": {"kind": "file", "path": f"out/i{k}.txt"}}
        for k in (1, 2)
    ]
    spec = spec_of(
        2,
        items=items,
        milestones=[{"id": "m1", "title": "both files"}],
        limits={"max_rounds_per_milestone": 1},
    )
    tid, first = await run_task(store, spec, tmp_path, ScriptedModel(policy=honest_actor))
    assert first.status == "waiting"
    report = await sweep(store, notifier=LogNotifier())
    assert report.notices == [(tid, "limit_reached")]
    (sent,) = await events_of(store, tid, "notice.sent")
    assert "milestone m1 used its 1 round;" in sent["text"]
