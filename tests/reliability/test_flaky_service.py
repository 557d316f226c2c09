"""A flaky service: 40% of the ticket API's answers are 503 (seeded), through a real worker.

A task of 12 items files one ticket per item with `create_ticket` (3 attempts per op,
quick backoff) under a contract whose breaker opens at 30% of at least 5 calls and
cools down for 1 s. The scripted actor files a ticket for the Next item every round,
so an item whose call failed is tried again. The ticket API, its own process, counts
what really happened: tickets created and every POST with its Idempotency-Key (the op
id) and attempt number.

- The task ends `satisfied` with every item done and exactly one ticket per item.
- The breaker opens and closes again (`breaker.changed` closed→open, open→half_open,
  half_open→closed), refuses calls only while open, and no request reaches the service
  during a cooldown.
- Attempts stay within policy: each op sends at most `max_attempts` POSTs, numbered
  1..n; the service's count per op matches tether's journal (one POST per attempt, a
  retry scheduled after each failed one); calls refused fast by the open breaker never
  reach the service.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.services.flaky_tools import MAX_ATTEMPTS, POLICY, SERVICE, TOOL_NAME, TOOLS_REF
from tests.support.services import TicketAPI

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
N_ITEMS = 12
FAIL_RATE = 0.4
SEEDS = [1, 2, 3]
COOLDOWN = 1.0
SERVICES = {
    SERVICE: {
        "failure_rate": 0.3,
        "min_calls": 5,
        "cooldown_seconds": COOLDOWN,
        "window_seconds": 30,
    }
}
#: Loop guards out of the way: refusals by the open breaker must not block items.
LOOSE = {
    "same_failure_repeats": 1000,
    "max_attempts_per_item": 1000,
    "no_progress_rounds": 1000,
    "max_rounds": 5000,
}
REFUSED = re.compile(
    rf"^service {SERVICE} is unavailable until \d+: breaker open, cooling down until ([0-9.]+)"
)


@pytest.fixture(params=SEEDS, ids=[f"seed{s}" for s in SEEDS])
def flaky_api(request: pytest.FixtureRequest) -> Iterator[TicketAPI]:
    """The ticket API answering 503 to 40% of POSTs, in a seeded order."""
    service = TicketAPI("--fail-rate", str(FAIL_RATE), "--seed", str(request.param))
    try:
        yield service
    finally:
        service.close()


def write_spec(folder: Path, limits: dict[str, Any] | None = None) -> Path:
    data: dict[str, Any] = {
        "name": "flaky-tickets",
        "objective": "file one ticket per item",
        "items": [
            {"id": f"t{k}", "title": f"ticket t{k}",
             "done_when": {"kind": "op", "tool": TOOL_NAME, "args": {"title": f"t{k}"}}}
            for k in range(1, N_ITEMS + 1)
        ],
        "tools": [TOOL_NAME],
        "models": {"judge": "rules"},
        "services": SERVICES,
    }  # fmt: skip
    if limits:
        data["limits"] = limits
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def cli(db: str, api: TicketAPI, *args: str, timeout: float = 90) -> Any:
    """`python -m tether.cli ARGS --db DB --json`: the parsed JSON output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env.update(PYTHONPATH=str(ROOT), TETHER_TOOLS=TOOLS_REF, TICKETS_URL=api.url)
    res = subprocess.run(
        [sys.executable, "-m", "tether.cli", *args, "--json", "--db", db],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def run_task(tmp_path: Path, api: TicketAPI, limits: dict[str, Any] | None) -> tuple[Any, Any]:
    """`tether run` of the flaky task to its end: (status document, events)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    db = f"sqlite:///{tmp_path / 'tether.db'}"
    spec = write_spec(tmp_path, limits)
    doc = cli(db, api, "run", str(spec), "--model", POLICY, "--workspace", str(ws))
    return doc, cli(db, api, "events", doc["task_id"])


def of_type(evs: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    return [e["data"] for e in evs if e["type"] == type_]


def not_done(doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [
        (i["id"], i["status"], (i["note"] or "")[:200])
        for i in doc["ledger"]["items"]
        if i["status"] != "done"
    ]


def assert_one_ticket_per_item(api: TicketAPI, evs: list[dict[str, Any]]) -> None:
    """The service holds exactly one ticket per item, each filed by an op that tether's
    journal says succeeded (its key is the op id)."""
    tickets = api.tickets()
    assert api.stats()["created"] == len(tickets) == N_ITEMS, sorted(t["title"] for t in tickets)
    assert sorted(t["title"] for t in tickets) == sorted(f"t{k}" for k in range(1, N_ITEMS + 1))
    succeeded = [d["op_id"] for d in of_type(evs, "op.result") if d["status"] == "succeeded"]
    assert len(succeeded) == N_ITEMS
    assert sorted(t["key"] for t in tickets) == sorted(succeeded)


def test_flaky_service_every_item_done_under_the_default_loop_guards(
    tmp_path: Path, flaky_api: TicketAPI
) -> None:
    """The contract sets only the breaker, no loop limits.

    The task must complete: every item done, one ticket each. A call refused by the open
    breaker is "transient with a delay": it must not count against the item as a failed
    attempt of the model, or the item is blocked within milliseconds of the breaker
    opening, long before its cooldown is over.
    """
    doc, evs = run_task(tmp_path, flaky_api, None)
    opened = [d for d in of_type(evs, "breaker.changed") if d["dst"] == "open"]
    assert opened, "the breaker never opened: pick another seed"
    assert doc["status"] == "satisfied", doc
    assert not_done(doc) == [], "items blocked while the breaker was open"
    assert_one_ticket_per_item(flaky_api, evs)


def test_flaky_service_breaker_cycles_and_attempts_stay_within_policy(
    tmp_path: Path, flaky_api: TicketAPI
) -> None:
    doc, evs = run_task(tmp_path, flaky_api, LOOSE)
    assert (doc["status"], doc["stop_reason"]) == ("satisfied", "delivered"), doc
    assert not_done(doc) == []
    assert_one_ticket_per_item(flaky_api, evs)

    # --- the breaker opened and closed again, as the events show
    changes = [(d["src"], d["dst"]) for d in of_type(evs, "breaker.changed")]
    assert all(d["service"] == SERVICE for d in of_type(evs, "breaker.changed"))
    assert ("closed", "open") in changes, changes
    assert ("open", "half_open") in changes and ("half_open", "closed") in changes, changes
    state = "closed"
    for src, dst in changes:  # a consistent chain from closed, ending closed
        assert src == state, changes
        state = dst
    assert state == "closed", changes
    first_open = changes.index(("closed", "open"))
    assert ("half_open", "closed") in changes[first_open:]

    # --- calls refused fast, only while the breaker was open (replayed in event order)
    state = "closed"
    refused: dict[str, float] = {}
    for e in evs:
        if e["type"] == "breaker.changed":
            state = e["data"]["dst"]
        elif e["type"] == "op.result" and e["data"]["status"] == "failed":
            m = REFUSED.match(e["data"]["error"] or "")
            if m:
                assert state == "open", (state, e["data"])
                assert e["data"]["error_class"] == "transient"
                assert e["data"]["duration_ms"] == 0.0
                refused[e["data"]["op_id"]] = float(m.group(1))
    assert refused, "no call was refused by the open breaker"

    # --- what the service saw, op by op, against tether's journal
    posts = flaky_api.stats()["posts"]
    intended = [d["op_id"] for d in of_type(evs, "op.intended")]
    assert len(intended) == len(set(intended))
    by_key: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in posts:
        by_key[p["key"]].append(p)
    assert set(by_key) <= set(intended), "a POST with a key tether never journaled"
    retries = Counter(d["op_id"] for d in of_type(evs, "op.retry_scheduled"))
    final = {d["op_id"]: d for d in of_type(evs, "op.result")}
    assert set(final) == set(intended)
    for op in intended:
        sent = by_key.get(op, [])
        assert len(sent) <= MAX_ATTEMPTS, (op, sent)
        # Attempts numbered 1..n, never restarted: each attempt is one POST.
        assert [p["attempt"] for p in sent] == [str(n) for n in range(1, len(sent) + 1)]
        # Every POST but a successful last one failed (503) and was followed by a
        # scheduled retry, unless it was the last allowed attempt.
        assert all(p["outcome"] == "unavailable" for p in sent[:-1])
        # One scheduled retry after each failed POST but the last allowed one; an op
        # refused by the open breaker was refused at its next attempt, never sent.
        assert retries[op] == len(sent) - (0 if op in refused else 1), (op, sent, retries[op])
        if final[op]["status"] == "succeeded":
            assert sent and sent[-1]["outcome"] == "created"
        elif op in refused:
            # Refused by the open breaker: the service never saw that attempt.
            assert len(sent) == retries[op], (op, sent)
        else:
            assert len(sent) == MAX_ATTEMPTS and "gave up" in final[op]["error"], (op, final[op])
    never_sent = [op for op in intended if op not in by_key]
    assert never_sent and set(never_sent) <= set(refused)
    reached = len(intended) - len(never_sent)
    assert len(posts) <= reached * MAX_ATTEMPTS
    outcomes = Counter(p["outcome"] for p in posts)
    assert outcomes == {"created": N_ITEMS, "unavailable": len(posts) - N_ITEMS}, outcomes

    # --- nothing reached the service during a cooldown
    for until in set(refused.values()):
        during = [p for p in posts if until - COOLDOWN + 0.01 < p["at"] < until - 0.01]
        assert during == [], (until, during)
