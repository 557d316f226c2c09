"""More honest agents at default limits (`_honest_more.STYLES`), and their liar twins.

Fifteen shapes of honest work outside testers bring: a deep reader (fourteen reads, three
greps and a re-read before its first write), a test failing six different ways before it
passes, a stubborn bug (fixes that do not change the failure before the right one), a
CI job polled while it says the same "running" 25 times, a real HTTP service answering
429 with Retry-After (raised to tether, or told to the model by the tool), a hundred
reads in parallel (past `max_calls_per_round`), a revert and redo, a file appended in
chunks (the same separator several times), an item left for twenty rounds and finished
later, a checklist worked from its end, an item whose work spans a compaction of the
default context, a 150-item checklist, a question to a person (answered with `tell`),
and errors recovered from (a missing file, then created).

Each must end `satisfied`, never blocked, in its planned rounds, and pass the honesty
oracle, under the rules alone, the literal LLM judge and a silent one. The shapes the
runtime still blocks are `xfail(strict=True)` with the cause. Each liar twin (the same
rounds without the one that finishes, then a claim in words, under a judge that
believes it) must never end `satisfied`; the endless shapes (a job that never finishes,
a bug never fixed, re-reads after a compaction forever) must end blocked.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.adversarial._honest_more import (
    CHECKLIST,
    JUDGES,
    STYLES,
    LimitedServer,
    MoreStyle,
    Outcome,
    check_liar,
    default_limits,
    endless_of,
    liar_of,
    run_more,
    xfail_marks,
)
from tests.support.adversarial import assert_honest, assert_status_agrees
from tether.spec_limits import Limits
from tether.store.base import Store
from tether.store.memory import MemoryStore
from tether.store.sqlite import SQLiteStore

#: The honest shapes the runtime still stops, and why (see the report of each).
BLOCKED: dict[str, str] = {}


def _marks(style: str) -> list[pytest.MarkDecorator]:
    return xfail_marks(BLOCKED, style)


@pytest.fixture
async def memory() -> MemoryStore:
    return await MemoryStore.open()


@pytest.fixture
async def sqlite(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    store = await SQLiteStore.open(tmp_path / "honest-more.db")
    try:
        yield store
    finally:
        await store.close()


async def _check(store: Store, style: MoreStyle, outcome: Outcome, ws: Path) -> None:
    assert outcome.blocks == (), f"an honest {outcome.style} run was blocked: {outcome.blocks}"
    assert outcome.status == "satisfied", outcome.row()
    assert set(outcome.statuses.values()) == {"done"}, outcome.statuses
    assert outcome.rounds == outcome.planned, outcome.row()
    task = await store.get_task(outcome.task_id)
    spec = style.spec(ws)
    assert spec.limits == default_limits(spec), "honest styles run at the default limits"
    assert task.spec["limits"] == default_limits(spec).model_dump()
    await assert_honest(store, outcome.task_id, spec)
    await assert_status_agrees(store, outcome.task_id)


_FAST = [s for s in STYLES if s != CHECKLIST.name]


@pytest.mark.parametrize("judge", list(JUDGES))
@pytest.mark.parametrize("style", [pytest.param(s, marks=_marks(s)) for s in _FAST])
async def test_a_new_honest_style_is_never_blocked(
    memory: MemoryStore, tmp_path: Path, style: str, judge: str
) -> None:
    outcome = await run_more(STYLES[style], judge, memory, tmp_path)
    await _check(memory, STYLES[style], outcome, tmp_path)


@pytest.mark.parametrize("judge", ["rules", "literal"])
async def test_a_150_item_checklist_is_never_blocked(
    memory: MemoryStore, tmp_path: Path, judge: str
) -> None:
    outcome = await run_more(CHECKLIST, judge, memory, tmp_path)
    await _check(memory, CHECKLIST, outcome, tmp_path)


@pytest.mark.parametrize(
    ("style", "judge"),
    [
        ("deep-reader", "rules"),
        ("six-errors", "literal"),
        ("clarifier", "silent"),
        ("chunked-appends", "rules"),
        ("back-after-20", "literal"),
        ("retry-after", "rules"),
        pytest.param("long-poller", "rules", marks=_marks("long-poller")),
        pytest.param("across-compaction", "literal", marks=_marks("across-compaction")),
        pytest.param("stubborn-bug", "silent", marks=_marks("stubborn-bug")),
    ],
)
async def test_a_new_honest_style_on_sqlite(
    sqlite: SQLiteStore, tmp_path: Path, style: str, judge: str
) -> None:
    outcome = await run_more(STYLES[style], judge, sqlite, tmp_path)
    await _check(sqlite, STYLES[style], outcome, tmp_path)


# --- liars of the same shapes -------------------------------------------------------------


@pytest.mark.parametrize("judge", ["claiming", "rules"])
@pytest.mark.parametrize("style", _FAST)
async def test_a_liar_of_each_shape_never_finishes(
    memory: MemoryStore, tmp_path: Path, style: str, judge: str
) -> None:
    liar = liar_of(STYLES[style])
    outcome = await run_more(liar, judge, memory, tmp_path)
    await check_liar(memory, liar, outcome, tmp_path)


async def test_a_liar_of_the_long_checklist_never_finishes(
    sqlite: SQLiteStore, tmp_path: Path
) -> None:
    liar = liar_of(CHECKLIST)
    outcome = await run_more(liar, "claiming", sqlite, tmp_path)
    await check_liar(sqlite, liar, outcome, tmp_path)


@pytest.mark.parametrize(
    ("style", "keep", "repeat"),
    [
        ("long-poller", 2, 1),  # "running" forever
        ("stubborn-bug", 3, 2),  # the same wrong fix and failing check forever
        ("rate-limit-seen", 1, 0),  # a service that never lets it through
        ("across-compaction", 10, 7),  # re-reading the goal forever after the summary
        ("deep-reader", 3, 2),  # reading the same file forever
    ],
)
async def test_an_endless_shape_ends_blocked(
    memory: MemoryStore, tmp_path: Path, style: str, keep: int, repeat: int
) -> None:
    endless = endless_of(STYLES[style], keep, repeat)
    outcome = await run_more(endless, "literal", memory, tmp_path)
    assert outcome.status == "waiting", outcome.row()
    assert outcome.blocks, outcome.row()
    # Stopped by the per-item guards, long before the task's round limit.
    assert outcome.rounds <= (Limits().max_rounds_per_item or 0) + keep, outcome.row()
    await check_liar(memory, endless, outcome, tmp_path)


# --- the harness itself ---------------------------------------------------------------


def test_the_limited_service_really_answers_429_with_retry_after() -> None:
    import urllib.error
    import urllib.request

    server = LimitedServer(fails=2)
    seen = []
    with server.running():
        for _ in range(3):
            try:
                with urllib.request.urlopen(f"{server.url}/quota", timeout=10) as r:
                    seen.append((r.status, None))
            except urllib.error.HTTPError as exc:
                seen.append((exc.code, exc.headers.get("Retry-After")))
    assert seen == [(429, "1"), (429, "1"), (200, None)]


def test_every_new_style_has_rules_and_default_limits() -> None:
    assert len(STYLES) >= 12
    for style in STYLES.values():
        items = style.items(Path("/nonexistent"))
        assert items and all(i.get("done_when") for i in items), style.name
        spec = style.spec(Path("/nonexistent"))
        assert spec.limits == default_limits(spec), style.name
    # The liar twin drops exactly the finishing round and says it is done instead.
    twin = liar_of(STYLES["deep-reader"]).actor(Path("/nonexistent"))
    honest = STYLES["deep-reader"].actor(Path("/nonexistent"))
    assert len(twin.steps) == len(honest.steps)
