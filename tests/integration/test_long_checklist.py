"""Long checklists: the ledger tool, compaction that keeps the latest round, compaction
driven by the conversation (not the checklist), and the lease check's light read."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from tests.support.loop import events_of, honest_actor, next_item, run_task, spec_of
from tether import errors
from tether.ledger_view import LEDGER_ITEMS_TOOL
from tether.models.base import ModelRequest, ModelResponse, ToolCall
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.round.context import SUMMARY_PREFIX
from tether.runtime.tasks import create_task
from tether.spec import parse_spec
from tether.store.base import LedgerWrite, Store
from tether.store.memory import MemoryStore
from tether.tools.registry import ensure_lease

from ..conftest import Backend, create_small_task

NEXT = re.compile(r"^Next: (\S+)", re.M)


@pytest.fixture
async def memory() -> MemoryStore:
    return await MemoryStore.open()


# --- the ledger tool ---------------------------------------------------------------------


async def test_a_long_ledger_comes_with_ledger_items_which_pages_the_stored_ledger(
    memory: MemoryStore, tmp_path: Path
) -> None:
    seen: list[ModelRequest] = []

    def policy(request: ModelRequest) -> ModelResponse:
        seen.append(request)
        if len(seen) == 1:
            return ModelResponse(
                "listing", (tool_call(LEDGER_ITEMS_TOOL, status="open", after="i3", limit=2),)
            )
        return ModelResponse("NEED_HELP: nothing more to try in this test")

    spec = spec_of(30)
    model = ScriptedModel(policy=policy)
    await run_task(memory, spec, tmp_path, model, max_rounds_this_run=2)
    assert LEDGER_ITEMS_TOOL in [t.name for t in seen[0].tools]
    result = next(m for m in seen[1].messages if m.role == "tool")
    assert result.content.startswith("2 of 27 matching items (status='open') after i3:")
    assert "[ ] i4: write out/i4.txt" in result.content
    assert "More: call ledger_items with after='i5'." in result.content
    # The view in the system prompt says how to page, and stays small.
    assert "ledger_items(status=..." in seen[0].system

    short: list[ModelRequest] = []
    model = ScriptedModel(policy=lambda r: short.append(r) or ModelResponse("NEED_HELP: stop"))
    await run_task(memory, spec_of(6), tmp_path / "short", model, max_rounds_this_run=1)
    assert LEDGER_ITEMS_TOOL not in [t.name for t in short[0].tools]


# --- compaction keeps the latest round -----------------------------------------------------


@dataclass
class Recorder:
    """An honest model (works on the item named Next) that records what it was sent and
    what it answered, to check the history the next request carries."""

    act: Callable[[ModelRequest, int], ModelResponse]
    requests: list[ModelRequest] = field(default_factory=list)
    responses: list[ModelResponse] = field(default_factory=list)
    compactions: int = 0

    def policy(self, request: ModelRequest) -> Any:
        if request.purpose == "compact":
            self.compactions += 1
            return "Earlier rounds worked through the ledger's items in order."
        if request.purpose != "act":
            return '{"changes": [], "decision": "continue", "reason": "rules decide"}'
        self.requests.append(request)
        response = self.act(request, len(self.requests))
        self.responses.append(response)
        return response


def _latest_round_kept(
    req: ModelRequest, calls: tuple[ToolCall, ...], texts: dict[str, str]
) -> None:
    """`req` carries the calls of the round before it, and their results, verbatim."""
    ids = [c.id for c in calls]
    assistants = [m for m in req.messages if m.role == "assistant" and m.tool_calls]
    assert assistants and [c.id for c in assistants[-1].tool_calls] == ids
    assert [c.raw_arguments for c in assistants[-1].tool_calls] == [c.raw_arguments for c in calls]
    results = {m.tool_call_id: m.content for m in req.messages if m.role == "tool"}
    for c in calls:
        assert c.id in results, f"the result of {c.id} is missing"
        assert "[trimmed]" not in results[c.id]
        if c.id in texts:
            assert texts[c.id] in results[c.id]


async def test_every_compaction_keeps_the_latest_calls_and_results_verbatim(
    memory: MemoryStore, tmp_path: Path
) -> None:
    # Each round reads a new 5,000-character file: the conversation outgrows a small
    # budget every other round, and the latest round alone is over the part of the
    # budget compaction keeps for recent rounds.
    texts: dict[str, str] = {}

    def act(request: ModelRequest, n: int) -> ModelResponse:
        (tmp_path / f"notes-{n}.txt").write_text(f"note {n}: " + f"{n:04d}-abcdefghij " * 330)
        call = tool_call("read_file", path=f"notes-{n}.txt")
        texts[call.id] = (tmp_path / f"notes-{n}.txt").read_text()
        return ModelResponse(f"reading notes {n}", (call,))

    rec = Recorder(act)
    spec = spec_of(
        2,
        context={"input_budget_tokens": 4000, "preview_chars": 6000},
        limits={"max_rounds": 40, "no_progress_rounds": 1000, "max_rounds_per_item": None},
    )
    model = ScriptedModel(policy=rec.policy)
    tid, _ = await run_task(memory, spec, tmp_path, model, compact=model, max_rounds_this_run=40)
    compacted = await events_of(memory, tid, "context.compacted")
    assert len(compacted) >= 5
    after = 0
    for k in range(1, len(rec.requests)):
        req = rec.requests[k]
        _latest_round_kept(req, rec.responses[k - 1].tool_calls, texts)
        after += req.messages[0].content.startswith(SUMMARY_PREFIX) and k > 0
    assert after >= 5  # checked right after compactions, not only between them


async def test_a_compaction_the_ledger_itself_forces_keeps_the_latest_round(
    memory: MemoryStore, tmp_path: Path
) -> None:
    # 25 items (listed whole) with long titles: every progress update carries the whole
    # ledger, so it is the ledger's size that fills the budget.
    items = [
        {
            "id": f"i{k}",
            "title": f"write out/i{k}.txt "
            + "with the careful wording the reviewers asked for " * 3,
            "done_when": {"kind": "file", "path": f"out/i{k}.txt"},
        }
        for k in range(1, 26)
    ]
    spec = parse_spec(
        {
            "name": "wordy",
            "objective": "write 25 files",
            "items": items,
            "tools": ["write_file"],
            "context": {"input_budget_tokens": 3300},
        }
    )

    def act(request: ModelRequest, n: int) -> ModelResponse:
        nxt = next_item(request)
        if nxt is None:
            return ModelResponse("Everything in the ledger is closed.")
        return ModelResponse(
            f"writing {nxt}", (tool_call("write_file", path=f"out/{nxt}.txt", content=nxt),)
        )

    rec = Recorder(act)
    model = ScriptedModel(policy=rec.policy)
    tid, result = await run_task(memory, spec, tmp_path, model, compact=model)
    assert result.status == "satisfied"
    compacted = await events_of(memory, tid, "context.compacted")
    assert len(compacted) >= 3
    for k in range(1, len(rec.requests)):
        _latest_round_kept(rec.requests[k], rec.responses[k - 1].tool_calls, {})


# --- compaction is driven by the conversation ---------------------------------------------


def _multi_call_spec(n_items: int, budget: int) -> Any:
    return parse_spec(
        {
            "name": f"migrate-{n_items}",
            "objective": f"migrate {n_items} files",
            "items": [
                {
                    "id": f"f-{k:05d}",
                    "title": f"migrate file {k:05d}",
                    "done_when": {"kind": "file", "path": f"out/f-{k:05d}.txt"},
                }
                for k in range(1, n_items + 1)
            ],
            "tools": ["write_file"],
            "limits": {"max_rounds": 1000},
            "context": {"input_budget_tokens": budget},
        }
    )


def multi_call_actor(calls: int) -> Callable[[ModelRequest, int], ModelResponse]:
    """Honest: `calls` writes per item (parts, then the file), on the item named Next."""
    parts: dict[str, int] = {}

    def act(request: ModelRequest, n: int) -> ModelResponse:
        nxt = next_item(request)
        if nxt is None:
            return ModelResponse("Everything in the ledger is closed.")
        part = parts.get(nxt, 0) + 1
        if part < calls:
            parts[nxt] = part
            path, text = f"work/{nxt}.part{part}", f"part {part} of {nxt}: " + "x" * 600
        else:
            path, text = f"out/{nxt}.txt", f"migrated {nxt}"
        return ModelResponse(
            f"{nxt}, step {part}", (tool_call("write_file", path=path, content=text),)
        )

    return act


async def _compactions(store: MemoryStore, n_items: int, folder: Path) -> tuple[int, int]:
    rec = Recorder(multi_call_actor(5))
    model = ScriptedModel(policy=rec.policy, keep_requests=1)
    tid, _ = await run_task(
        store,
        _multi_call_spec(n_items, 6000),
        folder,
        model,
        compact=model,
        max_rounds_this_run=100,
    )
    rounds = len(await events_of(store, tid, "round.committed"))
    return len(await events_of(store, tid, "context.compacted")), rounds


async def test_compactions_per_100_rounds_do_not_grow_with_the_checklist(
    memory: MemoryStore, tmp_path: Path
) -> None:
    few, rounds_few = await _compactions(memory, 20, tmp_path / "few")
    many, rounds_many = await _compactions(memory, 10_000, tmp_path / "many")
    assert rounds_few == rounds_many == 100
    assert few >= 3  # the conversation alone needs compacting at this budget
    assert many <= 2 * few


# --- the ledger a run holds ---------------------------------------------------------------


class LedgerCounting:
    """A store that counts `get_ledger` calls and keeps the ledger writes of commits."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.reads = 0
        self.writes: list[LedgerWrite] = []

    async def get_ledger(self, task_id: str) -> Any:
        self.reads += 1
        return await self.inner.get_ledger(task_id)

    async def commit(self, *args: Any, **kwargs: Any) -> Any:
        result = await self.inner.commit(*args, **kwargs)
        if kwargs.get("ledger") is not None:
            self.writes.append(kwargs["ledger"])
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _crashing_at(call: int) -> ScriptedModel:
    """Honest, except that the process dies (SystemExit stands for a SIGKILL) at act call
    `call`, after the rounds before it were committed."""

    calls = 0

    def act(request: ModelRequest) -> ModelResponse:
        nonlocal calls
        calls += request.purpose == "act"
        if calls == call:
            raise SystemExit("the worker died")
        return honest_actor(request)

    return ScriptedModel(policy=act)


async def test_a_run_reads_the_ledger_once_and_sends_the_changed_items_only(
    backend: Backend, tmp_path: Path
) -> None:
    # A round works on the ledger the run holds: it is read from the store when a run
    # (a turn) starts — after a crash, by the worker that takes over — never once per
    # round; and a commit sends the items that changed, not every item.
    counting = LedgerCounting(await backend.open())
    store = cast(Store, counting)
    spec = spec_of(300)
    tid = (await create_task(store, spec, workspace=tmp_path)).task_id
    with pytest.raises(SystemExit):
        await Engine(store, ModelSet(_crashing_at(9)), lease_ttl=30).run(tid)
    assert counting.reads == 1  # eight rounds committed on one read
    before_crash = (await counting.inner.get_ledger(tid)).to_ledger()
    assert before_crash.progress().done == 8
    assert len(counting.writes) >= 8
    assert all(w.positions is not None and len(w.state) <= 2 for w in counting.writes)

    counting.reads, counting.writes = 0, []
    with pytest.raises(SystemExit):
        await Engine(store, ModelSet(_crashing_at(5)), lease_ttl=30).run(tid, force=True)
    # The takeover read the stored ledger again (not a copy from before the crash) and
    # went on from it: four more items done, on one read.
    assert counting.reads == 1
    after = (await counting.inner.get_ledger(tid)).to_ledger()
    assert after.progress().done == 12
    assert after.version > before_crash.version
    assert all(w.positions is not None and len(w.state) <= 2 for w in counting.writes)


# --- the lease check ----------------------------------------------------------------------


async def test_the_lease_check_reads_the_fencing_token_alone(sql_backend: Backend) -> None:
    store = await sql_backend.open()
    try:
        task = await create_small_task(store)
        lease = await store.claim("w1", 30, task_id=task.task_id)
        assert lease is not None
        assert await store.fencing_token(task.task_id) == lease.token
        assert (await store.get_task(task.task_id)).fencing_token == lease.token
        await ensure_lease(store, task.task_id, lease.token)
        with pytest.raises(errors.StaleLease):
            await ensure_lease(store, task.task_id, lease.token + 1)
        with pytest.raises(errors.TaskNotFound):
            await store.fencing_token("no-such-task")
    finally:
        await store.close()
