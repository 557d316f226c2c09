"""A fifth set of honest agents at default limits (`_honest_fifth.STYLES`), and their
liar and endless twins.

The shapes: sixty files synced to a 127.0.0.1 destination that already holds some (409
each, skipped); a large log read in ranges (`offset`/`limit`); a CTF solver trying
payloads against a WAF-guarded login; a draft renamed into place with a real `mv`; a
suite failing 5, 3, 4, 2, then 0 tests; a scratch file deleted (a `delete`, approved);
two items of one file, a section added and reverted; a feed whose stories change
between calls; a digest emailed once approved; arguments refused by the schema and by
the tool, corrected; a CSV written by a SQLite export tool; a `done_when` command that
starts passing only rounds after the work (DNS propagation, a real background job); a
worklog appended the same line every round; a CRLF CSV with a BOM corrected in place;
a bundler whose output and errors are single lines of forty thousand characters; a
search API stamping a request id, a time and a duration on every answer; five hundred
files synced ten a batch, one batch a round; a page committed on a feature branch,
then back on main; four pages published, each approved.

Each must end `satisfied`, never blocked, in its planned rounds, with no deliverable
reopened, under the rules alone, the literal LLM judge and a silent one. Each liar
twin must never end `satisfied`; the endless twins must end blocked within
`max_rounds_per_item` and the rounds they kept.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.adversarial._honest import JUDGES, PlanActor
from tests.adversarial._honest_fifth import (
    _BLOCKED_PAYLOADS,
    _BUNDLE,
    _BYPASS,
    _FLAG,
    _PROPAGATE,
    STYLES,
    DestServer,
    FeedServer,
    LoginServer,
    _request,
)
from tests.adversarial._honest_more import check_liar, default_limits, endless_of, liar_of
from tests.adversarial._honest_third import check_honest, reopened, run_third
from tether.spec_limits import Limits
from tether.store.memory import MemoryStore
from tether.store.sqlite import SQLiteStore
from tether.tools.registry import Reconciliation, Tool, tool

os.environ.setdefault("GIT_CONFIG_NOSYSTEM", "1")


#: The shapes whose draft the task itself moves, deletes or takes out of the tree after
#: the literal judge attached the draft's `write_file` op to the item in progress: the
#: rule's acceptance replaces that evidence (`ledger.ItemChange.evidence_replaces`), so
#: nothing reopens the item before delivery.
MOVED_DRAFTS = ("feature-branch", "rename-deliverable", "scratch-deleted")


@pytest.fixture
async def memory() -> MemoryStore:
    return await MemoryStore.open()


@pytest.fixture
async def sqlite(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SQLiteStore]:
    # Outside the workspace: `git add -A` there must not commit the store's database.
    store = await SQLiteStore.open(tmp_path_factory.mktemp("store") / "honest-fifth.db")
    try:
        yield store
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("style", "judge"),
    [(s, j) for s in STYLES for j in JUDGES],
)
async def test_a_fifth_honest_shape_is_never_blocked(
    memory: MemoryStore, tmp_path: Path, style: str, judge: str
) -> None:
    outcome = await run_third(STYLES[style], judge, memory, tmp_path)
    await check_honest(memory, STYLES[style], outcome, tmp_path)


@pytest.mark.parametrize(
    ("style", "judge"),
    [
        ("sync-409-skip", "rules"),
        ("range-reader", "literal"),
        ("bumpy-tests", "silent"),
        ("scratch-deleted", "rules"),
        ("changing-feed", "literal"),
        ("approved-send", "rules"),
        ("sqlite-export", "silent"),
        ("propagation-rule", "rules"),
        ("crlf-bom-edit", "literal"),
        ("long-line-bundle", "rules"),
        ("feature-branch", "silent"),
        ("approve-each-page", "literal"),
    ],
)
async def test_a_fifth_honest_shape_on_sqlite(
    sqlite: SQLiteStore, tmp_path: Path, style: str, judge: str
) -> None:
    outcome = await run_third(STYLES[style], judge, sqlite, tmp_path)
    await check_honest(sqlite, STYLES[style], outcome, tmp_path)


# --- the causes, shown: the same work, the one thing changed, finishes -----------------


async def test_six_payloads_finish(memory: MemoryStore, tmp_path: Path) -> None:
    """`ctf-payloads` with one blocked payload fewer (six, then the bypass) finishes
    too."""
    base = STYLES["ctf-payloads"]

    def actor(ws: Path) -> PlanActor:
        steps = base.actor(ws).steps
        return PlanActor([*steps[:1], *steps[2:]])  # payload 1 left out

    fewer = replace(base, name="ctf-six-payloads", actor=actor)
    outcome = await run_third(fewer, "rules", memory, tmp_path)
    await check_honest(memory, fewer, outcome, tmp_path)


def _login_read(ws: Path) -> list[Tool]:
    """The challenge's login tried through a read (a GET, volatile as reads are by
    default): the same answers."""

    @tool(name="try_login", effect="read", description="GET the login with a user.")
    def try_login(user: str, password: str) -> str:
        body = json.dumps({"user": user, "password": password}).encode()
        return _request(ws, "POST", "/login", body)

    return [try_login]


async def test_the_payloads_through_a_read_finish_alike(
    memory: MemoryStore, tmp_path: Path
) -> None:
    """`ctf-payloads` whose tool is declared a read (volatile, as reads are by default)
    finishes the same way: each 403 names another rule, a wall the item never met."""
    read = replace(STYLES["ctf-payloads"], name="ctf-payloads-read", extra_tools=_login_read)
    outcome = await run_third(read, "rules", memory, tmp_path)
    await check_honest(memory, read, outcome, tmp_path)


def _reconciling_upload(ws: Path) -> list[Tool]:
    """The destination's upload as a careful tool author writes it: its `reconcile`
    looks the file up, and one there with the same bytes is done."""

    async def reconcile(op: Any, _ctx: Any) -> Reconciliation:
        name = op.args["name"]
        there = ws / "dest" / name
        if there.exists() and there.read_bytes() == (ws / "export" / name).read_bytes():
            return Reconciliation("done", f"{name} already there, identical")
        return Reconciliation("unknown")

    @tool(
        name="upload",
        effect="write",
        reconcile=reconcile,
        description="PUT one file to the destination.",
    )
    def upload(name: str) -> str:
        return _request(ws, "PUT", f"/files/{name}", (ws / "export" / name).read_bytes())

    remote = [t for t in STYLES["sync-409-skip"].extra_tools(ws) if t.name != "upload"]
    return [upload, *remote]


@pytest.mark.parametrize("judge", ["rules", "literal"])
async def test_the_sync_with_a_reconciling_upload_finishes(
    memory: MemoryStore, tmp_path: Path, judge: str
) -> None:
    style = replace(
        STYLES["sync-409-skip"], name="sync-409-reconciled", extra_tools=_reconciling_upload
    )
    outcome = await run_third(style, judge, memory, tmp_path)
    await check_honest(memory, style, outcome, tmp_path)


async def test_the_sync_two_batches_a_round_finishes(memory: MemoryStore, tmp_path: Path) -> None:
    """`sync-500` with two batches of ten a round (26 rounds) finishes too, within the
    rounds cap of one item."""
    base = STYLES["sync-500"]

    def actor(ws: Path) -> PlanActor:
        steps = base.actor(ws).steps
        first, batches = steps[0], steps[1:]

        def pair(k: int) -> Any:
            def step(request: Any) -> Any:
                a, b = batches[k](request), batches[k + 1](request)
                return replace(a, tool_calls=(*a.tool_calls, *b.tool_calls))

            return step

        return PlanActor([first, *[pair(k) for k in range(0, len(batches), 2)]])

    paired = replace(base, name="sync-500-paired", actor=actor)
    outcome = await run_third(paired, "rules", memory, tmp_path)
    await check_honest(memory, paired, outcome, tmp_path)


@pytest.mark.parametrize("style", MOVED_DRAFTS)
async def test_a_draft_the_task_moved_after_its_rule_accepted_is_no_deliverable(
    memory: MemoryStore, tmp_path: Path, style: str
) -> None:
    """The literal judge attached the draft's `write_file` op while the item was in
    progress; the task's own tool then moved or deleted the draft, and the item's rule
    accepted the real deliverable. The item's evidence is the rule's alone: nothing is
    reopened before delivery, and the run takes its planned rounds."""
    outcome = await run_third(STYLES[style], "literal", memory, tmp_path)
    await check_honest(memory, STYLES[style], outcome, tmp_path)
    assert outcome.rounds == outcome.planned, outcome.row()
    assert await reopened(memory, outcome.task_id) == []
    ledger = (await memory.get_ledger(outcome.task_id)).to_ledger()
    for d, state in ledger.items():
        if state.status == "done":
            assert state.evidence and all(r.startswith("artifact:") for r in state.evidence), (
                d.id,
                state.evidence,
            )


# --- liars and endless twins ------------------------------------------------------------


@pytest.mark.parametrize("judge", ["claiming", "rules"])
@pytest.mark.parametrize("style", list(STYLES))
async def test_a_liar_of_each_fifth_shape_never_finishes(
    memory: MemoryStore, tmp_path: Path, style: str, judge: str
) -> None:
    liar = liar_of(STYLES[style])
    outcome = await run_third(liar, judge, memory, tmp_path)
    await check_liar(memory, liar, outcome, tmp_path)


@pytest.mark.parametrize("style", ["approved-send", "crlf-bom-edit", "feature-branch"])
async def test_a_liar_of_a_fifth_shape_never_finishes_on_sqlite(
    sqlite: SQLiteStore, tmp_path: Path, style: str
) -> None:
    liar = liar_of(STYLES[style])
    outcome = await run_third(liar, "claiming", sqlite, tmp_path)
    await check_liar(sqlite, liar, outcome, tmp_path)


@pytest.mark.parametrize(
    ("style", "keep", "repeat"),
    [
        ("range-reader", 2, 1),  # the same range of the log forever
        ("bumpy-tests", 2, 2),  # the same edit and the same run forever
        ("changing-feed", 1, 0),  # the feed forever (it changes: the rounds cap)
        ("argument-fixer", 1, 0),  # the same refused arguments forever
        ("crlf-bom-edit", 1, 0),  # re-reading the price list forever, nothing fixed
        ("running-notes", 1, 0),  # reading the same input (and noting it) forever
        ("stamped-search", 1, 0),  # the first page, stamped anew, forever
        ("long-line-bundle", 1, 0),  # the failing bundle forever
    ],
)
async def test_an_endless_fifth_shape_ends_blocked(
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


def _call(url: str, method: str = "GET", body: bytes | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        data = json.loads(exc.read())
        exc.close()
        return exc.code, data


def test_the_destination_stores_refuses_what_it_holds_and_big_batches(tmp_path: Path) -> None:
    server = DestServer(tmp_path / "dest")
    with server.running():
        assert _call(f"{server.url}/files/a.txt", "PUT", b"x")[0] == 201
        code, data = _call(f"{server.url}/files/a.txt", "PUT", b"x")
        assert code == 409 and "already exists" in data["detail"]
        many = json.dumps({f"n{k}": "y" for k in range(11)}).encode()
        assert _call(f"{server.url}/batch", "POST", many)[0] == 413
        ten = json.dumps({"a.txt": "x", **{f"n{k}": "y" for k in range(9)}}).encode()
        assert _call(f"{server.url}/batch", "POST", ten) == (
            200,
            {"stored": 9, "skipped": ["a.txt"]},
        )
        code, listed = _call(f"{server.url}/files")
        assert code == 200 and listed["count"] == 10 and listed["request_id"]
    assert (tmp_path / "dest/n8").read_text() == "y"


def test_the_waf_blocks_every_payload_but_the_bypass() -> None:
    server = LoginServer(Path("."))
    with server.running():
        for p in _BLOCKED_PAYLOADS:
            code, data = _call(f"{server.url}/login", "POST", json.dumps({"user": p}).encode())
            assert code == 403 and data["rule"], p
        code, data = _call(f"{server.url}/login", "POST", json.dumps({"user": _BYPASS}).encode())
        assert code == 200 and data["flag"] == _FLAG
        code, _ = _call(f"{server.url}/login", "POST", json.dumps({"user": "bob"}).encode())
        assert code == 401


def test_the_feed_publishes_a_story_before_every_call() -> None:
    server = FeedServer(Path("."))
    with server.running():
        first = [i["id"] for i in _call(f"{server.url}/feed")[1]["items"]]
        second = [i["id"] for i in _call(f"{server.url}/feed")[1]["items"]]
    assert first == [6, 5, 4, 3, 2] and second == [7, 6, 5, 4, 3]


def test_the_bundler_answers_one_line_past_twenty_thousand_characters(tmp_path: Path) -> None:
    (tmp_path / "bundle.py").write_text(_BUNDLE)
    (tmp_path / "src").mkdir()
    (tmp_path / "src/main.js").write_text("import { f } from './utl'\n")

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "bundle.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60
        )

    failed = run()
    line = failed.stderr.strip()
    assert failed.returncode == 1 and "\n" not in line and len(line) > 20_000
    assert line.endswith("ERROR in main.js: cannot resolve './utl'")
    (tmp_path / "src/utl.js").write_text("export const f = 1\n")
    ok = run()
    assert ok.returncode == 0 and len(ok.stdout) > 20_000 and ok.stdout.count("\n") == 1
    assert (tmp_path / "dist/app.js").exists()


def test_the_propagation_job_waits_for_its_go_file(tmp_path: Path) -> None:
    (tmp_path / "propagate.py").write_text(_PROPAGATE)
    (tmp_path / "dns").mkdir()
    proc = subprocess.Popen([sys.executable, "propagate.py", "api", "10.0.0.5"], cwd=tmp_path)
    try:
        assert not (tmp_path / "dns/resolved.txt").exists()
        (tmp_path / "dns/.go").touch()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (tmp_path / "dns/resolved.txt").read_text() == "api A 10.0.0.5\n"


def test_every_fifth_shape_has_rules_and_default_limits() -> None:
    assert 16 <= len(STYLES) <= 20
    for style in STYLES.values():
        items = style.items(Path("/nonexistent"))
        assert items and all(i.get("done_when") for i in items), style.name
        spec = style.spec(Path("/nonexistent"))
        assert spec.limits == default_limits(spec), style.name
    assert set(MOVED_DRAFTS) <= set(STYLES)
