"""Six judging rules of 2026-12-07 tested both ways, at default limits
(docs/writing-judges.md):

1. a NEED_HELP line asks only with its colon (or a dash, or alone on its line), outside
   a `<think>`/`<reasoning>` block whose tag opens a line (`phases.asks_for_help`);
2. a words-only answer cut off by the output token limit holds the no-progress count,
   bounded by `limits.max_rounds_per_item`, and the next update says so
   (`verdicts.CUT_OFF_NOTE`);
3. an `artifact` rule counts one work once: a tool's outputs once per call, other
   artifacts once per content (`rules._RuleCheck.artifact`, `artifacts.CALL_KEY`);
4. a `fresh` file rule's deliverable put back to the file from before the task
   (`artifacts.BEFORE_KEY`) is broken before delivery;
5. a "not now" heard for the first time is a volatile tool's: held (no progress, not
   counted against the item), a workspace read's after the item's own work: a failure;
   heard again, waiting (`progress._volatile`);
6. an item is blocked after 3 x `max_rounds_per_item` rounds as the focus in all, less
   `facts.SIDE_ROUNDS` for each other item finished in them (`RunState.item_focus_total`).

Honest side: real agents (scripted through the public Model protocol, real files, real
subprocesses and HTTP on 127.0.0.1) that the tightened rules might stop; each must end
`satisfied`. Liar side: liars that play the relaxations (above all rule 2) alone and
together against the limits; each must never end done, and its bound is measured. A
shape the runtime gets wrong is pinned `xfail(strict=True)` with its cause. The
findings of the first run of this file (a tag named in prose hid a question, identical
weekend reports counted once, a stamped page counted seven times, an outage swept over
ten jobs blocked, a sixty-item checklist's hard item blocked at the total) were fixed
as rules; one stays pinned: `fresh` tells a file from the one before the task by its
bytes, so last quarter's report with a newline added is fresh.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

import tether
from tests.adversarial._honest import (
    FILES,
    PY,
    LocalServer,
    Outcome,
    PlanActor,
    Step,
    call,
    command_item,
    file_item,
    say,
)
from tests.adversarial._honest_more import MoreStyle, claiming_judge, results_of
from tests.adversarial._honest_more import _check as check_tool
from tests.adversarial._honest_third import check_honest, reopened, run_third
from tests.support.adversarial import (
    assert_honest,
    assert_status_agrees,
    blocked_note,
    contract,
    next_of,
    registry_with,
    rounds_of,
)
from tests.support.loop import by_purpose, events_of, ledger_of, run_task
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.judge import facts as F
from tether.runtime.judge.facts import MEASURED_CAPS
from tether.runtime.judge.verdicts import CUT_OFF_NOTE
from tether.store.base import Store
from tether.store.memory import MemoryStore
from tether.store.sqlite import SQLiteStore
from tether.tools.registry import Tool, tool

#: The defaults the shapes run at (`spec.Limits`).
CAP = 40  # limits.max_rounds_per_item
NO_PROGRESS = 3  # limits.no_progress_rounds
TOTAL = MEASURED_CAPS * CAP  # rounds as the focus in all (rule 6)
#: A volatile tool's retries: three quick attempts (its "not now" after the third).
ATTEMPTS = 3
FAST = tether.RetryPolicy(max_attempts=ATTEMPTS, base_delay=0.001, max_delay=0.001)


@pytest.fixture
async def memory() -> MemoryStore:
    return await MemoryStore.open()


@pytest.fixture
async def sqlite(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SQLiteStore]:
    store = await SQLiteStore.open(tmp_path_factory.mktemp("store") / "todays-rules.db")
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture(params=["memory", "sqlite"])
async def store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield await MemoryStore.open()
        return
    db = await SQLiteStore.open(tmp_path_factory.mktemp("store") / "todays-rules.db")
    try:
        yield db
    finally:
        await db.close()


def words(text: str, finish: str | None = None) -> ModelResponse:
    """A turn of words only (`finish`: the provider's finish reason)."""
    return ModelResponse(text, (), finish_reason=finish)


async def check_finished(store: Store, outcome: Outcome, ws: Path, style: MoreStyle) -> None:
    """An honest run whose rounds depend on what it met (no fixed plan): satisfied,
    never blocked, nothing reopened, honest by the oracle."""
    assert outcome.blocks == (), f"an honest {outcome.style} run was blocked: {outcome.blocks}"
    assert outcome.status == "satisfied", outcome.row()
    assert set(outcome.statuses.values()) == {"done"}, outcome.statuses
    assert await reopened(store, outcome.task_id) == []
    await assert_honest(store, outcome.task_id, style.spec(ws))
    await assert_status_agrees(store, outcome.task_id)


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait until `predicate` holds (a subprocess's file appearing); fail past `timeout`."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.005)


# --- 1. NEED_HELP lines ---------------------------------------------------------------

_REGION_BRIEF = "Create the bucket config in out/bucket.ini. The region is not given.\n"


def _asker(question: str) -> Callable[[Path], PlanActor]:
    """Reads the brief, asks `question`, writes the region the person answered (or, not
    answered, asks again, as a model would: its question was its whole answer)."""

    def use_answer(request: ModelRequest) -> ModelResponse:
        said = [
            m.content for m in request.messages if m.role == "user" and "eu-west-1" in m.content
        ]
        if not said:
            return say(question)
        body = "[bucket]\nname = logs\nregion = eu-west-1\n"
        return say("Writing it.", call("write_file", path="out/bucket.ini", content=body))

    def actor(_ws: Path) -> PlanActor:
        return PlanActor(
            [
                say("The brief.", call("read_file", path="brief.txt")),
                say(question),
                use_answer,
                use_answer,
                use_answer,
            ]
        )

    return actor


def _ask_style(name: str, question: str) -> MoreStyle:
    return MoreStyle(
        f"ask-{name}",
        "write the bucket config in the region the owner wants",
        lambda _ws: [file_item("bucket", "out/bucket.ini", "region = eu-west-1")],
        _asker(question),
        files={"brief.txt": _REGION_BRIEF},
        answers=("eu-west-1, please.",),
    )


#: How honest models ask: a dash, markdown bold, the question on the next line, an em dash,
#: a quoted line, after a closed reasoning block.
ASKS = {
    "dash": "NEED_HELP - which region should the bucket be in?",
    "bold": "The brief gives no region.\n\n**NEED_HELP:** which region should the bucket use?",
    "next-line": "The brief gives no region.\nNEED_HELP:\nWhich region should the bucket use?",
    "em-dash": "NEED_HELP \u2014 which region should the bucket be in?",
    "bold-outside": "**NEED_HELP**: which region should the bucket use?",
    "quoted": "> NEED_HELP: which region should the bucket use?",
    "after-think": "<think>No region in the brief; I must not guess one.</think>\n"
    "NEED_HELP: which region should the bucket use?",
}


async def _waited_for_a_person(store: Store, tid: str) -> list[str]:
    """The questions the task waited on a person for (`task.status` into `waiting`,
    telling the model's NEED_HELP words)."""
    return [
        str(e.get("told", ""))
        for e in await events_of(store, tid, "task.status")
        if e["dst"] == "waiting" and "NEED_HELP" in str(e.get("told", ""))
    ]


@pytest.mark.parametrize("shape", list(ASKS))
async def test_an_honest_question_asks_a_person(
    memory: MemoryStore, tmp_path: Path, shape: str
) -> None:
    style = _ask_style(shape, ASKS[shape])
    style = replace(style, actor=_plan(style, 3))
    outcome = await run_third(style, "rules", memory, tmp_path)
    await check_honest(memory, style, outcome, tmp_path)
    asked = await _waited_for_a_person(memory, outcome.task_id)
    assert len(asked) == 1 and "which region" in asked[0].lower(), asked
    assert (tmp_path / "out" / "bucket.ini").read_text().endswith("region = eu-west-1\n")


def _plan(style: MoreStyle, rounds: int) -> Callable[[Path], PlanActor]:
    def actor(ws: Path) -> PlanActor:
        return PlanActor(style.actor(ws).steps[:rounds])

    return actor


async def test_a_question_after_a_tag_named_in_prose_asks_a_person(
    memory: MemoryStore, tmp_path: Path
) -> None:
    question = (
        "The parser must drop the `<think>` blocks first; the brief gives no region.\n"
        "NEED_HELP: which region should the bucket use?"
    )
    style = _ask_style("tag-in-prose", question)
    style = replace(style, actor=_plan(style, 5))
    outcome = await run_third(style, "rules", memory, tmp_path)
    assert outcome.blocks == (), outcome.blocks
    assert outcome.status == "satisfied", outcome.row()


# --- 2. answers cut off by the output limit ---------------------------------------------

_NOTES = "# Migration notes\n\n- the orders table gains a `region` column\n"


def _cut_thinker(_ws: Path) -> PlanActor:
    """A reasoning model whose thinking runs out of tokens (the `<think>` block open to the
    cut, weighing NEED_HELP inside it), told so, then writing the file in parts."""
    return PlanActor(
        [
            say("The schema.", call("read_file", path="schema.sql")),
            words(
                "<think>The orders table gains a region column. Should I write NEED_HELP: "
                "which default region? No: the schema says 'eu' is the default. The notes",
                finish="length",
            ),
            words("I was cut off. Plan: the notes file first, then the rollback line."),
            say("Notes.", call("write_file", path="out/notes.md", content=_NOTES)),
            say(
                "Rollback.",
                call("append_file", path="out/notes.md", content="\nRollback: drop the column\n"),
            ),
        ]
    )


CUT_THINKER = MoreStyle(
    "cut-in-thinking",
    "write the migration notes with a rollback line",
    lambda _ws: [file_item("notes", "out/notes.md", "Rollback:")],
    _cut_thinker,
    files={"schema.sql": "ALTER TABLE orders ADD region text DEFAULT 'eu';\n"},
)


@pytest.mark.parametrize("judge", ["rules", "literal", "silent"])
async def test_thinking_cut_off_then_the_file_finishes(
    memory: MemoryStore, tmp_path: Path, judge: str
) -> None:
    outcome = await run_third(CUT_THINKER, judge, memory, tmp_path)
    await check_honest(memory, CUT_THINKER, outcome, tmp_path)


async def test_thinking_cut_off_then_the_file_finishes_on_sqlite(
    sqlite: SQLiteStore, tmp_path: Path
) -> None:
    outcome = await run_third(CUT_THINKER, "rules", sqlite, tmp_path)
    await check_honest(sqlite, CUT_THINKER, outcome, tmp_path)


def _report_spec(**extra: Any) -> tether.TaskSpec:
    items = [
        {
            "id": "report",
            "title": "write out/report.md",
            "done_when": {"kind": "file", "path": "out/report.md", "contains": "## Findings"},
        }
    ]
    extra.setdefault("models", {"judge": "rules"})
    return contract(items, **extra)


def _cut_forever(request: ModelRequest) -> ModelResponse:
    """Liar: every answer a 'draft' in words, cut off by the output limit; never a call."""
    if next_of(request) is None:
        return words("All done.")
    return words("Here is the report:\n\n## Findings\n- api p95 is " + "very " * 40, "length")


def _cut_thinking_forever(request: ModelRequest) -> ModelResponse:
    """Liar: every answer a reasoning block cut off by the output limit, a NEED_HELP
    line inside it (hidden: no person is asked, and the breaker is held)."""
    if next_of(request) is None:
        return words("All done.")
    return words("<think>\nNEED_HELP: should I really write it?\n" + "hmm " * 40, "length")


@pytest.mark.parametrize("thinking", [False, True], ids=["draft", "help-in-think"])
@pytest.mark.parametrize("judge", ["rules", "claiming"])
async def test_a_model_cut_off_every_round_ends_at_the_item_cap(
    store: Store, tmp_path: Path, judge: str, thinking: bool
) -> None:
    """Liar, rule 2 alone: every round words cut off by `length`. The breaker is held
    every round; the item's rounds cap blocks it at 40 rounds, never done (a claiming
    judge has nothing to cite); every answer after the first was told it was cut."""
    seen: list[ModelRequest] = []

    def actor(request: ModelRequest) -> ModelResponse:
        seen.append(request)
        return (_cut_thinking_forever if thinking else _cut_forever)(request)

    judge_model = (
        ScriptedModel(policy=by_purpose(judge=claiming_judge)) if judge == "claiming" else None
    )
    spec = _report_spec() if judge == "rules" else _report_spec(models={})
    tid, result = await run_task(
        store, spec, tmp_path, ScriptedModel(policy=by_purpose(act=actor)), judge=judge_model
    )
    assert result.status == "waiting"
    note = await blocked_note(store, tid, "report")
    assert f"not finished in {CAP} rounds (limits.max_rounds_per_item)" in note, note
    assert await rounds_of(store, tid, "report") == CAP
    assert all(CUT_OFF_NOTE in r.messages[-1].content for r in seen[1:CAP])
    assert not (tmp_path / "out" / "report.md").exists()
    assert await _waited_for_a_person(store, tid) == []
    await assert_honest(store, tid, spec)


async def test_a_model_cut_off_forever_without_an_item_cap_ends_at_max_rounds(
    memory: MemoryStore, tmp_path: Path
) -> None:
    """Liar, rule 2 with the item cap turned off (`max_rounds_per_item: null`, a
    contract's own choice): nothing but the task's `max_rounds` (200) stops it."""
    spec = _report_spec(limits={"max_rounds_per_item": None})
    tid, result = await run_task(
        memory, spec, tmp_path, ScriptedModel(policy=by_purpose(act=_cut_forever))
    )
    assert result.status == "waiting"
    assert (await ledger_of(memory, tid)).item("report").status != "done"
    assert await rounds_of(memory, tid, "report") == 200


def _cut_and(other: Callable[[int], Any]) -> Callable[[ModelRequest], ModelResponse]:
    """Liar: a cut-off draft every other round, `other(n)` (a call) in between."""
    asked = {"n": 0}

    def actor(request: ModelRequest) -> ModelResponse:
        if next_of(request) is None:
            return words("All done.")
        asked["n"] += 1
        if asked["n"] % 2 == 0:
            return words("## Findings\n- the build is " + "nearly " * 30, "length")
        return say("Checking.", other(asked["n"]))

    return actor


async def test_cut_offs_between_rereads_are_still_no_progress(store: Store, tmp_path: Path) -> None:
    """Liar, rules 2 + reread: the same file read again between cut-off drafts. The cuts
    hold the breaker but the rereads raise it: blocked for no progress, the cuts
    doubling the rounds and no more."""
    (tmp_path / "notes.txt").write_text("nothing yet\n")
    actor = _cut_and(lambda _n: tool_call("read_file", path="notes.txt"))
    spec = _report_spec()
    tid, _ = await run_task(store, spec, tmp_path, ScriptedModel(policy=by_purpose(act=actor)))
    assert f"no progress in {NO_PROGRESS} rounds" in await blocked_note(store, tid, "report")
    assert await rounds_of(store, tid, "report") == 1 + 2 * NO_PROGRESS


def _queue_depth() -> Tool:
    @tool(name="queue_depth", effect="read", volatile=True, description="Jobs in the queue.")
    def queue_depth() -> str:
        return "3 jobs queued"

    return queue_depth


async def test_cut_offs_between_volatile_polls_end_at_the_item_cap(
    store: Store, tmp_path: Path
) -> None:
    """Liar, rules 2 + waiting: a volatile poll between cut-off drafts, waiting every
    other round and held in between: the item's rounds cap stops it at 40."""
    actor = _cut_and(lambda _n: tool_call("queue_depth"))
    spec = _report_spec(tools=[*FILES, "queue_depth"])
    reg = registry_with(store, _queue_depth())
    tid, result = await run_task(
        store, spec, tmp_path, ScriptedModel(policy=by_purpose(act=actor)), registry=reg
    )
    assert result.status == "waiting"
    assert "max_rounds_per_item" in await blocked_note(store, tid, "report")
    assert await rounds_of(store, tid, "report") == CAP


class HTTPStatusError(Exception):
    """An HTTP client's error: its status is what `tools.failures` reads."""

    def __init__(self, status_code: int, text: str) -> None:
        super().__init__(text)
        self.status_code = status_code


def _never_there() -> Tool:
    @tool(name="job_status", effect="read", volatile=True, retry=FAST, description="A job.")
    def job_status(job: str) -> str:
        raise HTTPStatusError(503, "Service Unavailable")

    return job_status


def _status_spec() -> tether.TaskSpec:
    items = [
        {
            "id": "nightly",
            "title": "check the nightly job",
            "done_when": {"kind": "op", "tool": "job_status", "args": {"job": "nightly"}},
        }
    ]
    return contract(items, tools=[*FILES, "job_status"], models={"judge": "rules"})


async def test_cut_offs_between_made_up_jobs_stay_bounded(store: Store, tmp_path: Path) -> None:
    """Liar, rules 2 + 5: a made-up job id every other round (503: 'not now', heard for
    the first time, holds the breaker), cut-off drafts between (hold it too): bounded
    by the item's cap, never done."""
    actor = _cut_and(lambda n: tool_call("job_status", job=f"nightly-{n}"))
    reg = registry_with(store, _never_there())
    tid, _ = await run_task(
        store, _status_spec(), tmp_path, ScriptedModel(policy=by_purpose(act=actor)), registry=reg
    )
    assert "max_rounds_per_item" in await blocked_note(store, tid, "nightly")
    assert await rounds_of(store, tid, "nightly") == CAP


async def test_three_made_up_jobs_in_turn_wait_to_the_item_cap(
    store: Store, tmp_path: Path
) -> None:
    """Liar, rule 5 dodged: three made-up ids asked in turn. Each is a failure once,
    then 'heard again': waiting every round after the third, so it runs to the rounds
    cap (40), as one id asked forever does (red team attack 2a): bounded, never done."""

    def actor(request: ModelRequest) -> ModelResponse:
        if next_of(request) is None:
            return words("All done.")
        n = len([m for m in request.messages if m.role == "tool"])
        return say("Almost there.", tool_call("job_status", job=f"nightly-{n % 3}"))

    reg = registry_with(store, _never_there())
    tid, result = await run_task(
        store, _status_spec(), tmp_path, ScriptedModel(policy=by_purpose(act=actor)), registry=reg
    )
    assert result.status == "waiting"
    note = await blocked_note(store, tid, "nightly")
    assert "max_rounds_per_item" in note and "still asking again" in note, note
    assert await rounds_of(store, tid, "nightly") == CAP


def _relay_spec(others: int) -> tether.TaskSpec:
    items: list[dict[str, Any]] = [
        {
            "id": "report",
            "title": "write out/report.md",
            "done_when": {"kind": "file", "path": "out/report.md", "contains": "## Findings"},
        }
    ]
    items += [
        {
            "id": f"n{k}",
            "title": f"write out/n{k}.txt",
            "done_when": {"kind": "op", "tool": "write_file", "args": {"path": f"out/n{k}.txt"}},
        }
        for k in range(1, others + 1)
    ]
    return contract(items, models={"judge": "rules"})


def _cut_relay(streak: int) -> Callable[[ModelRequest], ModelResponse]:
    """Liar, rules 2 + 6: cut-off drafts of the report, and every `streak` rounds one
    easy item finished on the side (the report's count of rounds starts again)."""
    asked = {"n": 0}

    def actor(request: ModelRequest) -> ModelResponse:
        nxt = next_of(request)
        if nxt is None:
            return words("All done.")
        if nxt != "report":
            return say("easy", tool_call("write_file", path=f"out/{nxt}.txt", content="n\n"))
        asked["n"] += 1
        easy = [
            i["id"]
            for i in (request.ledger or {}).get("items", [])
            if i["id"] != "report" and i["status"] != "done"
        ]
        if asked["n"] % streak == 0 and easy:
            return say(
                "A quick one.", tool_call("write_file", path=f"out/{easy[0]}.txt", content="n")
            )
        return words("## Findings\n- " + "more " * 30, "length")

    return actor


async def test_cut_offs_relayed_by_items_on_the_side_end_at_the_total(
    store: Store, tmp_path: Path
) -> None:
    """Liar, rules 2 + 6: 39 cut-off rounds, then an easy item finished on the side,
    five times over. Its count starts again each time, but its rounds as the focus in
    all (less `SIDE_ROUNDS` for each item finished) reach 3 x the cap: blocked there,
    never done; the easy ones are done."""
    spec = _relay_spec(5)
    tid, result = await run_task(
        store, spec, tmp_path, ScriptedModel(policy=by_purpose(act=_cut_relay(CAP - 1)))
    )
    assert result.status == "waiting"
    note = await blocked_note(store, tid, "report")
    assert f"not finished in {TOTAL} rounds as the focus" in note, note
    led = await ledger_of(store, tid)
    finished = sum(led.item(f"n{k}").status == "done" for k in range(1, 6))
    assert await rounds_of(store, tid, "report") <= TOTAL + F.SIDE_ROUNDS * finished
    await assert_honest(store, tid, spec)


# --- 3. artifacts of one content ------------------------------------------------------


def _day_report(day: str, identical: bool) -> str:
    """The nightly report a real CI dashboard serves: weekend days ran nothing, and say
    so in the same words (the page names no date)."""
    if identical and day in ("saturday", "sunday"):
        return "nightly report: no runs scheduled\n" + "idle\n" * 200
    return f"nightly report for {day}: 5 of 5 stages ran\n" + f"{day} stage log line\n" * 80


class ReportServer(LocalServer):
    """A CI dashboard on 127.0.0.1: `GET /nightly/DAY` answers that day's report."""

    def __init__(self, identical: bool) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = _day_report(self.path.rsplit("/", 1)[-1], identical).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                pass

        self.serve(Handler)


_SERVED: dict[str, LocalServer] = {}


def _serving(make: Callable[[], LocalServer]) -> Callable[[Path], Any]:
    @contextmanager
    def serve(ws: Path) -> Iterator[LocalServer]:
        server = make()
        _SERVED[str(ws)] = server
        try:
            with server.running():
                yield server
        finally:
            del _SERVED[str(ws)]

    return serve


def _get(ws: Path, path: str) -> str:
    try:
        with urllib.request.urlopen(f"{_SERVED[str(ws)].url}{path}", timeout=10) as r:
            return str(r.read().decode())
    except urllib.error.HTTPError as exc:
        raise HTTPStatusError(exc.code, exc.read().decode()) from None


def _report_tools(ws: Path) -> list[Tool]:
    @tool(name="fetch_report", effect="read", description="GET one day's nightly report.")
    def fetch_report(day: str) -> str:
        return _get(ws, f"/nightly/{day}")

    return [fetch_report]


_WEEK = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


def _week_style(identical: bool) -> MoreStyle:
    return MoreStyle(
        f"week-of-reports-{'weekend' if identical else 'all-differ'}",
        "fetch the seven nightly reports of the week",
        lambda _ws: [
            {
                "id": "week",
                "title": "fetch the seven nightly reports of the week",
                "done_when": {"kind": "artifact", "name": "fetch_report output", "min_count": 7},
            }
        ],
        lambda _ws: PlanActor(
            [say(f"The {d} report.", call("fetch_report", day=d)) for d in _WEEK]
        ),
        tools=["read_file", "fetch_report"],
        extra_tools=_report_tools,
        serve=_serving(lambda: ReportServer(identical)),
    )


async def test_seven_different_reports_meet_the_rule(memory: MemoryStore, tmp_path: Path) -> None:
    style = _week_style(identical=False)
    outcome = await run_third(style, "rules", memory, tmp_path)
    await check_honest(memory, style, outcome, tmp_path)


async def test_a_week_with_two_identical_weekend_reports_meets_the_rule(
    memory: MemoryStore, tmp_path: Path
) -> None:
    style = _week_style(identical=True)
    outcome = await run_third(style, "rules", memory, tmp_path)
    assert outcome.blocks == (), outcome.blocks
    assert outcome.status == "satisfied", outcome.row()


class StampedServer(LocalServer):
    """A CI dashboard on 127.0.0.1 that stamps each page with the time it made it (as
    dashboards do): the same day's report differs byte for byte on every fetch."""

    def __init__(self) -> None:
        self.hits = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.hits += 1
                stamp = f"generated at 2026-12-07T19:{server.hits:02}:00Z (request {server.hits})\n"
                body = (stamp + _day_report(self.path.rsplit("/", 1)[-1], False)).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                pass

        self.serve(Handler)


def _monday_seven_times(_ws: Path) -> PlanActor:
    """Liar: Monday's report fetched seven times, called the week."""
    return PlanActor([say("The next day.", call("fetch_report", day="monday")) for _ in _WEEK])


async def test_one_stamped_report_seven_times_is_not_a_week(
    memory: MemoryStore, tmp_path: Path
) -> None:
    style = replace(
        _week_style(identical=False),
        name="monday-stamped-liar",
        actor=_monday_seven_times,
        serve=_serving(StampedServer),
    )
    outcome = await run_third(style, "rules", memory, tmp_path)
    assert outcome.status != "satisfied", outcome.row()


_SPEC_DOC = "The API spec, v2.\nThe cache holds 512 entries.\nEntries expire after 10 minutes.\n"
_RUNBOOK = "Ops runbook.\nThe cache holds 512 entries.\nRestart the node to clear it.\n"
_SHARED = "The cache holds 512 entries."


def _corroborator(_ws: Path) -> PlanActor:
    """Records the cache size once from each of two sources that say it in the same
    words, then a third claim: three claims, two of the same text."""
    snap = re.compile(r"cite snapshot artifact (\S+)")
    ev = re.compile(r"evidence artifact (\S+)")

    def quote(excerpt: str, line: int) -> Step:
        def step(request: ModelRequest) -> ModelResponse:
            found = [m for r in results_of(request) for m in snap.findall(r)]
            return say(
                "Quoting it.",
                call(
                    "record_evidence",
                    source_artifact=found[-1],
                    excerpt=excerpt,
                    location=f"line {line}",
                ),
            )

        return step

    def claim(text: str) -> Step:
        return lambda r: say(
            "Recording the claim.",
            call(
                "record_claim",
                text=text,
                evidence=[ev.findall(results_of(r)[-1])[-1]],
                topic="cache",
            ),
        )

    return PlanActor(
        [
            say("The spec.", call("read_source", source="spec")),
            quote(_SHARED, 2),
            claim(_SHARED),
            say("The runbook says it too?", call("read_source", source="runbook")),
            quote(_SHARED, 2),
            claim(_SHARED),
            say("The spec again, for expiry.", call("read_source", source="spec")),
            quote("Entries expire after 10 minutes.", 3),
            claim("Entries expire after 10 minutes."),
        ]
    )


CORROBORATED = MoreStyle(
    "corroborated-claims",
    "record three sourced claims about the cache",
    lambda _ws: [
        {
            "id": "claims",
            "title": "three claims about the cache, each quoting a source",
            "done_when": {
                "kind": "artifact",
                "artifact_kind": "claim",
                "name": "cache",
                "min_count": 3,
            },
        }
    ],
    _corroborator,
    files={"docs/spec.txt": _SPEC_DOC, "docs/runbook.txt": _RUNBOOK},
    tools=["read_source", "record_evidence", "record_claim", "list_files"],
    contract={
        "sources": [
            {"id": "spec", "kind": "document", "version": "v2", "location": "docs/spec.txt"},
            {"id": "runbook", "kind": "document", "version": "r7", "location": "docs/runbook.txt"},
        ]
    },
)


async def test_the_same_claim_from_two_sources_counts_twice(
    memory: MemoryStore, tmp_path: Path
) -> None:
    """Honest, rule 3: the same sentence claimed from two sources is two claims (a
    corroboration): a claim's content is its text and the evidence it cites, so the two
    are two blobs and meet min_count 3 with the third."""
    outcome = await run_third(CORROBORATED, "rules", memory, tmp_path)
    await check_honest(memory, CORROBORATED, outcome, tmp_path)
    claims = [a for a in await memory.get_artifacts(outcome.task_id) if a.kind == "claim"]
    assert len(claims) == 3 and len({a.blob_hash for a in claims}) == 3


# --- 4. fresh files put back ------------------------------------------------------------

_SETTINGS = "[pool]\nworkers = 8\ntimeout = 30\n"


def _restore_style(fresh: bool | None) -> MoreStyle:
    """A task that tries a setting, measures it, and restores the file as it was (the
    brief says so). `fresh`: the restore item's rule (None: left out, the default)."""

    def bench_tools(ws: Path) -> list[Tool]:
        @tool(name="bench", effect="read", description="Run the pool benchmark.")
        def bench() -> str:
            proc = subprocess.run(
                [sys.executable, "bench.py"], cwd=ws, capture_output=True, text=True, check=True
            )
            return proc.stdout.strip()

        return [bench]

    rule: dict[str, Any] = {"kind": "file", "path": "settings.ini", "contains": "workers = 8"}
    if fresh is not None:
        rule["fresh"] = fresh
    bench = (
        "import re\nw = int(re.search(r'workers = (\\d+)', open('settings.ini').read())[1])\n"
        "print(f'workers={w}: {1000 // w} ms')\n"
    )

    def actor(_ws: Path) -> PlanActor:
        def record(request: ModelRequest) -> ModelResponse:
            ms = [m.content for m in request.messages if m.role == "tool"][-1]
            return say("Noting it.", call("write_file", path="out/bench.md", content=ms + "\n"))

        return PlanActor(
            [
                say(
                    "Trying 16 workers.",
                    call("write_file", path="settings.ini", content=_SETTINGS.replace("8", "16")),
                ),
                say("Benchmark.", call("bench")),
                record,
                say(
                    "Restoring the settings as they were.",
                    call("write_file", path="settings.ini", content=_SETTINGS),
                ),
            ]
        )

    return MoreStyle(
        f"restore-{fresh}",
        "measure 16 workers, then leave settings.ini as it was",
        lambda _ws: [
            file_item("bench", "out/bench.md", "workers=16"),
            {"id": "restore", "title": "restore settings.ini", "done_when": rule},
        ],
        actor,
        files={"settings.ini": _SETTINGS, "bench.py": bench},
        tools=[
            "read_file",
            {"name": "write_file", "approval": False},
            "bench",
        ],
        extra_tools=bench_tools,
    )


async def test_a_restore_the_contract_says_is_not_fresh_finishes(
    memory: MemoryStore, tmp_path: Path
) -> None:
    """Honest, rule 4: the deliverable is the file as it was before the task; the
    contract says so (`fresh: false`), so no hash from before is kept to refuse it."""
    style = _restore_style(False)
    outcome = await run_third(style, "rules", memory, tmp_path)
    await check_honest(memory, style, outcome, tmp_path)
    assert (tmp_path / "settings.ini").read_text() == _SETTINGS


async def test_a_restore_under_a_fresh_rule_is_never_accepted(
    memory: MemoryStore, tmp_path: Path
) -> None:
    """The same task with the rule's default (`fresh: true`): 'differs from the file
    before the task' cannot hold for a restore, so the item is never done (a contract
    error, refused from the start as before today; nothing reopened)."""
    style = _restore_style(None)
    outcome = await run_third(style, "rules", memory, tmp_path)
    assert outcome.status != "satisfied"
    assert outcome.statuses["bench"] == "done" and outcome.statuses["restore"] != "done"
    assert await reopened(memory, outcome.task_id) == []


_OLD_REPORT = "# Q3 report\n\n## Findings\n- last quarter's numbers\n"
_NEW_REPORT = "# Q4 report\n\n## Findings\n- this quarter's numbers\n"


def _undo_redo(_ws: Path) -> PlanActor:
    """Writes this quarter's report (accepted), then, working on the next item, restores
    last quarter's from its own backup to compare the two, and writes this quarter's
    back before its notes."""
    rep = "out/report.md"
    return PlanActor(
        [
            say("The report.", call("write_file", path=rep, content=_NEW_REPORT)),
            say(
                "Backing up mine, restoring the old one to compare.",
                call("write_file", path="tmp/mine.md", content=_NEW_REPORT),
                call("write_file", path=rep, content=_OLD_REPORT),
            ),
            say("Compared. Mine back.", call("write_file", path=rep, content=_NEW_REPORT)),
            say("Notes.", call("write_file", path="out/notes.md", content="Q3 vs Q4 compared\n")),
        ]
    )


UNDO_REDO = MoreStyle(
    "undo-redo",
    "write this quarter's report, then notes comparing it with last quarter's",
    lambda _ws: [
        file_item("report", "out/report.md", "## Findings"),
        file_item("notes", "out/notes.md", "compared"),
    ],
    _undo_redo,
    files={"out/report.md": _OLD_REPORT},
    tools=["read_file", "list_files", {"name": "write_file", "approval": False}],
)


async def test_a_report_put_back_for_a_moment_and_rewritten_is_delivered(
    store: Store, tmp_path: Path
) -> None:
    """Honest, rule 4: last quarter's report is in place for one round (to compare), then
    this quarter's again; delivered with this quarter's."""
    outcome = await run_third(UNDO_REDO, "rules", store, tmp_path)
    assert outcome.status == "satisfied", outcome.row()
    assert (tmp_path / "out" / "report.md").read_text() == _NEW_REPORT
    await assert_honest(store, outcome.task_id, UNDO_REDO.spec(tmp_path))
    # Not even reopened: the deliverables are checked at delivery, not every round.
    assert await reopened(store, outcome.task_id) == []


# --- 5. a "not now" heard for the first time ------------------------------------------


class OutageServer(LocalServer):
    """A job service on 127.0.0.1 in a short outage: its first `down` requests answer
    503, then `GET /jobs/NAME` answers the finished job's JSON."""

    def __init__(self, down: int) -> None:
        self.down = down
        self.hits = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.hits += 1
                if server.hits <= server.down:
                    body, code = b"Service Unavailable: failing over", 503
                else:
                    name = self.path.rsplit("/", 1)[-1]
                    rows = int(name[1:]) * 10
                    body, code = (
                        json.dumps({"job": name, "state": "finished", "rows": rows}).encode(),
                        200,
                    )
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                pass

        self.serve(Handler)


def _status_tools(ws: Path) -> list[Tool]:
    @tool(
        name="job_status",
        effect="read",
        volatile=True,
        retry=FAST,
        description="GET a job's status from the job service.",
    )
    def job_status(job: str) -> str:
        return _get(ws, f"/jobs/{job}")

    return [job_status]


_JOBS = tuple(f"j{k}" for k in range(1, 11))


class SweepActor(PlanActor):
    """Checks ten jobs, one a round; a job the service could not answer ('not now')
    goes to the back of the queue, and the next one is asked meanwhile. With every
    job's rows, writes the summary."""

    def __init__(self) -> None:
        super().__init__([])
        self.queue = list(_JOBS)
        self.rows: dict[str, int] = {}
        self.asked: str | None = None

    def __call__(self, request: ModelRequest) -> ModelResponse:
        self.rounds += 1
        results = [m.content for m in request.messages if m.role == "tool"]
        if self.asked is not None and results:
            if '"state": "finished"' in results[-1]:
                self.rows[self.asked] = int(json.loads(results[-1])["rows"])
            else:
                self.queue.append(self.asked)  # not now: asked again after the others
            self.asked = None
        if self.queue:
            self.asked = self.queue.pop(0)
            return say(f"Status of {self.asked}.", call("job_status", job=self.asked))
        if len(self.rows) == len(_JOBS):
            text = "".join(f"{j}: {self.rows[j]} rows\n" for j in _JOBS)
            self.rows = {}
            return say("All ten.", call("write_file", path="out/jobs.md", content=text))
        return words("The summary is written.")


def _sweep_style(down_calls: int) -> MoreStyle:
    return MoreStyle(
        f"sweep-through-outage-{down_calls}",
        "note the rows of the ten nightly jobs",
        lambda _ws: [file_item("jobs", "out/jobs.md", "j10: 100 rows")],
        lambda _ws: SweepActor(),
        tools=[*FILES, "job_status"],
        extra_tools=_status_tools,
        serve=_serving(lambda: OutageServer(down_calls * ATTEMPTS)),
    )


@pytest.mark.parametrize("down_calls", [1, 4, 7])
async def test_a_sweep_of_jobs_through_a_short_outage_finishes(
    memory: MemoryStore, tmp_path: Path, down_calls: int
) -> None:
    """Honest, rule 5: ten different jobs, one a round, through an outage of up to 7
    calls (each a 'not now' heard for the first time: a wall, then fresh failures, then
    two rounds without progress); the service is back, every job answers, the summary
    is written."""
    style = _sweep_style(down_calls)
    outcome = await run_third(style, "rules", memory, tmp_path)
    await check_finished(memory, outcome, tmp_path, style)
    assert outcome.rounds == len(_JOBS) + down_calls + 1
    assert (tmp_path / "out" / "jobs.md").read_text().endswith("j10: 100 rows\n")


async def test_a_sweep_of_jobs_through_an_eight_call_outage_finishes(
    memory: MemoryStore, tmp_path: Path
) -> None:
    style = _sweep_style(8)
    outcome = await run_third(style, "rules", memory, tmp_path)
    await check_finished(memory, outcome, tmp_path, style)


_BUILD = """\
import pathlib, time

def wait(name):
    while not pathlib.Path(name).exists():
        time.sleep(0.005)

log = pathlib.Path("logs/build.log")
wait("go1")
log.parent.mkdir(exist_ok=True)
with log.open("a", buffering=1) as f:
    f.write("step 1/3 compiling 48 units\\n")
    wait("go2")
    f.write("step 2/3 linking app\\n")
    wait("go3")
    pathlib.Path("out").mkdir(exist_ok=True)
    pathlib.Path("out/app.bin").write_text("BIN")
    f.write("step 3/3 BUILD OK out/app.bin\\n")
"""
_BUILDS: dict[str, subprocess.Popen[bytes]] = {}


def _build_tools(ws: Path) -> list[Tool]:
    @tool(name="start_build", effect="write", description="Start the build in the background.")
    def start_build(target: str) -> str:
        _BUILDS[str(ws)] = subprocess.Popen([sys.executable, "build.py"], cwd=ws)
        return f"build of {target} started; it logs to logs/build.log"

    return [start_build]


def _log_text(ws: Path) -> str:
    p = ws / "logs" / "build.log"
    return p.read_text() if p.exists() else ""


def _tail_actor(ws: Path) -> PlanActor:
    """Starts the build, reads its log before it exists (twice: 'no such file'), then
    tails it with a growing offset as the build writes it (once with nothing new), and
    records the result."""
    log = "logs/build.log"

    def after(go: str, line: str, offset: Callable[[], int]) -> Step:
        def step(_request: ModelRequest) -> ModelResponse:
            (ws / go).touch()  # time passes: the build goes on
            wait_for(lambda: line in _log_text(ws))
            return say("Tailing.", call("read_file", path=log, offset=offset()))

        return step

    def line_end(k: int) -> Callable[[], int]:
        return lambda: sum(len(x) + 1 for x in _log_text(ws).splitlines()[:k])

    def tail(text: str, offset: Callable[[], int]) -> Step:
        return lambda _request: say(text, call("read_file", path=log, offset=offset()))

    return PlanActor(
        [
            say("Starting the build.", call("start_build", target="app")),
            say("Its log?", call("read_file", path=log)),
            say("Not there yet. Again.", call("read_file", path=log)),
            after("go1", "step 1/3", lambda: 0),
            after("go2", "step 2/3", line_end(1)),
            tail("Anything after linking?", line_end(2)),
            tail("Nothing new yet. Again.", line_end(2)),
            after("go3", "BUILD OK", line_end(2)),
            say(
                "Recording it.",
                call("write_file", path="out/build.md", content="step 3/3 BUILD OK out/app.bin\n"),
            ),
        ]
    )


TAIL = MoreStyle(
    "tail-growing-log",
    "build the app and record the build's result",
    lambda _ws: [file_item("build", "out/build.md", "BUILD OK")],
    _tail_actor,
    files={"build.py": _BUILD},
    tools=[*FILES, "start_build"],
    extra_tools=_build_tools,
)


@pytest.mark.parametrize("judge", ["rules", "literal"])
async def test_a_log_tailed_while_the_build_writes_it_finishes(
    store: Store, tmp_path: Path, judge: str
) -> None:
    try:
        outcome = await run_third(TAIL, judge, store, tmp_path)
    finally:
        proc = _BUILDS.pop(str(tmp_path), None)
        if proc is not None:
            for go in ("go1", "go2", "go3"):
                (tmp_path / go).touch()
            assert proc.wait(timeout=30) == 0
    await check_honest(store, TAIL, outcome, tmp_path)
    fails = [
        e for e in await events_of(store, outcome.task_id, "op.result") if e["status"] == "failed"
    ]
    assert [f["error"] for f in fails] == ["no such file: logs/build.log"] * 2


# --- 6. rounds as the focus in all ----------------------------------------------------

_PARSE = "def parse(line):\n    return line.split(',')\n"
_PARSE_FIXED = "def parse(line):\n    return [f.strip() for f in line.split(',')]\n"
_PARSE_CHECK = """\
import parse

got = parse.parse("a, b ,c")
assert got == ["a", "b", "c"], f"parse gave {got!r}"
print("ok")
"""
OTHERS = 59


def _checklist_actor(read_first: bool) -> Callable[[Path], PlanActor]:
    """A 60-item checklist taken in the agent's own order: the hard first item (a parser
    fix) last, the 59 easy ones before it, each read (`read_first`) and written."""

    def actor(_ws: Path) -> PlanActor:
        steps: list[Step | ModelResponse] = []
        for k in range(1, OTHERS + 1):
            if read_first:
                steps.append(say(f"Input {k}.", call("read_file", path=f"in/c{k:02}.txt")))
            steps.append(
                say(
                    f"Output {k}.",
                    call("write_file", path=f"out/c{k:02}.txt", content=f"value {k * 7}\n"),
                )
            )
        steps += [
            say("Now the hard one: the check.", call("run_check")),
            say("The parser.", call("read_file", path="parse.py")),
            say("Stripping the fields.", call("write_file", path="parse.py", content=_PARSE_FIXED)),
        ]
        return PlanActor(steps)

    return actor


def _checklist_style(read_first: bool) -> MoreStyle:
    return MoreStyle(
        f"sixty-hard-last-{'read-write' if read_first else 'write'}",
        "fix the parser and convert the 59 inputs",
        lambda _ws: [
            command_item("hard", "make check_parse.py pass", f"{PY} check_parse.py"),
            *[
                file_item(f"c{k:02}", f"out/c{k:02}.txt", f"value {k * 7}")
                for k in range(1, OTHERS + 1)
            ],
        ],
        _checklist_actor(read_first),
        files={
            "parse.py": _PARSE,
            "check_parse.py": _PARSE_CHECK,
            **{f"in/c{k:02}.txt": f"value {k * 7}\n" for k in range(1, OTHERS + 1)},
        },
        tools=["read_file", "list_files", {"name": "write_file", "approval": False}, "run_check"],
        extra_tools=check_tool("check_parse.py", "run_check"),
    )


async def test_sixty_items_with_the_hard_one_last_in_one_round_each(
    memory: MemoryStore, tmp_path: Path
) -> None:
    """Honest, rule 6: the hard first item is the focus of all 62 rounds (59 finishing
    other items, then its own 3): under 3 x the cap, delivered."""
    style = _checklist_style(read_first=False)
    outcome = await run_third(style, "rules", memory, tmp_path)
    await check_honest(memory, style, outcome, tmp_path)


async def test_sixty_items_read_then_written_with_the_hard_one_last(
    memory: MemoryStore, tmp_path: Path
) -> None:
    style = _checklist_style(read_first=True)
    outcome = await run_third(style, "rules", memory, tmp_path)
    await check_honest(memory, style, outcome, tmp_path)


# --- 4, liar side: last year's report, one byte changed -----------------------------


def _report_only(_ws: Path) -> list[dict[str, Any]]:
    return [file_item("report", "out/report.md", "## Findings")]


def _stale_plus(extra: str) -> Callable[[Path], PlanActor]:
    """Liar: 'writes' the report by writing last quarter's back with `extra` appended."""
    return lambda _ws: PlanActor(
        [say("The report.", call("write_file", path="out/report.md", content=_OLD_REPORT + extra))]
    )


@pytest.mark.xfail(
    strict=True,
    reason="rule 4's class: rules._RuleCheck.file's `fresh` compares the file's sha256 with "
    "the one before the task (and artifacts.BEFORE_KEY the same after acceptance); last "
    "quarter's report with one newline added differs byte for byte, is accepted as fresh "
    "and delivered",
)
async def test_last_quarters_report_with_a_newline_added_is_not_fresh(
    store: Store, tmp_path: Path
) -> None:
    style = replace(
        UNDO_REDO, name="stale-plus-newline", items=_report_only, actor=_stale_plus("\n")
    )
    outcome = await run_third(style, "rules", store, tmp_path)
    assert outcome.status != "satisfied", outcome.row()


async def test_last_quarters_report_written_back_as_it_was_is_never_done(
    store: Store, tmp_path: Path
) -> None:
    """Guard: byte for byte last quarter's report is refused (no progress, blocked)."""
    style = replace(UNDO_REDO, name="stale-as-it-was", items=_report_only, actor=_stale_plus(""))
    outcome = await run_third(style, "rules", store, tmp_path)
    assert outcome.status != "satisfied" and outcome.statuses["report"] == "blocked"
