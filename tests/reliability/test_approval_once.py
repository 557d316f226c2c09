"""An approval to resend an op in doubt is one send, counted by a real HTTP service on
SQLite and PostgreSQL: when the approved resend's answer is lost too, a human is asked
again (a new request), resuming without an answer sends nothing, and the service sees
exactly two sends before a person records the outcome."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.reliability.test_crash_windows import CLI, assert_delivered, spec_file
from tests.support.services import TicketAPI


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_an_approved_resend_lost_again_asks_again_and_never_sends_a_third_time(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    api = TicketAPI()
    try:
        db = (
            request.getfixturevalue("pg_schema_url")()
            if kind == "postgres"
            else f"sqlite:///{tmp_path / 'tether.db'}"
        )
        cli = CLI(db, {"TICKETS_URL": api.url})
        ws = tmp_path / "ws"
        ws.mkdir()
        # POSTs 1 and 2 create their ticket, then the connection drops unanswered.
        api.faults(drop_after=[1, 2])
        doc = cli.run(spec_file(tmp_path, "create_ticket_blind", items=1), ws)
        tid = doc["task_id"]
        op = f"{tid}.r1.c0"
        assert doc["status"] == "waiting" and doc["waiting"]["request_id"] == f"{op}.in_doubt"
        assert api.stats()["created"] == 1

        # Approved: sent once more, and that answer is lost too: a new question.
        assert cli("approve", tid, f"{op}.in_doubt").returncode == 0
        again = cli.resume(tid)
        assert again["status"] == "waiting"
        assert again["waiting"]["request_id"] == f"{op}.in_doubt.2"
        assert api.stats()["created"] == 2

        # Without an answer nothing is sent, however often it is resumed.
        for _ in range(2):
            assert cli.resume(tid)["status"] == "waiting"
        assert len(api.stats()["posts"]) == 2

        # A person checks the service and records that it happened.
        res = cli("approve", tid, f"{op}.in_doubt.2", "--done")
        assert res.returncode == 0, res.stderr
        assert_delivered(cli.resume(tid))
        posts = api.stats()["posts"]
        assert [p["trace"] for p in posts] == [op, op]  # the first send and the one approved resend
    finally:
        api.close()


@pytest.mark.parametrize("point", ["after_op_dispatch", "after_op_result"])
def test_an_approved_resend_cut_by_a_kill_is_sent_at_most_once(point: str, tmp_path: Path) -> None:
    """The worker that carries out an approved resend dies (after sending it, or after
    its answer came, before the commit; the resend journals no new intent, so there is
    no fail point before it): whatever it did, the
    approval is one send at most, resuming never sends it again on its own, and a
    person settles what is left (the answer of the first send was lost)."""
    api = TicketAPI()
    try:
        cli = CLI(f"sqlite:///{tmp_path / 'tether.db'}", {"TICKETS_URL": api.url})
        ws = tmp_path / "ws"
        ws.mkdir()
        api.faults(drop_after=[1])
        doc = cli.run(spec_file(tmp_path, "create_ticket_blind", items=1), ws)
        tid = doc["task_id"]
        op = f"{tid}.r1.c0"
        assert doc["waiting"]["request_id"] == f"{op}.in_doubt"
        assert cli("approve", tid, f"{op}.in_doubt").returncode == 0
        res = cli("resume", tid, "--model", "scripted:tests.services.policies:actor",
                  "--json", failpoints=f"{point}=1")  # fmt: skip
        assert res.returncode == 137, res.stderr[-2000:]
        sent = len(api.stats()["posts"])
        assert sent == 2
        for _ in range(2):
            doc = cli.resume(tid)
            assert len(api.stats()["posts"]) <= 2, api.stats()["posts"]
        if doc["status"] == "waiting":
            # Asked again: the resend's outcome is not known; a person says it happened.
            request = doc["waiting"]["request_id"]
            assert request != f"{op}.in_doubt", doc["waiting"]
            assert cli("approve", tid, request, "--done").returncode == 0
            doc = cli.resume(tid)
        assert_delivered(doc)
        posts = api.stats()["posts"]
        assert len(posts) <= 2 and all(p["trace"] == op for p in posts), posts
    finally:
        api.close()
