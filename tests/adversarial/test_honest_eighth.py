"""An eighth set of honest agents at default limits (`_honest_eighth.STYLES`), every one
talking through the real Anthropic adapter to a local server that speaks the Messages
API and refuses, with the real API's 400, any request the real API would refuse.

The shapes: text around two `tool_use` blocks; extended thinking before the text; a
`NEED_HELP:` question as the second text block; a `max_tokens` cut mid-text and then
mid-`tool_use`; three parallel `toolu_` calls to a local HTTP service; a `refusal` once;
a citations-style answer split into text blocks mid-sentence; a long investigation with
cache figures on every answer; a `pause_turn`; a compaction mid-item whose summary is
asked over the same wire; a `<thinking>` tag in the text.

Each must end `satisfied`, never blocked, in its planned rounds, with every deliverable
really there and the mess really met, under the rules alone, the literal LLM judge and a
silent one, and every request it made one the real API takes. Two were findings when
written, both fixed: extended thinking in a tool loop (thinking blocks were dropped, so
the second request broke the API's rule that the last assistant turn of a tool loop
opens with its thinking block: a 400), and a `NEED_HELP:` question in a text block of its
own (text blocks were joined with nothing, so the question did not start its line).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.adversarial._honest import JUDGES
from tests.adversarial._honest_eighth import (
    CITED,
    SNAPSHOT,
    STYLES,
    WIRE_LOG,
    check_eighth,
    liar_of,
    message,
    text,
    turn,
    use,
    wire_of,
    wire_problems,
)
from tests.adversarial._honest_more import check_liar, default_limits
from tests.adversarial._honest_third import run_third
from tests.support.fake_provider import Seen, model_request
from tether.models.anthropic import parse_anthropic_response
from tether.runtime.round.phases import asks_for_help
from tether.store.memory import MemoryStore
from tether.store.sqlite import SQLiteStore


@pytest.fixture
async def memory() -> MemoryStore:
    return await MemoryStore.open()


@pytest.fixture
async def sqlite(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SQLiteStore]:
    store = await SQLiteStore.open(tmp_path_factory.mktemp("store") / "honest-eighth.db")
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture(autouse=True)
def _no_wire_log_left(tmp_path: Path) -> object:
    yield
    WIRE_LOG.pop(str(tmp_path), None)


@pytest.mark.parametrize(
    ("style", "judge"),
    [(s, j) for s in STYLES for j in JUDGES],
)
async def test_an_eighth_honest_shape_is_never_blocked(
    memory: MemoryStore, tmp_path: Path, style: str, judge: str
) -> None:
    outcome = await run_third(STYLES[style], judge, memory, tmp_path)
    await check_eighth(memory, STYLES[style], outcome, tmp_path)


@pytest.mark.parametrize(
    ("style", "judge"),
    [
        ("text-around-two-reads", "literal"),
        ("thinking-before-text", "silent"),
        ("max-tokens-text-then-tool-use", "rules"),
        ("parallel-tool-use-http", "silent"),
        ("refusal-then-work", "literal"),
        ("long-investigation-cached", "rules"),
        ("compaction-over-the-wire", "literal"),
    ],
)
async def test_an_eighth_honest_shape_on_sqlite(
    sqlite: SQLiteStore, tmp_path: Path, style: str, judge: str
) -> None:
    outcome = await run_third(STYLES[style], judge, sqlite, tmp_path)
    await check_eighth(sqlite, STYLES[style], outcome, tmp_path)


# --- what went over the wire, shown -----------------------------------------------------


@pytest.mark.parametrize(
    ("style", "ids"),
    [
        ("text-around-two-reads", ["toolu_01A9xQbase", "toolu_01B7yRprod"]),
        ("parallel-tool-use-http", ["toolu_01HlthApi", "toolu_01HlthWeb", "toolu_01HlthJobs"]),
    ],
)
async def test_tool_results_go_back_under_their_toolu_ids(
    memory: MemoryStore, tmp_path: Path, style: str, ids: list[str]
) -> None:
    """The second request answers the first one's `tool_use` blocks in one user message,
    `tool_result` blocks first, in the order asked, each under its `toolu_` id; the
    answer's words and both calls went back as one assistant message."""
    outcome = await run_third(STYLES[style], "rules", memory, tmp_path)
    await check_eighth(memory, STYLES[style], outcome, tmp_path)
    first, second = (e.seen.body for e in wire_of(tmp_path)[:2])
    assert first["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert all(m["role"] != "system" for m in second["messages"])
    asked, answered = second["messages"][-2:]
    assert [b["type"] for b in asked["content"]] == ["text"] + ["tool_use"] * len(ids)
    assert [b["id"] for b in asked["content"][1:]] == ids
    kinds = [b["type"] for b in answered["content"]]
    assert kinds == ["tool_result"] * len(ids) + ["text"]
    assert [b["tool_use_id"] for b in answered["content"][: len(ids)]] == ids


async def test_cache_figures_are_added_back_into_the_prompt(
    memory: MemoryStore, tmp_path: Path
) -> None:
    """Each act call's recorded usage is the server's: the whole prompt (input plus
    cache read plus cache written), the cached part apart, the first call writing the
    cache and every later one reading it."""
    style = STYLES["long-investigation-cached"]
    outcome = await run_third(style, "rules", memory, tmp_path)
    await check_eighth(memory, style, outcome, tmp_path)
    sent = [e.answer["usage"] for e in wire_of(tmp_path)]
    calls = [
        e.data
        for e in await memory.read_events(outcome.task_id, types={"model.called"})
        if e.data["purpose"] == "act"
    ]
    assert len(calls) == len(sent) == 10
    for got, u in zip(calls, sent, strict=True):
        whole = u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
        assert got["input_tokens"] == whole
        assert got["cached_tokens"] == u["cache_read_input_tokens"]
        assert got["cache_write_tokens"] == u["cache_creation_input_tokens"]
        assert got["output_tokens"] == u["output_tokens"]
    assert sent[0]["cache_read_input_tokens"] == 0 < sent[0]["cache_creation_input_tokens"]
    assert all(u["cache_read_input_tokens"] > 0 for u in sent[1:])


async def test_a_sentence_split_into_cited_blocks_goes_back_whole(
    memory: MemoryStore, tmp_path: Path
) -> None:
    """Five text blocks, two of them cited, are one sentence: the runtime keeps it whole,
    as the answer's text."""
    style = STYLES["citations-split-text"]
    outcome = await run_third(style, "rules", memory, tmp_path)
    await check_eighth(memory, style, outcome, tmp_path)
    calls = await memory.read_events(outcome.task_id, types={"model.called"})
    said = [c.data["response"]["text"] for c in calls if c.data["purpose"] == "act"]
    assert said == ["The brief.", CITED]
    assert len(wire_of(tmp_path)[-1].answer["content"]) == 6


async def test_a_cut_tool_use_goes_back_as_an_object_and_is_told(
    memory: MemoryStore, tmp_path: Path
) -> None:
    """The `tool_use` the output limit cut (its input partial JSON text) goes back with
    an object input, as the API requires, and its `tool_result` says it was cut off."""
    style = STYLES["max-tokens-text-then-tool-use"]
    outcome = await run_third(style, "rules", memory, tmp_path)
    await check_eighth(memory, style, outcome, tmp_path)
    msgs = wire_of(tmp_path)[-1].seen.body["messages"]
    cut = [b for m in msgs for b in m["content"] if b.get("id") == "toolu_01CutAppnd0"]
    assert cut and cut[0]["input"] == {}
    told = [
        b["content"]
        for m in msgs
        for b in m["content"]
        if b.get("tool_use_id") == "toolu_01CutAppnd0"
    ]
    assert told and "cut off by the output token limit" in told[0]


async def test_thinking_goes_back_verbatim_and_is_never_judged(
    memory: MemoryStore, tmp_path: Path
) -> None:
    """With extended thinking on, each answer's `thinking` (and `redacted_thinking`)
    blocks go back first in its assistant message, as sent (signature and all), and the
    runtime never reads them as words: the thinking muses on a `NEED_HELP:` line, yet the
    recorded texts are the text blocks alone and no person is asked."""
    style = STYLES["thinking-before-text"]
    outcome = await run_third(style, "rules", memory, tmp_path)
    await check_eighth(memory, style, outcome, tmp_path)
    log = wire_of(tmp_path)
    assert all(e.seen.body["thinking"]["type"] == "enabled" for e in log)
    first, second = log[0].answer["content"], log[1].answer["content"]
    replayed = log[1].seen.body["messages"][-2]
    assert replayed["role"] == "assistant"
    assert replayed["content"][0] == first[0]
    assert [b["type"] for b in replayed["content"]] == ["thinking", "text", "tool_use"]
    assert second[0]["type"] == "thinking" and second[1]["type"] == "redacted_thinking"
    events = await memory.read_events(outcome.task_id)
    said = [e.data["response"]["text"] for e in events if e.type == "model.called"]
    assert said == ["Let me look at the conversion.", "The offset is missing. Adding it."]
    waits = [e.data for e in events if e.type == "task.status" and e.data["dst"] == "waiting"]
    assert waits == []


def test_a_need_help_text_block_asks_for_help() -> None:
    """An answer of two text blocks, the second `NEED_HELP: ...`: separate passages, the
    question starts its line (found by this set: they were joined with nothing)."""
    body = message(
        turn(
            text("The brief names the app but not the config format."),
            text("NEED_HELP: should the config be YAML or TOML?"),
        ),
        {},
        0,
    )
    resp = parse_anthropic_response(body, model_request())
    assert asks_for_help(resp.text) is not None, resp.text


async def test_a_refusal_goes_back_as_a_turn_and_the_work_goes_on(
    memory: MemoryStore, tmp_path: Path
) -> None:
    """A `refusal` with no content goes back as a non-empty assistant turn (the API
    refuses an empty one) and the work goes on; its stop reason is on the record."""
    style = STYLES["refusal-then-work"]
    outcome = await run_third(style, "literal", memory, tmp_path)
    await check_eighth(memory, style, outcome, tmp_path)
    second = wire_of(tmp_path)[1].seen.body["messages"]
    assert second[1]["role"] == "assistant" and second[1]["content"][0]["text"].strip()
    calls = await memory.read_events(outcome.task_id, types={"model.called"})
    finishes = [c.data["response"]["finish_reason"] for c in calls if c.data["purpose"] == "act"]
    assert finishes == ["refusal", "tool_use", "tool_use"], finishes


# --- liars ------------------------------------------------------------------------------


@pytest.mark.parametrize("judge", ["claiming", "rules"])
@pytest.mark.parametrize("style", list(STYLES))
async def test_a_liar_of_each_eighth_shape_never_finishes(
    memory: MemoryStore, tmp_path: Path, style: str, judge: str
) -> None:
    """The same answers over the same wire without the one that does the work, then "All
    done": never `satisfied`, and every request still one the real API takes."""
    liar = liar_of(STYLES[style])
    outcome = await run_third(liar, judge, memory, tmp_path)
    await check_liar(memory, liar, outcome, tmp_path)
    assert [p for e in wire_of(tmp_path) for p in e.problems] == []


@pytest.mark.parametrize("style", ["text-around-two-reads", "max-tokens-text-then-tool-use"])
async def test_a_liar_of_an_eighth_shape_never_finishes_on_sqlite(
    sqlite: SQLiteStore, tmp_path: Path, style: str
) -> None:
    liar = liar_of(STYLES[style])
    outcome = await run_third(liar, "claiming", sqlite, tmp_path)
    await check_liar(sqlite, liar, outcome, tmp_path)


# --- the harness itself ---------------------------------------------------------------


def _seen(body: dict[str, object]) -> Seen:
    return Seen("POST", "/v1/messages", {"anthropic-version": "2023-06-01"}, body)


def test_the_server_refuses_what_the_real_api_refuses() -> None:
    """The rules checked are real rules: a well formed request passes, and each break
    is named."""
    call = use("toolu_1", "read_file", path="a")
    ok = {
        "model": "m",
        "max_tokens": 10,
        "system": [{"type": "text", "text": "be careful"}],
        "messages": [
            {"role": "user", "content": [text("go")]},
            {"role": "assistant", "content": [text("reading"), call]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]},
        ],
    }
    assert wire_problems(_seen(ok)) == []
    broken = {
        "model": "m",
        "max_tokens": 10,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [
            {"role": "system", "content": "be careful"},
            {"role": "user", "content": [text(" \n")]},
            {"role": "user", "content": [text("go")]},
            {"role": "assistant", "content": [text("a"), call, use("toolu 2", "x")]},
            {
                "role": "user",
                "content": [text("next"), {"type": "tool_result", "tool_use_id": "toolu_9"}],
            },
        ],
    }
    found = "\n".join(wire_problems(_seen(broken)))
    for rule in (
        "first message must use the `user` role",
        "Input should be 'user' or 'assistant'",
        "non-whitespace text",
        "roles must alternate",
        "should match pattern",
        "`tool_result` blocks must come first",
        "unexpected `tool_use_id`",
        "without `tool_result` blocks immediately after",
        "must be >= 1024 and less than max_tokens",
        "Expected `thinking` or `redacted_thinking`",
    ):
        assert rule in found, rule


def test_every_eighth_shape_has_rules_and_default_limits() -> None:
    assert 10 <= len(STYLES) <= 14
    for style in STYLES.values():
        items = style.items(Path("/nonexistent"))
        assert items and all(i.get("done_when") for i in items), style.name
        spec = style.spec(Path("/nonexistent"))
        assert spec.limits == default_limits(spec), style.name
    assert SNAPSHOT.startswith("claude-")


def test_text_split_around_citations_is_one_passage() -> None:
    """Text blocks the API split around their citations join as they came (one
    sentence); blocks without citations are separate passages, a line apart."""
    cite = [{"type": "char_location", "cited_text": "x", "document_index": 0}]
    body = message(
        turn(
            {"type": "text", "text": "The report says "},
            {"type": "text", "text": "revenue rose 4%", "citations": cite},
            {"type": "text", "text": " in May."},
        ),
        {},
        0,
    )
    assert parse_anthropic_response(body, model_request()).text == (
        "The report says revenue rose 4% in May."
    )
    two = message(turn(text("First."), text("Second.")), {}, 0)
    assert parse_anthropic_response(two, model_request()).text == "First.\nSecond."
