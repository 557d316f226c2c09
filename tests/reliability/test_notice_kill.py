"""A sender killed while it sends a notice: the next worker sends it, at once.

A task waits for a person to approve its ticket; its contract sends notices to a
webhook receiver (`tests/services/notice_receiver.py`, its own process). The real
`tether run` that ends waiting sends its own `approval_requested` notice (no worker
needed) and is killed (fail point,
`os._exit`) before it sends it (`before_notice_send`), after the receiver got it but before the
worker recorded that (`after_notice_send`), or after it journaled `notice.sent` but
before the cursor moved (`after_notice_commit`). The next worker of the machine sees
that the taker is dead and goes on at once instead of waiting for the take to expire:
it sends a notice that may not have gone out (the same id: a receiver drops the
repeat), not one the journal says went out; the notices after it (the task's end) are
not held back either, and each notice is journaled once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.reliability.test_crash_windows import POLICY, ROOT, of_type
from tests.support.services import NoticeReceiver, TicketAPI

pytestmark = pytest.mark.slow


@pytest.fixture
def services() -> Iterator[tuple[TicketAPI, NoticeReceiver]]:
    api, hook = TicketAPI(), NoticeReceiver()
    try:
        yield api, hook
    finally:
        api.close()
        hook.close()


def tether(db: str, api: TicketAPI, *args: str, points: str | None = None) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env.update(PYTHONPATH=str(ROOT), TETHER_TOOLS="tests.services.tools:TOOLS",
               TICKETS_URL=api.url)  # fmt: skip
    if points:
        env["TETHER_FAILPOINTS"] = points
    return subprocess.run([sys.executable, "-m", "tether.cli", *args, "--db", db], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip


#: Fail point -> (the receiver got it before the kill, repeats after the next worker).
POINTS = {
    "before_notice_send": (False, 0),
    # Sent, not recorded: it must go again (the receiver drops the repeat by its id).
    "after_notice_send": (True, 1),
    # Sent and journaled, the cursor not moved: the journal says it went; not again.
    "after_notice_commit": (True, 0),
}


@pytest.mark.parametrize("point", list(POINTS))
def test_a_notice_whose_sender_died_is_sent_by_the_next_worker(
    point: str, tmp_path: Path, services: tuple[TicketAPI, NoticeReceiver]
) -> None:
    api, hook = services
    db = f"sqlite:///{tmp_path / 'tether.db'}"
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "approve-me", "objective": "file t1",
        "items": [{"id": "t1", "title": "file t1",
                   "done_when": {"kind": "op", "tool": "create_ticket", "args": {"title": "t1"}}}],
        "tools": [{"name": "create_ticket", "approval": True}],
        "models": {"judge": "rules"},
        "notify": {"targets": [{"webhook": hook.url}]},
    }))  # fmt: skip
    ws = tmp_path / "ws"
    ws.mkdir()
    # The foreground run that ends waiting sends its notice itself: it dies sending it.
    run = ("run", str(spec), "--model", POLICY, "--workspace", str(ws), "--json")
    killed = tether(db, api, *run, points=point)
    assert killed.returncode == 137, killed.stderr[-2000:]
    assert f"fail point {point} reached" in killed.stderr
    (task,) = json.loads(tether(db, api, "list", "--json").stdout)
    tid = task["task_id"]
    doc = json.loads(tether(db, api, "status", tid, "--json").stdout)
    assert doc["status"] == "waiting", doc
    request = doc["waiting"]["request_id"]
    worker = ("worker", "--once", "--poll", "0.05", "--model", POLICY)
    sent_before = [n["body"]["kind"] for n in hook.stats()["notices"]]
    was_sent, repeats = POINTS[point]
    assert sent_before == (["approval_requested"] if was_sent else [])

    # The next worker sends it (again, under the same id), without waiting.
    res = tether(db, api, *worker)
    assert res.returncode == 0, res.stderr[-2000:]
    stats = hook.stats()
    assert [n["body"]["kind"] for n in stats["notices"]] == ["approval_requested"]
    assert stats["repeats"] == repeats

    # The task goes on; its end is announced too.
    assert tether(db, api, "approve", tid, request).returncode == 0
    res = tether(db, api, "resume", tid, "--model", POLICY, "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["status"] == "satisfied", res.stderr
    assert tether(db, api, *worker).returncode == 0
    notices = hook.stats()["notices"]
    assert [n["body"]["kind"] for n in notices] == ["approval_requested", "finished"]
    evs = json.loads(tether(db, api, "events", tid, "--json").stdout)
    assert Counter(d["kind"] for d in of_type(evs, "notice.sent")) == {
        "approval_requested": 1, "finished": 1,
    }  # fmt: skip
