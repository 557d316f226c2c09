"""The other side of the adversarial tests: honest agents are never blocked.

Thirteen ordinary ways of working (`_honest.STYLES`: explorers, converging and wandering
fixers, a flaky HTTP service the model sees, a rate-limited batch service, a drafter,
a researcher toward `min_count`, an interleaver, one long item, a thinker, a doc
reader, a verifier, a job poller), each doing real work through the built-in tools and a
few of its own, at the contract's default limits, under three judges: the rules alone (`judge:
rules`), an LLM judge that does what tether's judge instructions say and nothing more,
and one that attaches nothing. Every run must end `satisfied`, with no item blocked at
any time (the event log is searched for any block), in exactly the rounds the agent
planned, and pass the honesty oracle.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.adversarial._honest import (
    FLAKY_HTTP,
    JUDGES,
    STYLES,
    FlakyServer,
    Outcome,
    literal_judge,
    run_style,
)
from tests.support.adversarial import assert_honest, assert_status_agrees
from tether.models.base import ModelRequest
from tether.runtime.judge.judges import JUDGE_INSTRUCTIONS
from tether.spec import Limits
from tether.store.base import Store
from tether.store.memory import MemoryStore
from tether.store.sqlite import SQLiteStore


@pytest.fixture
async def memory() -> MemoryStore:
    return await MemoryStore.open()


@pytest.fixture
async def sqlite(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    store = await SQLiteStore.open(tmp_path / "honest.db")
    try:
        yield store
    finally:
        await store.close()


async def _check(store: Store, outcome: Outcome, ws: Path) -> None:
    assert outcome.blocks == (), f"an honest {outcome.style} run was blocked: {outcome.blocks}"
    assert outcome.status == "satisfied", outcome.row()
    assert set(outcome.statuses.values()) == {"done"}, outcome.statuses
    # The agent did all its planned work, and nothing more was needed.
    assert outcome.rounds == outcome.planned, outcome.row()
    task = await store.get_task(outcome.task_id)
    spec = STYLES[outcome.style].spec(ws)
    assert spec.limits == Limits(), "honest styles run at the default limits"
    assert task.spec["limits"] == Limits().model_dump()
    await assert_honest(store, outcome.task_id, spec)
    await assert_status_agrees(store, outcome.task_id)


@pytest.mark.parametrize("judge", list(JUDGES))
@pytest.mark.parametrize("style", list(STYLES))
async def test_an_honest_style_is_never_blocked(
    memory: MemoryStore, tmp_path: Path, style: str, judge: str
) -> None:
    outcome = await run_style(STYLES[style], judge, memory, tmp_path)
    await _check(memory, outcome, tmp_path)


@pytest.mark.parametrize(
    ("style", "judge"),
    [("converging-fixer", "rules"), ("researcher", "literal"), ("thinker", "silent")],
)
async def test_an_honest_style_on_sqlite(
    sqlite: SQLiteStore, tmp_path: Path, style: str, judge: str
) -> None:
    outcome = await run_style(STYLES[style], judge, sqlite, tmp_path)
    await _check(sqlite, outcome, tmp_path)


# --- the harness itself ----------------------------------------------------------------


def test_there_are_at_least_ten_styles_each_with_rules_only() -> None:
    assert len(STYLES) >= 10
    for style in STYLES.values():
        items = style.items(Path("/nonexistent"))
        assert items and all(i.get("done_when") for i in items), style.name
        assert "limits" not in style.spec(Path("/nonexistent")).model_fields_set


def test_the_flaky_service_really_answers_503_first() -> None:
    import urllib.error
    import urllib.request

    server = FlakyServer(fails=2)
    codes = []
    with server.running():
        for _ in range(3):
            try:
                with urllib.request.urlopen(f"{server.url}/release", timeout=10) as r:
                    codes.append(r.status)
            except urllib.error.HTTPError as exc:
                codes.append(exc.code)
    assert codes == [503, 503, 200]
    assert FLAKY_HTTP.name in STYLES


def _judge_request(system: str, focus: str, ops: list[dict[str, object]]) -> ModelRequest:
    import json

    from tether.models.base import Message

    payload = {
        "focus_item": focus,
        "ledger": {"items": [{"id": focus, "title": "write out/a.txt", "status": "in_progress"}]},
        "op_journal": ops,
    }
    return ModelRequest(
        purpose="judge", system=system, messages=(Message("user", json.dumps(payload)),)
    )


def test_the_literal_judge_attaches_only_what_its_instructions_ask() -> None:
    import json

    read = {
        "evidence_ref": "op:1",
        "tool": "read_file",
        "args": {"path": "in.txt"},
        "status": "succeeded",
    }
    write = {
        "evidence_ref": "op:2",
        "tool": "write_file",
        "args": {"path": "out/a.txt"},
        "status": "succeeded",
    }
    # Proof of the item: done, with that proof.
    done = json.loads(literal_judge(_judge_request(JUDGE_INSTRUCTIONS, "a", [read, write])))
    assert done["changes"] == [{"item": "a", "status": "done", "evidence": ["op:2"]}]
    assert done["decision"] == "satisfied"
    # Work that is not the proof: attached only if the instructions speak of in-progress
    # evidence.
    plain = "You are the judge.\n- Mark an item done only with proof.\n"
    assert json.loads(literal_judge(_judge_request(plain, "a", [read])))["changes"] == []
    asked = plain + "- Attach this round's new work to the focus item as in_progress evidence.\n"
    got = json.loads(literal_judge(_judge_request(asked, "a", [read])))["changes"]
    assert got == [
        {"item": "a", "status": "in_progress", "evidence": ["op:1"], "note": "work of this round"}
    ]
