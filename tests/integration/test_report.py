"""The retrospective report, time travel and stored calls, on real runs of scripted
models: every figure is checked against sums taken over the event log, and the ledger
at every event against the ledger the runtime stored live at that point."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support.loop import by_purpose, next_item, rules_judge, run_task, spec_of
from tether import decisions, errors
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.report import build_report, show_call, status_at
from tether.report.calls import list_calls
from tether.report.render import markdown, render
from tether.runtime.tasks import status_dict
from tether.store import open_store
from tether.store.base import CommitResult, LedgerWrite, Store

#: A priced model name, so money is spent and summed.
PRICED = "gpt-4.1-mini"


def _actor(request: ModelRequest) -> ModelResponse:
    """Writes each item's file, except i3's: it reads a file that is not there."""
    nxt = next_item(request)
    if nxt is None:
        return ModelResponse("Everything is closed.")
    if nxt == "i3":
        return ModelResponse("looking for i3", (tool_call("read_file", path="missing.txt"),))
    return ModelResponse(
        f"writing {nxt}", (tool_call("write_file", path=f"out/{nxt}.txt", content=nxt),)
    )


class RecordingStore:
    """A store that remembers, after each commit, its last seq and the ledger stored then
    (a commit is one transaction: only its end is a state anyone could read)."""

    def __init__(self, inner: Store) -> None:
        self._inner = inner
        self.ledgers: list[tuple[int, dict[str, Any] | None, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def commit(
        self, task_id: str, token: int | None, events: Sequence[Any], **kw: Any
    ) -> Any:
        result: CommitResult = await self._inner.commit(task_id, token, events, **kw)
        write: LedgerWrite | None = kw.get("ledger")
        if write is not None:
            # The whole ledger as stored by this commit (a write may carry only the
            # items that moved), and what the write sent is in it.
            stored = await self._inner.get_ledger(task_id)
            assert {k: stored.state[k] for k in write.state} == write.state
            self.ledgers.append((result.last_seq, stored.state, write.version))
        elif self.ledgers:
            self.ledgers.append((result.last_seq, *self.ledgers[-1][1:]))
        else:
            self.ledgers.append((result.last_seq, None, 0))
        return result


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    urls = {"memory": "memory://", "sqlite": f"sqlite:///{tmp_path}/t.db"}
    if request.param == "postgres":
        urls["postgres"] = request.getfixturevalue("pg_url")
    s = await open_store(urls[request.param])
    yield RecordingStore(s)
    await s.close()


async def _blocked_then_waived(store: Any, tmp_path: Path) -> str:
    """A run whose i3 fails until it is blocked; a person waives it; the run ends."""
    spec = spec_of(
        3,
        limits={"no_progress_rounds": 2, "same_failure_repeats": 2},
        tools=["write_file", "read_file"],
    )
    actor = ScriptedModel(policy=by_purpose(act=_actor), name=PRICED)
    judge = ScriptedModel(policy=rules_judge, name=PRICED)
    tid, first = await run_task(store, spec, tmp_path, actor, judge=judge)
    assert first.status == "waiting", first
    await decisions.waive_item(store, tid, "i3", reason="no such file", by="alice")
    _, second = await run_task(store, spec, tmp_path, actor, judge=judge, task_id=tid)
    assert second.status == "satisfied", second
    return tid


async def test_json_totals_equal_sums_over_the_event_log(store: Any, tmp_path: Path) -> None:
    tid = await _blocked_then_waived(store, tmp_path)
    events = await store.read_events(tid)
    calls = [e.data for e in events if e.type == "model.called"]
    doc = json.loads(render(await build_report(store, tid), "json"))
    t = doc["totals"]
    assert t["model_calls"] == len(calls) > 0
    assert t["input_tokens"] == sum(c["input_tokens"] for c in calls)
    assert t["output_tokens"] == sum(c["output_tokens"] for c in calls)
    assert t["cached_tokens"] == sum(c["cached_tokens"] for c in calls) > 0
    assert t["cost_usd"] == pytest.approx(sum(c["cost_usd"] for c in calls), abs=1e-6)
    assert t["cost_usd"] > 0
    assert t["rounds"] == sum(1 for e in events if e.type == "round.committed")
    ops = {e.data["op_id"] for e in events if e.type in ("op.intended", "op.result")}
    assert t["tool_calls"] == len(ops) > 0
    assert t["wall_seconds"] == pytest.approx(events[-1].at - events[0].at, abs=1e-3)
    # Each breakdown adds up to the totals.
    for key in ("by_milestone", "by_item", "by_purpose", "by_model"):
        rows = doc["spend"][key]
        assert sum(r["calls"] for r in rows) == t["model_calls"], key
        assert sum(r["tokens"] for r in rows) == t["tokens"], key
        assert sum(r["cost_usd"] for r in rows) == pytest.approx(t["cost_usd"], abs=1e-5), key
    purposes = {r["key"]: r for r in doc["spend"]["by_purpose"]}
    assert set(purposes) == {"act", "judge"}
    assert purposes["act"]["calls"] == sum(1 for c in calls if c["purpose"] == "act")
    items = {r["key"] for r in doc["spend"]["by_item"]}
    assert {"i1", "i2", "i3"} <= items
    tools = {r["key"]: r for r in doc["spend"]["by_tool"]}
    assert set(tools) == {"write_file", "read_file"}
    # The failures are i3's reads, by tool and by class.
    failed = [e.data for e in events if e.type == "op.result" and e.data["status"] != "succeeded"]
    assert doc["failures"]["by_tool"] == {"read_file": len(failed)} and failed
    assert sum(doc["failures"]["by_class"].values()) == len(failed) == doc["failures"]["total"]
    # The person: one waiver that answered one wait for a decision.
    assert [(i["kind"], i["by"]) for i in doc["interventions"]] == [("waive", "alice")]
    decision_waits = [w for w in doc["waits"] if w["kind"] == "decision"]
    assert len(decision_waits) == 1 and decision_waits[0]["answered_by"] == "waive"
    assert decision_waits[0]["seconds"] >= 0
    # Cache hit rate per turn: two turns (start, then the resume after the waiver).
    turns = doc["cache_by_turn"]
    assert [x["kind"] for x in turns][:1] == ["start"] and len(turns) == 2
    assert sum(x["calls"] for x in turns) == purposes["act"]["calls"]
    assert 0 < turns[0]["hit_rate"] < 1
    # Progress ends where the ledger is; the top three are the biggest places.
    assert doc["progress"][-1]["finished"] == 3 and doc["progress"][0]["finished"] == 0
    top = doc["top_spend"]
    assert len(top) == 3 and top[0]["cost_usd"] >= top[1]["cost_usd"] >= top[2]["cost_usd"]
    assert sum(x["share"] for x in top) <= 1.0001


async def test_ledger_at_every_seq_equals_the_ledger_stored_live(
    store: Any, tmp_path: Path
) -> None:
    tid = await _blocked_then_waived(store, tmp_path)
    live = store.ledgers
    assert len(live) > 5
    for seq, state, version in live:
        doc = await status_at(store, tid, seq)
        assert doc["at"]["seq"] == seq
        folded = {
            it["id"]: {f: it[f] for f in ("status", "evidence", "attempts", "breaker", "note")}
            for it in doc["ledger"]["items"]
        }
        if state is None:
            assert {x["status"] for x in folded.values()} == {"pending"}, seq
        else:
            assert folded == state, seq
        assert doc["ledger"]["version"] == version, seq
    last_seq = (await store.get_task(tid)).last_seq
    assert live[-1][0] == last_seq
    # At the last event, time travel and the live status agree.
    now, back = await status_dict(store, tid), await status_at(store, tid, last_seq)
    assert back["ledger"] == now["ledger"]
    assert (back["status"], back["stop_reason"]) == (now["status"], now["stop_reason"])
    for key in ("rounds", "model_calls", "tokens", "cached_tokens"):
        assert back["budget"]["used"][key] == now["budget"]["used"][key], key


async def test_status_at_shows_the_wait_and_refuses_an_unknown_seq(
    store: Any, tmp_path: Path
) -> None:
    tid = await _blocked_then_waived(store, tmp_path)
    events = await store.read_events(tid, types={"decision.requested"})
    wait = await status_at(store, tid, events[0].seq + 1)
    assert wait["status"] == "waiting" and wait["waiting"]["kind"] == "decision"
    assert {it["id"] for it in wait["waiting"]["partial"]["blocked"]} == {"i3"}
    last = (await store.get_task(tid)).last_seq
    for bad in (0, last + 1):
        with pytest.raises(errors.UserError, match=f"events 1 to {last}"):
            await status_at(store, tid, bad)


async def test_show_gives_back_the_request_the_model_saw(store: Any, tmp_path: Path) -> None:
    actor = ScriptedModel(policy=_actor, name=PRICED)
    tid, _ = await run_task(store, spec_of(2), tmp_path, actor)
    calls = await list_calls(store, tid)
    acts = [c for c in calls if c["purpose"] == "act"]
    assert len(acts) == len(actor.requests) >= 2
    for c, seen in zip(acts, actor.requests, strict=True):
        short = c["call_id"].removeprefix(f"{tid}.")
        for ref in (c["call_id"], short, short.rsplit(".", 1)[1]):
            doc = await show_call(store, tid, ref)
            assert doc["request"] == seen.to_dict()
            assert doc["call"]["call_id"] == c["call_id"]
    assert doc["response"]["text"] == "writing i2"
    # Shown whole, though its blob leaves out the fields at their defaults.
    assert {"finish_reason", "model", "latency_ms"} <= set(doc["response"])
    assert set(doc["response"]["usage"]) == {
        "input_tokens",
        "output_tokens",
        "cached_input_tokens",
        "cache_write_tokens",
    }
    assert all({"raw_arguments", "error"} <= set(c) for c in doc["response"]["tool_calls"])
    with pytest.raises(errors.UserError, match=r"has no model call 'act\.999'; its calls are"):
        await show_call(store, tid, "act.999")


async def test_markdown_and_html_say_the_same_and_escape_user_text(
    store: Any, tmp_path: Path
) -> None:
    spec = spec_of(1, name="evil | <script>alert(1)</script>\n\x1b[31m")
    tid, _ = await run_task(store, spec, tmp_path, ScriptedModel(policy=_actor, name=PRICED))
    doc = await build_report(store, tid)
    md = markdown(doc)
    headings = re.findall(r"^## (.+)$", md, re.M)
    assert headings[:2] == ["Summary", "Where the budget went (top three)"]
    assert "Ledger progress over time" in headings
    assert "\x1b" not in md and "evil \\| <script>" in md
    page = render(doc, "html")
    for h in headings:
        assert f"<h2>{h}</h2>" in page, h
    assert "<script>" not in page and "&lt;script&gt;" in page
    # Self-contained: three inline charts, nothing loaded from anywhere.
    assert page.count("<svg") == 3
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<link" not in page and "@import" not in page
