"""A steady round's store calls: its two commits, and no read of what the run wrote
itself (issue 22). The judge's indexes keep up from the run's own commits
(`judge.rules.own`) and read what came after the run's last commit (a tool's own commit
during the round) only when the run's store committed something for the task since,
once for both; a commit of someone else in between is still read and judged."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import tether
from tests.conftest import Backend
from tests.integration.test_judge_reads_flat import _steps_spec, _ticket_registry
from tests.support.loop import events_of, run_task
from tether import events as ev
from tether.artifacts import stored_event
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.rebuild import rebuild
from tether.runtime.judge.rules.own import OwnCommits
from tether.store.base import ArtifactRecord, CommitResult, OpRecord, Store, blob_hash
from tether.tools.builtin.files import default_registry


class Calls:
    """A store that counts every call by method, per round (the act calls so far)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.round = 0
        self.calls: dict[int, Counter[str]] = defaultdict(Counter)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[self.round][name] += 1
            return await attr(*args, **kwargs)

        return call

    def per_round(self, lo: int, hi: int) -> dict[str, float]:
        total: Counter[str] = Counter()
        for r in range(lo, hi):
            total.update(self.calls[r])
        return {k: v / (hi - lo) for k, v in sorted(total.items())}


def _actor(calls: Calls, on_next: Any = None) -> ScriptedModel:
    steps: dict[str, int] = {}

    def actor(request: ModelRequest) -> ModelResponse:
        calls.round += 1
        nxt = request.ledger["next"] if request.ledger else None
        if on_next is not None:
            on_next(nxt)
        if nxt is None:
            return ModelResponse("done")
        steps[nxt] = steps.get(nxt, 0) + 1
        return ModelResponse("filing", (tool_call("file_ticket", title=nxt, step=steps[nxt]),))

    return ScriptedModel(policy=actor, keep_requests=1)


async def test_a_steady_rule_judged_round_makes_its_two_commits_and_no_read(
    store: Store, tmp_path: Path
) -> None:
    """Each round: the decision with its op intent, then the results with the verdict.
    The judge's `op` rules and its undone-evidence check learn what changed from those
    commits, not by reading them back (nor the ops they wrote), and nothing came after
    them (was 2 reads, 2.12 with the undone-evidence check's, then 1)."""
    calls = Calls(store)
    spec = _steps_spec(items=6, steps=4)  # 24 rounds, an item done every 4th
    tid, result = await run_task(
        calls,  # type: ignore[arg-type]
        spec,
        tmp_path,
        _actor(calls),
        registry=_ticket_registry({}),
    )
    assert result.status == "satisfied"
    assert calls.round >= 24
    # Round 1 builds the indexes (a turn's reads); rounds 3 to 22 are steady.
    assert calls.per_round(3, 23) == {"commit": 2.0}
    assert (await rebuild(store, tid))["consistent"]


async def test_the_op_and_artifact_indexes_look_each_round_without_a_read(
    store: Store, tmp_path: Path
) -> None:
    """With an `artifact` rule open too, both indexes look each round: no read."""
    calls = Calls(store)
    spec = _steps_spec(items=4, steps=4)
    data = spec.model_dump(mode="json")
    data["items"].append(
        {
            "id": "zz",
            "title": "a report",
            "done_when": {"kind": "artifact", "name": "report", "min_count": 1},
        }
    )
    data["limits"]["max_rounds"] = 18
    _, result = await run_task(
        calls,  # type: ignore[arg-type]
        tether.parse_spec(data),
        tmp_path,
        _actor(calls),
        registry=_ticket_registry({}),
    )
    assert result.status == "waiting", result
    assert calls.per_round(3, 16) == {"commit": 2.0}


async def test_a_steady_round_without_rules_makes_its_two_commits_and_no_read(
    store: Store, tmp_path: Path
) -> None:
    """The peer benchmark's workload: one item no rule closes, a write tool each round."""
    calls = Calls(store)

    @tether.tool(effect="write", idempotent=True)
    def do_step(step: int, ctx: tether.ToolContext) -> str:
        """Process one record."""
        return ("x" * 63 + "\n") * 16

    def actor(request: ModelRequest) -> ModelResponse:
        calls.round += 1
        return ModelResponse(f"Step {calls.round}.", (tool_call("do_step", step=calls.round),))

    spec = tether.parse_spec(
        {
            "name": "steps",
            "objective": "do the steps",
            "items": [{"id": "work", "title": "Process every record"}],
            "tools": ["do_step"],
            "models": {"judge": "rules"},
            "limits": {
                "max_rounds": 20,
                "no_progress_rounds": 10**9,
                "max_attempts_per_item": 10**9,
                "max_rounds_per_item": None,
            },
            "context": {"preview_chars": 2000},
        }
    )
    _, result = await run_task(
        calls,  # type: ignore[arg-type]
        spec,
        tmp_path,
        ScriptedModel(policy=actor, keep_requests=1),
        registry=tether.ToolRegistry([do_step]),
    )
    assert result.status == "waiting"
    assert calls.per_round(3, 19) == {"commit": 2.0}


async def test_an_op_undone_by_someone_else_mid_run_is_judged(store: Store, tmp_path: Path) -> None:
    """A commit of another process between two of the run's own (here an op that proved
    an item marked done by hand, i.e. history only) leaves a hole in the run's numbers:
    the judge reads what it missed, and the item goes back to work."""
    calls = Calls(store)
    state: dict[str, Any] = {"armed": False, "done": False}
    tid_box: list[str] = []

    def on_next(nxt: str | None) -> None:
        if nxt == "t2" and not state["done"]:
            state["armed"] = True  # t1 is done: before the run's next commit, undo it

    real_commit = store.commit

    async def commit(task_id: str, token: int | None, events: Any, **parts: Any) -> CommitResult:
        if state["armed"] and token is not None:
            state["armed"], state["done"] = False, True
            proof = next(
                o
                for o in await store.get_ops(task_id, statuses={"succeeded"})
                if o.args.get("title") == "t1"
                and o.args.get("step") == 2  # the op t1's rule matched
            )
            undone = dataclasses.replace(
                proof, result={**(proof.result or {}), "compensation": "done_by_hand"}
            )
            tid_box.append(proof.op_id)
            await real_commit(
                task_id,
                None,
                [ev.OpCompensated(op_id=proof.op_id, by="alice", outcome="done_by_hand")],
                ops=[undone],
            )
        return await real_commit(task_id, token, events, **parts)

    store.commit = commit  # type: ignore[method-assign]
    try:
        tid, _ = await run_task(
            calls,  # type: ignore[arg-type]
            _steps_spec(items=3, steps=2),
            tmp_path,
            _actor(calls, on_next),
            registry=_ticket_registry({}),
            max_rounds_this_run=5,
        )
    finally:
        del store.commit
    assert state["done"], "the foreign commit was made"
    verdicts = await events_of(store, tid, "judge.verdict")
    reopened = [
        v["round"]
        for v in verdicts
        for c in v["changes"]
        if c.get("item") == "t1" and c.get("field") == "status" and c.get("before") == "done"
    ]
    assert reopened, [(v["round"], c) for v in verdicts for c in v["changes"]]


async def test_a_tools_own_commit_during_the_round_is_judged_with_the_round(
    store: Store, tmp_path: Path
) -> None:
    """A tool that commits through the run's store itself (as the source tools do: a
    snapshot, a claim) is judged with its round: that round's judge reads what came
    after the run's last commit, and finds the artifact the tool stored."""
    calls = Calls(store)

    @tether.tool(effect="write", idempotent=True)
    async def publish(ctx: tether.ToolContext) -> str:
        """Publish the report (stored by the tool itself, under the run's token)."""
        data = b"the report"
        art = ArtifactRecord(
            artifact_id=f"{ctx.op_id}.report",
            task_id=ctx.task_id,
            kind="report",
            name="report",
            blob_hash=blob_hash(data),
            size=len(data),
            source=ctx.op_id,
            task_version=ctx.task_version,
        )
        await calls.commit(
            ctx.task_id, ctx.fencing_token, [stored_event(art)], artifacts=[art], blobs=[data]
        )
        return "published"

    data = _steps_spec(items=2, steps=4).model_dump(mode="json")
    data["items"].append(
        {"id": "rep", "title": "the report", "done_when": {"kind": "artifact", "name": "report"}}
    )
    data["tools"].append("publish")
    registry = _ticket_registry({})
    registry.add(publish)
    steps: dict[str, int] = {}

    def actor(request: ModelRequest) -> ModelResponse:
        calls.round += 1
        nxt = request.ledger["next"] if request.ledger else None
        if nxt is None:
            return ModelResponse("done")
        if nxt == "rep":
            return ModelResponse("publishing", (tool_call("publish"),))
        steps[nxt] = steps.get(nxt, 0) + 1
        return ModelResponse("filing", (tool_call("file_ticket", title=nxt, step=steps[nxt]),))

    tid, result = await run_task(
        calls,  # type: ignore[arg-type]
        tether.parse_spec(data),
        tmp_path,
        ScriptedModel(policy=actor, keep_requests=1),
        registry=registry,
    )
    assert result.status == "satisfied", result
    (op,) = [o for o in await store.get_ops(tid, statuses={"succeeded"}) if o.tool == "publish"]
    done_in = [
        v["round"]
        for v in await events_of(store, tid, "judge.verdict")
        for c in v["changes"]
        if c.get("item") == "rep" and c.get("field") == "status" and c.get("after") == "done"
    ]
    assert done_in == [op.round]
    # The steady rounds before read nothing; the publishing round reads.
    assert calls.per_round(3, 8) == {"commit": 2.0}
    assert calls.calls[9]["read_events"] >= 1, calls.calls


async def test_another_process_commit_during_the_round_is_judged_at_the_next_look(
    sql_backend: Backend, tmp_path: Path
) -> None:
    """A commit of another process (another store object) after the run's last commit is
    not read by that round's judge (the run's store committed nothing since): it is
    read at the next look, whose numbers skip it, as if it had come a moment later."""
    store, other = await sql_backend.open(), await sql_backend.open()
    state: dict[str, Any] = {"armed": False, "round": None}

    def on_next(nxt: str | None) -> None:
        if nxt == "t2" and state["round"] is None:
            state["armed"] = True

    @tether.tool(effect="write", idempotent=True)
    async def file_ticket(title: str, step: int, ctx: tether.ToolContext) -> str:
        """File one step of a ticket; once, someone undoes t1's proof meanwhile."""
        if state["armed"]:
            state["armed"], state["round"] = False, ctx.round
            proof = next(
                o
                for o in await other.get_ops(ctx.task_id, statuses={"succeeded"})
                if o.args.get("title") == "t1" and o.args.get("step") == 2
            )
            undone = dataclasses.replace(
                proof, result={**(proof.result or {}), "compensation": "done_by_hand"}
            )
            await other.commit(
                ctx.task_id,
                None,
                [ev.OpCompensated(op_id=proof.op_id, by="alice", outcome="done_by_hand")],
                ops=[undone],
            )
        return f"{title}#{step}"

    registry = default_registry(lambda: None)  # type: ignore[arg-type,return-value]
    registry.add(file_ticket)
    calls = Calls(store)
    try:
        tid, _ = await run_task(
            calls,  # type: ignore[arg-type]
            _steps_spec(items=3, steps=2),
            tmp_path,
            _actor(calls, on_next),
            registry=registry,
            max_rounds_this_run=6,
        )
        verdicts = await events_of(store, tid, "judge.verdict")
        assert (await rebuild(store, tid))["consistent"]
    finally:
        await store.close()
        await other.close()
    reopened = [
        v["round"]
        for v in verdicts
        for c in v["changes"]
        if c.get("item") == "t1" and c.get("field") == "status" and c.get("before") == "done"
    ]
    assert state["round"] is not None and reopened == [state["round"] + 1], (state, reopened)


def _op(op_id: str, status: str, **more: Any) -> OpRecord:
    return OpRecord(op_id, "t", 1, 0, "file_ticket", {"title": "x"}, "h", "write", status, **more)


def test_own_commits_answer_only_for_numbers_all_their_own() -> None:
    own = OwnCommits(("op.intended", "op.result"))
    intent = ev.OpIntended(op_id="a", tool="file_ticket", effect="write", round=1)
    own.add(
        CommitResult(11, 12, version=1),
        [intent, ev.RoundStarted(round=1, turn=1)],
        [_op("a", "intended")],
    )
    # The later write keeps the first write's arguments (as the store's merge does).
    later = dataclasses.replace(_op("a", "succeeded", result={"content": "ok"}), args={"y": 1})
    own.add(CommitResult(13, 13, version=1), [ev.OpCommitted(op_id="a", round=1)], [later])
    win = own.window(10, 13)
    assert win is not None
    assert [(e.seq, e.type) for e in win.events] == [(11, "op.intended")]
    stored = win.ops["a"]
    assert stored is not None and stored.status == "succeeded" and stored.args == {"title": "x"}
    assert stored.result == {"content": "ok"}
    assert own.window(12, 13) is not None
    assert own.window(9, 13) is None  # seq 10 is not the run's
    own.add(CommitResult(15, 15, version=1), [ev.OpCommitted(op_id="a", round=1)], [])
    assert own.window(13, 15) is None  # seq 14: someone else's commit
    # A commit the store added an event to (a request it closed) is not known whole.
    own.add(CommitResult(16, 17, version=1), [ev.OpCommitted(op_id="a", round=1)], [])
    assert own.window(15, 17) is None
    # An op first written before (no intent among the run's commits): the store is asked.
    own.add(
        CommitResult(18, 18, version=1),
        [ev.OpCommitted(op_id="b", round=1)],
        [_op("b", "succeeded")],
    )
    win = own.window(17, 18)
    assert win is not None and win.ops == {"b": None}


async def test_a_rule_judged_task_reads_little_besides_its_rounds(
    store: Store, tmp_path: Path
) -> None:
    """A fresh task judged by its rules, from its start to its delivery: its op index
    reads the ops and the approved modifications once (a person's modify decided before
    its first load must apply to an op that succeeds after it) and round 2 is steady
    already (round 1's op intents were kept); no user message is read (no LLM judge to
    hear them); a person's requests are read once (at the turn's start: nobody wrote
    since); the delivery check reads the cited ops, not every file write and approval."""
    calls = Calls(store)
    spec = _steps_spec(items=3, steps=2)  # 6 rounds
    _, result = await run_task(
        calls,  # type: ignore[arg-type]
        spec,
        tmp_path,
        _actor(calls),
        registry=_ticket_registry({}),
    )
    assert result.status == "satisfied"
    total: Counter[str] = Counter()
    for per in calls.calls.values():
        total.update(per)
    assert calls.per_round(2, 6) == {"commit": 2.0}
    assert total["get_approvals"] == 1  # the index's first load
    assert total["get_ops"] == 2  # the index's load, the delivery check's cited ops
    # Its launch record, its history at the turn's start, a person's requests (was 5:
    # the user messages and the requests again at the end too).
    assert total["read_events"] == 3
