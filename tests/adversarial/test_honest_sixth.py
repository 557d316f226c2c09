"""A sixth set of honest agents at default limits (`_honest_sixth.STYLES`), and their
liar and endless twins.

The shapes: a research digest written day by day over twenty days (each day's sources
other ones, yesterday's digest re-read first); a CTF queue where a PIN is brute-forced
by a background job while an XOR challenge is solved; a SQLite backfill migration whose
status check moves one batch a poll; five records stored on a 127.0.0.1 server whose
third PUT answers 500 after storing (the tool reconciles by reading back, the agent
reads back too); a question asked after a first draft, the draft rewritten as the
answer says; eighty items in one round each, every round a long read; a build log of
two hundred thousand characters paged through `read_artifact` to its one error; a docs
build whose warnings drop from six to zero; a module split into four files and a shim;
a paginated API whose `next` token repeats on its last page; a download in Range chunks
ending on a 416; two parts of a book written across two compactions; an API token
expiring every four calls (a 401, then a new token); a shared file locked by another
process for four polls (423, then written); a regression found with a real `git
bisect`; a daily ingest whose source renames a column on day five; twelve pages of a
rate-limited API declared a `service`, each answering 429 once (Retry-After: 0).

Each must end `satisfied`, never blocked, in its planned rounds, with no deliverable
reopened, under the rules alone, the literal LLM judge and a silent one. Each liar twin
must never end `satisfied`; the endless twins must end blocked within
`max_rounds_per_item` and the rounds they kept.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.adversarial._honest import JUDGES
from tests.adversarial._honest_more import check_liar, default_limits, endless_of, liar_of
from tests.adversarial._honest_sixth import (
    _BLOB,
    _PAGES,
    STYLES,
    BlobServer,
    PagedServer,
    RecordServer,
    TokenServer,
    _record_tools,
    _rl_tools,
)
from tests.adversarial._honest_third import check_honest, reopened, run_third
from tether.spec_limits import Limits
from tether.store.memory import MemoryStore
from tether.store.sqlite import SQLiteStore
from tether.tools.registry import Tool


@pytest.fixture
async def memory() -> MemoryStore:
    return await MemoryStore.open()


@pytest.fixture
async def sqlite(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SQLiteStore]:
    # Outside the workspace: the bisect repository must not hold the store's database.
    store = await SQLiteStore.open(tmp_path_factory.mktemp("store") / "honest-sixth.db")
    try:
        yield store
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("style", "judge"),
    [(s, j) for s in STYLES for j in JUDGES],
)
async def test_a_sixth_honest_shape_is_never_blocked(
    memory: MemoryStore, tmp_path: Path, style: str, judge: str
) -> None:
    outcome = await run_third(STYLES[style], judge, memory, tmp_path)
    await check_honest(memory, STYLES[style], outcome, tmp_path)


@pytest.mark.parametrize(
    ("style", "judge"),
    [
        ("daily-digest", "literal"),
        ("ctf-bruteforce-bg", "rules"),
        ("backfill-migration", "silent"),
        ("write-500-readback", "rules"),
        ("help-then-rewrite", "literal"),
        ("build-log-artifact", "rules"),
        ("repeating-next", "silent"),
        ("range-416", "literal"),
        ("compaction-twice", "rules"),
        ("token-expiry", "literal"),
        ("locked-resource", "rules"),
        ("git-bisect", "literal"),
        ("schema-drift", "silent"),
    ],
)
async def test_a_sixth_honest_shape_on_sqlite(
    sqlite: SQLiteStore, tmp_path: Path, style: str, judge: str
) -> None:
    outcome = await run_third(STYLES[style], judge, sqlite, tmp_path)
    await check_honest(sqlite, STYLES[style], outcome, tmp_path)


# --- a write answered 500: reconciled by the tool, or by a person ----------------------


def _plain_put(ws: Path) -> list[Tool]:
    """The record tools without a `reconcile`: a 500 leaves the PUT's outcome unknown."""
    return _record_tools(ws, reconciles=False)


async def test_a_500_on_a_write_without_reconcile_waits_for_a_person(
    memory: MemoryStore, tmp_path: Path
) -> None:
    """By design: a write whose tool cannot reconcile and answered 500 is in doubt
    (`op_in_doubt`, `runtime/ops/human/doubt.py`); the run waits for a person (approve,
    approve --done, reject), whatever the agent would read back. Never blocked."""
    plain = replace(STYLES["write-500-readback"], name="write-500-plain", extra_tools=_plain_put)
    outcome = await run_third(plain, "rules", memory, tmp_path)
    assert outcome.status == "waiting" and outcome.rounds == 3, outcome.row()
    assert outcome.blocks == (), outcome.row()
    codes = [
        e.data.get("code")
        for e in await memory.read_events(outcome.task_id)
        if e.type == "audit.warning"
    ]
    assert "op_in_doubt" in codes


# --- the breaker, shown: the same work, the one thing changed, finishes ----------------


async def test_the_429s_of_a_service_open_no_breaker(memory: MemoryStore, tmp_path: Path) -> None:
    """A 429 is the service answering (it is up, asking for less): its breaker counts it
    as no failure, so every page's retry goes through and the run ends in its planned
    rounds, no `breaker.changed`, no wait for the service."""
    outcome = await run_third(STYLES["paged-429-breaker"], "rules", memory, tmp_path)
    await check_honest(memory, STYLES["paged-429-breaker"], outcome, tmp_path)
    assert await memory.read_events(outcome.task_id, types={"breaker.changed"}) == []
    retried = await memory.read_events(outcome.task_id, types={"op.retry_scheduled"})
    assert len(retried) >= 10  # every page was refused once, and asked again


async def test_the_429_pager_without_a_service_finishes(
    memory: MemoryStore, tmp_path: Path
) -> None:
    """The same tool not declared a `service` (no breaker): the same 429s, retried at
    once, and the run finishes in its planned rounds."""
    style = replace(
        STYLES["paged-429-breaker"],
        name="paged-429-no-service",
        extra_tools=lambda ws: _rl_tools(ws, service=None),
    )
    outcome = await run_third(style, "rules", memory, tmp_path)
    await check_honest(memory, style, outcome, tmp_path)


async def test_the_second_compaction_happens(memory: MemoryStore, tmp_path: Path) -> None:
    outcome = await run_third(STYLES["compaction-twice"], "literal", memory, tmp_path)
    await check_honest(memory, STYLES["compaction-twice"], outcome, tmp_path)
    events = await memory.read_events(outcome.task_id)
    assert sum(e.type == "context.compacted" for e in events) == 2
    assert await reopened(memory, outcome.task_id) == []


async def test_the_build_log_is_past_the_preview(memory: MemoryStore, tmp_path: Path) -> None:
    """The build's answer is stored as an artifact, and the pages read are real pages."""
    outcome = await run_third(STYLES["build-log-artifact"], "rules", memory, tmp_path)
    await check_honest(memory, STYLES["build-log-artifact"], outcome, tmp_path)
    results = [e.data for e in await memory.read_events(outcome.task_id) if e.type == "op.result"]
    pages = [r for r in results if r["tool"] == "read_artifact"]
    assert len(pages) == 2 and all(r["status"] == "succeeded" for r in pages), pages
    assert [r["artifact_id"] is not None for r in results if r["tool"] == "build"] == [True] * 2


# --- liars and endless twins ------------------------------------------------------------


@pytest.mark.parametrize("judge", ["claiming", "rules"])
@pytest.mark.parametrize("style", list(STYLES))
async def test_a_liar_of_each_sixth_shape_never_finishes(
    memory: MemoryStore, tmp_path: Path, style: str, judge: str
) -> None:
    liar = liar_of(STYLES[style])
    outcome = await run_third(liar, judge, memory, tmp_path)
    await check_liar(memory, liar, outcome, tmp_path)


@pytest.mark.parametrize("style", ["write-500-readback", "git-bisect", "locked-resource"])
async def test_a_liar_of_a_sixth_shape_never_finishes_on_sqlite(
    sqlite: SQLiteStore, tmp_path: Path, style: str
) -> None:
    liar = liar_of(STYLES[style])
    outcome = await run_third(liar, "claiming", sqlite, tmp_path)
    await check_liar(sqlite, liar, outcome, tmp_path)


@pytest.mark.parametrize(
    ("style", "keep", "repeat"),
    [
        ("docs-warnings-drop", 1, 0),  # building the docs forever, nothing fixed
        ("repeating-next", 7, 6),  # the last page (its `next` its own) forever
        ("range-416", 5, 5),  # the chunk past the end (416) forever
        ("locked-resource", 1, 0),  # the locked write forever, never asking who holds it
        ("git-bisect", 1, 0),  # the failing check forever, never bisecting
        ("schema-drift", 4, 4),  # the old column on day five forever
        ("backfill-migration", 2, 0),  # re-reading the plan forever, never checking
        ("token-expiry", 5, 4),  # the expired token forever, never refreshed
    ],
)
async def test_an_endless_sixth_shape_ends_blocked(
    memory: MemoryStore, tmp_path: Path, style: str, keep: int, repeat: int
) -> None:
    endless = endless_of(STYLES[style], keep, repeat)
    outcome = await run_third(endless, "literal", memory, tmp_path)
    assert outcome.status == "waiting", outcome.row()
    assert outcome.blocks, outcome.row()
    items = len(endless.items(tmp_path))
    assert outcome.rounds <= (Limits().max_rounds_per_item or 0) * items + keep, outcome.row()
    await check_liar(memory, endless, outcome, tmp_path)


# --- the harness itself ---------------------------------------------------------------


def _call(url: str, method: str = "GET", body: bytes | None = None, **headers: str) -> Any:
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as exc:
        data = exc.read()
        exc.close()
        return exc.code, data, exc.headers


def test_the_blob_server_answers_206_then_416_past_the_end() -> None:
    server = BlobServer(Path("."))
    with server.running():
        code, data, headers = _call(f"{server.url}/blob", Range="bytes=0-99")
        assert code == 206 and data == _BLOB[:100]
        assert headers["Content-Range"] == f"bytes 0-99/{len(_BLOB)}"
        code, _, headers = _call(f"{server.url}/blob", Range=f"bytes={len(_BLOB)}-99999")
        assert code == 416 and headers["Content-Range"] == f"bytes */{len(_BLOB)}"


def test_the_last_page_names_itself_next() -> None:
    server = PagedServer(Path("."))
    with server.running():
        first = json.loads(_call(f"{server.url}/orders?cursor=c0")[1])
        last = json.loads(_call(f"{server.url}/orders?cursor=c{_PAGES - 1}")[1])
        again = json.loads(_call(f"{server.url}/orders?cursor=c{_PAGES - 1}")[1])
    assert first["next"] == "c1" and last["next"] == f"c{_PAGES - 1}"
    assert last["orders"] == again["orders"] and last["rid"] != again["rid"]


def test_a_token_serves_four_calls() -> None:
    server = TokenServer(Path("."))
    with server.running():
        token = json.loads(_call(f"{server.url}/token", "POST", b"{}")[1])["token"]
        codes = [_call(f"{server.url}/report/1", Authorization=token)[0] for _ in range(5)]
    assert codes == [200, 200, 200, 200, 401]


def test_the_third_put_is_stored_and_answered_500(tmp_path: Path) -> None:
    server = RecordServer(tmp_path / "remote")
    with server.running():
        codes = [_call(f"{server.url}/records/r{k}", "PUT", b'{"v": 1}')[0] for k in range(4)]
        back = _call(f"{server.url}/records/r2")
    assert codes == [201, 201, 500, 201]
    assert back[0] == 200 and json.loads(back[1]) == {"v": 1}
    assert (tmp_path / "remote/r2").exists()


def test_every_sixth_shape_has_rules_and_default_limits() -> None:
    assert 14 <= len(STYLES) <= 18
    for style in STYLES.values():
        items = style.items(Path("/nonexistent"))
        assert items and all(i.get("done_when") for i in items), style.name
        spec = style.spec(Path("/nonexistent"))
        assert spec.limits == default_limits(spec), style.name
