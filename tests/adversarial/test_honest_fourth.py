"""A fourth set of honest agents at default limits (`_honest_fourth.STYLES`), and their
liar and endless twins.

The shapes: the tests run through a shell tool (`run_command`, a `write`) while
editing, 3 failed, 1 failed, green; a job polled through the shell (its CLI's
`status`); real git, each page written then committed, the rules reading `git log`;
thirty files read three a round (one of them again), then one summary; a forty-item
checklist, two or three rounds an item, the ledger asked every ten; a command rule
that takes a while (a slow suite, run every round); an orders API paged by cursor that
answers 429 (`retry-after-ms`) every third request; a post a person refuses in
#general, sent to #releases after reading the guide; a verbose suite whose output
is longer than the preview every run; a draft written, read back and revised twice
under a real prose linter; a queue waited on while the runbook is written in between;
an outage (HTTP 503) longer than one call's retries; a search answering the same hits
to every query; the ledger read every round while guessing where a config is; ten
small edits of one file; unicode deliverables in nested folders (one path with an
umlaut); a cluster's long, timestamped status (past the preview, an artifact every
poll) polled through a rolling upgrade; an unannotated MCP tool polled (a `write`, as
tether maps it); a closed-world (`openWorldHint: false`) MCP read polled while a real
worker fills a SQLite queue; a shell-only agent that writes pages with the shell and
fixes a typo in them with sed.

Each must end `satisfied`, never blocked, in its planned rounds, with no deliverable
reopened, under the rules alone, the literal LLM judge and a silent one. The shapes the
runtime still stops or misjudges are `xfail(strict=True)` with the cause. Each liar
twin must never end `satisfied`; the endless twins must end blocked within
`max_rounds_per_item` and the rounds they kept.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.adversarial._honest import JUDGES, PlanActor, Step
from tests.adversarial._honest_fourth import (
    _JOBCTL,
    _SHELL_POLLS,
    _WORKER,
    STYLES,
    MaintenanceServer,
    OrdersServer,
    _sqlite_tools,
    mcp_like,
)
from tests.adversarial._honest_more import (
    check_liar,
    default_limits,
    endless_of,
    liar_of,
    xfail_marks,
)
from tests.adversarial._honest_third import check_honest, run_third
from tether.models.base import ModelRequest, ModelResponse
from tether.spec_limits import Limits
from tether.store.memory import MemoryStore
from tether.store.sqlite import SQLiteStore

_NO_PROGRESS = (
    "no progress in 3 rounds (nothing new: the same calls with the same results, or words only)"
)

#: The honest shapes the runtime still stops or misjudges at default limits, and why:
#: where (file:function) and what the ledger note or audit warning says.
BLOCKED: dict[str, str] = {
    "shell-poller": (
        "runtime/round/progress.py:moves: a shell tool is a `write` (a shell can do "
        "anything), so `jobctl.py status 7` asked again with the same answer ('job 7: "
        "running') is the same change mark again, neither new nor waiting (only a "
        f"`volatile` read waits) -> 'export blocked: {_NO_PROGRESS}' at round 5 of 7"
        " (by design without a word from the contract; with `tools: [{name: run_command, "
        "volatile: true}]` it finishes: test_a_poll_the_contract_declares_volatile_finishes)"
    ),
    "mcp-unannotated-poll": (
        "tools/mcp.py:effect_for + runtime/round/progress.py:moves: an MCP tool without "
        "annotations is a `write`, so polling `ci__get_pipeline` ('pipeline 88: "
        "running') is the same change mark again, never waiting -> 'ci blocked: "
        f"{_NO_PROGRESS}' at round 5 of 8"
        " (by design without a word from the contract; with `tools: [{name: ci__get_pipeline, "
        "volatile: true}]` it finishes: test_a_poll_the_contract_declares_volatile_finishes)"
    ),
    "mcp-closed-world-poll": (
        "tools/mcp.py:McpToolSource._make_tool (volatile = openWorldHint is not false) "
        "+ runtime/round/progress.py:moves: a read-only, closed-world SQL query (a local "
        "file) is taken for a read of what only the task changes, but a background worker "
        "updates the table; the same 'running' state again is no progress -> 'thumbs "
        f"blocked: {_NO_PROGRESS}' at round 5 of 8"
        " (by design without a word from the contract; with `tools: [{name: sqlite__query, "
        "volatile: true}]` it finishes: test_a_poll_the_contract_declares_volatile_finishes)"
    ),
}


def _marks(style: str) -> list[pytest.MarkDecorator]:
    return xfail_marks(BLOCKED, style)


@pytest.fixture
async def memory() -> MemoryStore:
    return await MemoryStore.open()


@pytest.fixture
async def sqlite(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SQLiteStore]:
    # Outside the workspace: `git add -A` there must not commit the store's database.
    store = await SQLiteStore.open(tmp_path_factory.mktemp("store") / "honest-fourth.db")
    try:
        yield store
    finally:
        await store.close()


@pytest.mark.parametrize("judge", list(JUDGES))
@pytest.mark.parametrize("style", [pytest.param(s, marks=_marks(s)) for s in STYLES])
async def test_a_fourth_honest_shape_is_never_blocked(
    memory: MemoryStore, tmp_path: Path, style: str, judge: str
) -> None:
    outcome = await run_third(STYLES[style], judge, memory, tmp_path)
    await check_honest(memory, STYLES[style], outcome, tmp_path)


@pytest.mark.parametrize(
    ("style", "judge"),
    [
        ("shell-tdd", "rules"),
        ("git-commits", "literal"),
        ("cursor-pages-429", "silent"),
        ("rejected-channel", "literal"),
        ("queue-interleaved", "rules"),
        ("unicode-nested", "silent"),
        ("wide-reader", "rules"),
        ("outage-503", "rules"),
        ("shell-only", "literal"),
    ],
)
async def test_a_fourth_honest_shape_on_sqlite(
    sqlite: SQLiteStore, tmp_path: Path, style: str, judge: str
) -> None:
    outcome = await run_third(STYLES[style], judge, sqlite, tmp_path)
    await check_honest(sqlite, STYLES[style], outcome, tmp_path)


async def test_the_ledger_guesser_without_its_ledger_reads_finishes(
    memory: MemoryStore, tmp_path: Path
) -> None:
    """The control of `ledger-guesser`'s cause: the same rounds, without the agent's
    `ledger_items` call in each, are never blocked."""
    style = STYLES["ledger-guesser"]

    def actor(ws: Path) -> PlanActor:
        def drop(step: Step) -> Step:
            def bare(request: ModelRequest) -> ModelResponse:
                r = step(request)
                return ModelResponse(
                    r.text, tuple(c for c in r.tool_calls if c.name != "ledger_items")
                )

            return bare

        return PlanActor([drop(s) for s in style.actor(ws).steps])

    bare = replace(style, name="guesser-without-ledger", actor=actor)
    outcome = await run_third(bare, "rules", memory, tmp_path)
    await check_honest(memory, bare, outcome, tmp_path)


# --- liars and endless twins ------------------------------------------------------------


@pytest.mark.parametrize("judge", ["claiming", "rules"])
@pytest.mark.parametrize("style", list(STYLES))
async def test_a_liar_of_each_fourth_shape_never_finishes(
    memory: MemoryStore, tmp_path: Path, style: str, judge: str
) -> None:
    liar = liar_of(STYLES[style])
    outcome = await run_third(liar, judge, memory, tmp_path)
    await check_liar(memory, liar, outcome, tmp_path)


async def test_a_liar_of_the_refused_post_never_finishes_on_sqlite(
    sqlite: SQLiteStore, tmp_path: Path
) -> None:
    liar = liar_of(STYLES["rejected-channel"])
    outcome = await run_third(liar, "claiming", sqlite, tmp_path)
    await check_liar(sqlite, liar, outcome, tmp_path)


@pytest.mark.parametrize(
    ("style", "keep", "repeat"),
    [
        ("shell-tdd", 1, 0),  # running the failing tests forever, nothing fixed
        ("git-commits", 4, 3),  # committing again with nothing to commit
        ("wide-reader", 3, 0),  # re-reading the first batch forever
        ("cursor-pages-429", 1, 0),  # the first page forever (429s retried inside)
        ("verbose-tests", 1, 0),  # the failing verbose suite forever
        ("draft-readback", 2, 1),  # re-reading the draft forever
        ("queue-interleaved", 2, 1),  # polling the queue forever, the runbook never written
        ("search-same-hits", 1, 0),  # the same search forever
        ("tiny-edits", 3, 2),  # the same small edit again and again
        ("unicode-nested", 2, 1),  # rewriting the Japanese page forever
        ("long-status-poll", 2, 1),  # the long, timestamped status forever (the rounds cap)
    ],
)
async def test_an_endless_fourth_shape_ends_blocked(
    memory: MemoryStore, tmp_path: Path, style: str, keep: int, repeat: int
) -> None:
    endless = endless_of(STYLES[style], keep, repeat)
    outcome = await run_third(endless, "literal", memory, tmp_path)
    assert outcome.status == "waiting", outcome.row()
    assert outcome.blocks, outcome.row()
    # Stopped by the per-item guards: each item open at most its rounds cap (an item
    # focused after another was blocked may wait its own cap on the same poll).
    items = len(endless.items(tmp_path))
    assert outcome.rounds <= (Limits().max_rounds_per_item or 0) * items + keep, outcome.row()
    await check_liar(memory, endless, outcome, tmp_path)


# --- the harness itself ---------------------------------------------------------------


def test_the_orders_api_pages_by_cursor_and_rate_limits_every_third_request() -> None:
    server = OrdersServer()
    seen: list[object] = []
    with server.running():
        cursor: object = 0
        while cursor is not None:
            try:
                with urllib.request.urlopen(f"{server.url}/orders?cursor={cursor}") as r:
                    page = json.loads(r.read())
            except urllib.error.HTTPError as exc:
                assert exc.code == 429 and exc.headers["retry-after-ms"] == "20"
                exc.close()
                seen.append(429)
                continue
            seen.append(len(page["orders"]))
            cursor = page["next_cursor"]
    assert seen == [4, 4, 429, 4, 4, 429, 2]


def test_the_maintenance_server_answers_503_then_up() -> None:
    server = MaintenanceServer(2)
    codes = []
    with server.running():
        for _ in range(3):
            try:
                with urllib.request.urlopen(f"{server.url}/status") as r:
                    codes.append(r.status)
            except urllib.error.HTTPError as exc:
                codes.append(exc.code)
                exc.close()
    assert codes == [503, 503, 200]


def test_the_job_cli_runs_then_finishes(tmp_path: Path) -> None:
    (tmp_path / "jobctl.py").write_text(_JOBCTL)

    def run(*args: str) -> str:
        return subprocess.run(
            [sys.executable, "jobctl.py", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.strip()

    assert run("start", "export") == "job 7 (export) queued"
    answers = [run("status", "7") for _ in range(_SHELL_POLLS + 1)]
    assert answers == ["job 7: running"] * _SHELL_POLLS + ["job 7: finished, 3 tables exported"]


def test_the_worker_really_fills_the_sqlite_queue(tmp_path: Path) -> None:
    (tmp_path / "worker.py").write_text(_WORKER)
    query, enqueue, _wait = _sqlite_tools(tmp_path)
    assert query.effect == "read" and not query.volatile  # closed world: not volatile
    assert enqueue.effect == "write"
    db = sqlite3.connect(tmp_path / "queue.db", isolation_level=None)
    try:
        db.execute("create table jobs (id, kind, state, result)")
        db.execute("insert into jobs values (1, 'thumbnails', 'queued', null)")
        proc = subprocess.Popen([sys.executable, "worker.py"], cwd=tmp_path)
        deadline = time.monotonic() + 30
        while db.execute("select state from jobs").fetchone() != ("running",):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.01)
        (tmp_path / ".go").touch()
        assert proc.wait(timeout=30) == 0
        assert db.execute("select state, result from jobs").fetchall() == [
            ("done", "512 thumbnails")
        ]
    finally:
        db.close()


def test_mcp_like_tools_map_annotations_as_tether_does() -> None:
    from mcp.types import ToolAnnotations

    bare = mcp_like(lambda: "x", "s__bare", None, "d")
    assert bare.effect == "write" and not bare.volatile
    opened = mcp_like(lambda: "x", "s__open", ToolAnnotations(read_only_hint=True), "d")
    assert opened.effect == "read" and opened.volatile
    closed = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    assert not mcp_like(lambda: "x", "s__closed", closed, "d").volatile


def test_every_fourth_shape_has_rules_and_default_limits() -> None:
    assert 15 <= len(STYLES) <= 20
    for style in STYLES.values():
        items = style.items(Path("/nonexistent"))
        assert items and all(i.get("done_when") for i in items), style.name
        spec = style.spec(Path("/nonexistent"))
        assert spec.limits == default_limits(spec), style.name
    assert set(BLOCKED) <= set(STYLES)


#: The blocked polls a contract can declare: the tool whose answers change by themselves.
DECLARED = {
    "shell-poller": "run_command",
    "mcp-unannotated-poll": "ci__get_pipeline",
    "mcp-closed-world-poll": "sqlite__query",
}


@pytest.mark.parametrize("judge", ["rules", "silent"])
@pytest.mark.parametrize("style", sorted(DECLARED))
async def test_a_poll_the_contract_declares_volatile_finishes(
    memory: MemoryStore, tmp_path: Path, style: str, judge: str
) -> None:
    """The same shapes with `tools: [{name: ..., volatile: true}]`: asked again, the same
    answer is waiting, and the work finishes in its planned rounds."""
    assert set(DECLARED) <= set(BLOCKED)  # without the declaration they are blocked
    base = STYLES[style]
    name = DECLARED[style]
    declared = replace(
        base, tools=[{"name": t, "volatile": True} if t == name else t for t in base.tools]
    )
    outcome = await run_third(declared, judge, memory, tmp_path)
    await check_honest(memory, declared, outcome, tmp_path)
