"""Events as a database written by an earlier release holds them: they must decode to the
same events for as long as such databases are read. The examples are a peer-benchmark
task's (`benchmarks/store_bytes.py`) events as its SQL store wrote them (fields at their
defaults left out: `store._rules.compact`), one per type, copied byte for byte."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from tether import events as ev
from tether.models.base import Message, ModelResponse, ToolCall, Usage
from tether.runtime.round import history

#: (type, data) as stored by tether 8ec2ee8 (SQLite and PostgreSQL alike).
STORED: list[tuple[str, str]] = [
    (
        "task.created",
        '{"name":"peers-bench","objective":"Process the records one step at a time with'
        ' do_step","items":1,"workspace":null,"preexisting":{}}',
    ),
    ("lease.claimed", '{"worker_id":"vm:14365","token":1,"expires_at":1796581997.4282427}'),
    ("task.status", '{"src":"queued","dst":"running","stop_reason":null,"reason":"start"}'),
    (
        "turn.started",
        '{"turn":1,"kind":"start","epoch":true,"epoch_reason":"task start","system_blob":'
        '"sha256:70145612933730aed29054cbe7c6153513775c07e302cf54b6c7f98cd0e2791f",'
        '"system_chars":1168,"message":"Start the task. The goal ledger is at the end of the'
        ' system prompt; begin with the item named Next (work)."}',
    ),
    ("round.started", '{"round":1,"turn":1,"item":"work"}'),
    (
        "ledger.updated",
        '{"version":1,"diff":[{"item":"work","field":"status","before":"pending","after":'
        '"in_progress"}],"cause":"runtime"}',
    ),
    (
        "model.called",
        '{"call_id":"t6b15aa306c7bba.act.5","purpose":"act","model":"peers","round":5,'
        '"request":{"ref":2,"epoch":"sha256:1084ca8f0fdd935b873d926a3303f2c82640ec3e9a4b9c2c48'
        'fff21e76658c13","upto_seq":37,"max_output_tokens":2048,"metadata":'
        '{"system_stable_prefix":987}},"response_blob":"sha256:6ba3c3a44e6f40d5672b5b31532d0bb2'
        '16fc463da73e59ffe0fd3a11e3a686ff","input_tokens":1643,"output_tokens":20,'
        '"latency_ms":0.05,"summary":"Step 5. [calls: do_step]","tool_calls":1}',
    ),
    (
        "op.intended",
        '{"op_id":"t6b15aa306c7bba.r1.c0","tool":"do_step","args":{"step":1},"round":1,'
        '"effect":"write"}',
    ),
    ("op.dispatched", '{"op_id":"t6b15aa306c7bba.r1.c0"}'),
    (
        "op.result",
        '{"op_id":"t6b15aa306c7bba.r1.c0","tool":"do_step","status":"succeeded","summary":'
        '"step 1 done. yg rh fjayiarut fs yb cicyocu zb oipf le fhgqv yarb wjdna ltmq kzatarg'
        ' ct ivi ohm vienlulym pdajmknzg phbhd","duration_ms":0.6677530000160914}',
    ),
    ("op.committed", '{"op_id":"t6b15aa306c7bba.r1.c0","round":1}'),
    (
        "round.committed",
        '{"round":4,"turn":1,"ops":1,"text":"Step 4.","messages":{"ref":2,"response":"sha256:'
        'bf270977af00c68dfc3a0ba82090124341c1f13e1969e8756239de9e2b34a38f","tools":[{"id":'
        '"call_4","name":"do_step","op":"t6b15aa306c7bba.r4.c0"}]},"item":"work"}',
    ),
    (
        "judge.verdict",
        '{"round":1,"decision":"continue","total":1,"judges":["rules"],"continuation":'
        '"Progress update from the runtime (judged after your last round).\\n\\nCURRENT GOAL'
        " LEDGER (version 1)\\nObjective: Process the records one step at a time with do_step"
        "\\nProgress: 0/1 done, 1 open, 0 blocked, 0 skipped\\n  [~] work: Process every"
        ' record\\nNext: work\\n\\nWork on work next: Process every record","item":"work",'
        '"marks":["04b15558b1fa84ef"]}',
    ),
    (
        "audit.warning",
        '{"code":"summary_claims_done","message":"the compaction summary claims that the whole'
        ' task is finished (\\"work were done\\") and that work is done, which the ledger does'
        ' not record; the claim was not accepted","details":{"items":["work"],"global":'
        '"work were done","unfinished":["work"],"found_by":"rules"}}',
    ),
    (
        "context.compacted",
        '{"summary_blob":"sha256:884eb509dfbd6adc550346db1ad27453825aaebfb273cdf657014a175cbe'
        'bca9","rounds_compacted":29,"upto_round":29,"tokens_before":16003,"tokens_after":5880,'
        '"claimed_done":["work"]}',
    ),
]

#: What a round's stored events decode to, written out field by field.
ROUND: dict[str, ev.Event] = {
    "round.started": ev.RoundStarted(round=1, turn=1, item="work"),
    "model.called": ev.ModelCalled(
        call_id="t6b15aa306c7bba.act.5",
        purpose="act",
        model="peers",
        round=5,
        request={
            "ref": 2,
            "epoch": "sha256:1084ca8f0fdd935b873d926a3303f2c82640ec3e9a4b9c2c48fff21e76658c13",
            "upto_seq": 37,
            "max_output_tokens": 2048,
            "metadata": {"system_stable_prefix": 987},
        },
        response_blob="sha256:6ba3c3a44e6f40d5672b5b31532d0bb216fc463da73e59ffe0fd3a11e3a686ff",
        input_tokens=1643,
        output_tokens=20,
        latency_ms=0.05,
        summary="Step 5. [calls: do_step]",
        tool_calls=1,
    ),
    "op.intended": ev.OpIntended(
        op_id="t6b15aa306c7bba.r1.c0", tool="do_step", args={"step": 1}, round=1, effect="write"
    ),
    "op.dispatched": ev.OpDispatched(op_id="t6b15aa306c7bba.r1.c0"),
    "op.result": ev.OpResult(
        op_id="t6b15aa306c7bba.r1.c0",
        tool="do_step",
        status="succeeded",
        summary="step 1 done. yg rh fjayiarut fs yb cicyocu zb oipf le fhgqv yarb wjdna ltmq"
        " kzatarg ct ivi ohm vienlulym pdajmknzg phbhd",
        # As stored, to the last digit: reading rounds nothing.
        duration_ms=0.6677530000160914,
    ),
    "op.committed": ev.OpCommitted(op_id="t6b15aa306c7bba.r1.c0", round=1),
    "round.committed": ev.RoundCommitted(
        round=4,
        turn=1,
        ops=1,
        text="Step 4.",
        messages={
            "ref": 2,
            "response": "sha256:bf270977af00c68dfc3a0ba82090124341c1f13e1969e8756239de9e2b34a38f",
            "tools": [{"id": "call_4", "name": "do_step", "op": "t6b15aa306c7bba.r4.c0"}],
        },
        item="work",
    ),
}


#: A call and a round as this tether stores them (h1/resp): the response inline in its
#: call's event, less what the event's fields say; the round's messages document
#: (`history.ROUND_REF` 3) names its tool messages' ops only.
STORED_NOW: list[tuple[str, str]] = [
    (
        "model.called",
        '{"call_id":"t6b15d825dc39c1.act.5","purpose":"act","model":"peers","round":5,'
        '"request":{"ref":2,"epoch":"sha256:1084ca8f0fdd935b873d926a3303f2c82640ec3e9a4b9c2c'
        '48fff21e76658c13","upto_seq":37,"max_output_tokens":2048,"metadata":'
        '{"system_stable_prefix":987}},"response":{"text":"Step 5.","tool_calls":[{"id":'
        '"call_5","name":"do_step","arguments":{"step":5},"raw_arguments":"{\\"step\\": 5}"}]},'
        '"input_tokens":1643,"output_tokens":20,"latency_ms":0.069,"summary":"Step 5. [calls:'
        ' do_step]","tool_calls":1}',
    ),
    (
        "round.committed",
        '{"round":5,"turn":1,"ops":1,"text":"Step 5.","messages":{"ref":3,"tools":[{"op":'
        '"t6b15d825dc39c1.r5.c0"}]},"item":"work"}',
    ),
]

#: The round's call: the model's response, as its event gives it back.
CALL_5 = ToolCall("call_5", "do_step", {"step": 5}, '{"step": 5}')
RESPONSE_5 = ModelResponse("Step 5.", (CALL_5,), Usage(1643, 20), "peers", 0.069)

ROUND_NOW: dict[str, ev.Event] = {
    "model.called": ev.ModelCalled(
        call_id="t6b15d825dc39c1.act.5",
        purpose="act",
        model="peers",
        round=5,
        request={
            "ref": 2,
            "epoch": "sha256:1084ca8f0fdd935b873d926a3303f2c82640ec3e9a4b9c2c48fff21e76658c13",
            "upto_seq": 37,
            "max_output_tokens": 2048,
            "metadata": {"system_stable_prefix": 987},
        },
        response={
            "text": "Step 5.",
            "tool_calls": [
                {
                    "id": "call_5",
                    "name": "do_step",
                    "arguments": {"step": 5},
                    "raw_arguments": '{"step": 5}',
                }
            ],
        },
        input_tokens=1643,
        output_tokens=20,
        latency_ms=0.069,
        summary="Step 5. [calls: do_step]",
        tool_calls=1,
    ),
    "round.committed": ev.RoundCommitted(
        round=5,
        turn=1,
        ops=1,
        text="Step 5.",
        messages={"ref": 3, "tools": [{"op": "t6b15d825dc39c1.r5.c0"}]},
        item="work",
    ),
}


def _stored(type_name: str, stored: list[tuple[str, str]] = STORED) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(dict(stored)[type_name])
    return data


@pytest.mark.parametrize("type_name", sorted(ROUND))
def test_a_stored_round_decodes_to_the_same_events(type_name: str) -> None:
    assert ev.decode(type_name, _stored(type_name)) == ROUND[type_name]


@pytest.mark.parametrize("type_name", sorted(ROUND_NOW))
def test_a_round_stored_now_decodes_to_the_same_events(type_name: str) -> None:
    assert ev.decode(type_name, _stored(type_name, STORED_NOW)) == ROUND_NOW[type_name]


@pytest.mark.parametrize(
    ("type_name", "text"),
    STORED + STORED_NOW,
    ids=[t for t, _ in STORED] + [f"{t}-now" for t, _ in STORED_NOW],
)
def test_stored_events_read_back_as_they_were_written(type_name: str, text: str) -> None:
    # Decoded and written again, every stored field comes back as it was, and the fields
    # left out (at their defaults) decode to their defaults: nothing is lost or changed
    # (a float written to fewer digits, `Millis`, is compared at the written precision).
    stored = json.loads(text)
    event = ev.decode(type_name, stored)
    assert type(event) is ev.EVENT_TYPES[type_name]
    name, _, data = ev.encode(event)
    assert name == type_name
    for key, value in stored.items():
        if key in ("duration_ms", "latency_ms"):
            assert data[key] == round(value, 3), key
        else:
            assert data[key] == value, key
    fields = type(event).model_fields
    for key in set(data) - set(stored):
        assert data[key] == fields[key].get_default(call_default_factory=True), key


def test_durations_are_written_to_the_microsecond_and_read_as_stored() -> None:
    assert ev.OpResult.MILLIS == ("duration_ms",)
    assert ev.ModelCalled.MILLIS == ("latency_ms",)
    assert ev.RoundStarted.MILLIS == ()
    result = ev.OpResult(op_id="o", tool="t", status="succeeded", duration_ms=0.196649000031357)
    name, _, data = ev.encode(result)
    assert data["duration_ms"] == 0.197
    assert result.duration_ms == 0.196649000031357  # the event itself keeps its value
    # Read back, the written value is the event's (nothing rounds it again or away).
    assert ev.decode(name, json.loads(json.dumps(data))).duration_ms == 0.197
    call = ev.ModelCalled(call_id="c", purpose="act", model="m", latency_ms=12.3456789)
    assert call.data()["latency_ms"] == 12.346
    assert ev.ModelCalled(call_id="c", purpose="act", model="m").data()["latency_ms"] == 0.0


class _Store:
    """The store reads of `history.round_messages` and `call_response`: blobs, and the
    round's op record (its journaled result is the tool message)."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    async def get_blob(self, ref: str) -> bytes:
        return self.blobs[ref]

    async def get_ops(self, task_id: str, op_ids: Any = None) -> list[Any]:
        content = {"content": "step 5 done"}
        return [SimpleNamespace(op_id=o, result=content) for o in op_ids or ()]


#: The round's messages, as the model saw them in the next request.
ROUND_5 = [
    Message("assistant", "Step 5.", tool_calls=(CALL_5,)),
    Message("tool", "step 5 done", tool_call_id="call_5", name="do_step"),
]


def test_a_call_and_round_stored_now_read_back_as_the_model_gave_them() -> None:
    called = ev.decode("model.called", _stored("model.called", STORED_NOW)).data()
    doc = history.called_response(called)
    assert doc is not None and ModelResponse.from_dict(doc) == RESPONSE_5
    store: Any = _Store()
    assert asyncio.run(history.call_response(store, called)) == doc
    messages = _stored("round.committed", STORED_NOW)["messages"]
    got = asyncio.run(history.round_messages(store, "t6b15d825dc39c1", messages, doc))
    assert got == ROUND_5


def test_a_call_and_round_stored_by_an_older_tether_still_read() -> None:
    # Its response a blob the call's event and the round's document both name.
    store: Any = _Store()
    ref = "sha256:6ba3c3a44e6f40d5672b5b31532d0bb216fc463da73e59ffe0fd3a11e3a686ff"
    store.blobs[ref] = json.dumps(RESPONSE_5.to_dict()).encode()
    called = ev.decode("model.called", _stored("model.called")).data()
    assert history.called_response(called) is None and called["response_blob"] == ref
    assert ModelResponse.from_dict(asyncio.run(history.call_response(store, called))) == RESPONSE_5
    messages = {**_stored("round.committed")["messages"], "response": ref}
    messages["tools"] = [{**messages["tools"][0], "id": "call_5"}]
    assert messages["ref"] == history.ROUND_REF_BLOB
    assert asyncio.run(history.round_messages(store, "t6b15aa306c7bba", messages)) == ROUND_5
