"""A recorded task rewritten in place into the form an older tether stored: each model
call's response as a blob (`response_blob`) and each round's messages document naming
that blob (`history.ROUND_REF_BLOB`), as a database written before responses were
inline holds them. SQLite and PostgreSQL only: a memory store holds no older log."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tether.runtime.round import history
from tether.store.base import Store

if TYPE_CHECKING:
    from tests.conftest import Backend


def set_event_data(backend: Backend, task_id: str, seq: int, data: dict[str, Any]) -> None:
    """Edit one recorded event in place, as someone tampering with the database would."""
    conn = backend.raw()
    try:
        if backend.kind == "sqlite":
            conn.execute(
                "UPDATE events SET data = ? WHERE task_id = ? AND seq = ?",
                (json.dumps(data), task_id, seq),
            )
        else:  # a commit's events are one row of `event_batches` (schema 11)
            conn.execute(
                "UPDATE event_batches b SET events = (SELECT json_agg(CASE WHEN"
                " b.last_seq - json_array_length(b.events) + e.n = %(seq)s"
                " THEN json_build_array(e.v -> 0, e.v -> 1, %(data)s::json) ELSE e.v END"
                " ORDER BY e.n) FROM json_array_elements(b.events) WITH ORDINALITY e(v, n))"
                " WHERE task_id = %(id)s AND last_seq >= %(seq)s"
                " AND last_seq - json_array_length(events) < %(seq)s",
                {"data": json.dumps(data), "id": task_id, "seq": seq},
            )
    finally:
        conn.close()


async def old_call(store: Store, data: dict[str, Any]) -> dict[str, Any]:
    """A `model.called` event's data as an older tether wrote it: the response (whole,
    as its blob held it) stored as a blob and named, not inline."""
    doc = history.called_response(data)
    assert doc is not None, "the call is in the old form already"
    blob = await store.put_blob(json.dumps(doc, sort_keys=True).encode())
    old = {k: v for k, v in data.items() if k != "response"}
    old["response_blob"] = blob
    return old


async def to_old_format(backend: Backend, store: Store, task_id: str) -> int:
    """Rewrite every model call and round of the task into the older form; returns how
    many rounds were rewritten."""
    blobs: dict[Any, tuple[str, list[dict[str, Any]]]] = {}
    rounds = 0
    for e in await store.read_events(task_id, types={"model.called", "round.committed"}):
        data = dict(e.data)
        if e.type == "model.called":
            if data.get("response") is None:
                continue
            calls = (history.called_response(data) or {}).get("tool_calls", [])
            old = await old_call(store, data)
            if data.get("purpose") == "act":
                blobs[data.get("round")] = (old["response_blob"], calls)
            set_event_data(backend, task_id, e.seq, old)
            continue
        doc = data.get("messages")
        if isinstance(doc, dict) and doc.get("ref") == history.ROUND_REF:
            response, calls = blobs.pop(data["round"])
            # Each tool message's call id and name were stored with it then.
            tools = [
                {"id": c["id"], "name": c["name"], **t}
                for c, t in zip(calls, doc["tools"], strict=True)
            ]
            data["messages"] = {"ref": history.ROUND_REF_BLOB, "response": response, "tools": tools}
            set_event_data(backend, task_id, e.seq, data)
            rounds += 1
    return rounds
