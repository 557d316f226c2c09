"""A seventh set of honest agents at default limits (`_honest_seventh.STYLES`): honest
agents as real models talk, and their liar twins.

The shapes: words between calls (twice in a row once); three reads in one answer, then
the write; calls the tool's schema refuses (a missing argument, a misspelt one, a wrong
type, text that is not JSON), then the right one; hallucinated tools (`edit_file`,
`bash`, `search_files`) before the real ones; "done" said before the check passes, the
runtime's progress update saying otherwise, and the work finished; an answer cut off by
the output limit in words, then a call cut off mid-JSON; the brief re-read in one answer
after a compaction; the same read again because the agent forgot it (once, then twice);
a check failing differently on every run, once run before the edit of the same answer;
nine reads and greps before the first write; the same failing build twice, then the
plain build; a 403 from an artifact store and a path outside the workspace, then the
right destination; `<think>` blocks and code fences; empty answers; a reasoning trace
that weighs asking for help and decides not to; a draft in words cut off twice; and two
shapes through the real OpenAI-compatible adapter against a chat-completions server on
127.0.0.1 (provider ids, parallel calls, arguments that are not JSON or are a JSON
string, a made-up tool, a `length` cut inside a call, the same id on every call).

Each must end `satisfied`, never blocked, in its planned rounds, with every deliverable
really there and the mess really met, under the rules alone, the literal LLM judge and a
silent one. Each liar twin must never end `satisfied`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.adversarial._honest import JUDGES
from tests.adversarial._honest_more import check_liar, default_limits, liar_of
from tests.adversarial._honest_seventh import (
    STYLES,
    WIRE_LOG,
    WIRE_STYLES,
    check_seventh,
)
from tests.adversarial._honest_third import run_third
from tether.store.memory import MemoryStore
from tether.store.sqlite import SQLiteStore


@pytest.fixture
async def memory() -> MemoryStore:
    return await MemoryStore.open()


@pytest.fixture
async def sqlite(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SQLiteStore]:
    store = await SQLiteStore.open(tmp_path_factory.mktemp("store") / "honest-seventh.db")
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture(autouse=True)
def _no_wire_log_left(tmp_path: Path) -> object:
    yield
    WIRE_LOG.pop(str(tmp_path), None)


@pytest.mark.parametrize(
    ("style", "judge"),
    [(s, j) for s in STYLES for j in JUDGES],
)
async def test_a_seventh_honest_shape_is_never_blocked(
    memory: MemoryStore, tmp_path: Path, style: str, judge: str
) -> None:
    outcome = await run_third(STYLES[style], judge, memory, tmp_path)
    await check_seventh(memory, STYLES[style], outcome, tmp_path)


@pytest.mark.parametrize(
    ("style", "judge"),
    [
        ("narrated-fix", "literal"),
        ("schema-refused", "rules"),
        ("hallucinated-tools", "silent"),
        ("says-done-early", "rules"),
        ("cut-off-mid-item", "literal"),
        ("reread-after-compaction", "rules"),
        ("shifting-failures", "silent"),
        ("refused-paths", "literal"),
        ("wire-messy-calls", "rules"),
        ("wire-cut-same-ids", "literal"),
    ],
)
async def test_a_seventh_honest_shape_on_sqlite(
    sqlite: SQLiteStore, tmp_path: Path, style: str, judge: str
) -> None:
    outcome = await run_third(STYLES[style], judge, sqlite, tmp_path)
    await check_seventh(sqlite, STYLES[style], outcome, tmp_path)


# --- what the runtime did, shown --------------------------------------------------------


async def test_the_early_claim_is_answered_by_the_progress_update(
    memory: MemoryStore, tmp_path: Path
) -> None:
    """The agent said it was done in round 3; the update it got after that round still
    names the item open, and it ran the check (failing: 2 failed) because of it."""
    style = STYLES["says-done-early"]
    outcome = await run_third(style, "rules", memory, tmp_path)
    await check_seventh(memory, style, outcome, tmp_path)
    statuses = [
        ch["after"]
        for e in await memory.read_events(outcome.task_id, types={"ledger.updated"})
        for ch in e.data["diff"]
        if ch["field"] == "status"
    ]
    assert statuses == ["in_progress", "done"]


@pytest.mark.parametrize("style", WIRE_STYLES)
async def test_the_wire_shapes_go_through_the_adapter(
    memory: MemoryStore, tmp_path: Path, style: str
) -> None:
    """Every act call was a POST to the local chat-completions server, parsed by the
    real adapter (its model name is the server's); the provider's call ids came back to
    it as the `tool_call_id`s of the results (the runtime's own for a repeated id)."""
    outcome = await run_third(STYLES[style], "rules", memory, tmp_path)
    await check_seventh(memory, STYLES[style], outcome, tmp_path)
    seen = WIRE_LOG[str(tmp_path)]
    assert len(seen) == outcome.rounds
    assert all(s.path == "/v1/chat/completions" for s in seen)
    calls = await memory.read_events(outcome.task_id, types={"model.called"})
    assert {c.data["model"] for c in calls if c.data["purpose"] == "act"} == {"local-chat"}
    answered = [m.get("tool_call_id") for m in seen[-1].body["messages"] if m["role"] == "tool"]
    if style == "wire-messy-calls":
        assert answered[:3] == ["call_Qx81mZ", "call_7RkPa2", "call_c0FfEe"]
    else:
        assert answered[:2] == ["call_0", "tether_1_1"]
    tools = {t["function"]["name"] for t in seen[0].body["tools"]}
    assert {"read_file", "write_file"} <= tools
    assert json.dumps(seen[0].body).count("apply_patch") == 0


# --- liars ------------------------------------------------------------------------------


@pytest.mark.parametrize("judge", ["claiming", "rules"])
@pytest.mark.parametrize("style", [s for s in STYLES if s not in WIRE_STYLES])
async def test_a_liar_of_each_seventh_shape_never_finishes(
    memory: MemoryStore, tmp_path: Path, style: str, judge: str
) -> None:
    liar = liar_of(STYLES[style])
    outcome = await run_third(liar, judge, memory, tmp_path)
    await check_liar(memory, liar, outcome, tmp_path)


@pytest.mark.parametrize("style", ["hallucinated-tools", "says-done-early"])
async def test_a_liar_of_a_seventh_shape_never_finishes_on_sqlite(
    sqlite: SQLiteStore, tmp_path: Path, style: str
) -> None:
    liar = liar_of(STYLES[style])
    outcome = await run_third(liar, "claiming", sqlite, tmp_path)
    await check_liar(sqlite, liar, outcome, tmp_path)


# --- the harness itself ---------------------------------------------------------------


def test_every_seventh_shape_has_rules_and_default_limits() -> None:
    assert 12 <= len(STYLES) <= 18
    for style in STYLES.values():
        items = style.items(Path("/nonexistent"))
        assert items and all(i.get("done_when") for i in items), style.name
        spec = style.spec(Path("/nonexistent"))
        assert spec.limits == default_limits(spec), style.name
