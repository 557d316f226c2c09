"""Progress measured from what rounds did, through the loop, at default limits.

A fixer whose test runs converge ("3 failed" → "2 failed" → "1 failed" → passed) finishes
with the rules judge; an agent that reads the same file again and again is blocked after
`limits.no_progress_rounds` rounds that did nothing new. What each item has seen lives in
the run state committed with every round: a crash between rounds, or between a round's
results and its LLM judge's verdict, changes neither outcome nor the number of rounds, on
memory, SQLite and PostgreSQL; and the recorded run replays clean. A draft the item
itself rewrote before it was done is revision, not a broken deliverable; a change after
acceptance is still caught. After the item started a build of its own, its log read
again in a quiet phase, or its output file not there yet, is waiting (never blocked,
across crashes; a build that never ends is blocked at the rounds cap); without such
work the same reads are a loop, as before.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.loop import events_of, ledger_of
from tether import errors
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.report.replay import replay_task
from tether.retry import RetryPolicy
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.tasks import create_task
from tether.spec import TaskSpec, parse_spec
from tether.store.base import Store
from tether.tools.builtin.files import default_registry
from tether.tools.registry import Tool, ToolRegistry, tool

from ..conftest import Backend

Policy = Callable[[ModelRequest], Any]


class Crashy:
    """A scripted model whose process dies (SystemExit stands for a SIGKILL) at the given
    call numbers; every other call answers with `policy`."""

    def __init__(self, name: str, policy: Policy, crash_at: set[int]) -> None:
        self.name = name
        self.policy = policy
        self.crash_at = crash_at
        self.calls = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        if self.calls in self.crash_at:
            raise SystemExit("the worker died")
        answer = self.policy(request)
        return answer if isinstance(answer, ModelResponse) else ModelResponse(str(answer))


async def run_until_done(
    backend: Backend,
    tid: str,
    actor: Crashy,
    judge: Crashy | None,
    extra: tuple[Tool, ...] = (),
) -> tuple[Store, str]:
    """Run the task, restarting on a fresh store handle after every crash, until a run
    ends; returns the last handle (open) and the final status."""
    for _ in range(10):
        store = await backend.open()
        registry = registry_of(store, extra)
        engine = Engine(store, ModelSet(actor, judge=judge), registry=registry, lease_ttl=30)
        try:
            result = await engine.run(tid, force=True)
        except SystemExit:
            if backend.durable:
                await store.close()
            continue
        return store, result.status
    raise AssertionError("the task never finished a run")


def registry_of(store: Store, extra: tuple[Tool, ...] = ()) -> ToolRegistry:
    """The built-in tools on this store handle, and `extra`."""
    registry = default_registry(lambda: store)
    for t in extra:
        registry.add(t)
    return registry


def next_of(request: ModelRequest) -> str | None:
    return request.ledger["next"] if request.ledger else None


def last_tool_text(request: ModelRequest) -> str:
    for m in reversed(request.messages):
        if m.role == "tool":
            return m.content
    return ""


# --- the converging fixer ------------------------------------------------------------------

BUGS = ("parse", "render", "save")


def runner_tool(workspace: Path) -> Tool:
    """`run_tests`: fails while any `fixes/<bug>.txt` is missing, saying how many tests
    failed, with a timing and a timestamp that change on every run."""
    runs = {"n": 0}

    @tool(effect="read")
    def run_tests() -> str:
        runs["n"] += 1
        broken = [b for b in BUGS if not (workspace / "fixes" / f"{b}.txt").exists()]
        took = f"{0.1 + runs['n'] / 100:.2f}s"
        if broken:
            raise AssertionError(
                f"{len(broken)} failed, {len(BUGS) - len(broken)} passed in {took} "
                f"(run at 2026-12-0{runs['n'] % 9 + 1}T10:0{runs['n'] % 10}:00Z)"
            )
        return f"{len(BUGS)} passed in {took}"

    return run_tests


def fixer(request: ModelRequest) -> ModelResponse:
    """Runs the tests; after a failure fixes one bug; after a fix runs the tests again."""
    if next_of(request) is None:
        return ModelResponse("all green")
    last = last_tool_text(request)
    m = re.search(r"(\d+) failed", last)
    if m is None:
        return ModelResponse("running the tests", (tool_call("run_tests"),))
    bug = BUGS[len(BUGS) - int(m.group(1))]
    return ModelResponse(
        f"fixing {bug}", (tool_call("write_file", path=f"fixes/{bug}.txt", content="fixed\n"),)
    )


def fixer_spec() -> TaskSpec:
    return parse_spec(
        {
            "objective": "make the tests pass",
            "items": [
                {
                    "id": "green",
                    "title": "the tests pass",
                    "done_when": {"kind": "op", "tool": "run_tests"},
                }
            ],
            "tools": ["run_tests", "write_file", "read_file"],
            "models": {"judge": "rules"},
        }
    )


@pytest.mark.parametrize("crash_at", [set(), {3, 6}], ids=["straight", "crashes"])
async def test_a_converging_fixer_finishes_at_default_limits(
    backend: Backend, tmp_path: Path, crash_at: set[int]
) -> None:
    """3 failed → 2 failed → 1 failed → passed: each run says something new, so the item
    is never blocked (before: non-convergent at the third failing run)."""
    spec = fixer_spec()
    store = await backend.open()
    tid = (await create_task(store, spec, workspace=tmp_path)).task_id
    if backend.durable:
        await store.close()
    actor = Crashy("fixer", fixer, crash_at)
    store, status = await run_until_done(backend, tid, actor, None, (runner_tool(tmp_path),))
    try:
        led = await ledger_of(store, tid)
        assert status == "satisfied", led.item("green").note
        assert led.item("green").status == "done"
        # Four test runs and three fixes: crashes before a round cost no round.
        rounds = await events_of(store, tid, "round.committed")
        assert len(rounds) == 7
        assert not [w for w in await events_of(store, tid, "audit.warning")]
    finally:
        await store.close()


async def test_the_converging_run_replays_clean(backend: Backend, tmp_path: Path) -> None:
    store = await backend.open()
    try:
        tid = (await create_task(store, fixer_spec(), workspace=tmp_path)).task_id
        registry = registry_of(store, (runner_tool(tmp_path),))
        engine = Engine(store, ModelSet(ScriptedModel(policy=fixer)), registry=registry)
        assert (await engine.run(tid)).status == "satisfied"
        result = await replay_task(store, tid, registry=registry)
        assert result.divergence is None, result.divergence
        assert result.rounds == 7
    finally:
        await store.close()


# --- the same read again -------------------------------------------------------------------


def rereader(request: ModelRequest) -> ModelResponse:
    """Checks the same config file every round for `deploy`; writes `announce` honestly."""
    nxt = next_of(request)
    if nxt == "deploy":
        return ModelResponse("checking the config", (tool_call("read_file", path="config.txt"),))
    if nxt == "announce":
        return ModelResponse(
            "announcing", (tool_call("write_file", path="out/announce.txt", content="hi\n"),)
        )
    return ModelResponse("done")


def attaching_judge(request: ModelRequest) -> str:
    """Attaches every successful op of the round to the focus item as progress."""
    data = json.loads(request.messages[0].content)
    refs = [o["evidence_ref"] for o in data["op_journal"] if o["status"] == "succeeded"]
    focus = data["focus_item"]
    changes = [{"item": focus, "status": "in_progress", "evidence": refs}] if refs else []
    return json.dumps({"changes": changes, "decision": "continue", "reason": "progress"})


def rereader_spec() -> TaskSpec:
    return parse_spec(
        {
            "objective": "deploy, then announce",
            "items": [
                {"id": "deploy", "title": "deploy the service"},
                {
                    "id": "announce",
                    "title": "announce it",
                    "done_when": {"kind": "op", "tool": "write_file"},
                },
            ],
            "tools": ["read_file", "write_file"],
        }
    )


@pytest.mark.parametrize(
    ("crash_actor", "crash_judge"),
    [(set(), set()), ({3, 5}, set()), (set(), {2, 3})],
    ids=["straight", "crash-between-rounds", "crash-before-the-verdict"],
)
async def test_the_same_read_again_is_blocked_after_the_same_rounds_across_crashes(
    backend: Backend,
    tmp_path: Path,
    crash_actor: set[int],
    crash_judge: set[int],
) -> None:
    """The first read is new; every repeat (same call, same result) is not, even with a
    judge attaching it as progress. A crash between rounds, or after the round's results
    were committed but before its verdict, loses none of what the item has seen."""
    (tmp_path / "config.txt").write_text("replicas: 3\n")
    spec = rereader_spec()
    store = await backend.open()
    tid = (await create_task(store, spec, workspace=tmp_path)).task_id
    if backend.durable:
        await store.close()
    actor = Crashy("actor", rereader, crash_actor)
    judge = Crashy("judge", attaching_judge, crash_judge)
    store, status = await run_until_done(backend, tid, actor, judge)
    try:
        assert status == "waiting"
        led = await ledger_of(store, tid)
        deploy = led.item("deploy")
        assert deploy.status == "blocked"
        assert deploy.note.startswith(f"no progress in {spec.limits.no_progress_rounds} rounds")
        assert led.item("announce").status == "done"
        started = await events_of(store, tid, "round.started")
        assert sum(1 for r in started if r["item"] == "deploy") == (
            1 + spec.limits.no_progress_rounds
        )
        verdicts = await events_of(store, tid, "judge.verdict")
        assert len({v["round"] for v in verdicts}) == len(verdicts)  # each round judged once
        task = await store.get_task(tid)
        # Once blocked, the item's memory is dropped: the state carries only open items.
        assert "deploy" not in task.usage.get("seen", {})
    finally:
        await store.close()


async def test_the_blocked_rereader_replays_clean(backend: Backend, tmp_path: Path) -> None:
    """Replay judges every round again from the recorded results: the same rounds move
    nothing and the item is blocked in the same round."""
    (tmp_path / "config.txt").write_text("replicas: 3\n")
    store = await backend.open()
    try:
        tid = (await create_task(store, rereader_spec(), workspace=tmp_path)).task_id
        models = ModelSet(
            ScriptedModel(policy=rereader), judge=ScriptedModel(policy=attaching_judge)
        )
        result = await Engine(store, models, registry=registry_of(store)).run(tid)
        assert result.status == "waiting"
        replayed = await replay_task(store, tid)
        assert replayed.divergence is None, replayed.divergence
        assert replayed.rounds == len(await events_of(store, tid, "round.committed"))
    finally:
        await store.close()


# --- waiting on the world: the same status again ------------------------------------------

#: How many times the build says "running" before it passes: more than the rounds without
#: progress an item may have, fewer than its rounds cap.
RUNNING = 30


def build_tools(volatile: bool | None = None) -> tuple[Tool, ...]:
    """`start_build` and `build_status` (a read whose answer changes by itself, unless
    `volatile=False` says otherwise): "running" `RUNNING` times, then "passed"."""
    polls = {"n": 0}

    @tool(effect="write", idempotent=True)
    def start_build() -> str:
        return "build #7 started"

    @tool(effect="read", volatile=volatile)
    def build_status() -> str:
        polls["n"] += 1
        return "build #7: running" if polls["n"] <= RUNNING else "build #7: passed"

    return start_build, build_status


def poller(request: ModelRequest) -> ModelResponse:
    """Starts the build, asks its status until it passes, then records the result."""
    if next_of(request) is None:
        return ModelResponse("recorded")
    last = last_tool_text(request)
    if "passed" in last:
        call = tool_call("write_file", path="out/build.txt", content="build #7 passed\n")
        return ModelResponse("recording it", (call,))
    if "build #7" in last:
        return ModelResponse("still waiting on the build", (tool_call("build_status"),))
    return ModelResponse("starting the build", (tool_call("start_build"),))


def poller_spec(tools: tuple[str, ...] = ("start_build", "build_status", "write_file")) -> TaskSpec:
    return parse_spec(
        {
            "objective": "build, and record that it passed",
            "items": [
                {
                    "id": "build",
                    "title": "the build passed and is recorded",
                    "done_when": {"kind": "file", "path": "out/build.txt", "contains": "passed"},
                }
            ],
            "tools": list(tools),
        }
    )


@pytest.mark.parametrize(
    ("crash_actor", "crash_judge"),
    [(set(), set()), ({4, 17}, set()), (set(), {5, 20})],
    ids=["straight", "crash-between-rounds", "crash-before-the-verdict"],
)
async def test_polling_a_status_that_changes_by_itself_finishes_at_default_limits(
    backend: Backend, tmp_path: Path, crash_actor: set[int], crash_judge: set[int]
) -> None:
    """Thirty identical "running" answers are waiting, not rounds without progress: the
    item is never blocked, across crashes too, and every round is judged once."""
    spec = poller_spec()
    store = await backend.open()
    tid = (await create_task(store, spec, workspace=tmp_path)).task_id
    if backend.durable:
        await store.close()
    actor = Crashy("poller", poller, crash_actor)
    judge = Crashy("judge", attaching_judge, crash_judge)
    store, status = await run_until_done(backend, tid, actor, judge, build_tools())
    try:
        led = await ledger_of(store, tid)
        assert status == "satisfied", led.item("build").note
        rounds = await events_of(store, tid, "round.committed")
        assert len(rounds) == 1 + RUNNING + 1 + 1
        assert not [w for w in await events_of(store, tid, "audit.warning")]
        verdicts = await events_of(store, tid, "judge.verdict")
        assert len({v["round"] for v in verdicts}) == len(verdicts)
    finally:
        await store.close()


def failing_status_tools(
    fail: Callable[[], Exception], volatile: bool | None = None
) -> tuple[Tool, ...]:
    """`start_build` and `build_status`, whose status fails with `fail()` for its first 24
    calls (eight rounds of three tries, retried at once), then says "passed"."""
    calls = {"n": 0}

    @tool(effect="write", idempotent=True)
    def start_build() -> str:
        return "build #7 started"

    @tool(effect="read", volatile=volatile, retry=RetryPolicy(base_delay=0.001, max_delay=0.001))
    def build_status() -> str:
        calls["n"] += 1
        if calls["n"] <= 24:
            raise fail()
        return "build #7: passed"

    return start_build, build_status


def index_tools() -> tuple[Tool, ...]:
    """The status says "not now" (`RetryLater`) through eight rounds."""
    return failing_status_tools(lambda: errors.RetryLater("build #7 still running", delay=0.001))


def later_poller(request: ModelRequest) -> ModelResponse:
    """`poller`, hearing "still running" as an error."""
    last = last_tool_text(request)
    if "still running" in last:
        return ModelResponse("still waiting on the build", (tool_call("build_status"),))
    return poller(request)


def outage_tools(volatile: bool | None = None) -> tuple[Tool, ...]:
    """The status's service answers HTTP 503 (a transient failure) through an outage of
    eight of the model's polls."""
    return failing_status_tools(
        lambda: errors.ToolFailed("HTTP 503: scheduled maintenance", retryable=True), volatile
    )


def outage_poller(request: ModelRequest) -> ModelResponse:
    """`poller`, asking again through the outage."""
    if "503" in last_tool_text(request):
        return ModelResponse("the service is down; asking again", (tool_call("build_status"),))
    return poller(request)


@pytest.mark.parametrize("why", ["not-now", "outage"])
@pytest.mark.parametrize(
    ("crash_at", "crash_judge"),
    [(set(), set()), ({4, 7}, set()), (set(), {3, 6})],
    ids=["straight", "crash-between-rounds", "crash-before-the-verdict"],
)
async def test_a_status_that_cannot_answer_yet_is_waiting_across_crashes(
    backend: Backend, tmp_path: Path, crash_at: set[int], crash_judge: set[int], why: str
) -> None:
    """Eight rounds whose poll ends, after its retries, in `RetryLater` or in a transient
    failure of a volatile read (a 503 through an outage): its "not now", waiting, never
    the same failure repeated (non-convergent), after a crash too (the op keeps it)."""
    policy, tools = (
        (later_poller, index_tools()) if why == "not-now" else (outage_poller, outage_tools())
    )
    store = await backend.open()
    tid = (await create_task(store, poller_spec(), workspace=tmp_path)).task_id
    if backend.durable:
        await store.close()
    actor = Crashy("poller", policy, crash_at)
    judge = Crashy("judge", attaching_judge, crash_judge)
    store, status = await run_until_done(backend, tid, actor, judge, tools)
    try:
        led = await ledger_of(store, tid)
        assert status == "satisfied", led.item("build").note
        assert led.item("build").attempts == 0
        assert len(await events_of(store, tid, "round.committed")) == 1 + 8 + 1 + 1
    finally:
        await store.close()


async def test_an_outage_of_a_read_that_does_not_change_by_itself_is_non_convergent(
    backend: Backend, tmp_path: Path
) -> None:
    store = await backend.open()
    try:
        tid = (await create_task(store, poller_spec(), workspace=tmp_path)).task_id
        registry = registry_of(store, outage_tools(volatile=False))
        engine = Engine(store, ModelSet(ScriptedModel(policy=outage_poller)), registry=registry)
        assert (await engine.run(tid)).status == "waiting"
        item = (await ledger_of(store, tid)).item("build")
        assert item.status == "blocked"
        assert item.note.startswith("non-convergent: build_status failed 3 times"), item.note
    finally:
        await store.close()


async def test_a_poll_of_what_only_the_task_changes_is_blocked_as_before(
    backend: Backend, tmp_path: Path
) -> None:
    """The same poller against a status the tool says does not change by itself
    (`volatile=False`): the same answer is no progress, blocked after the usual rounds."""
    spec = poller_spec()
    store = await backend.open()
    try:
        tid = (await create_task(store, spec, workspace=tmp_path)).task_id
        registry = registry_of(store, build_tools(volatile=False))
        engine = Engine(store, ModelSet(ScriptedModel(policy=poller)), registry=registry)
        assert (await engine.run(tid)).status == "waiting"
        item = (await ledger_of(store, tid)).item("build")
        assert item.status == "blocked"
        assert item.note.startswith(f"no progress in {spec.limits.no_progress_rounds} rounds")
        rounds = await events_of(store, tid, "round.committed")
        assert len(rounds) == 2 + spec.limits.no_progress_rounds
    finally:
        await store.close()


async def test_a_wait_that_never_ends_is_blocked_at_the_rounds_cap_and_replays_clean(
    backend: Backend, tmp_path: Path
) -> None:
    """A build that runs forever: the item is blocked at `max_rounds_per_item`, saying
    it was still asking with the same answers; the recorded run replays clean."""
    spec = poller_spec()
    store = await backend.open()
    try:
        tid = (await create_task(store, spec, workspace=tmp_path)).task_id
        start, status_tool = build_tools()
        forever = tool(lambda: "build #7: running", name="build_status", effect="read")
        registry = registry_of(store, (start, forever))
        engine = Engine(store, ModelSet(ScriptedModel(policy=poller)), registry=registry)
        assert (await engine.run(tid)).status == "waiting"
        item = (await ledger_of(store, tid)).item("build")
        cap = spec.limits.max_rounds_per_item
        assert item.status == "blocked"
        assert item.note == (
            f"not finished in {cap} rounds (limits.max_rounds_per_item); still asking again "
            "with the same answers"
        )
        assert len(await events_of(store, tid, "round.committed")) == cap
        replayed = await replay_task(store, tid, registry=registry)
        assert replayed.divergence is None, replayed.divergence
        assert status_tool.volatile and forever.volatile
    finally:
        await store.close()


class Refused(Exception):
    """An HTTP client's error for a refused request, as `httpx.HTTPStatusError` carries
    it: the status and the response's headers."""

    def __init__(self, status: int, headers: dict[str, str]) -> None:
        super().__init__(f"{status} maintenance")
        self.status_code = status
        self.response = type("Response", (), {"headers": headers, "status_code": status})()


def maintenance_tools(headers: dict[str, str], outage: int) -> tuple[Tool, ...]:
    """`publish`, a write whose service answers 503 (with `headers`) to its first
    `outage` x 3 requests (tether's three attempts per call), then takes it."""
    calls = {"n": 0}

    @tool(effect="write", idempotent=True, retry=RetryPolicy(base_delay=0.001, max_delay=0.001))
    def publish() -> str:
        calls["n"] += 1
        if calls["n"] <= outage * 3:
            raise Refused(503, headers)
        return "published: build #7 passed"

    return (publish,)


def publisher(request: ModelRequest) -> ModelResponse:
    """Publishes until the service takes it, then records it."""
    last = last_tool_text(request)
    if "published" in last:
        call = tool_call("write_file", path="out/build.txt", content="build #7 passed\n")
        return ModelResponse("recording it", (call,))
    if next_of(request) is None:
        return ModelResponse("recorded")
    return ModelResponse("publishing (again)", (tool_call("publish"),))


@pytest.mark.parametrize(
    "headers", [{"Retry-After": "1", "retry-after-ms": "5"}, {}], ids=["retry-after", "bare"]
)
async def test_a_write_the_service_asks_to_retry_later_is_no_loop(
    backend: Backend, tmp_path: Path, headers: dict[str, str]
) -> None:
    """A maintenance window outlasting tether's retries of a write four times: with a
    `Retry-After` the service said when to come back, so trying again is not the same
    failure repeated and the item finishes; a bare 503 of a tool that is not volatile is
    non-convergent at the third, as before."""
    spec = poller_spec(("publish", "write_file"))
    store = await backend.open()
    try:
        tid = (await create_task(store, spec, workspace=tmp_path)).task_id
        registry = registry_of(store, maintenance_tools(headers, 4))
        engine = Engine(store, ModelSet(ScriptedModel(policy=publisher)), registry=registry)
        result = await engine.run(tid)
        item = (await ledger_of(store, tid)).item("build")
        if headers:
            assert result.status == "satisfied", item.note
            replayed = await replay_task(store, tid, registry=registry)
            assert replayed.divergence is None, replayed.divergence
        else:
            assert item.status == "blocked"
            assert item.note.startswith("non-convergent: publish failed 3 times"), item.note
    finally:
        await store.close()


def not_ready_tools(fails: int | None) -> tuple[Tool, ...]:
    """`start_build`, and `build_status` failing "build #7 not ready" as a plain
    (deterministic) failure, `ToolFailed`, not "not now", `fails` times (None: forever),
    then "passed": how many job APIs and MCP servers say it."""
    calls = {"n": 0}

    @tool(effect="write", idempotent=True)
    def start_build() -> str:
        return "build #7 started"

    @tool(effect="read")
    def build_status() -> str:
        calls["n"] += 1
        if fails is None or calls["n"] <= fails:
            raise errors.ToolFailed("build #7 not ready")
        return "build #7: passed"

    return start_build, build_status


def blind_poller(request: ModelRequest) -> ModelResponse:
    """Asks for the build's status without ever starting it."""
    if "passed" in last_tool_text(request):
        return poller(request)
    return ModelResponse("is it done?", (tool_call("build_status"),))


async def test_a_jobs_not_ready_after_starting_it_is_waiting_not_a_loop(
    backend: Backend, tmp_path: Path
) -> None:
    """The job's status fails "not ready" (a plain failure) twelve times after the item
    started the job: asking again is waiting on its own work, not the same failure
    repeated (non-convergent at the third) nor rounds without progress."""
    store = await backend.open()
    try:
        tid = (await create_task(store, poller_spec(), workspace=tmp_path)).task_id
        registry = registry_of(store, not_ready_tools(12))
        engine = Engine(store, ModelSet(ScriptedModel(policy=poller)), registry=registry)
        assert (await engine.run(tid)).status == "satisfied"
        assert len(await events_of(store, tid, "round.committed")) == 1 + 12 + 1 + 1
        replayed = await replay_task(store, tid, registry=registry)
        assert replayed.divergence is None, replayed.divergence
    finally:
        await store.close()


async def test_a_job_never_ready_is_blocked_at_the_cap_and_unstarted_at_the_third(
    backend: Backend, tmp_path: Path
) -> None:
    """Bounds of the rule above: a job that never gets ready blocks the item at
    `max_rounds_per_item`, and asking for one never started is the same failure repeated,
    non-convergent at `same_failure_repeats`, as before. Neither records the result."""
    spec = poller_spec()
    store = await backend.open()
    try:
        forever = (await create_task(store, spec, workspace=tmp_path / "a")).task_id
        registry = registry_of(store, not_ready_tools(None))
        engine = Engine(store, ModelSet(ScriptedModel(policy=poller)), registry=registry)
        assert (await engine.run(forever)).status == "waiting"
        item = (await ledger_of(store, forever)).item("build")
        assert item.status == "blocked"
        assert item.note.startswith(f"not finished in {spec.limits.max_rounds_per_item} rounds")
        assert len(await events_of(store, forever, "round.committed")) == (
            spec.limits.max_rounds_per_item
        )
        blind = (await create_task(store, spec, workspace=tmp_path / "b")).task_id
        engine = Engine(store, ModelSet(ScriptedModel(policy=blind_poller)), registry=registry)
        assert (await engine.run(blind)).status == "waiting"
        item = (await ledger_of(store, blind)).item("build")
        assert item.note.startswith("non-convergent: build_status failed 3 times"), item.note
        assert not (tmp_path / "a" / "out").exists() and not (tmp_path / "b" / "out").exists()
    finally:
        await store.close()


# --- the task's own work writing the workspace: a log, an output file ----------------------

#: How many polls of the workspace hear the same thing before the build finishes: more
#: than the rounds without progress an item may have, fewer than its rounds cap.
QUIET = 20


def job_tools(workspace: Path, output: bool) -> tuple[Tool, ...]:
    """`start_build`: the task's own build (a write tool, not tether's), which logs
    "compiling" to logs/build.log and, with `output`, will write out/report.csv only
    when it finishes (the test finishes it: `finish_build`)."""

    @tool(effect="write", idempotent=True)
    def start_build() -> str:
        (workspace / "logs").mkdir(exist_ok=True)
        (workspace / "logs/build.log").write_text("compiling 214 files\n")
        return "build started; it logs to logs/build.log" + (
            " and writes out/report.csv when done" if output else ""
        )

    return (start_build,)


def finish_build(workspace: Path) -> None:
    """The background build finishes: its last log line and its output."""
    with (workspace / "logs/build.log").open("a") as log:
        log.write("BUILD OK\n")
    (workspace / "out").mkdir(exist_ok=True)
    (workspace / "out/report.csv").write_text("total\n200\n")


def workspace_poller(
    workspace: Path, path: str, polls: int | None = QUIET, start: bool = True
) -> Policy:
    """Starts the build (unless not `start`), then reads `path` until it shows the build
    done, and records it. The build finishes once `polls` reads heard the same (never
    when None)."""
    state = {"reads": 0, "started": not start}

    def policy(request: ModelRequest) -> ModelResponse:
        if next_of(request) is None:
            return ModelResponse("recorded")
        last = last_tool_text(request)
        if "BUILD OK" in last or "200" in last:
            call = tool_call("write_file", path="out/build.txt", content="build passed\n")
            return ModelResponse("recording it", (call,))
        if not state["started"]:
            state["started"] = True
            return ModelResponse("starting the build", (tool_call("start_build"),))
        if polls is not None and state["reads"] == polls:
            finish_build(workspace)
        state["reads"] += 1
        return ModelResponse("is it done?", (tool_call("read_file", path=path),))

    return policy


def build_spec() -> TaskSpec:
    """The poller's contract with the build's workspace read instead of a status tool."""
    return poller_spec(("start_build", "read_file", "write_file"))


@pytest.mark.parametrize("path", ["logs/build.log", "out/report.csv"], ids=["log", "output"])
@pytest.mark.parametrize(
    ("crash_actor", "crash_judge"),
    [(set(), set()), ({4, 15}, set()), (set(), {5, 12})],
    ids=["straight", "crash-between-rounds", "crash-before-the-verdict"],
)
async def test_reading_what_the_tasks_own_build_writes_is_waiting(
    backend: Backend, tmp_path: Path, path: str, crash_actor: set[int], crash_judge: set[int]
) -> None:
    """After the item started a build of its own, its log read again with nothing new
    (a quiet phase), or its output file still missing, is waiting on that work, not a
    loop: the item finishes at default limits, never blocked nor non-convergent, across
    crashes too (the item's marks say the work was started)."""
    spec = build_spec()
    store = await backend.open()
    tid = (await create_task(store, spec, workspace=tmp_path)).task_id
    if backend.durable:
        await store.close()
    actor = Crashy("poller", workspace_poller(tmp_path, path), crash_actor)
    judge = Crashy("judge", attaching_judge, crash_judge)
    tools = job_tools(tmp_path, output=True)
    store, status = await run_until_done(backend, tid, actor, judge, tools)
    try:
        led = await ledger_of(store, tid)
        assert status == "satisfied", led.item("build").note
        assert led.item("build").attempts == 0
        # Started, QUIET polls heard the same, one heard it done, recorded.
        rounds = await events_of(store, tid, "round.committed")
        assert len(rounds) == 1 + QUIET + 1 + 1
        assert not [w for w in await events_of(store, tid, "audit.warning")]
    finally:
        await store.close()


@pytest.mark.parametrize("path", ["logs/build.log", "out/report.csv"], ids=["log", "output"])
async def test_a_build_that_never_finishes_is_blocked_at_the_rounds_cap_and_replays_clean(
    backend: Backend, tmp_path: Path, path: str
) -> None:
    spec = build_spec()
    store = await backend.open()
    try:
        tid = (await create_task(store, spec, workspace=tmp_path)).task_id
        registry = registry_of(store, job_tools(tmp_path, output=True))
        policy = workspace_poller(tmp_path, path, polls=None)
        engine = Engine(store, ModelSet(ScriptedModel(policy=policy)), registry=registry)
        assert (await engine.run(tid)).status == "waiting"
        item = (await ledger_of(store, tid)).item("build")
        cap = spec.limits.max_rounds_per_item
        assert item.status == "blocked"
        assert item.note.startswith(
            f"not finished in {cap} rounds (limits.max_rounds_per_item); still asking again "
            "with the same answers"
        )
        if path.endswith(".csv"):  # what the wait kept hearing
            assert item.note.endswith("; last error: no such file: out/report.csv")
        assert len(await events_of(store, tid, "round.committed")) == cap
        replayed = await replay_task(store, tid, registry=registry)
        assert replayed.divergence is None, replayed.divergence
    finally:
        await store.close()


@pytest.mark.parametrize("path", ["logs/build.log", "out/report.csv"], ids=["log", "output"])
async def test_without_work_of_its_own_the_same_workspace_read_is_a_loop(
    backend: Backend, tmp_path: Path, path: str
) -> None:
    """No build started by the item (the log was there before, the output never comes):
    re-reading the log is no progress, and the missing file failing the same way again is
    non-convergent, after the usual rounds."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs/build.log").write_text("compiling 214 files\n")
    spec = build_spec()
    store = await backend.open()
    try:
        tid = (await create_task(store, spec, workspace=tmp_path)).task_id
        registry = registry_of(store, job_tools(tmp_path, output=True))
        policy = workspace_poller(tmp_path, path, polls=None, start=False)
        engine = Engine(store, ModelSet(ScriptedModel(policy=policy)), registry=registry)
        assert (await engine.run(tid)).status == "waiting"
        item = (await ledger_of(store, tid)).item("build")
        assert item.status == "blocked"
        rounds = len(await events_of(store, tid, "round.committed"))
        if path.endswith(".log"):
            assert item.note.startswith(f"no progress in {spec.limits.no_progress_rounds} rounds")
            assert rounds == 1 + spec.limits.no_progress_rounds
        else:
            assert item.note.startswith("non-convergent: read_file failed 3 times"), item.note
            assert rounds == spec.limits.same_failure_repeats
    finally:
        await store.close()


# --- drafts and deliverables ---------------------------------------------------------------

DRAFTS = ("notes v1\n", "notes v2, fuller\n", "notes v3, final\n")


def drafter(touch_after: bool) -> Policy:
    """Writes three drafts of out/notes.txt (reading each back), then the next item; with
    `touch_after`, also writes over the notes once while working on the next item."""
    state = {"n": 0, "touched": False}

    def policy(request: ModelRequest) -> ModelResponse:
        nxt = next_of(request)
        if nxt == "notes":
            n = state["n"]
            state["n"] += 1
            if n % 2 == 1:
                return ModelResponse(
                    "reading back", (tool_call("read_file", path="out/notes.txt"),)
                )
            draft = DRAFTS[min(n // 2, len(DRAFTS) - 1)]
            return ModelResponse(
                "drafting", (tool_call("write_file", path="out/notes.txt", content=draft),)
            )
        if nxt == "summary":
            calls = [tool_call("write_file", path="out/summary.txt", content="summary\n")]
            if touch_after and not state["touched"]:
                state["touched"] = True
                calls.insert(0, tool_call("write_file", path="out/notes.txt", content="oops\n"))
            return ModelResponse("summarising", tuple(calls))
        return ModelResponse("done")

    return policy


def drafts_judge(request: ModelRequest) -> str:
    """Attaches each draft as in-progress evidence; done when the final draft is written
    (citing it); `summary` done on its write."""
    data = json.loads(request.messages[0].content)
    changes = []
    for o in data["op_journal"]:
        if o["status"] != "succeeded" or o["tool"] != "write_file":
            continue
        path = o["args"]["path"]
        if path == "out/notes.txt" and data["focus_item"] == "notes":
            final = o["args"]["content"] == DRAFTS[-1]
            changes.append(
                {
                    "item": "notes",
                    "status": "done" if final else "in_progress",
                    "evidence": [o["evidence_ref"]],
                }
            )
        elif path == "out/summary.txt":
            changes.append({"item": "summary", "status": "done", "evidence": [o["evidence_ref"]]})
    return json.dumps({"changes": changes, "decision": "continue", "reason": ""})


@pytest.mark.parametrize("touch_after", [False, True], ids=["revised", "changed-after"])
async def test_drafts_are_revision_and_a_later_change_is_caught(
    tmp_path: Path, touch_after: bool
) -> None:
    from tether.store.memory import MemoryStore

    store = MemoryStore()
    spec = parse_spec(
        {
            "objective": "notes and a summary",
            "items": [
                {"id": "notes", "title": "write out/notes.txt"},
                {"id": "summary", "title": "write out/summary.txt"},
            ],
            "tools": ["read_file", "write_file"],
        }
    )
    tid = (await create_task(store, spec, workspace=tmp_path)).task_id
    models = ModelSet(
        ScriptedModel(policy=drafter(touch_after)), judge=ScriptedModel(policy=drafts_judge)
    )
    result = await Engine(store, models).run(tid)
    led = await ledger_of(store, tid)
    # The drafts stay cited; the item was accepted on the final one.
    assert len(led.item("notes").evidence) >= 1
    broken = [
        w for w in await events_of(store, tid, "audit.warning") if w["code"] == "deliverable_broken"
    ]
    if not touch_after:
        assert result.status == "satisfied", result
        assert len(led.item("notes").evidence) == len(DRAFTS)
        assert broken == []
        assert (tmp_path / "out" / "notes.txt").read_text() == DRAFTS[-1]
    else:
        # Written over after acceptance: caught before delivery and reopened.
        assert [w["details"]["item"] for w in broken][:1] == ["notes"]
        assert "notes" in broken[0]["message"]
