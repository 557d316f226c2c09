"""A stored model call, request and response, as the model saw and answered it.

Requests are stored by reference (see `tether.runtime.round.history`); `load_call` rebuilds
one byte for byte. Here a call is found by its id (`TASK.act.7`) or the part after the
task id (`act.7`) or its number (`7`), and listed for people who do not know the ids yet.
"""

from __future__ import annotations

from typing import Any

from tether import errors
from tether.runtime.round.history import load_call
from tether.runtime.run.model_calls import response_in_full
from tether.store.base import Store


async def list_calls(store: Store, task_id: str) -> list[dict[str, Any]]:
    """Every model call of a task, in order: id, purpose, model, round, tokens, cost."""
    await store.get_task(task_id)
    rows = []
    for e in await store.read_events(task_id, types={"model.called"}):
        d = e.data
        rows.append(
            {
                "call_id": d["call_id"],
                "seq": e.seq,
                "at": e.at,
                "purpose": d.get("purpose"),
                "model": d.get("model"),
                "round": d.get("round"),
                "input_tokens": d.get("input_tokens", 0),
                "cached_tokens": d.get("cached_tokens", 0),
                "output_tokens": d.get("output_tokens", 0),
                "cost_usd": d.get("cost_usd", 0.0),
                "summary": d.get("summary", ""),
            }
        )
    return rows


def _full_id(task_id: str, call_id: str, known: list[str]) -> str:
    """The full id of `call_id`: itself, with the task id in front, or (a bare number,
    the call's place in the task) the call that ends with it."""
    if call_id.isdigit():
        return next((k for k in known if k.endswith(f".{call_id}")), call_id)
    return call_id if call_id.startswith(f"{task_id}.") else f"{task_id}.{call_id}"


async def show_call(store: Store, task_id: str, call_id: str) -> dict[str, Any]:
    """`{"call": summary, "request": ModelRequest.to_dict(), "response": the stored
    response, every field in it}` of one call. `UserError` (exit 2) naming a few known
    ids if it is not one of the task's calls; `TaskNotFound` for an unknown task."""
    calls = await list_calls(store, task_id)
    known = [c["call_id"] for c in calls]
    full = _full_id(task_id, call_id.strip(), known)
    try:
        request, response = await load_call(store, task_id, full)
    except KeyError:
        hint = ", ".join(known[:3]) + (f" … {known[-1]}" if len(known) > 3 else "")
        raise errors.UserError(
            f"task {task_id} has no model call {call_id!r}"
            + (f"; its calls are {hint}" if known else "; it has made no model call yet")
        ) from None
    summary = next(c for c in calls if c["call_id"] == full)
    # In full: a stored response leaves out the fields at their defaults.
    return {"call": summary, "request": request.to_dict(), "response": response_in_full(response)}
