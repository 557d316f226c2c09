"""The status probe: a round in flight that commits nothing for `limits.probe_after`
is asked DONE, WORKING or STUCK; WORKING and DONE let it go on, STUCK or two unusable
answers restart the round or wait for a person, per the contract. The engine's clock
is a `FakeClock` moved by minutes; the round hangs on an event the test controls."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import tether
from tests.support.loop import events_of, honest_actor, spec_of
from tests.support.probe import Actor, Beats, probe_answered, probe_answers, start_probed, until
from tether import errors
from tether.cli import views
from tether.clock import FakeClock
from tether.edits import tell
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.round import history
from tether.runtime.run.liveness import probe
from tether.runtime.tasks import create_task
from tether.runtime.watch.sinks import LogNotifier
from tether.runtime.watch.sweep import sweep
from tether.store import Store
from tether.store.memory import MemoryStore

SECRET = "sk-probe-9c8b7a6f5e4d"


async def test_working_keeps_the_round_and_the_probe_is_journaled_and_counted(
    store: Store, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every backend: the probe commits next to the round in flight, under its token.
    monkeypatch.setenv("PROBE_API_KEY", SECRET)
    beats = Beats(store)
    actor = Actor([f"**Working.** (key {SECRET})"])
    tid, run = await start_probed(store, tmp_path, actor, clock)
    await until(lambda: actor.hanging, "the round's model call")
    await beats.wait()
    assert actor.probes == []  # not silent for long enough yet
    clock.advance(301)
    await until(lambda: probe_answered(store, tid, 1), "the probe's answer")
    assert await probe_answers(store, tid) == ["WORKING"]
    # The silence clock starts again at the answer: 299 s later nothing is asked...
    clock.advance(299)
    await beats.wait()
    assert len(actor.probes) == 1
    # ... 301 s later the round is asked again.
    clock.advance(2)
    await until(lambda: len(actor.probes) == 2, "a second probe")
    await until(lambda: probe_answered(store, tid, 2), "its answer")
    actor.release.set()
    result = await asyncio.wait_for(run, 30)
    assert result.status == "satisfied" and not result.interrupted
    assert actor.cancelled == 0
    (request,) = actor.probes[:1]
    assert request.tools == () and request.max_output_tokens <= 16
    assert "i1" in request.messages[0].content and "WORKING" in request.messages[0].content
    # Journaled like any model call: the call, its blobs, then the answer; redacted.
    calls = [c for c in await events_of(store, tid, "model.called") if c["purpose"] == "probe"]
    assert len(calls) == 2 and all(c["input_tokens"] > 0 for c in calls)
    asked = json.loads(await store.get_blob(calls[0]["request_blob"]))
    assert asked["purpose"] == "probe"
    # Its answer inline, as every call's: no blob.
    answered = history.called_response(calls[0])
    assert answered is not None and not calls[0]["response_blob"]
    assert answered["text"].startswith("**Working.**")
    (first, _) = await events_of(store, tid, "probe.answered")
    assert first["item"] == "i1" and first["silent_for"] >= 300 and first["attempt"] == 1
    everything = json.dumps([e.data for e in await store.read_events(tid)])
    assert SECRET not in everything
    # Counted in the usage and the spend by purpose, like any call.
    usage = (await store.get_task(tid)).usage
    spend = usage["by_purpose"]["probe"]
    assert spend["calls"] == 2
    assert spend["input"] == sum(c["input_tokens"] for c in calls)
    assert usage["model_calls"] == 2 + usage["by_purpose"]["act"]["calls"]


async def test_the_silence_counts_from_the_answer_even_when_the_clock_moves_before_it_is_read(
    store: Store, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The probe's answer is committed, and the run's clock moves on (299 s) before the
    # probing coroutine resumes: the next probe is still due 300 s after the answer,
    # not 300 s after the moment the coroutine happened to read the clock.
    from tether.runtime.run.journal import RunJournal

    commit_aside = RunJournal.commit_aside
    moved: list[bool] = []

    async def late(self: RunJournal, events: Any, blobs: Any) -> None:
        await commit_aside(self, events, blobs)
        if any(e.TYPE == "probe.answered" for e in events) and not moved:
            moved.append(True)
            clock.advance(299)

    monkeypatch.setattr(RunJournal, "commit_aside", late)
    beats = Beats(store)
    actor = Actor(["WORKING"])
    tid, run = await start_probed(store, tmp_path, actor, clock)
    await until(lambda: actor.hanging, "the round's model call")
    await beats.wait()
    start = clock.now()
    clock.advance(301)
    await until(lambda: probe_answered(store, tid, 1), "the probe's answer")
    assert clock.now() == start + 600
    await beats.wait()
    assert len(actor.probes) == 1
    clock.advance(2)  # 302 s after the answer
    await until(lambda: len(actor.probes) == 2, "a second probe")
    actor.release.set()
    result = await asyncio.wait_for(run, 30)
    assert result.status == "satisfied"


async def test_done_is_recorded_but_never_taken_as_completion(tmp_path: Path) -> None:
    clock = FakeClock()
    store = await MemoryStore.open()
    actor = Actor(["I am DONE with it"])
    tid, run = await start_probed(store, tmp_path, actor, clock)
    await until(lambda: actor.hanging, "the round's model call")
    clock.advance(301)
    await until(lambda: probe_answered(store, tid, 1), "the probe's answer")
    assert await probe_answers(store, tid) == ["DONE"]
    ledger = (await store.get_ledger(tid)).to_ledger()
    assert ledger.item("i1").status != "done"  # the ledger decides, not the answer
    assert not actor.cancelled
    actor.release.set()
    result = await asyncio.wait_for(run, 30)
    assert result.status == "satisfied"


@pytest.mark.parametrize(
    ("answers", "recorded"),
    [
        (["hmm, let me think", "I am not stuck, still working"], ["unusable", "unusable"]),
        (["STUCK: the tool never returns"], ["STUCK"]),
        ([errors.ModelError("503 overloaded", transient=True), "?"], ["unusable", "unusable"]),
    ],
)
async def test_stuck_or_two_unusable_answers_restart_the_round(
    tmp_path: Path, answers: list[str | Exception], recorded: list[str]
) -> None:
    clock = FakeClock()
    store = await MemoryStore.open()
    actor = Actor(answers)
    tid, run = await start_probed(store, tmp_path, actor, clock)
    await until(lambda: actor.hanging, "the round's model call")
    clock.advance(301)
    result = await asyncio.wait_for(run, 30)
    # Cancelled and recorded like a round_timeout: a crash of this worker.
    assert (result.status, result.interrupted) == ("running", True)
    assert actor.cancelled == 1
    assert await probe_answers(store, tid) == recorded
    failed = await events_of(store, tid, "model.failed")
    assert [f["purpose"] for f in failed] == ["probe"] * isinstance(answers[0], Exception)
    (warning,) = await events_of(store, tid, "audit.warning")
    assert warning["code"] == "status_probe"
    assert "limits.probe_after" in warning["message"]
    task = await store.get_task(tid)
    assert task.lease_owner is None  # given back: any worker recovers it
    # The next run recovers it like a crash (counted) and finishes.
    again = Engine(store, ModelSet(actor.model), lease_ttl=0.3, clock=clock)
    assert (await asyncio.wait_for(again.run(tid), 30)).status == "satisfied"
    assert len(await events_of(store, tid, "recovery.started")) == 1
    assert (await store.get_task(tid)).usage["crash_streak"] == 1


async def test_with_ask_human_a_failed_probe_waits_for_a_person(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    actor = Actor(["", "?"])
    tid, run = await start_probed(
        store, tmp_path, actor, clock, limits={"on_probe_failure": "ask_human"}
    )
    await until(lambda: actor.hanging, "the round's model call")
    clock.advance(301)
    result = await asyncio.wait_for(run, 30)
    assert result.status == "waiting" and not result.interrupted
    assert actor.cancelled == 1
    assert await probe_answers(store, tid) == ["unusable", "unusable"]
    # The timeline says what was asked and what came back.
    lines = [views.describe_event(e)[1] for e in await store.read_events(tid)]
    assert "status probe of round 1 on i1 after 301s silent: unusable ('?')" in lines
    task = await store.get_task(tid)
    assert task.waiting is not None and task.waiting["kind"] == "human"
    assert "2 unusable answers" in task.waiting["reason"]
    assert task.lease_owner is None
    # Announced like a NEED_HELP, once.
    report = await sweep(store, notifier=LogNotifier())
    assert report.notices == [(tid, "need_help")]
    assert (await sweep(store, notifier=LogNotifier())).notices == []
    # A person answers; the task goes on and finishes (not counted as a crash).
    await tell(store, tid, "the service is back, go on")
    again = Engine(store, ModelSet(actor.model), lease_ttl=0.3, clock=clock)
    assert (await asyncio.wait_for(again.run(tid), 30)).status == "satisfied"
    assert (await store.get_task(tid)).usage.get("crash_streak", 0) == 0


class GatedClock(FakeClock):
    """A fake clock whose sleeps wait for the test to open the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.sleeping = 0

    async def sleep(self, seconds: float) -> None:
        self.sleeping += 1
        try:
            await self.gate.wait()
        finally:
            self.sleeping -= 1
        await super().sleep(seconds)


async def test_a_round_waiting_for_a_retry_time_is_never_probed(tmp_path: Path) -> None:
    clock = GatedClock()
    store = await MemoryStore.open()
    beats = Beats(store)
    polls = 0

    @tether.tool(effect="read")
    def poll_status() -> str:
        """The state of a slow service: ask again in a few seconds the first time."""
        nonlocal polls
        polls += 1
        if polls == 1:
            raise errors.RetryLater("not yet", delay=5)
        return "ready"

    registry = tether.default_registry(lambda: store)
    registry.add(poll_status)
    actor = Actor([], hang=False)
    calls = 0

    def act(request: ModelRequest) -> Any:
        nonlocal calls
        if request.purpose == "probe":
            return actor.answer(request)
        calls += 1
        if calls == 1:
            return ModelResponse("checking", (tool_call("poll_status"),))
        return honest_actor(request)

    actor.model = ScriptedModel(policy=act, name="actor")
    tools = ["write_file", "read_file", "list_files", "poll_status"]
    tid, run = await start_probed(
        store, tmp_path, actor, clock, registry=registry, spec={"tools": tools}
    )
    await until(lambda: clock.sleeping == 1, "the inline wait for the retry time")
    clock.advance(3600)  # an hour of waiting is not an hour of silence
    await beats.wait()
    assert actor.probes == []
    clock.gate.set()
    result = await asyncio.wait_for(run, 30)
    assert result.status == "satisfied"
    assert polls == 2 and actor.probes == []
    assert await events_of(store, tid, "probe.answered") == []


async def test_a_task_parked_waiting_is_not_probed_nor_stalled(tmp_path: Path) -> None:
    clock = FakeClock()
    store = await MemoryStore.open(clock=clock)
    model = ScriptedModel(["NEED_HELP: which folder?"])
    tid = (await create_task(store, spec_of(1), workspace=tmp_path)).task_id
    result = await Engine(store, ModelSet(model), lease_ttl=0.3, clock=clock).run(tid)
    assert result.status == "waiting"
    clock.advance(3 * 3600)
    report = await sweep(store, notifier=LogNotifier())
    assert report.stalled == [] and (await store.get_task(tid)).status == "waiting"
    assert await events_of(store, tid, "probe.answered") == []
    assert model.calls == 1


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("WORKING", "WORKING"),
        ("working.", "WORKING"),
        ("**Done**", "DONE"),
        ("  > stuck - the tool never returns", "STUCK"),
        ("I am still WORKING on it, the download is slow.", "WORKING"),
        ("Stuck, not done", "STUCK"),
        ("not stuck, working", None),
        ("", None),
        ("I'm fine", None),
        ("doneness", None),
    ],
)
def test_answers_are_read_robustly(text: str, answer: str | None) -> None:
    assert probe.parse(text) == answer


def test_the_contract_says_when_and_what() -> None:
    limits = spec_of(1).limits
    assert (limits.probe_after, limits.on_probe_failure) == (300.0, "restart_round")
    off = spec_of(1, limits={"probe_after": None, "on_probe_failure": "ask_human"}).limits
    assert (off.probe_after, off.on_probe_failure) == (None, "ask_human")
    with pytest.raises(errors.SpecError, match="on_probe_failure"):
        spec_of(1, limits={"on_probe_failure": "panic"})


async def test_an_answer_that_comes_after_the_round_moved_on_changes_nothing(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    store = await MemoryStore.open()
    beats = Beats(store)
    gates = {1: asyncio.Event(), 2: asyncio.Event()}
    answer_now = asyncio.Event()
    state = {"act": 0, "hanging": 0, "cancelled": 0}

    async def policy(request: ModelRequest) -> Any:
        if request.purpose == "probe":
            await answer_now.wait()
            return "STUCK"
        state["act"] += 1
        n = state["act"]
        if n in gates:
            state["hanging"] = n
            try:
                await gates[n].wait()
            except asyncio.CancelledError:
                state["cancelled"] += 1
                raise
        return honest_actor(request)

    actor = Actor([], hang=False)
    actor.model = ScriptedModel(policy=policy, name="actor")
    spec = spec_of(2, limits={"probe_after": 300})
    tid = (await create_task(store, spec, workspace=tmp_path)).task_id
    eng = Engine(store, ModelSet(actor.model), lease_ttl=0.3, clock=clock)
    run = asyncio.create_task(eng.run(tid))
    await until(lambda: state["hanging"] == 1, "round 1's model call")
    clock.advance(301)  # round 1 is probed; the model takes its time to answer
    await beats.wait()
    gates[1].set()  # round 1 goes on and commits; round 2 hangs
    await until(lambda: state["hanging"] == 2, "round 2's model call")
    answer_now.set()  # the late STUCK is about round 1
    await until(lambda: probe_answered(store, tid, 1), "the late answer")
    await beats.wait()
    assert state["cancelled"] == 0 and not run.done()
    gates[2].set()
    result = await asyncio.wait_for(run, 30)
    assert result.status == "satisfied" and not result.interrupted
    assert await probe_answers(store, tid) == ["STUCK"]
    assert await events_of(store, tid, "audit.warning") == []
