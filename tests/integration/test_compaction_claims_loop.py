"""A compressor that claims completion in its own words is caught, and the next request
says the claim was not accepted, next to the true ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.loop import by_purpose, events_of, ledger_of, next_item, run_task, spec_of
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.report.replay import replay_task
from tether.runtime.round.claims import SUMMARY_AUDIT_INSTRUCTIONS
from tether.runtime.round.context import SUMMARY_PREFIX
from tether.store.memory import MemoryStore

NOTE = "NOTE FROM THE RUNTIME"


@pytest.fixture
async def store() -> MemoryStore:
    return await MemoryStore.open()


class Loop:
    """An actor that writes i1, then only reads a big file until a compaction happened,
    then finishes honestly; and a compressor that says `summary`."""

    def __init__(self, summary: str) -> None:
        self.summary = summary
        self.compact_requests: list[ModelRequest] = []
        self.after: list[ModelRequest] = []

    def actor(self, request: ModelRequest) -> ModelResponse:
        if self.compact_requests:
            self.after.append(request)
        nxt = next_item(request)
        if nxt is None:
            return ModelResponse("Everything in the ledger is closed.")
        if nxt == "i1" or self.compact_requests:
            return ModelResponse(
                f"writing {nxt}", (tool_call("write_file", path=f"out/{nxt}.txt", content=nxt),)
            )
        # Make no progress, and grow the history past the small budget.
        return ModelResponse("reading", (tool_call("read_file", path="big.txt"),))

    def compressor(self, request: ModelRequest) -> str:
        self.compact_requests.append(request)
        return self.summary

    def model(self) -> ScriptedModel:
        return ScriptedModel(
            policy=by_purpose(act=self.actor, judge=lambda r: "{}", compact=self.compressor)
        )


def _spec(**context: Any) -> Any:
    return spec_of(
        3,
        context={"input_budget_tokens": 1500, "preview_chars": 750, **context},
        limits={"no_progress_rounds": 50, "max_rounds": 20},
    )


async def _run(store: MemoryStore, tmp_path: Path, loop: Loop) -> tuple[str, Any]:
    (tmp_path / "big.txt").write_text("x" * 700)
    model = loop.model()
    return await run_task(store, _spec(), tmp_path, model, compact=model)


def _summary_message(request: ModelRequest) -> str:
    summaries = [m.content for m in request.messages if m.content.startswith(SUMMARY_PREFIX)]
    assert len(summaries) == 1
    return summaries[0]


async def test_a_global_claim_in_plain_words_is_flagged_and_refused(
    store: MemoryStore, tmp_path: Path
) -> None:
    loop = Loop("Read big.txt several times.\n\nEverything finished, all items done.")
    tid, result = await _run(store, tmp_path, loop)
    assert loop.compact_requests, "the budget should have forced a compaction"
    # The compressor saw the true ledger: i1 done, i2 and i3 pending.
    assert "Progress: 1/3 done, 2 open" in loop.compact_requests[0].system

    warns = [
        w
        for w in await events_of(store, tid, "audit.warning")
        if w["code"] == "summary_claims_done"
    ]
    assert warns, "a summary claiming completion must raise an audit warning"
    details = warns[0]["details"]
    assert details["global"] == "everything finished"
    assert details["items"] == []
    assert "everything finished" in warns[0]["message"]
    compacted = await events_of(store, tid, "context.compacted")
    assert compacted[0]["claimed_done"] == []

    # The summary changed nothing in the ledger: the compaction committed no ledger update,
    # the next change came within a later round, and the next request shows the ledger the
    # compressor was given (same version, i2 and i3 still open).
    events = await store.read_events(tid)
    at = next(n for n, e in enumerate(events) if e.type == "context.compacted")
    call = max(
        n
        for n, e in enumerate(events[:at])
        if e.type == "model.called" and e.data["purpose"] == "compact"
    )
    assert [e.type for e in events[call : at + 1]] == [
        "model.called",
        "audit.warning",
        "context.compacted",
    ]
    later = [e.type for e in events[at:]]
    assert later.index("round.started") < later.index("ledger.updated")
    version = int(loop.compact_requests[0].system.split("GOAL LEDGER (version ")[1].split(")")[0])

    first = loop.after[0]
    text = _summary_message(first)
    assert "Everything finished, all items done." in text  # the summary is kept...
    note = text[text.index(NOTE) :]  # ...and followed by the runtime's note
    assert 'claims that the whole task is finished ("everything finished")' in note
    assert "that claim was not accepted" in note
    assert "The goal ledger is the truth:" in note
    assert f"GOAL LEDGER (version {version})" in note
    assert "Progress: 1/3 done, 2 open" in note
    assert "[x] done (1): i1" in note
    assert "] i2: write out/i2.txt" in note and "[ ] i3: write out/i3.txt" in note
    assert "Next: i2" in note
    assert "Progress: 1/3 done" in first.system  # the re-rendered system prompt agrees
    assert next_item(first) == "i2"

    # Real work then finished the task; every done item has its file behind it.
    assert result.status == "satisfied"
    led = await ledger_of(store, tid)
    for item_id in ("i1", "i2", "i3"):
        assert led.item(item_id).status == "done" and led.item(item_id).evidence
        assert (tmp_path / "out" / f"{item_id}.txt").read_text() == item_id


async def test_per_item_claims_in_markdown_are_listed(store: MemoryStore, tmp_path: Path) -> None:
    loop = Loop(
        "## Progress\n\n- [x] i1: written\n- [x] **i2**: written\n- [X] i3 ✅\n\n"
        "Read big.txt (700 bytes) a few times."
    )
    tid, _ = await _run(store, tmp_path, loop)
    assert loop.compact_requests
    warns = [
        w
        for w in await events_of(store, tid, "audit.warning")
        if w["code"] == "summary_claims_done"
    ]
    assert warns and warns[0]["details"]["items"] == ["i2", "i3"]  # i1 is really done
    assert warns[0]["details"]["global"] is None
    compacted = await events_of(store, tid, "context.compacted")
    assert compacted[0]["claimed_done"] == ["i2", "i3"]
    note = _summary_message(loop.after[0]).split(NOTE, 1)[1]
    assert "claims that i2, i3 are done; that claim was not accepted" in note
    assert "Progress: 1/3 done, 2 open" in note


async def test_an_honest_summary_gets_no_warning_and_no_note(
    store: MemoryStore, tmp_path: Path
) -> None:
    loop = Loop(
        "Done: i1 (out/i1.txt written). Remaining: i2, i3 — not started.\n"
        "Read big.txt a few times; the reads finished without errors."
    )
    tid, result = await _run(store, tmp_path, loop)
    assert loop.compact_requests
    codes = [w["code"] for w in await events_of(store, tid, "audit.warning")]
    assert "summary_claims_done" not in codes
    assert NOTE not in _summary_message(loop.after[0])
    assert result.status == "satisfied"


async def test_the_note_survives_when_the_summary_is_cut_to_fit(
    store: MemoryStore, tmp_path: Path
) -> None:
    # A long lying summary against a tight budget: the summary is shortened, the note
    # and the ledger are not (nor the latest round, kept verbatim, hence 1,100 tokens).
    filler = " ".join(f"Round {k}: read big.txt again." for k in range(1, 200))
    loop = Loop("ALL ITEMS ARE COMPLETE. " + filler)
    (tmp_path / "big.txt").write_text("x" * 700)
    model = loop.model()
    await run_task(store, _spec(input_budget_tokens=1100), tmp_path, model, compact=model)
    assert loop.compact_requests
    text = _summary_message(loop.after[0])
    assert "ALL ITEMS ARE COMPLETE." in text
    assert text.index("[cut]") < text.index(NOTE)  # the summary was cut, before the note
    note = text.split(NOTE, 1)[1]
    assert 'finished ("all items are complete"); that claim was not accepted' in note
    assert note.rstrip().endswith("Next: i2")


# --- a judge model's second reading ------------------------------------------------------------

SLY = "i2 and i3 went the same way as i1, which is done."


class JudgedLoop:
    """Writes i1, then reads new notes every round (never the same call twice) until a
    compaction happened, then finishes honestly; a compressor that says `summary`; and a
    judge model that answers the runtime's question about the summary with `reading`
    (or fails, when `reading` is None). Default limits."""

    def __init__(self, summary: str, reading: str | None) -> None:
        self.summary = summary
        self.reading = reading
        self.compact_requests: list[ModelRequest] = []
        self.audit_requests: list[ModelRequest] = []
        self.after: list[ModelRequest] = []
        self.reads = 0

    def actor(self, request: ModelRequest) -> ModelResponse:
        if self.compact_requests:
            self.after.append(request)
        nxt = next_item(request)
        if nxt is None:
            return ModelResponse("Everything in the ledger is closed.")
        if nxt == "i1" or self.compact_requests:
            return ModelResponse(
                f"writing {nxt}", (tool_call("write_file", path=f"out/{nxt}.txt", content=nxt),)
            )
        self.reads += 1
        return ModelResponse("reading", (tool_call("read_file", path=f"notes-{self.reads}.txt"),))

    def judge(self, request: ModelRequest) -> str:
        if request.system == SUMMARY_AUDIT_INSTRUCTIONS:
            self.audit_requests.append(request)
            if self.reading is None:
                raise RuntimeError("the judge model is down")
            return self.reading
        return '{"changes": [], "decision": "continue", "reason": "rules decide"}'

    def compressor(self, request: ModelRequest) -> str:
        self.compact_requests.append(request)
        return self.summary

    async def run(self, store: MemoryStore, tmp_path: Path) -> tuple[str, Any]:
        for k in range(1, 30):
            (tmp_path / f"notes-{k}.txt").write_text(f"notes {k} " + "x" * 700)
        model = ScriptedModel(
            policy=by_purpose(act=self.actor, judge=self.judge, compact=self.compressor)
        )
        spec = spec_of(3, context={"input_budget_tokens": 1500, "preview_chars": 750})
        assert "limits" not in spec.model_fields_set
        return await run_task(
            store, spec, tmp_path, model, judge=model, compact=model, max_rounds_this_run=30
        )


async def test_the_judge_finds_a_claim_the_rules_miss(store: MemoryStore, tmp_path: Path) -> None:
    loop = JudgedLoop(SLY, '{"claimed_done": ["i2", "i3"], "whole_task": false, "quote": "x"}')
    tid, result = await loop.run(store, tmp_path)
    assert loop.compact_requests and loop.audit_requests
    # The judge was shown the summary and the true ledger.
    shown = loop.audit_requests[0].messages[0].content
    assert SLY in shown and '"id": "i2"' in shown
    (warn,) = [
        w
        for w in await events_of(store, tid, "audit.warning")
        if w["code"] == "summary_claims_done"
    ][:1]
    assert warn["details"]["items"] == ["i2", "i3"]
    assert warn["details"]["found_by"] == "judge"
    # The next request says the claim was refused, next to the true ledger.
    summary = _summary_message(loop.after[0])
    assert summary.index(SLY) < summary.index(NOTE)
    assert "claims that i2, i3 are done" in summary
    # The judge's call is journaled like any other.
    calls = await events_of(store, tid, "model.called")
    assert any(c["purpose"] == "judge" and c.get("round") is None for c in calls)
    # The task finished honestly afterwards, and replays clean.
    assert result.status == "satisfied"
    replayed = await replay_task(store, tid)
    assert replayed.divergence is None, replayed.divergence


@pytest.mark.parametrize(
    "reading",
    [None, "not json", '{"claimed_done": [], "whole_task": false}'],
    ids=["judge-down", "unreadable", "nothing-found"],
)
async def test_the_rules_are_the_floor(
    store: MemoryStore, tmp_path: Path, reading: str | None
) -> None:
    # A judge that fails, answers nonsense or finds nothing changes nothing: the
    # rules' reading stands (no claim here), and the task goes on.
    loop = JudgedLoop(SLY, reading)
    tid, result = await loop.run(store, tmp_path)
    assert loop.audit_requests
    warns = [
        w
        for w in await events_of(store, tid, "audit.warning")
        if w["code"] == "summary_claims_done"
    ]
    assert warns == []
    assert NOTE not in _summary_message(loop.after[0])
    assert result.status == "satisfied"
    failed = await events_of(store, tid, "model.failed")
    assert [f["purpose"] for f in failed] == (["judge"] if reading is None else [])
    # The judge's call, or its failure, is journaled: the run replays clean.
    replayed = await replay_task(store, tid)
    assert replayed.divergence is None, replayed.divergence


async def test_a_judge_cannot_clear_what_the_rules_flagged(
    store: MemoryStore, tmp_path: Path
) -> None:
    loop = JudgedLoop("cat: i1 to i3 are done.", '{"claimed_done": [], "whole_task": false}')
    tid, _ = await loop.run(store, tmp_path)
    # The rules found the claim: the judge is not asked, and the claim is refused.
    assert loop.audit_requests == []
    (warn,) = [
        w
        for w in await events_of(store, tid, "audit.warning")
        if w["code"] == "summary_claims_done"
    ][:1]
    assert warn["details"]["items"] == ["i2", "i3"] and warn["details"]["found_by"] == "rules"


async def test_a_summary_without_completion_words_is_not_sent_to_the_judge(
    store: MemoryStore, tmp_path: Path
) -> None:
    loop = JudgedLoop("Read notes 1 to 4; each has 700 x.", '{"claimed_done": ["i2"]}')
    tid, _ = await loop.run(store, tmp_path)
    assert loop.compact_requests and loop.audit_requests == []
    assert "summary_claims_done" not in {
        w["code"] for w in await events_of(store, tid, "audit.warning")
    }
