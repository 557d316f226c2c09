"""Compensation across crashes, against a ticket service that counts its own effects.

A batch of three ticket creations in one round; the service answers the third with
503 on every attempt, so its retries run out and its policy says `compensate`: the two
tickets already created are cancelled, newest first. A real `tether run` worker is
killed at a fail point in the middle of that and `tether resume` finishes it. The
service (`tests/services/ticket_api.py`, its own process) says how many cancel requests
it got per ticket: exactly one each, whatever the crash.

- between two compensations (`after_compensation`): the first is not sent again;
- after a compensation's intent, before it was sent (`after_op_intent`): sent once;
- after a cancel was executed, before its result was committed (`after_op_dispatch`):
  its `reconcile` finds the ticket cancelled, it is not sent again;
- the answer of a cancel is lost in a live worker (`cancel_drop_after`): reconciled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.reliability.test_crash_windows import CLI, ROOT, of_type
from tests.services.compensation_tools import POLICY, TOOLS_REF
from tests.support.services import TicketAPI

pytestmark = pytest.mark.slow

#: POSTs 3, 4 and 5 are the third ticket's three attempts (`RETRY`: 3 attempts).
UNAVAILABLE = [3, 4, 5]


class Run(CLI):
    """The crash-window CLI with the compensation tools and model."""

    def __call__(
        self, *args: str, failpoints: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
        env.update(self.env, PYTHONPATH=str(ROOT), TETHER_TOOLS=TOOLS_REF)
        if failpoints:
            env["TETHER_FAILPOINTS"] = failpoints
        return subprocess.run(
            [sys.executable, "-m", "tether.cli", *args, "--db", self.db],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def go(
        self, spec: Path, ws: Path, failpoints: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self("run", str(spec), "--model", POLICY, "--workspace", str(ws), "--json",
                    failpoints=failpoints)  # fmt: skip

    def resume_doc(self, tid: str) -> dict[str, Any]:
        res = self("resume", tid, "--model", POLICY, "--json")
        assert res.returncode == 0, res.stderr[-2000:]
        return dict(json.loads(res.stdout))

    def task_id(self) -> str:
        listed = self("list", "--json")
        assert listed.returncode == 0, listed.stderr
        return str(json.loads(listed.stdout)[0]["task_id"])


def spec_file(folder: Path) -> Path:
    data = {
        "name": "batch",
        "objective": "file tickets a, b and c as one batch",
        "items": [{"id": "batch", "title": "file tickets a, b and c",
                   "done_when": {"kind": "op", "tool": "create_ticket",
                                 "args": {"title": "c"}}}],
        "tools": [{"name": "create_ticket", "on_exhausted": "compensate"}],
        "models": {"judge": "rules"},
    }  # fmt: skip
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def api() -> Any:
    service = TicketAPI("--unavailable", ",".join(map(str, UNAVAILABLE)))
    try:
        yield service
    finally:
        service.close()


def assert_compensated_once_each(api: TicketAPI, cli: Run, tid: str, doc: dict[str, Any]) -> None:
    """Tickets a and b cancelled, b first, by exactly one cancel request each with the
    compensation's op id as key; c never created; the item blocked with the reason."""
    a, b, c = (f"{tid}.r1.c{i}" for i in range(3))
    stats = api.stats()
    tickets = {t["title"]: t for t in api.tickets()}
    assert sorted(tickets) == ["a", "b"] and stats["created"] == 2
    assert all(t["cancelled"] for t in tickets.values()) and stats["cancelled"] == 2
    assert tickets["a"]["cancel_key"] == f"{a}.compensate"
    assert tickets["b"]["cancel_key"] == f"{b}.compensate"
    per_ticket = Counter(x["ticket"] for x in stats["cancels"])
    assert per_ticket == {str(tickets["a"]["id"]): 1, str(tickets["b"]["id"]): 1}, stats["cancels"]
    assert [x["ticket"] for x in stats["cancels"]] == [str(tickets[t]["id"]) for t in "ba"]
    # The task: the item blocked with the reason, a person asked what next.
    assert doc["status"] == "waiting" and doc["waiting"]["kind"] == "decision", doc
    (item,) = doc["ledger"]["items"]
    assert item["status"] == "blocked"
    assert item["note"].startswith("compensated after create_ticket failed")
    # The journal: the plan once, each compensation an op with one intent and one mark.
    evs = cli.events(tid)
    (plan,) = of_type(evs, "op.exhausted")
    assert plan["op_id"] == c and plan["compensate"] == [b, a]
    marks = of_type(evs, "op.compensated")
    assert [(m["op_id"], m["outcome"]) for m in marks] == [(b, "compensated"), (a, "compensated")]
    intents = Counter(d["op_id"] for d in of_type(evs, "op.intended"))
    assert intents[f"{a}.compensate"] == intents[f"{b}.compensate"] == 1
    results = [d for d in of_type(evs, "op.result") if d["op_id"].endswith(".compensate")]
    assert [(d["op_id"], d["status"]) for d in results] == [
        (f"{b}.compensate", "succeeded"),
        (f"{a}.compensate", "succeeded"),
    ]
    assert [(x["op_id"], x["outcome"]) for x in doc["compensations"]] == [
        (b, "compensated"),
        (a, "compensated"),
    ]
    status = cli("status", tid)
    assert status.returncode == 0, status.stderr
    assert f"compensations: {b} compensated; {a} compensated" in " ".join(status.stdout.split())
    timeline = cli("timeline", tid)
    assert timeline.returncode == 0, timeline.stderr
    assert "gave up after 3 attempts → compensate 2 applied op(s)" in timeline.stdout
    assert f"{b} compensated by {b}.compensate" in timeline.stdout


def reconciled(cli: Run, tid: str) -> list[tuple[str, str]]:
    return [(d["op_id"], d["outcome"]) for d in of_type(cli.events(tid), "op.reconciled")]


def test_live_compensation_cancels_each_ticket_once(tmp_path: Path, api: TicketAPI) -> None:
    cli = Run(f"sqlite:///{tmp_path / 'tether.db'}", {"TICKETS_URL": api.url})
    ws = tmp_path / "ws"
    ws.mkdir()
    res = cli.go(spec_file(tmp_path), ws)
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads(res.stdout)
    assert_compensated_once_each(api, cli, doc["task_id"], doc)
    assert reconciled(cli, doc["task_id"]) == []


# The fail points, counted in the worker that crashes: three intents of the batch are
# hit first, then the compensation of b; dispatches: a, b, c three times, then b's
# cancel (the sixth).
CRASHES = {
    "between-compensations": ("after_compensation=1", 1),
    "after-intent": ("after_op_intent=4", 0),
    "after-cancel-sent": ("after_op_dispatch=6", 1),
}


def crash_and_resume(cli: Run, tmp_path: Path, api: TicketAPI, point: str, sent: int) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    res = cli.go(spec_file(tmp_path), ws, failpoints=point)
    assert res.returncode == 137, (res.returncode, res.stderr[-2000:])
    assert f"fail point {point.split('=')[0]} reached" in res.stderr
    tid = cli.task_id()
    # What the service saw before the crash: b's cancel or nothing.
    assert len(api.stats()["cancels"]) == sent
    doc = cli.resume_doc(tid)
    assert_compensated_once_each(api, cli, tid, doc)
    b = f"{tid}.r1.c1.compensate"
    if point.startswith("after_op_dispatch"):
        assert reconciled(cli, tid) == [(b, "done")]  # found cancelled, not sent again
    if point.startswith("after_op_intent"):
        assert reconciled(cli, tid) == [(b, "not_done")]  # asked before sending


@pytest.mark.parametrize("case", list(CRASHES))
def test_sqlite_crash_mid_compensation_resumes_without_repeating(
    case: str, tmp_path: Path, api: TicketAPI
) -> None:
    point, sent = CRASHES[case]
    cli = Run(f"sqlite:///{tmp_path / 'tether.db'}", {"TICKETS_URL": api.url})
    crash_and_resume(cli, tmp_path, api, point, sent)


@pytest.mark.postgres
@pytest.mark.parametrize("case", ["between-compensations", "after-cancel-sent"])
def test_postgres_crash_mid_compensation_resumes_without_repeating(
    case: str, tmp_path: Path, api: TicketAPI, pg_schema_url: Callable[[], str]
) -> None:
    point, sent = CRASHES[case]
    cli = Run(pg_schema_url(), {"TICKETS_URL": api.url})
    crash_and_resume(cli, tmp_path, api, point, sent)


def test_a_lost_cancel_answer_is_reconciled_in_the_live_worker(
    tmp_path: Path, api: TicketAPI
) -> None:
    api.faults(cancel_drop_after=[1])
    cli = Run(f"sqlite:///{tmp_path / 'tether.db'}", {"TICKETS_URL": api.url})
    ws = tmp_path / "ws"
    ws.mkdir()
    res = cli.go(spec_file(tmp_path), ws)
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads(res.stdout)
    tid = doc["task_id"]
    assert api.stats()["cancels"][0]["outcome"] == "cancelled+dropped"
    assert_compensated_once_each(api, cli, tid, doc)
    assert reconciled(cli, tid) == [(f"{tid}.r1.c1.compensate", "done")]
