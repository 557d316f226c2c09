"""The conversation as stored: every message once, requests by reference.

A round's messages are stored as a small document that points at what is already in
the store: the round's act call's `model.called` event holds the response (the
assistant message) and, for each tool call, the op whose journaled result is the tool
message (its content inline only when the op record cannot give it back byte for
byte, e.g. a refused call). A model request is
stored as a reference too: its epoch's system prompt blob, the tool schemas blob, the
last compaction snapshot, and the sequence number of the last event it includes.
Rebuilding replays the history events after the snapshot up to that number, so a
stored request costs a few hundred bytes whatever the size of the context window,
and `rebuild_request` gives back the very request the model saw.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from tether.models.base import Message, ModelRequest, ModelResponse, ToolCall, ToolSchema
from tether.runtime.round.context import Entry, transcript
from tether.store.base import Store

#: Event types whose data adds to the conversation.
HISTORY_TYPES = frozenset({"turn.started", "round.committed", "judge.verdict", "user.message"})
#: What the history is read from: those, and the calls whose responses the rounds are.
_READ_TYPES = HISTORY_TYPES | {"model.called"}
#: Marks the reference formats (a plain request dict has no "ref" key). A round's
#: messages: `ROUND_REF` (its assistant message is its act call's response, in that
#: `model.called` event), `ROUND_REF_BLOB` (older: the response's blob named here).
ROUND_REF = 3
ROUND_REF_BLOB = 2
REQUEST_REF = 2
#: Marks a compaction request stored by reference (`compact_ref`).
COMPACT_REF = 3


def round_doc(
    tool_messages: Sequence[tuple[Message, str | None, str | None]],
    calls: Sequence[ToolCall] = (),
) -> dict[str, Any]:
    """A round's messages by reference: `(message, op_id, journaled_content)` per tool
    message; the content is stored inline unless the op's record holds the same text.
    The assistant message is not here: it is the response in the round's act call's
    `model.called` event (`load_entries` pairs them), whose tool `calls` give each tool
    message at their place its call id and name (stored only where they differ)."""
    tools: list[dict[str, Any]] = []
    for i, (msg, op_id, journaled) in enumerate(tool_messages):
        call = calls[i] if i < len(calls) else None
        if call is not None and (call.id, call.name) == (msg.tool_call_id, msg.name):
            entry: dict[str, Any] = {}
        else:
            entry = {"id": msg.tool_call_id, "name": msg.name}
        if op_id is not None and journaled == msg.content:
            entry["op"] = op_id
        else:
            entry["content"] = msg.content
        tools.append(entry)
    return {"ref": ROUND_REF, "tools": tools}


def round_refs(doc: Any) -> Any:
    """What a round's messages document (any format) itself says of its tool messages:
    each one's op or inline text. The rest (the response, its calls' ids and names) is
    its act call's, stored elsewhere by each format; a list (older) as it is."""
    if not isinstance(doc, Mapping):
        return doc
    return [{k: t[k] for k in ("op", "content") if k in t} for t in doc.get("tools", ())]


#: Marks a JSON document stored compressed (see `pack`).
_PACKED = b"zlib:"
#: Documents smaller than this are stored as they are: compressing them saves nothing.
_PACK_FROM = 512


#: `json.dumps(obj, ensure_ascii=False, sort_keys=True)` made once: `dumps` with any
#: keyword builds an encoder per call (the same text either way).
_ENCODER = json.JSONEncoder(ensure_ascii=False, sort_keys=True)


def dumps(obj: Any) -> str:
    """The JSON text of a stored document: `json.dumps(obj, ensure_ascii=False,
    sort_keys=True)`, with one encoder for every call."""
    return _ENCODER.encode(obj)


def pack(obj: Any) -> bytes:
    """A JSON document as blob bytes: compressed when large (a compaction request's
    transcript, a context snapshot), so what is kept of history costs a fraction of its
    text."""
    data = dumps(obj).encode("utf-8")
    if len(data) < _PACK_FROM:
        return data
    # Level 1: a context snapshot (tens of KB, one per compaction) compresses in a third
    # of level 6's time, to a few percent more bytes.
    return _PACKED + zlib.compress(data, 1)


def unpack(data: bytes) -> Any:
    """Inverse of `pack` (plain JSON blobs read as they are)."""
    if data.startswith(_PACKED):
        data = zlib.decompress(data[len(_PACKED) :])
    return json.loads(data.decode("utf-8"))


async def _json(store: Store, ref: str) -> Any:
    return unpack(await store.get_blob(ref))


def called_response(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """The response (`model_calls.response_doc`'s form) of a `model.called` event's
    data that holds it inline, the fields its event records put back (see
    `model_calls.inline_response`); None for one that names its blob (older)."""
    inline = data.get("response")
    if inline is None:
        return None
    doc = dict(inline)
    usage = {
        k: v
        for k, v in (
            ("input_tokens", data.get("input_tokens", 0)),
            ("output_tokens", data.get("output_tokens", 0)),
            ("cached_input_tokens", data.get("cached_tokens", 0)),
            ("cache_write_tokens", data.get("cache_write_tokens", 0)),
        )
        if v
    }
    if usage:
        doc["usage"] = usage
    if not doc.setdefault("model", data.get("model", "")):
        del doc["model"]
    if not doc.setdefault("latency_ms", data.get("latency_ms", 0.0)):
        del doc["latency_ms"]
    if data.get("attempts", 1) != 1:
        doc["attempts"] = data["attempts"]
    return doc


async def call_response(store: Store, data: Mapping[str, Any]) -> dict[str, Any]:
    """The stored response of a `model.called` event's data: inline, or its blob."""
    doc = called_response(data)
    if doc is None:
        got: dict[str, Any] = await _json(store, data["response_blob"])
        return got
    return doc


async def round_messages(
    store: Store, task_id: str, doc: Any, response: Mapping[str, Any] | None = None
) -> list[Message]:
    """The messages of one round from its stored document (any format); `response`: the
    round's act call's (`call_response`), which a `ROUND_REF` document leaves out."""
    if not isinstance(doc, Mapping) or doc.get("ref") not in (ROUND_REF, ROUND_REF_BLOB):
        return [Message.from_dict(m) for m in doc]
    if doc["ref"] == ROUND_REF_BLOB:
        response = await _json(store, doc["response"])
    if response is None:
        raise KeyError(f"round response of task {task_id}")
    answer = ModelResponse.from_dict(response)
    msgs = [
        Message("assistant", answer.text, tool_calls=answer.tool_calls, reasoning=answer.reasoning)
    ]
    op_ids = {t["op"] for t in doc["tools"] if "op" in t}
    ops = {o.op_id: o for o in await store.get_ops(task_id, op_ids=op_ids)} if op_ids else {}
    calls = answer.tool_calls
    for i, t in enumerate(doc["tools"]):
        if "op" in t:
            op = ops.get(t["op"])
            content = str((op.result or {}).get("content", "")) if op is not None else ""
        else:
            content = t["content"]
        # Left out: the id and name of the response's call at the same place.
        call_id = t["id"] if "id" in t else calls[i].id
        name = t["name"] if "name" in t else calls[i].name
        msgs.append(Message("tool", content, tool_call_id=call_id, name=name))
    return msgs


def last_continuation(entries: Sequence[Entry]) -> str:
    """The text of the last continuation in `entries` ("" if none): a verdict whose
    continuation is that text again stores `same_continuation` instead of the text."""
    for e in reversed(entries):
        if e.kind == "continuation" and e.messages:
            return e.messages[0].content
    return ""


async def load_entries(
    store: Store,
    task_id: str,
    *,
    snapshot: str | None,
    after_seq: int,
    upto_seq: int | None = None,
    skip_round: int = 0,
) -> list[Entry]:
    """History entries: the compaction snapshot, then the history events after
    `after_seq` (up to `upto_seq`), leaving out the round `skip_round` (in flight)."""
    entries: list[Entry] = []
    after = 0
    if snapshot:
        doc = await _json(store, snapshot)
        for e in doc["entries"]:
            entries.append(
                Entry(e["kind"], [Message.from_dict(m) for m in e["messages"]], e.get("round"))
            )
        after = after_seq
    hist = await store.read_events(task_id, after=after, types=set(_READ_TYPES))
    # Each round's act call, until its `round.committed` (the last one of the round's
    # number: a round a new turn abandoned may have called before).
    acts: dict[Any, Mapping[str, Any]] = {}
    for h in hist:
        if upto_seq is not None and h.seq > upto_seq:
            break
        d = h.data
        if h.type == "model.called":
            if d.get("purpose") == "act":
                acts[d.get("round")] = d
        elif h.type == "turn.started" and d.get("message"):
            entries.append(Entry("turn", [Message("user", d["message"])]))
        elif h.type == "round.committed" and (d.get("messages") or d.get("messages_blob")):
            called = acts.pop(d.get("round"), None)
            if skip_round and d.get("round") == skip_round:
                continue
            doc = d.get("messages") or await _json(store, d["messages_blob"])
            response = None
            if isinstance(doc, Mapping) and doc.get("ref") == ROUND_REF:
                if called is None:
                    called = await _act_call(store, task_id, d.get("round"), h.seq)
                response = await call_response(store, called)
            msgs = await round_messages(store, task_id, doc, response)
            entries.append(Entry("round", msgs, d.get("round")))
        elif h.type == "judge.verdict" and (d.get("continuation") or d.get("same_continuation")):
            text = last_continuation(entries) if d.get("same_continuation") else d["continuation"]
            entries.append(Entry("continuation", [Message("user", text)], d.get("round")))
        elif h.type == "user.message":
            entries.append(Entry("turn", [Message("user", f"Message from the user: {d['text']}")]))
    return entries


async def _act_call(store: Store, task_id: str, round_no: Any, before: int) -> Mapping[str, Any]:
    """The act call of round `round_no` last before event `before`, from the whole log:
    for a round whose call is not among the events `load_entries` read (none is, as
    compaction never comes between a round's call and its commit; read defensively)."""
    found = [
        e.data
        for e in await store.read_events(task_id, types={"model.called"})
        if e.seq < before and e.data.get("purpose") == "act" and e.data.get("round") == round_no
    ]
    if not found:
        raise KeyError(f"act call of round {round_no} of task {task_id}")
    return found[-1]


def epoch_doc(
    *, system_blob: str, tools_blob: str, snapshot: str | None, after_seq: int
) -> dict[str, Any]:
    """What every request of one epoch shares: the system prompt, the tool schemas and
    the compaction snapshot the history starts from (stored once, as a blob)."""
    return {
        "system": system_blob,
        "tools": tools_blob,
        "snapshot": snapshot,
        "after_seq": after_seq,
    }


def request_ref(request: ModelRequest, *, epoch_blob: str, upto_seq: int) -> dict[str, Any]:
    """A request as a reference to what the store already holds: its epoch and the last
    event of the history it carries (a few dozen bytes whatever the context size)."""
    doc: dict[str, Any] = {
        "ref": REQUEST_REF,
        "epoch": epoch_blob,
        "upto_seq": upto_seq,
        "max_output_tokens": request.max_output_tokens,
    }
    if request.purpose != "act":
        doc["purpose"] = request.purpose
    # Defaults are left out.
    optional = {
        "temperature": request.temperature,
        "json_output": request.json_output,
        "metadata": dict(request.metadata),
    }
    doc.update({k: v for k, v in optional.items() if v})
    return doc


def compact_body(older: Sequence[Entry], room_chars: int) -> str:
    """The compressor's one message: the earlier summary (if any) and the transcript of
    the history entries it folds (`transcript`), within `room_chars`. Requests stored by
    `compact_ref` are rebuilt with it: it must not change (or bump `COMPACT_REF`)."""
    prior = "\n\n".join(m.content for e in older if e.kind == "summary" for m in e.messages)
    body = ""
    if prior:
        body += "Earlier summary:\n" + prior[-room_chars // 3 :] + "\n\n"
    return (
        body
        + "Transcript to compress:\n"
        + transcript([e for e in older if e.kind != "summary"], room_chars - len(body))
    )


def compact_ref(
    request: ModelRequest,
    *,
    system_blob: str,
    snapshot: str | None,
    after_seq: int,
    upto_seq: int,
    fold: int,
    room_chars: int,
) -> dict[str, Any]:
    """A compaction request by reference: its system prompt blob, and where its message
    comes from (the first `fold` history entries up to event `upto_seq`, rendered by
    `compact_body` within `room_chars`) instead of the transcript itself."""
    return {
        "ref": COMPACT_REF,
        "purpose": request.purpose,
        "system": system_blob,
        "snapshot": snapshot,
        "after_seq": after_seq,
        "upto_seq": upto_seq,
        "fold": fold,
        "room_chars": room_chars,
        "max_output_tokens": request.max_output_tokens,
    }


async def _rebuild_compact(store: Store, task_id: str, doc: Mapping[str, Any]) -> ModelRequest:
    entries = await load_entries(
        store,
        task_id,
        snapshot=doc.get("snapshot"),
        after_seq=int(doc.get("after_seq", 0)),
        upto_seq=int(doc["upto_seq"]),
    )
    body = compact_body(entries[: int(doc["fold"])], int(doc["room_chars"]))
    return ModelRequest(
        purpose=doc.get("purpose", "compact"),
        system=(await store.get_blob(doc["system"])).decode("utf-8"),
        messages=(Message("user", body),),
        max_output_tokens=doc["max_output_tokens"],
        task_id=task_id,
    )


async def rebuild_request(store: Store, task_id: str, doc: Mapping[str, Any]) -> ModelRequest:
    """The request a stored model call sent, from its stored form (any format)."""
    if doc.get("ref") == COMPACT_REF:
        return await _rebuild_compact(store, task_id, doc)
    if doc.get("ref") != REQUEST_REF:
        return ModelRequest(
            purpose=doc["purpose"],
            system=doc["system"],
            messages=tuple(Message.from_dict(m) for m in doc["messages"]),
            tools=tuple(ToolSchema(**t) for t in doc.get("tools", [])),
            max_output_tokens=doc.get("max_output_tokens", 2048),
            temperature=doc.get("temperature"),
            json_output=bool(doc.get("json_output", False)),
            task_id=doc.get("task_id"),
            metadata=doc.get("metadata", {}),
        )
    epoch = await _json(store, doc["epoch"])
    system = (await store.get_blob(epoch["system"])).decode("utf-8")
    tools = tuple(ToolSchema(**t) for t in await _json(store, epoch["tools"]))
    entries = await load_entries(
        store,
        task_id,
        snapshot=epoch.get("snapshot"),
        after_seq=int(epoch.get("after_seq", 0)),
        upto_seq=int(doc["upto_seq"]),
    )
    return ModelRequest(
        purpose=doc.get("purpose", "act"),
        system=system,
        messages=tuple(m for e in entries for m in e.messages),
        tools=tools,
        max_output_tokens=doc["max_output_tokens"],
        temperature=doc.get("temperature"),
        json_output=bool(doc.get("json_output", False)),
        task_id=task_id,
        metadata=doc.get("metadata", {}),
    )


async def load_call(store: Store, task_id: str, call_id: str) -> tuple[ModelRequest, Any]:
    """The request and the stored response of one model call (`model.called` event)."""
    for e in await store.read_events(task_id, types={"model.called"}):
        if e.data.get("call_id") == call_id:
            doc = e.data.get("request") or await _json(store, e.data["request_blob"])
            request = await rebuild_request(store, task_id, doc)
            return request, await call_response(store, e.data)
    raise KeyError(call_id)
