"""Helpers for the agent-loop tests: specs, scripted policies, request inspection."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tether import ledger as L
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.engine import Engine, ModelSet, RunResult
from tether.runtime.tasks import create_task
from tether.spec import TaskSpec, parse_spec
from tether.store.base import Store

NEXT = re.compile(r"^Next: (\S+)", re.M)


def spec_of(n_items: int = 3, **overrides: Any) -> TaskSpec:
    """Items `i1..iN`, each done when `out/iK.txt` is written (file rule)."""
    data: dict[str, Any] = {
        "name": "files",
        "objective": f"write {n_items} files",
        "items": [
            {
                "id": f"i{k}",
                "title": f"write out/i{k}.txt",
                "done_when": {"kind": "file", "path": f"out/i{k}.txt"},
            }
            for k in range(1, n_items + 1)
        ],
        "tools": ["write_file", "read_file", "list_files"],
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return parse_spec(data)


def latest_ledger_text(request: ModelRequest) -> str:
    """The most recent ledger the runtime gave the model."""
    for m in reversed(request.messages):
        if m.role == "user" and "GOAL LEDGER" in m.content:
            return m.content
    return request.system


def next_item(request: ModelRequest) -> str | None:
    """The item the ledger names as Next, as a model would read it."""
    found = NEXT.findall(latest_ledger_text(request))
    return None if not found or found[-1] == "nothing" else found[-1]


def honest_actor(request: ModelRequest) -> ModelResponse:
    """Writes the file of the Next item; says it is finished when nothing is open."""
    nxt = next_item(request)
    if nxt is None:
        return ModelResponse("Everything in the ledger is closed.")
    return ModelResponse(
        f"writing {nxt}", (tool_call("write_file", path=f"out/{nxt}.txt", content=nxt),)
    )


def rules_judge(_: ModelRequest) -> str:
    """An LLM judge that proposes nothing (rules decide)."""
    return json.dumps({"changes": [], "decision": "continue", "reason": "no opinion"})


def by_purpose(**policies: Callable[[ModelRequest], Any]) -> Callable[[ModelRequest], Any]:
    """A policy that dispatches on `request.purpose`."""

    def policy(request: ModelRequest) -> Any:
        return policies[request.purpose](request)

    return policy


async def run_task(
    store: Store,
    spec: TaskSpec,
    workspace: Path,
    model: ScriptedModel,
    *,
    judge: ScriptedModel | None = None,
    compact: ScriptedModel | None = None,
    review: ScriptedModel | None = None,
    task_id: str | None = None,
    **engine_opts: Any,
) -> tuple[str, RunResult]:
    """Create the task (unless `task_id`) and run it once."""
    if task_id is None:
        task = await create_task(store, spec, workspace=workspace)
        task_id = task.task_id
    models = ModelSet(actor=model, judge=judge, compact=compact, review=review)
    engine = Engine(store, models, lease_ttl=30, **engine_opts)
    return task_id, await engine.run(task_id)


async def ledger_of(store: Store, task_id: str) -> L.Ledger:
    """The stored ledger."""
    return (await store.get_ledger(task_id)).to_ledger()


async def event_types(store: Store, task_id: str) -> list[str]:
    """Types of all events in order."""
    return [e.type for e in await store.read_events(task_id)]


async def events_of(store: Store, task_id: str, type_: str) -> list[Mapping[str, Any]]:
    """Data of the events of one type."""
    return [e.data for e in await store.read_events(task_id, types={type_})]


def serialized(request: ModelRequest) -> list[str]:
    """The request as a provider's prefix cache sees it: tools, system, then messages."""
    parts = [json.dumps([t.to_dict() for t in request.tools], sort_keys=True), request.system]
    parts += [json.dumps(m.to_dict(), sort_keys=True) for m in request.messages]
    return parts
