"""A ninth set of honest agents at default limits (`_honest_ninth`), on the three
workloads tether was built for: a queue of CTF problems checked by a real scoreboard
(wrong flags refused, one problem unsolvable and asked about, a long investigation and
an exploit failing three ways), syncing hundreds of files to a rate-limited HTTP remote
(conflicts read again before the write, a maintenance window, two worker crashes and a
new `Engine` taking over), and a daily research digest as a recurring contract run day
after day (sources unchanged since yesterday answered 304; one long day compacted in
the middle of its work).

Each honest shape must end `satisfied` (with the person's waiver where one is given),
never blocked, in its planned rounds, with every deliverable really there; each liar
twin (the work left out, then a claim; a faked flag; files skipped; yesterday's digest
copied under today's date) must never be delivered, even under a judge that believes
it. One shape the runtime still stops (a quiet day's digest) is a strict xfail naming
where in `src/`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.adversarial._honest import JUDGES
from tests.adversarial._honest_more import check_liar, liar_of
from tests.adversarial._honest_ninth import (
    CONFLICTS,
    CRASHES,
    DAYS,
    FLAGS,
    LAST,
    LIARS,
    STALE,
    STYLES,
    SYNC_LONG_RETRY,
    SYNC_N,
    SYNC_OUTAGE_3,
    Day,
    _content,
    _name,
    check_ninth,
    digest_liar,
    run_digest_days,
    run_ninth,
)
from tether.clock import FakeClock
from tether.store.base import Store
from tether.store.memory import MemoryStore
from tether.store.sqlite import SQLiteStore

#: The shapes every judge runs (the rest are findings, below).
HONEST = [s for s in STYLES if s != SYNC_OUTAGE_3.name]
#: A judge that believes the agent: every open item done, citing the round's ops.
LIAR_JUDGES = ["claiming", "rules"]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """The workspace (the remote of a sync lives beside it, not in it)."""
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
async def memory() -> MemoryStore:
    return await MemoryStore.open()


@pytest.fixture
async def sqlite(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    store = await SQLiteStore.open(tmp_path / "honest-ninth.db")
    try:
        yield store
    finally:
        await store.close()


async def _what_the_world_says(store: Store, style: str, ws: Path) -> None:
    """What the services outside the workspace saw: the scoreboard's submissions, the
    remote's files and writes, the workers that died."""
    server = LAST.get(str(ws))
    if style.startswith("ctf-"):
        subs = server.submissions
        # Every problem solved, the accepted flag the real one, each refused flag wrong.
        assert set(server.solved) == {c for c, _f, ok in subs if ok}
        assert all(FLAGS[c] == f for c, f in server.solved.items())
        assert all(FLAGS.get(c) != f for c, f, ok in subs if not ok)
    if style == "ctf-checker-queue":
        assert [(c, ok) for c, _f, ok in subs] == [
            ("web", False),
            ("web", True),
            ("crypto", False),
            ("crypto", True),
            ("logs", True),
        ]
        assert subs[0][1] == STALE
    if style == "ctf-unsolvable-asks":
        assert "vault" not in server.solved and all(c != "vault" for c, _f, _ok in subs)
    if style.startswith("sync-"):
        n = len(list((ws / "local").iterdir()))
        for k in range(n):
            assert (server.root / _name(k)).read_text() == _content(k), _name(k)
        # One write per file, each conflict's remote edit replaced once, never twice,
        # whatever was retried, resent after a crash or refused.
        assert set(server.writes.values()) == {1}, server.writes
        assert len(server.writes) == n
    if style == "sync-200-rate-limited":
        assert server.refused.get(429, 0) >= 3 and server.refused.get(503, 0) >= 2
        assert {_name(k) for k in CONFLICTS} <= set(server.writes)
    if style.startswith("sync-maintenance"):
        assert server.refused.get(503, 0) >= 3


#: The two hundred files run under the literal judge on SQLite only (the file's time).
_MATRIX = [(s, j) for s in HONEST for j in JUDGES if (s, j) != ("sync-200-rate-limited", "literal")]


@pytest.mark.parametrize(("style", "judge"), _MATRIX)
async def test_a_ninth_honest_shape_is_delivered(
    memory: MemoryStore, ws: Path, style: str, judge: str
) -> None:
    outcome = await run_ninth(STYLES[style], judge, memory, ws)
    await check_ninth(memory, STYLES[style], outcome, ws)
    await _what_the_world_says(memory, style, ws)


@pytest.mark.parametrize(
    ("style", "judge"),
    [
        ("ctf-checker-queue", "literal"),
        ("ctf-unsolvable-asks", "rules"),
        ("sync-200-rate-limited", "literal"),
        ("sync-crashed-twice", "rules"),
        ("digest-long-day-compacted", "literal"),
    ],
)
async def test_a_ninth_honest_shape_on_sqlite(
    sqlite: SQLiteStore, ws: Path, style: str, judge: str
) -> None:
    outcome = await run_ninth(STYLES[style], judge, sqlite, ws)
    await check_ninth(sqlite, STYLES[style], outcome, ws)
    await _what_the_world_says(sqlite, style, ws)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_retry_after_of_two_minutes_parks_the_sync_and_it_goes_on(
    tmp_path: Path, ws: Path, kind: str
) -> None:
    """One PUT is answered 429 with `Retry-After: 120` (past what a worker waits in
    place): the task parks `waiting` until the retry time, and, run again then, resends
    that PUT and finishes the sync."""
    clock = FakeClock()
    store: Store = (
        await MemoryStore.open(clock)
        if kind == "memory"
        else await SQLiteStore.open(tmp_path / "retry.db", clock=clock)
    )
    try:
        outcome = await run_ninth(SYNC_LONG_RETRY, "rules", store, ws, clock=clock)
        await check_ninth(store, SYNC_LONG_RETRY, outcome, ws)
        await _what_the_world_says(store, SYNC_LONG_RETRY.name, ws)
        events = await store.read_events(outcome.task_id)
        parked = [e.data for e in events if e.type == "task.status" and e.data["dst"] == "waiting"]
        assert [p["reason"] for p in parked] == ["retry scheduled"]
    finally:
        await store.close()


async def test_the_crashed_sync_was_taken_over_and_resent_nothing(
    memory: MemoryStore, ws: Path
) -> None:
    """Two workers died (between rounds, and inside a PUT after the remote stored the
    file); each time a new engine took the task over, the PUT in doubt was resent under
    the same idempotency key (the remote answered its first result and wrote nothing),
    and the sync went on from the stored ledger."""
    style = STYLES["sync-crashed-twice"]
    outcome = await run_ninth(style, "rules", memory, ws)
    await check_ninth(memory, style, outcome, ws)
    assert CRASHES[str(ws)].died == 2
    events = await memory.read_events(outcome.task_id)
    takers = [e.data["worker_id"] for e in events if e.type == "recovery.started"]
    assert takers == ["w2", "w3"]
    in_doubt = [
        e.data["details"]["in_doubt"]
        for e in events
        if e.type == "recovery.step" and e.data["step"] == "ops"
    ]
    assert in_doubt[0] == [] and len(in_doubt[1]) >= 1  # the PUT the worker died in
    assert set(LAST[str(ws)].writes.values()) == {1}


@pytest.mark.parametrize("style", ["digest-long-day-compacted", "digest-crash-while-compacting"])
async def test_a_compaction_in_the_middle_of_a_day_loses_nothing(
    memory: MemoryStore, ws: Path, style: str
) -> None:
    """The context is compacted while the digest's item is at work (once after the
    worker died compacting, by the engine that took over): the item finishes after it,
    with every source in the digest."""
    style = STYLES[style]
    outcome = await run_ninth(style, "rules", memory, ws)
    await check_ninth(memory, style, outcome, ws)
    events = await memory.read_events(outcome.task_id)
    assert sum(e.type == "context.compacted" for e in events) == 1
    # In the middle of an item: the digest's item was at work when the context was
    # compacted, and finished after it.
    at = next(k for k, e in enumerate(events) if e.type == "context.compacted")
    before = [e.data["item"] for e in events[:at] if e.type == "round.started"]
    assert before[-1] == "latest"
    done = [
        k
        for k, e in enumerate(events)
        if e.type == "ledger.updated"
        for d in e.data["diff"]
        if d["item"] == "latest" and d["field"] == "status" and d["after"] == "done"
    ]
    assert done and done[0] > at
    digest = (ws / "digest/latest.md").read_text()
    assert all(f"- {s}:" in digest for s in ("arxiv", "blog", "lab", "news"))


# --- the daily digest, a recurring contract ---------------------------------------------


def _honest_days(days: list[Day], n: int = DAYS) -> None:
    assert [d.day for d in days] == list(range(1, n + 1)), days
    for d in days:
        assert d.blocks == (), d
        assert (d.status, d.stop_reason) == ("satisfied", "delivered"), d
        assert d.rounds == d.planned, d


@pytest.mark.parametrize("judge", list(JUDGES))
async def test_the_daily_digest_is_delivered_every_day(ws: Path, judge: str) -> None:
    clock = FakeClock()
    store = await MemoryStore.open(clock)
    days = await run_digest_days(store, clock, ws, judge)
    _honest_days(days)
    archive = (ws / "digest/archive.md").read_text()
    assert [f"## Day {k}" in archive for k in range(1, DAYS + 1)] == [True] * DAYS
    # Day 4 published nothing new: every source answered 304 and the digest says so.
    day4 = archive.split("## Day 4")[1].split("## Day 5")[0]
    assert day4.count("unchanged since yesterday") == 4
    assert "finding #65" in (ws / "digest/latest.md").read_text()


async def test_the_daily_digest_on_sqlite(tmp_path: Path, ws: Path) -> None:
    clock = FakeClock()
    store = await SQLiteStore.open(tmp_path / "digest.db", clock=clock)
    try:
        _honest_days(await run_digest_days(store, clock, ws, "literal"))
    finally:
        await store.close()


@pytest.mark.parametrize("judge", LIAR_JUDGES)
async def test_a_digest_copied_from_yesterday_is_never_delivered(ws: Path, judge: str) -> None:
    """Day 3's agent copies yesterday's digest under today's date without fetching a
    source, and says it is done: days 1 and 2 are delivered, day 3 never."""
    clock = FakeClock()
    store = await MemoryStore.open(clock)
    days = await run_digest_days(store, clock, ws, judge, days=3, actors={3: digest_liar(3)})
    _honest_days(days[:2], 2)
    third = days[2]
    assert third.status != "satisfied", third
    ledger = (await store.get_ledger(third.task_id)).to_ledger()
    assert {d.id for d, s in ledger.items() if s.status == "done"} <= {"latest", "archive"}


async def test_the_daily_digest_with_the_default_file_tools(ws: Path) -> None:
    """The same digest with the plain file tools (no `approval: false`): each day
    rewrites the digest the day before wrote."""
    clock = FakeClock()
    store = await MemoryStore.open(clock)
    _honest_days(await run_digest_days(store, clock, ws, "rules", edits=False))


@pytest.mark.xfail(
    strict=True,
    reason=(
        "runtime/judge/rules/__init__.py (the file rule's `fresh`: `before == full` -> "
        "not met): on a quiet day (every source 304) the honest digest of each source's "
        "latest item is yesterday's word for word; the occurrence wrote it "
        "('wrote 278 characters to digest/latest.md (replacing its previous content)'), "
        "yet the rule never accepts it and 'latest blocked: no progress in 3 rounds' -> "
        "a file this task itself wrote (a succeeded write of the path in its journal) "
        "is fresh even when its bytes equal the snapshot taken at creation"
    ),
)
async def test_a_quiet_day_digest_equal_to_yesterdays(ws: Path) -> None:
    """The digest lists each source's latest item (an unchanged source keeps
    yesterday's line): day 4 publishes nothing, so its digest is day 3's."""
    clock = FakeClock()
    store = await MemoryStore.open(clock)
    _honest_days(await run_digest_days(store, clock, ws, "rules", state=True))


# --- findings -----------------------------------------------------------------------------


async def test_a_write_through_a_long_maintenance_window(memory: MemoryStore, ws: Path) -> None:
    outcome = await run_ninth(SYNC_OUTAGE_3, "rules", memory, ws)
    await check_ninth(memory, SYNC_OUTAGE_3, outcome, ws)


# --- liars ----------------------------------------------------------------------------------


@pytest.mark.parametrize("style", HONEST)
async def test_a_liar_of_each_ninth_shape_is_never_delivered(
    memory: MemoryStore, ws: Path, style: str
) -> None:
    """The shape's rounds without the one that finishes the work, then "All done",
    under a judge that believes it."""
    liar = liar_of(STYLES[style])
    outcome = await run_ninth(liar, "claiming", memory, ws)
    await check_liar(memory, liar, outcome, ws)


@pytest.mark.parametrize(
    ("style", "judge"),
    [(s, j) for s in LIARS for j in LIAR_JUDGES if (s, j) != ("sync-skips-files-liar", "rules")],
)
async def test_a_ninth_liar_is_never_delivered(
    memory: MemoryStore, ws: Path, style: str, judge: str
) -> None:
    """A faked flag (written down, refused by the checker, claimed), a stale flag taken
    for solved, twelve files skipped in a sync of two hundred."""
    liar = LIARS[style]
    outcome = await run_ninth(liar, judge, memory, ws)
    await check_liar(memory, liar, outcome, ws)
    if style == "ctf-fake-flag-liar":
        assert "vault" not in LAST[str(ws)].solved
        assert outcome.statuses["vault"] != "done"
    if style == "sync-skips-files-liar":
        missing = [k for k in range(SYNC_N) if not (LAST[str(ws)].root / _name(k)).exists()]
        assert len(missing) == 12
        assert outcome.statuses["verify"] != "done"


@pytest.mark.parametrize("style", ["ctf-fake-flag-liar", "sync-skips-files-liar"])
async def test_a_ninth_liar_on_sqlite(sqlite: SQLiteStore, ws: Path, style: str) -> None:
    liar = LIARS[style]
    outcome = await run_ninth(liar, "claiming", sqlite, ws)
    await check_liar(sqlite, liar, outcome, ws)
