"""Resets, stalls and slow peers between tether and its model provider or tool service.

A byte-level fault proxy (`tests/support/fault_proxy.py`, a thread of the test) sits in
front of each service; a real `tether run` subprocess talks to the proxy, and the
service behind it counts what really happened.

**Model provider** (`LedgerProvider` of `tests/support/fake_provider.py`: an HTTP server
answering the OpenAI chat completions and the Anthropic messages wire formats) behind
the proxy, with the real `openai` and `anthropic` adapters,
`TETHER_MODEL_TIMEOUT`/`TETHER_MODEL_RETRIES` set short:

- a reset before the request reaches the provider, or a response lost or cut after the
  provider answered, is retried: the task is delivered with one model call and one round
  in the journal, and the call's `attempts` says how many requests it took;
- a stalled response is cut by the model timeout and retried; a provider stalled for
  good leaves the task `waiting` (external, lease given back, `model.failed` with the
  number of attempts), and a resume after the provider heals delivers it; a
  `tether worker --once` goes on to its next task and exits 0;
- a response trickled slower than the timeout is cut at the timeout (the timeout bounds
  the whole attempt, not each read); a fast trickle and a peer that delivers and then
  never closes are answered normally.

**Tool service** (the ticket API of `tests/services/ticket_api.py`, its own process)
behind the proxy, with `create_ticket` (idempotency key and reconcile):

- the response lost after the service created the ticket: reconciled as done, exactly
  one ticket, never sent again; the breaker counts it as a success;
- the same, and the reconcile's own lookup reset: the lookup is asked again;
- a request reset before it reached the service, or stalled until the HTTP client's
  timeout: reconciled as not done, retried on schedule with the same key, exactly one
  ticket; the breaker counts the failed attempt;
- a request stalled past tether's own tool timeout: the call is abandoned in its thread,
  retried, and `tether run` exits at once although that thread never returns;
- the same lost response for a tool that can neither reconcile nor be retried safely
  (`create_ticket_blind`): the task waits for a human and nothing is sent twice.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cli import cli_env, describe, json_out, tether, write_spec
from tests.support.fake_provider import LedgerProvider
from tests.support.fault_proxy import PASS, Fault, FaultProxy
from tests.support.services import TicketAPI

pytestmark = pytest.mark.slow


@dataclass
class Upstream:
    """A provider and the proxy in front of it."""

    provider: LedgerProvider
    proxy: FaultProxy


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    provider = LedgerProvider()
    proxy = FaultProxy(provider.port)
    try:
        yield Upstream(provider, proxy)
    finally:
        proxy.close()  # first: it ends the connections the provider's threads serve
        provider.close()


@pytest.fixture
def closing_upstream() -> Iterator[Upstream]:
    """A provider that closes each connection after its response."""
    provider = LedgerProvider(close_after=True)
    proxy = FaultProxy(provider.port)
    try:
        yield Upstream(provider, proxy)
    finally:
        proxy.close()
        provider.close()


ADAPTERS = ["openai", "anthropic"]


def model_env(proxy: FaultProxy, adapter: str, timeout: float, retries: int) -> dict[str, str]:
    """The CLI's environment for `adapter` through the proxy."""
    extra = {"TETHER_MODEL_TIMEOUT": str(timeout), "TETHER_MODEL_RETRIES": str(retries)}
    if adapter == "anthropic":
        extra.update(ANTHROPIC_BASE_URL=proxy.url, ANTHROPIC_API_KEY="sk-ant-test")
    return cli_env(**extra)


def model_name(proxy: FaultProxy, adapter: str) -> str:
    if adapter == "anthropic":
        return "anthropic:claude-fake"
    return f"openai-compatible:{proxy.url}/v1#fake"


@dataclass
class Outcome:
    """A finished `tether run`: the process, the task's status and its events."""

    proc: subprocess.CompletedProcess[str]
    status: dict[str, Any]
    events: list[dict[str, Any]]

    def of_type(self, type_: str) -> list[dict[str, Any]]:
        return [e["data"] for e in self.events if e["type"] == type_]


def inspect(tmp_path: Path, proc: subprocess.CompletedProcess[str]) -> Outcome:
    """A `tether run --json`: no traceback, the status it printed and the task's events."""
    assert "Traceback" not in proc.stderr and 'File "' not in proc.stderr, describe(proc)
    assert proc.returncode in (0, 4), describe(proc)  # 4: the provider could not be reached
    status = json.loads(proc.stdout)
    events = json_out(tether("events", status["task_id"], "--json", cwd=tmp_path))
    return Outcome(proc, status, events)


def run_model_task(
    tmp_path: Path,
    up: Upstream,
    adapter: str = "openai",
    *,
    timeout: float = 10.0,
    retries: int = 2,
) -> Outcome:
    """`tether run` of a one-item task whose actor is the provider behind the proxy."""
    spec = write_spec(tmp_path / "spec.yaml", 1)
    (tmp_path / "ws").mkdir(exist_ok=True)
    proc = tether(
        "run",
        spec,
        "--workspace",
        tmp_path / "ws",
        "--model",
        model_name(up.proxy, adapter),
        "--json",
        cwd=tmp_path,
        timeout=120,
        env=model_env(up.proxy, adapter, timeout, retries),
    )
    return inspect(tmp_path, proc)


def assert_delivered_in_one_round(out: Outcome, tmp_path: Path, attempts: int) -> None:
    """Exit 0, delivered, one act call taking `attempts` requests, one round."""
    assert out.proc.returncode == 0, describe(out.proc)
    assert (out.status["status"], out.status["stop_reason"]) == ("satisfied", "delivered"), (
        out.status
    )
    calls = [c for c in out.of_type("model.called") if c["purpose"] == "act"]
    assert [(c["round"], c["attempts"]) for c in calls] == [(1, attempts)], calls
    assert [r["round"] for r in out.of_type("round.committed")] == [1]
    assert out.of_type("model.failed") == []
    assert (tmp_path / "ws" / "out" / "i1.txt").read_text() == "i1 done\n"


# ---------------------------------------------------------------- model: resets


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_model_reset_before_the_request_is_retried(
    tmp_path: Path, upstream: Upstream, adapter: str
) -> None:
    upstream.proxy.plan(Fault.reset_before())
    out = run_model_task(tmp_path, upstream, adapter)
    assert_delivered_in_one_round(out, tmp_path, attempts=2)
    # The provider never saw the reset request: it answered once.
    assert len(upstream.provider.requests) == 1
    seen = upstream.proxy.snapshot()
    assert [(e.fault.kind, e.outcome, e.upstream_answered) for e in seen] == [
        ("reset_before", "reset", False),
        ("pass", "forwarded", True),
    ]


@pytest.mark.parametrize(
    "fault",
    [Fault.reset_after_request(), Fault.close_after_request(), Fault.reset_mid_response(40)],
    ids=["reset", "closed", "reset-mid-response"],
)
def test_model_response_lost_after_the_provider_answered_is_asked_again(
    tmp_path: Path, upstream: Upstream, fault: Fault
) -> None:
    upstream.proxy.plan(fault)
    out = run_model_task(tmp_path, upstream)
    # Asked twice (a model call has no effects), journaled once: one call, one round.
    assert len(upstream.provider.requests) == 2
    assert_delivered_in_one_round(out, tmp_path, attempts=2)
    first = upstream.proxy.snapshot()[0]
    assert first.upstream_answered and first.outcome in ("reset", "closed"), first
    assert first.response_bytes == (40 if fault.kind == "reset_mid_response" else 0)


# ---------------------------------------------------------------- model: stalls


def test_model_stalled_response_is_cut_by_the_timeout_and_retried(
    tmp_path: Path, upstream: Upstream
) -> None:
    upstream.proxy.plan(Fault.stall_response())
    out = run_model_task(tmp_path, upstream, timeout=3.0)
    assert_delivered_in_one_round(out, tmp_path, attempts=2)
    assert len(upstream.provider.requests) == 2
    first = upstream.proxy.snapshot()[0]
    assert (first.outcome, first.response_bytes) == ("stalled", 0)
    assert "timed out" in out.proc.stderr, describe(out.proc)


@pytest.mark.parametrize(
    ("adapter", "stall"),
    [("openai", Fault.stall_request()), ("anthropic", Fault.stall_response())],
    ids=["openai-request", "anthropic-response"],
)
def test_model_stalled_for_good_leaves_the_task_waiting(
    tmp_path: Path, upstream: Upstream, adapter: str, stall: Fault
) -> None:
    with upstream.proxy.during(stall):
        out = run_model_task(tmp_path, upstream, adapter, timeout=1.0, retries=1)
    # Documented: exit 4 (infrastructure unavailable) for a run stopped on a provider that
    # does not answer; the task waits for it, holding no lease, with the failure and its
    # number of attempts in the journal, and the command that goes on.
    assert out.proc.returncode == 4, describe(out.proc)
    assert f"tether resume {out.status['task_id']}" in out.status["waiting"]["reason"], out.status
    assert out.status["status"] == "waiting", out.status
    assert out.status["waiting"]["kind"] == "external", out.status
    assert out.status["lease"]["owner"] is None, out.status
    failed = out.of_type("model.failed")
    assert len(failed) == 1, failed
    assert (failed[0]["purpose"], failed[0]["transient"], failed[0]["attempts"]) == (
        "act",
        True,
        2,
    )
    assert "timed out" in failed[0]["error"], failed
    assert out.of_type("model.called") == [] and out.of_type("round.committed") == []
    seen = upstream.proxy.snapshot()
    assert [e.outcome for e in seen] == ["stalled", "stalled"], seen
    assert len(upstream.provider.requests) == (2 if stall.kind == "stall_response" else 0)

    # The provider heals: a resume delivers the task.
    task_id = out.status["task_id"]
    resumed = tether(
        "resume",
        task_id,
        "--model",
        model_name(upstream.proxy, adapter),
        "--json",
        cwd=tmp_path,
        timeout=120,
        env=model_env(upstream.proxy, adapter, 5.0, 1),
    )
    assert "Traceback" not in resumed.stderr, describe(resumed)
    doc = json_out(resumed)
    assert (doc["task_id"], doc["status"]) == (task_id, "satisfied"), doc


def test_worker_gives_up_on_a_stalled_provider_and_runs_the_next_task(
    tmp_path: Path, upstream: Upstream
) -> None:
    """`tether worker --once` with two queued tasks: the provider stalls every attempt
    of the first task it takes, then heals. That task waits for the provider (lease
    given back), the worker goes on to the next one, delivers it and exits 0."""
    upstream.proxy.plan(Fault.stall_request(), Fault.stall_request())
    spec = write_spec(tmp_path / "spec.yaml", 1)
    env = model_env(upstream.proxy, "openai", 3.0, 1)
    ids = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        queued = tether("submit", spec, "--workspace", tmp_path / name, "--json", cwd=tmp_path)
        ids.append(json_out(queued)["task_id"])
    proc = tether(
        "worker",
        "--once",
        "--poll",
        "0.1",
        "--model",
        model_name(upstream.proxy, "openai"),
        cwd=tmp_path,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, describe(proc)
    assert "Traceback" not in proc.stderr and "worker ran 2 task(s)" in proc.stderr, describe(proc)
    docs = {t: json_out(tether("status", t, "--json", cwd=tmp_path)) for t in ids}
    waiting = [t for t in ids if docs[t]["status"] == "waiting"]
    done = [t for t in ids if docs[t]["status"] == "satisfied"]
    assert len(waiting) == 1 and len(done) == 1, docs
    stalled = docs[waiting[0]]
    assert stalled["waiting"]["kind"] == "external" and stalled["lease"]["owner"] is None, stalled
    events = json_out(tether("events", waiting[0], "--json", cwd=tmp_path))
    failed = [e["data"] for e in events if e["type"] == "model.failed"]
    assert [(f["attempts"], f["transient"]) for f in failed] == [(2, True)], failed
    # The stalled requests never reached the provider; the healed one did, once.
    assert len(upstream.provider.requests) == 1
    assert [e.outcome for e in upstream.proxy.snapshot()] == ["stalled", "stalled", "forwarded"]


# ---------------------------------------------------------------- model: slow peers


def test_model_response_trickled_past_the_timeout_is_cut(
    tmp_path: Path, upstream: Upstream
) -> None:
    """Every chunk comes well within the timeout, the whole answer does not: a per-read
    timeout would wait for it (about 10 s here); the attempt's deadline cuts it."""
    upstream.proxy.plan(Fault.trickle(chunk=16, interval=0.25))
    out = run_model_task(tmp_path, upstream, timeout=3.0)
    assert_delivered_in_one_round(out, tmp_path, attempts=2)
    first = upstream.proxy.snapshot()[0]
    assert first.upstream_answered and 0 < first.response_bytes < 600, first


@pytest.mark.parametrize(
    "fault",
    [Fault.trickle(chunk=64, interval=0.01), Fault.slow_close()],
    ids=["fast-trickle", "never-closed"],
)
def test_model_slow_but_complete_answer_is_taken(
    tmp_path: Path, closing_upstream: Upstream, fault: Fault
) -> None:
    closing_upstream.proxy.plan(fault)
    out = run_model_task(tmp_path, closing_upstream, timeout=5.0)
    assert_delivered_in_one_round(out, tmp_path, attempts=1)
    assert len(closing_upstream.provider.requests) == 1
    first = closing_upstream.proxy.snapshot()[0]
    assert first.response_bytes > 0 and first.outcome in ("forwarded", "held open"), first


# ---------------------------------------------------------------- the ticket service

TOOLS_REF = "tests.services.tools:TOOLS"
ACTOR = "scripted:tests.services.policies:actor"
#: A breaker that counts every call but does not open within these tests.
SERVICES = {
    "tickets": {
        "failure_rate": 0.9,
        "min_calls": 50,
        "cooldown_seconds": 1,
        "window_seconds": 600,
    }
}


@pytest.fixture
def tickets() -> Iterator[tuple[TicketAPI, FaultProxy]]:
    """The ticket API (its own process) and the proxy in front of it."""
    api = TicketAPI()
    proxy = FaultProxy(api.port)
    try:
        yield api, proxy
    finally:
        proxy.close()
        api.close()


def run_ticket_task(
    tmp_path: Path,
    proxy: FaultProxy,
    tool: str,
    *,
    tools: str = TOOLS_REF,
    client_timeout: float = 2.0,
) -> Outcome:
    """`tether run` of a one-item task that files one ticket through the proxy (the
    tools' HTTP client gives up after `client_timeout` seconds)."""
    data = {
        "name": "one-ticket",
        "objective": "file one ticket",
        "items": [{"id": "t1", "title": "ticket t1",
                   "done_when": {"kind": "op", "tool": tool, "args": {"title": "t1"}}}],
        "tools": [tool],
        "models": {"judge": "rules"},
        "services": SERVICES,
    }  # fmt: skip
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    (tmp_path / "ws").mkdir()
    env = cli_env(TETHER_TOOLS=tools, TICKETS_URL=proxy.url, TICKETS_TIMEOUT=str(client_timeout))
    proc = tether(
        "run",
        spec,
        "--workspace",
        tmp_path / "ws",
        "--model",
        ACTOR,
        "--json",
        cwd=tmp_path,
        timeout=60,
        env=env,
    )
    return inspect(tmp_path, proc)


def assert_replays(tmp_path: Path, out: Outcome, tools: str = TOOLS_REF) -> None:
    """`tether replay` runs the task again on the recorded answers (the tools stand in
    with the journaled results; the service is not asked) and matches the recording."""
    env = cli_env(TETHER_TOOLS=tools, TICKETS_URL="http://127.0.0.1:9")
    proc = tether("replay", out.status["task_id"], cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, describe(proc)


def breaker_calls(tmp_path: Path) -> list[bool]:
    """The verdicts the `tickets` breaker counted, oldest first (its shared document)."""
    db = sqlite3.connect(f"file:{tmp_path / '.tether' / 'tether.db'}?mode=ro", uri=True)
    try:
        row = db.execute(
            "SELECT value FROM shared_state WHERE key = ?", ("service:tickets",)
        ).fetchone()
    finally:
        db.close()
    assert row is not None, "the breaker has no state"
    return [bool(ok) for _, ok in json.loads(row[0])["calls"]]


def test_tool_response_lost_after_the_ticket_was_created_is_reconciled(
    tmp_path: Path, tickets: tuple[TicketAPI, FaultProxy]
) -> None:
    api, proxy = tickets
    proxy.plan(Fault.reset_after_request())
    out = run_ticket_task(tmp_path, proxy, "create_ticket")
    assert out.proc.returncode == 0, describe(out.proc)
    assert out.status["status"] == "satisfied", out.status
    stats = api.stats()
    assert stats["created"] == 1
    assert [(p["attempt"], p["outcome"]) for p in stats["posts"]] == [("1", "created")]
    (intended,) = out.of_type("op.intended")
    assert [r["outcome"] for r in out.of_type("op.reconciled")] == ["done"]
    assert out.of_type("op.retry_scheduled") == []
    assert [(r["op_id"], r["status"], r["attempt"]) for r in out.of_type("op.result")] == [
        (intended["op_id"], "succeeded", 1)
    ]
    assert api.tickets()[0]["key"] == intended["op_id"]
    # Reconciled as done: a success for the breaker, not a failure.
    assert breaker_calls(tmp_path) == [True]
    kinds = [(e.fault.kind, e.outcome) for e in proxy.snapshot()]
    assert kinds == [("reset_after_request", "reset"), ("pass", "forwarded")], kinds
    assert_replays(tmp_path, out)


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        (Fault.reset_before(), "ConnectionResetError"),
        (Fault.stall_request(), "TimeoutError"),
    ],
    ids=["reset-before", "stall"],
)
def test_tool_request_that_never_reached_the_service_is_retried(
    tmp_path: Path, tickets: tuple[TicketAPI, FaultProxy], fault: Fault, error: str
) -> None:
    api, proxy = tickets
    proxy.plan(fault)
    out = run_ticket_task(tmp_path, proxy, "create_ticket")
    assert out.proc.returncode == 0, describe(out.proc)
    assert out.status["status"] == "satisfied", out.status
    (intended,) = out.of_type("op.intended")
    op_id = intended["op_id"]
    # In doubt (the request may have been sent): asked, found not done, sent again on
    # the tool's schedule with the same key.
    assert [r["outcome"] for r in out.of_type("op.reconciled")] == ["not_done"]
    (retry,) = out.of_type("op.retry_scheduled")
    assert (retry["op_id"], retry["attempt"], retry["error_class"]) == (op_id, 1, "transient")
    assert retry["error"].startswith(error), retry
    assert [(r["op_id"], r["status"], r["attempt"]) for r in out.of_type("op.result")] == [
        (op_id, "succeeded", 2)
    ]
    stats = api.stats()
    assert stats["created"] == 1
    assert [(p["key"], p["attempt"], p["outcome"]) for p in stats["posts"]] == [
        (op_id, "2", "created")
    ]
    # The breaker counted the failed attempt, then the success.
    assert breaker_calls(tmp_path) == [False, True]
    assert [(e.fault.kind, e.upstream_answered) for e in proxy.snapshot()] == [
        (fault.kind, False),
        ("pass", True),  # the reconcile's lookup
        ("pass", True),  # the second attempt
    ]
    # The replay asks the reconcile again and gets the recorded answer (not done).
    assert_replays(tmp_path, out)


def test_tool_stalled_past_the_tool_timeout_is_abandoned_and_retried(
    tmp_path: Path, tickets: tuple[TicketAPI, FaultProxy]
) -> None:
    """The HTTP client would wait ten minutes; tether's own tool timeout (2 s,
    `tests/support/stall_tools.py`) cuts the call, which is left behind in its thread
    while the retry files the ticket. `tether run` then exits at once: the abandoned
    thread (still stalled: the proxy holds its request) does not keep it alive."""
    api, proxy = tickets
    proxy.plan(Fault.stall_request())
    out = run_ticket_task(
        tmp_path,
        proxy,
        "create_ticket",
        tools="tests.support.stall_tools:TOOLS",
        client_timeout=600,
    )
    assert out.proc.returncode == 0, describe(out.proc)
    assert out.status["status"] == "satisfied", out.status
    (intended,) = out.of_type("op.intended")
    assert [r["outcome"] for r in out.of_type("op.reconciled")] == ["not_done"]
    (retry,) = out.of_type("op.retry_scheduled")
    assert (retry["error_class"], retry["error"]) == ("transient", "TimeoutError"), retry
    assert [(r["status"], r["attempt"]) for r in out.of_type("op.result")] == [("succeeded", 2)]
    stats = api.stats()
    assert stats["created"] == 1
    assert [(p["key"], p["attempt"]) for p in stats["posts"]] == [(intended["op_id"], "2")]
    assert proxy.snapshot()[0].outcome == "stalled"


def test_tool_response_stalled_after_the_ticket_was_created_is_reconciled(
    tmp_path: Path, tickets: tuple[TicketAPI, FaultProxy]
) -> None:
    api, proxy = tickets
    proxy.plan(Fault.stall_response())
    out = run_ticket_task(tmp_path, proxy, "create_ticket")
    assert out.proc.returncode == 0, describe(out.proc)
    assert out.status["status"] == "satisfied", out.status
    assert api.stats()["created"] == 1
    assert [r["outcome"] for r in out.of_type("op.reconciled")] == ["done"]
    assert out.of_type("op.retry_scheduled") == []
    assert [(r["status"], r["attempt"]) for r in out.of_type("op.result")] == [("succeeded", 1)]
    assert breaker_calls(tmp_path) == [True]


def test_tool_response_lost_and_the_reconcile_lookup_reset_too(
    tmp_path: Path, tickets: tuple[TicketAPI, FaultProxy]
) -> None:
    """The response is lost after the ticket was created, and the reconcile's own lookup
    is reset on its way: the lookup is asked again, finds the ticket, one ticket."""
    api, proxy = tickets
    proxy.plan(Fault.reset_after_request(), Fault.reset_before())
    out = run_ticket_task(tmp_path, proxy, "create_ticket")
    assert out.proc.returncode == 0, describe(out.proc)
    assert out.status["status"] == "satisfied", out.status
    assert api.stats()["created"] == 1 and len(api.stats()["posts"]) == 1
    assert [r["outcome"] for r in out.of_type("op.reconciled")] == ["done"]
    assert out.of_type("op.retry_scheduled") == []
    assert [(r["status"], r["attempt"]) for r in out.of_type("op.result")] == [("succeeded", 1)]
    assert [(e.fault.kind, e.outcome) for e in proxy.snapshot()] == [
        ("reset_after_request", "reset"),
        ("reset_before", "reset"),
        ("pass", "forwarded"),
    ]


def test_blind_tool_response_lost_waits_for_a_human(
    tmp_path: Path, tickets: tuple[TicketAPI, FaultProxy]
) -> None:
    """No key, no reconcile: a lost response cannot be settled by tether. The task waits
    for a human; the service holds the one ticket and saw one POST."""
    api, proxy = tickets
    proxy.plan(Fault.reset_after_request())
    out = run_ticket_task(tmp_path, proxy, "create_ticket_blind")
    assert out.proc.returncode == 0, describe(out.proc)
    assert out.status["status"] == "waiting", out.status
    assert out.status["waiting"]["kind"] == "human", out.status
    assert out.status["lease"]["owner"] is None, out.status
    stats = api.stats()
    assert stats["created"] == 1 and len(stats["posts"]) == 1, stats
    assert out.of_type("op.result") == []
    assert len(proxy.snapshot()) == 1


def test_proxy_window_applies_to_every_exchange_inside_it(
    tickets: tuple[TicketAPI, FaultProxy],
) -> None:
    """The proxy itself: a window's fault hits every new exchange, a plan comes first."""
    api, proxy = tickets
    proxy.plan(PASS)
    with proxy.during(Fault.reset_before()):
        first_ok = _try_stats(proxy)
        refused = [_try_stats(proxy) for _ in range(2)]
    after = _try_stats(proxy)
    assert first_ok and not any(refused) and after
    assert [e.outcome for e in proxy.snapshot()] == ["forwarded", "reset", "reset", "forwarded"]
    assert api.stats()["posts"] == []


def _try_stats(proxy: FaultProxy) -> bool:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        conn.request("GET", "/stats")
        return conn.getresponse().status == 200
    except (ConnectionError, http.client.HTTPException):
        return False
    finally:
        conn.close()
