"""The three crash windows, against external systems that count their own effects.

A real `tether run` worker is killed at a fail point (or loses a response), then
`tether resume` finishes the task. The ticket API (`tests/services/ticket_api.py`, its
own process) and a PostgreSQL table with the op id as unique key say how many effects
really happened: exactly one per call, whatever the crash.

- window 1, crashed after the intent, before dispatch: sent once, with the original op id;
- window 2, executed but the response lost: reconciled and backfilled; a tool that can
  neither reconcile nor be retried safely waits for a human, who decides;
- window 3, response received, crashed before the commit: reconciled and backfilled,
  never sent again;
- a restart in the middle of a long backoff keeps the stored schedule.

Each seed picks which call of the task (1..N_ITEMS) the fault hits.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
import yaml
from tests.services.tools import ROWS_TABLE_ENV, create_rows_table, rows_connect
from tests.support.services import TicketAPI

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
POLICY = "scripted:tests.services.policies:actor"
TOOLS = "tests.services.tools:TOOLS"
N_ITEMS = 3
SEEDS = [3, 4, 5]


def call_of(seed: int) -> int:
    """Which call (1..N_ITEMS) the fault hits for this seed."""
    return 1 + seed % N_ITEMS


# ---------------------------------------------------------------- the ticket API process


@pytest.fixture
def api() -> Iterator[TicketAPI]:
    """A fresh ticket API for the test."""
    with TicketAPI() as service:
        yield service


# ---------------------------------------------------------------- driving the CLI


def spec_file(folder: Path, tool: str, items: int = N_ITEMS) -> Path:
    """Items t1..tN, each done when one call of `tool` for it succeeded."""
    arg = "key" if tool == "insert_row" else "title"
    data = {
        "name": f"{tool}-crash",
        "objective": f"one {tool} per item",
        "items": [
            {"id": f"t{k}", "title": f"{tool} for t{k}",
             "done_when": {"kind": "op", "tool": tool, "args": {arg: f"t{k}"}}}
            for k in range(1, items + 1)
        ],
        "tools": [tool],
        "models": {"judge": "rules"},
    }  # fmt: skip
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


class CLI:
    """Runs `python -m tether.cli` in a subprocess against one database."""

    def __init__(self, db: str, env: dict[str, str]) -> None:
        self.db = db
        self.env = env

    def __call__(
        self, *args: str, failpoints: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
        env.update(self.env)
        env["PYTHONPATH"] = str(ROOT)
        env["TETHER_TOOLS"] = TOOLS
        if failpoints:
            env["TETHER_FAILPOINTS"] = failpoints
        return subprocess.run(
            [sys.executable, "-m", "tether.cli", *args, "--db", self.db],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def run(self, spec: Path, ws: Path) -> dict[str, Any]:
        """`tether run --json` to its end (delivered or waiting): the status document."""
        res = self("run", str(spec), "--model", POLICY, "--workspace", str(ws), "--json")
        assert res.returncode == 0, res.stderr[-2000:]
        return dict(json.loads(res.stdout))

    def crash(self, spec: Path, ws: Path, failpoints: str) -> str:
        """`tether run` killed at a fail point; the task id (from `list`)."""
        res = self("run", str(spec), "--model", POLICY, "--workspace", str(ws), "--json",
                   failpoints=failpoints)  # fmt: skip
        assert res.returncode == 137, (res.returncode, res.stderr[-2000:])
        assert f"fail point {failpoints.split('=')[0]} reached" in res.stderr
        listed = self("list", "--json")
        assert listed.returncode == 0, listed.stderr
        return str(json.loads(listed.stdout)[0]["task_id"])

    def resume(self, tid: str, timeout: float = 60) -> dict[str, Any]:
        """`tether resume --json`: the final status document."""
        res = self("resume", tid, "--model", POLICY, "--json", timeout=timeout)
        assert res.returncode == 0, res.stderr[-2000:]
        return dict(json.loads(res.stdout))

    def start(self, spec: Path, ws: Path) -> subprocess.Popen[str]:
        """`tether run` in the background (to be killed by the test)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
        env.update(self.env, PYTHONPATH=str(ROOT), TETHER_TOOLS=TOOLS)
        cmd = [sys.executable, "-m", "tether.cli", "run", str(spec), "--model", POLICY,
               "--workspace", str(ws), "--json", "--db", self.db]  # fmt: skip
        return subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True
        )

    def status(self, tid: str) -> dict[str, Any]:
        """`tether status --json`."""
        res = self("status", tid, "--json")
        assert res.returncode == 0, res.stderr
        return dict(json.loads(res.stdout))

    def events(self, tid: str) -> list[dict[str, Any]]:
        """`tether events --json`."""
        res = self("events", tid, "--json")
        assert res.returncode == 0, res.stderr
        return list(json.loads(res.stdout))


def of_type(evs: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    """The data of the events of one type, in order."""
    return [e["data"] for e in evs if e["type"] == type_]


def final_ops(evs: list[dict[str, Any]]) -> dict[str, str]:
    """op id -> its last recorded result status."""
    return {d["op_id"]: d["status"] for d in of_type(evs, "op.result")}


def reconciled(evs: list[dict[str, Any]], op_id: str) -> list[str]:
    """The reconcile outcomes journaled for an op."""
    return [d["outcome"] for d in of_type(evs, "op.reconciled") if d["op_id"] == op_id]


def assert_delivered(doc: dict[str, Any]) -> None:
    assert (doc["status"], doc["stop_reason"]) == ("satisfied", "delivered"), doc
    assert all(i["status"] == "done" for i in doc["ledger"]["items"]), doc["ledger"]


def assert_one_ticket_per_item(api: TicketAPI, evs: list[dict[str, Any]], tool: str) -> None:
    """The service holds exactly one ticket per item, and they are the ones tether's
    journal says succeeded."""
    tickets = api.tickets()
    assert api.stats()["created"] == N_ITEMS == len(tickets)
    assert sorted(t["title"] for t in tickets) == [f"t{k}" for k in range(1, N_ITEMS + 1)]
    ok = [o for o, s in final_ops(evs).items() if s == "succeeded"]
    assert len(ok) == N_ITEMS
    if tool == "create_ticket":
        assert sorted(t["key"] for t in tickets) == sorted(ok)


@pytest.fixture
def sqlite_cli(tmp_path: Path, api: TicketAPI) -> CLI:
    return CLI(f"sqlite:///{tmp_path / 'tether.db'}", {"TICKETS_URL": api.url})


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    return folder


# ---------------------------------------------------------------- window 1


@pytest.mark.parametrize("seed", SEEDS)
def test_window1_crash_after_intent_sends_once_with_the_original_op_id(
    seed: int, tmp_path: Path, ws: Path, api: TicketAPI, sqlite_cli: CLI
) -> None:
    k = call_of(seed)
    cli = sqlite_cli
    tid = cli.crash(spec_file(tmp_path, "create_ticket"), ws, f"after_op_intent={k}")
    op = f"{tid}.r{k}.c0"
    # Nothing of call k reached the service.
    assert [p["key"] for p in api.stats()["posts"]] == [f"{tid}.r{i}.c0" for i in range(1, k)]

    assert_delivered(cli.resume(tid))
    evs = cli.events(tid)
    # The intent journaled before the crash is the one that was sent: no second intent.
    assert [d["op_id"] for d in of_type(evs, "op.intended")] == [
        f"{tid}.r{i}.c0" for i in range(1, N_ITEMS + 1)
    ]
    posts = api.stats()["posts"]
    # Each op reached the service exactly once; op k with the key journaled before the crash.
    assert Counter(p["key"] for p in posts) == {f"{tid}.r{i}.c0": 1 for i in range(1, 4)}
    assert next(p for p in posts if p["title"] == f"t{k}")["key"] == op
    assert reconciled(evs, op) == ["not_done"]  # recovery asked before sending
    assert_one_ticket_per_item(api, evs, "create_ticket")


# ---------------------------------------------------------------- window 2


@pytest.mark.parametrize(
    ("seed", "crash"),
    [(3, False), (4, False), (5, False), (4, True), (5, True)],
    ids=["3-live", "4-live", "5-live", "4-crash", "5-crash"],
)
def test_window2_response_lost_is_reconciled_not_resent(
    seed: int, crash: bool, tmp_path: Path, ws: Path, api: TicketAPI, sqlite_cli: CLI
) -> None:
    """The service creates the ticket and closes the connection without answering. The
    op is unknown; reconcile finds the ticket by key and backfills the result — in the
    same worker, or (crash) in the one that resumes after the worker died there."""
    k = call_of(seed)
    cli = sqlite_cli
    api.faults(drop_after=[k])
    spec = spec_file(tmp_path, "create_ticket")
    if crash:
        tid = cli.crash(spec, ws, f"after_op_dispatch={k}")
        assert api.stats()["created"] == k
        assert_delivered(cli.resume(tid))
    else:
        doc = cli.run(spec, ws)
        assert_delivered(doc)
        tid = doc["task_id"]
    op = f"{tid}.r{k}.c0"
    evs = cli.events(tid)
    posts = api.stats()["posts"]
    lost = posts[k - 1]
    assert (lost["key"], lost["outcome"]) == (op, "created+dropped")
    assert Counter(p["key"] for p in posts)[op] == 1  # never sent again
    assert reconciled(evs, op) == ["done"]
    result = next(d for d in of_type(evs, "op.result") if d["op_id"] == op)
    assert result["status"] == "succeeded"
    assert f'"id": {lost["ticket"]}' in result["summary"]  # the service's answer, backfilled
    assert_one_ticket_per_item(api, evs, "create_ticket")


@pytest.mark.parametrize("seed", SEEDS)
def test_window2_without_reconcile_waits_for_a_human(
    seed: int, tmp_path: Path, ws: Path, api: TicketAPI, sqlite_cli: CLI
) -> None:
    """`create_ticket_blind` has no key and no reconcile: a lost response leaves the task
    waiting for a human with the op shown, never guessing. The human looks at the service
    (here: the request never executed) and decides; approve sends the same op again,
    reject records it as failed and the model files it in a new call. Either way the
    service ends with exactly one ticket per item, matching tether's journal."""
    k = call_of(seed)
    decision = "approve" if seed % 2 else "reject"
    cli = sqlite_cli
    api.faults(drop_before=[k])
    doc = cli.run(spec_file(tmp_path, "create_ticket_blind"), ws)
    tid = doc["task_id"]
    op = f"{tid}.r{k}.c0"
    assert doc["status"] == "waiting", doc
    waiting = doc["waiting"]
    assert waiting["kind"] == "human" and waiting["ops"] == [op]
    assert waiting["request_id"] == f"{op}.in_doubt"
    assert op in waiting["reason"]
    # Nothing guessed: no second request while waiting; the service shows no ticket t{k}.
    assert api.stats()["created"] == k - 1
    assert [p["outcome"] for p in api.stats()["posts"]][-1] == "dropped_before"
    assert f"t{k}" not in {t["title"] for t in api.tickets()}

    # Resuming before anyone decides changes nothing.
    again = cli.resume(tid)
    assert again["status"] == "waiting" and again["waiting"]["ops"] == [op]
    assert len(api.stats()["posts"]) == k

    res = cli(decision, tid, f"{op}.in_doubt")
    assert res.returncode == 0, res.stderr
    assert_delivered(cli.resume(tid))
    evs = cli.events(tid)
    warn = [d for d in of_type(evs, "audit.warning") if d.get("code") == "op_in_doubt"]
    assert warn and all(d["details"]["op_id"] == op for d in warn)
    asked = {d["request_id"] for d in of_type(evs, "approval.requested")}
    assert asked == {f"{op}.in_doubt"}
    posts = api.stats()["posts"]
    ops = final_ops(evs)
    if decision == "approve":
        assert ops[op] == "succeeded"
        # Sent again as the same op (same round, same call), once.
        assert [p["trace"] for p in posts if p["title"] == f"t{k}"] == [op, op]
    else:
        assert ops[op] == "failed"
        err = next(d for d in of_type(evs, "op.result") if d["op_id"] == op)
        assert "recorded this call as failed" in err["error"]
        retried = [p["trace"] for p in posts if p["title"] == f"t{k}"]
        assert len(retried) == 2 and retried[0] == op and retried[1] != op
        assert ops[retried[1]] == "succeeded"
    assert_one_ticket_per_item(api, evs, "create_ticket_blind")


# ---------------------------------------------------------------- window 3


@pytest.mark.parametrize("seed", SEEDS)
def test_window3_crash_before_commit_is_backfilled_not_resent(
    seed: int, tmp_path: Path, ws: Path, api: TicketAPI, sqlite_cli: CLI
) -> None:
    """Killed after the answer came (`after_op_dispatch`: in the tool loop;
    `after_op_result`: before the round's write-back; the seed picks one)."""
    k = call_of(seed)
    point = ("after_op_dispatch", "after_op_result")[seed % 2]
    cli = sqlite_cli
    tid = cli.crash(spec_file(tmp_path, "create_ticket"), ws, f"{point}={k}")
    op = f"{tid}.r{k}.c0"
    # The service answered call k; the worker died before committing the answer.
    assert api.stats()["created"] == k

    assert_delivered(cli.resume(tid))
    evs = cli.events(tid)
    assert Counter(p["key"] for p in api.stats()["posts"])[op] == 1  # not sent again
    assert reconciled(evs, op) == ["done"]
    assert of_type(evs, "recovery.step")[2]["details"]["in_doubt"] == [op]
    assert final_ops(evs)[op] == "succeeded"
    assert_one_ticket_per_item(api, evs, "create_ticket")


def test_approved_call_lost_in_a_crash_is_reconciled_not_sent_again(
    tmp_path: Path, ws: Path, api: TicketAPI, sqlite_cli: CLI
) -> None:
    """A call a human approved is sent, the service executes it and drops the answer,
    and the worker dies right there: recovery asks the service (reconcile) instead of
    sending the approved call again as if it had never left."""
    cli = sqlite_cli
    spec = spec_file(tmp_path, "create_ticket", items=1)
    data = yaml.safe_load(spec.read_text())
    data["tools"] = [{"name": "create_ticket", "approval": True}]
    spec.write_text(yaml.safe_dump(data))
    doc = cli.run(spec, ws)
    tid = doc["task_id"]
    assert doc["status"] == "waiting" and doc["waiting"]["kind"] == "approval", doc
    res = cli("approve", tid, doc["waiting"]["request_id"])
    assert res.returncode == 0, res.stderr
    api.faults(drop_after=[1])
    res = cli("resume", tid, "--model", POLICY, "--json", failpoints="after_op_dispatch=1")
    assert res.returncode == 137, res.stderr[-2000:]
    assert api.stats()["created"] == 1

    assert_delivered(cli.resume(tid))
    evs = cli.events(tid)
    op = f"{tid}.r1.c0"
    assert [p["key"] for p in api.stats()["posts"]] == [op]  # never sent again
    assert reconciled(evs, op) == ["done"]
    assert final_ops(evs)[op] == "succeeded"
    assert len(api.tickets()) == 1


# ---------------------------------------------------------------- PostgreSQL table


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("point", "seed"),
    [("after_op_intent", 3), ("after_op_dispatch", 4), ("after_op_result", 5)],
)  # fmt: skip
def test_postgres_row_written_once_across_a_crash(
    point: str, seed: int, tmp_path: Path, ws: Path, pg_schema_url: Callable[[], str]
) -> None:
    """tether's store and the effect both in PostgreSQL (two schemas, separate
    transactions): the table's unique op id column counts the effects, and a second
    insert of an op would fail there rather than pass unseen."""
    k = call_of(seed)
    db, rows_url = pg_schema_url(), pg_schema_url()
    schema = dict(parse_qsl(urlsplit(rows_url).query))["schema"]
    with rows_connect(rows_url) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    create_rows_table(rows_url)
    cli = CLI(db, {"ROWS_PG_URL": rows_url, ROWS_TABLE_ENV: "effects"})
    tid = cli.crash(spec_file(tmp_path, "insert_row"), ws, f"{point}={k}")
    op = f"{tid}.r{k}.c0"

    def rows() -> list[tuple[str, str]]:
        with rows_connect(rows_url) as conn:
            return [(r[0], r[1]) for r in conn.execute("SELECT op_id, key FROM effects")]

    written = k if point != "after_op_intent" else k - 1
    assert len(rows()) == written
    assert_delivered(cli.resume(tid))
    evs = cli.events(tid)
    got = rows()
    assert len(got) == N_ITEMS  # exactly one row per item, as the table counts
    assert sorted(key for _, key in got) == [f"t{i}" for i in range(1, N_ITEMS + 1)]
    ops = final_ops(evs)
    assert sorted(o for o, _ in got) == sorted(o for o, s in ops.items() if s == "succeeded")
    assert (op, f"t{k}") in got  # written under the op id journaled before the crash
    assert reconciled(evs, op) == (["not_done"] if point == "after_op_intent" else ["done"])


# ---------------------------------------------------------------- a long backoff


RETRY_AFTER = 45.0  # above the engine's inline-wait limit (30 s): the task is parked
RETRY_SHORT = 12.0  # below it: the worker waits (long enough for a loaded machine)


def test_restart_in_a_long_backoff_keeps_the_stored_schedule(
    tmp_path: Path, ws: Path, api: TicketAPI, sqlite_cli: CLI
) -> None:
    """The service answers 503 with Retry-After: the next attempt time is stored and
    the task parks. A resume before that time does not call the service; one started
    inside the inline window waits for the stored time, then makes attempt 2 (not 1)."""
    cli = sqlite_cli
    api.faults(unavailable=[1], retry_after=RETRY_AFTER)
    t0 = time.time()
    doc = cli.run(spec_file(tmp_path, "create_ticket"), ws)
    tid = doc["task_id"]
    op = f"{tid}.r1.c0"
    assert doc["status"] == "waiting" and doc["waiting"]["kind"] == "retry", doc
    until = float(doc["waiting"]["until"])
    assert t0 + RETRY_AFTER - 1 <= until <= time.time() + RETRY_AFTER
    assert [(p["attempt"], p["outcome"]) for p in api.stats()["posts"]] == [("1", "unavailable")]

    # A restart well before the stored time: parked again at the same time, no call.
    assert until - time.time() > 31, "the machine is too slow for this test's timing"
    early = cli.resume(tid)
    assert early["status"] == "waiting" and float(early["waiting"]["until"]) == until
    assert len(api.stats()["posts"]) == 1
    sched = of_type(cli.events(tid), "op.retry_scheduled")
    assert [(d["op_id"], d["attempt"], d["next_attempt_at"]) for d in sched] == [(op, 1, until)]

    # A restart inside the inline window: the worker waits for the stored time.
    time.sleep(max(0.0, until - 28 - time.time()))
    started = time.time()
    assert_delivered(cli.resume(tid, timeout=90))
    posts = api.stats()["posts"]
    retry = posts[1]
    assert (retry["key"], retry["attempt"], retry["outcome"]) == (op, "2", "created")
    assert retry["at"] >= until - 0.01, (retry["at"], until)  # not at once
    assert retry["at"] - started >= 20  # the resumed worker did wait
    assert retry["at"] <= until + 15  # and went at the stored time (a loaded machine is slow)
    evs = cli.events(tid)
    assert len(of_type(evs, "op.retry_scheduled")) == 1
    assert final_ops(evs)[op] == "succeeded"
    assert_one_ticket_per_item(api, evs, "create_ticket")


# ---------------------------------------------------------------- TETHER_TOOLS


def test_tether_tools_registers_tools_and_reports_bad_references(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tether import errors
    from tether.tools.builtin.files import default_registry

    def store() -> Any:
        raise AssertionError("not used")

    monkeypatch.setenv("TETHER_TOOLS", f"{TOOLS}, tests.services.tools:insert_row")
    names = default_registry(store).names()
    assert {"create_ticket", "create_ticket_blind", "insert_row", "write_file"} <= set(names)
    for ref, says in [
        ("tests.services.nowhere:TOOLS", "cannot import the tool module"),
        ("tests.services.tools:MISSING", "has no 'MISSING'"),
        ("tests.services.tools:RETRY", "neither a Tool nor a list of Tools"),
        ("tests.services.tools", "not a module:attr reference"),
    ]:
        monkeypatch.setenv("TETHER_TOOLS", ref)
        with pytest.raises(errors.UserError, match=says):
            default_registry(store)


def test_worker_killed_during_an_inline_backoff_resumes_the_schedule(
    tmp_path: Path, ws: Path, api: TicketAPI, sqlite_cli: CLI
) -> None:
    """A backoff short enough to be waited out in the worker; the worker is killed
    (SIGKILL, a real crash) while it waits. The resumed worker takes over the dead
    worker's lease and makes attempt 2 at the stored time: not at once, not attempt 1."""
    cli = sqlite_cli
    api.faults(unavailable=[1], retry_after=RETRY_SHORT)
    proc = cli.start(spec_file(tmp_path, "create_ticket"), ws)
    db = tmp_path / "tether.db"
    query = "SELECT task_id, data FROM events WHERE type = 'op.retry_scheduled'"
    found: list[tuple[str, str]] = []
    try:
        deadline = time.time() + 30
        while not found and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
            if db.exists():
                with (
                    contextlib.closing(sqlite3.connect(db, timeout=10)) as conn,
                    contextlib.suppress(sqlite3.OperationalError),  # not migrated yet
                ):
                    found = list(conn.execute(query))
        assert found, "the retry was never scheduled"
        proc.kill()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
    tid, data = found[0]
    until = float(json.loads(data)["next_attempt_at"])
    assert time.time() < until - 1  # killed while waiting
    assert [p["attempt"] for p in api.stats()["posts"]] == ["1"]

    assert_delivered(cli.resume(tid))
    op = f"{tid}.r1.c0"
    retry = api.stats()["posts"][1]
    assert (retry["key"], retry["attempt"], retry["outcome"]) == (op, "2", "created")
    # Not before the stored time; the upper bound only says "not another full backoff
    # later" (a loaded machine can take seconds to start the resumed worker).
    assert until - 0.01 <= retry["at"] <= until + 30
    evs = cli.events(tid)
    assert len(of_type(evs, "op.retry_scheduled")) == 1
    assert_one_ticket_per_item(api, evs, "create_ticket")
