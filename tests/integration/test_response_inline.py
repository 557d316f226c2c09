"""Each model call's response is stored once, inline in its `model.called` event (less
what the event's own fields record), and a round's messages document no longer names
it: the history, `show_call` and a replay read it back as the model gave it, a round
interrupted after its first commit resumes from it, and what an older tether stored
(its response blobs, an `inflight` naming one) still reads and resumes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import tether
from tests.support.loop import next_item, rules_judge
from tests.support.old_logs import old_call, set_event_data
from tether import approvals
from tether.models.base import Message, ModelRequest, ModelResponse, ToolCall, Usage
from tether.models.scripted import tool_call
from tether.report.calls import show_call
from tether.report.replay import replay_task
from tether.runtime.round import history
from tether.runtime.run.model_calls import response_doc
from tether.store.base import Store, TaskPatch, blob_hash
from tether.tools.builtin.files import default_registry

from ..conftest import Backend


class Given:
    """A model answering with `policy`'s responses exactly as they are (a latency is
    set on each, so the run measures none of its own), and keeping them."""

    def __init__(self, policy: Any, name: str = "given") -> None:
        self.policy = policy
        self.name = name
        self.given: list[ModelResponse] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """The policy's answer, kept."""
        response: ModelResponse = self.policy(request)
        self.given.append(response)
        return response


def _varied(n: int, text: str, calls: tuple[ToolCall, ...]) -> ModelResponse:
    """Responses whose fields differ from what their event says in every way one may:
    no model name (the event names the configured one), a latency finer than the
    microsecond the event keeps, retries, cache counts, a finish reason or none."""
    if n % 3 == 0:
        return ModelResponse(
            text,
            calls,
            Usage(input_tokens=900 + n, output_tokens=12, cached_input_tokens=300),
            "",
            1.2345678,
            None,
            attempts=2,
        )
    if n % 3 == 1:
        return ModelResponse(text, calls, Usage(40, 7), "m-1", 0.5, "tool_calls")
    return ModelResponse(text, calls, Usage(cache_write_tokens=3), "m-2", 3.0, "")


def _actor(request: ModelRequest) -> ModelResponse:
    nxt = next_item(request)
    n = sum(1 for m in request.messages if m.role == "assistant")
    if nxt is None:
        return _varied(n, "Everything in the ledger is closed.", ())
    return _varied(
        n, f"writing {nxt}", (tool_call("write_file", path=f"out/{nxt}.txt", content=nxt),)
    )


def _judge(request: ModelRequest) -> ModelResponse:
    # Named as the configured judge: a verdict records that name, which a replay takes
    # from the call's event (the answering model's), a difference of its own.
    return ModelResponse(rules_judge(request), (), Usage(30, 9), "judge", 0.25)


def _spec(items: int) -> tether.TaskSpec:
    return tether.parse_spec(
        {
            "objective": "write the files",
            "items": [
                {
                    "id": f"i{k}",
                    "title": f"write out/i{k}.txt",
                    "done_when": {"kind": "file", "path": f"out/i{k}.txt"},
                }
                for k in range(1, items + 1)
            ],
            "tools": ["write_file"],
        }
    )


async def test_each_response_is_stored_once_inline_and_reads_back_as_given(
    backend: Backend, tmp_path: Path
) -> None:
    store = await backend.open()
    try:
        actor, judge = Given(_actor), Given(_judge, "judge")
        tid = (await tether.create_task(store, _spec(4), workspace=tmp_path)).task_id
        engine = tether.Engine(store, tether.ModelSet(actor, judge=judge), lease_ttl=30)
        assert (await engine.run(tid)).status == "satisfied"
        calls = [e.data for e in await store.read_events(tid, types={"model.called"})]
        given = {"act": list(actor.given), "judge": list(judge.given)}
        assert len(calls) == len(given["act"]) + len(given["judge"]) >= 8
        for call in calls:
            was = given[call["purpose"]].pop(0)
            # Inline, once: no blob, and no field the event records said again.
            assert call["response"] and not call["response_blob"]
            assert not {"usage", "attempts"} & set(call["response"])
            assert ("model" in call["response"]) == (was.model == "")
            assert ("latency_ms" in call["response"]) == (was.latency_ms == 1.2345678)
            with pytest.raises(KeyError):
                await store.get_blob(blob_hash(json.dumps(response_doc(was)).encode()))
            # Read back as the model gave it.
            doc = history.called_response(call)
            assert doc == response_doc(was)
            assert ModelResponse.from_dict(json.loads(json.dumps(doc))) == was
            shown = await show_call(store, tid, call["call_id"])
            assert shown["response"] == json.loads(json.dumps(was.to_dict()))
            _, loaded = await history.load_call(store, tid, call["call_id"])
            assert loaded == doc
        # A round's messages name its tool calls' ops only; the assistant message is
        # its act call's response.
        rounds = await store.read_events(tid, types={"round.committed"})
        assert all(set(r.data["messages"]) == {"ref", "tools"} for r in rounds)
        assert all(r.data["messages"]["ref"] == history.ROUND_REF for r in rounds)
        # Each tool message's call id and name are the response's call's at its place.
        tools = [t for r in rounds for t in r.data["messages"]["tools"]]
        assert tools and all(set(t) == {"op"} for t in tools)
        entries = await history.load_entries(store, tid, snapshot=None, after_seq=0)
        said = [e.messages[0] for e in entries if e.kind == "round"]
        assert said == [Message("assistant", r.text, tool_calls=r.tool_calls) for r in actor.given]
        result = await replay_task(store, tid)
        assert result.divergence is None, result.divergence
    finally:
        if backend.durable:
            await store.close()


class Refunds:
    """A refund over 100 waits for a person's approval: the round's first commit (its
    decision and op intent) is stored, its results are not (`state.inflight`)."""

    def __init__(self) -> None:
        self.refunds: dict[str, int] = {}

    def tool(self) -> tether.Tool:
        @tether.tool(effect="write", idempotent=True)
        def refund(amount: int, ctx: tether.ToolContext) -> str:
            """Refund an amount; over 100 needs a human's approval."""
            if amount > 100 and not ctx.approved:
                raise tether.ApprovalRequired(f"a refund of {amount} is over the 100 limit")
            self.refunds[ctx.op_id] = amount
            return f"refunded {amount}"

        return refund


def _refunder(request: ModelRequest) -> ModelResponse:
    if any(m.role == "tool" for m in request.messages):
        return ModelResponse("done", (), Usage(5, 1), "m", 0.5)
    return ModelResponse(
        "refunding", (tether.tool_call("refund", amount=420),), Usage(9, 3), "m", 0.75
    )


async def _run_refund(store: Store, tid: str | None, pay: Refunds, tmp: Path) -> Any:
    spec = tether.parse_spec(
        {
            "objective": "refund the customer",
            "items": [
                {"id": "r", "title": "refund", "done_when": {"kind": "op", "tool": "refund"}}
            ],
            "tools": ["refund"],
            "models": {"judge": "rules"},
        }
    )
    if tid is None:
        tid = (await tether.create_task(store, spec, workspace=tmp)).task_id
    registry = default_registry(lambda: store)
    registry.add(pay.tool())
    engine = tether.Engine(store, tether.ModelSet(Given(_refunder)), registry=registry)
    return tid, await engine.run(tid)


@pytest.mark.parametrize("inflight", ["new", "older tether's"])
async def test_an_interrupted_round_resumes_from_its_stored_call(
    backend: Backend, tmp_path: Path, inflight: str
) -> None:
    store = await backend.open()
    try:
        pay = Refunds()
        tid, first = await _run_refund(store, None, pay, tmp_path)
        assert first.status == "waiting" and pay.refunds == {}
        task = await store.get_task(tid)
        state = task.usage["inflight"]
        # Which call, and where its event lies: not the response again.
        assert set(state) == {"round", "focus", "call", "after"}
        (called,) = [
            e
            for e in await store.read_events(tid, types={"model.called"})
            if e.data["call_id"] == state["call"]
        ]
        assert called.seq > state["after"] and called.data["response"]["text"] == "refunding"
        if inflight != "new":
            # What an older tether stored: the call's response as a blob, which its
            # `inflight` names (and, in a database, the event names it too).
            old = await old_call(store, dict(called.data))
            if backend.durable:
                set_event_data(backend, tid, called.seq, old)
            usage = {
                **task.usage,
                "inflight": {
                    "round": state["round"],
                    "focus": state["focus"],
                    "response_blob": old["response_blob"],
                },
            }
            await store.commit(tid, None, [], task=TaskPatch(usage=usage))
            assert "response_blob" in (await store.get_task(tid)).usage["inflight"]
        (req,) = await approvals.pending(store, tid)
        await approvals.decide(store, tid, req.request_id, "approve", by="ops")
        _, done = await _run_refund(store, tid, pay, tmp_path)
        assert done.status == "satisfied"
        assert list(pay.refunds.values()) == [420]
        assert (await store.get_task(tid)).usage.get("inflight") is None
        entries = await history.load_entries(store, tid, snapshot=None, after_seq=0)
        first_round = next(e for e in entries if e.kind == "round")
        assert [m.role for m in first_round.messages] == ["assistant", "tool"]
        assert first_round.messages[0].content == "refunding"
        assert first_round.messages[1].content == "refunded 420"
    finally:
        if backend.durable:
            await store.close()
