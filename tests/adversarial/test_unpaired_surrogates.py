"""Text with unpaired UTF-16 surrogates, as a JSON document's escapes make it (`"\\ud800"`
decodes to a lone surrogate, which no UTF-8 encoder, hence no database, takes): from the
model's text and tool arguments, the judge and the compressor, a tool's result, its
error and its reconcile note. The run goes on, on every store; what is stored and shown
has U+FFFD where a lone surrogate was, and a surrogate pair split in two code points is
the character it stands for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.adversarial import (
    act_requests,
    all_text,
    assert_honest,
    assert_status_agrees,
    contract,
    first_then,
    op_rule_items,
    say,
    statuses,
    write,
)
from tests.support.loop import run_task
from tether import Reconciliation, ToolContext, ToolRegistry, tool
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.store.base import Store
from tether.text import clean_data, clean_text

#: A high surrogate alone, a low one alone, and a pair written as two code points
#: (U+1F600, as `json.loads('"\\ud83d\\ude00"')` would not make it but `"\ud83d\ude00"` does).
ODD = "hi\ud800 lo\udc80 pair\ud83d\ude00 end\udbff"
CLEAN = "hi\ufffd lo\ufffd pair\U0001f600 end\ufffd"


def _encodable(value: Any) -> None:
    """Every string in `value` (keys too) encodes as UTF-8."""
    json.dumps(value, ensure_ascii=False).encode("utf-8")


def test_clean_text_replaces_lone_surrogates_and_joins_split_pairs() -> None:
    assert clean_text(ODD) == CLEAN
    plain = "plain ascii and é and \U0001f600"
    assert clean_text(plain) is plain  # nothing to clean: the same object
    assert clean_text("\udc80\ud800") == "\ufffd\ufffd"  # low before high is no pair


def test_clean_data_walks_keys_values_and_sequences() -> None:
    value = {"k\ud800": [ODD, ("t\udc80", 1, None, 2.5)], "ok": {"n": True}}
    assert clean_data(value) == {
        "k\ufffd": [CLEAN, ("t\ufffd", 1, None, 2.5)],
        "ok": {"n": True},
    }
    clean = {"a": ["b", 1], "c": {"d": "e"}}
    assert clean_data(clean) is clean  # nothing to clean: the same object


async def test_the_models_text_and_arguments_never_stop_a_run(store: Store, tmp_path: Path) -> None:
    spec = contract(op_rule_items("a", "b"), limits={"max_rounds": 6})
    actor = first_then(
        say(
            "DONE" + ODD,
            tool_call("list_files", path=ODD),
            tool_call("read_file", **{"path\udc80": "x"}),
            write("a", "a" + ODD + "\n"),
        ),
        say("b" + ODD, write("b")),
    )

    def judge(request: ModelRequest) -> str:
        return json.dumps({"changes": [], "next": "continue", "note": ODD}, ensure_ascii=False)

    tid, res = await run_task(
        store, spec, tmp_path, ScriptedModel(policy=actor), judge=ScriptedModel(policy=judge)
    )
    assert res.status == "satisfied", res
    assert await statuses(store, tid) == {"a": "done", "b": "done"}
    assert (tmp_path / "out" / "a.txt").read_text() == "a" + CLEAN + "\n"
    events = await store.read_events(tid)
    for e in events:
        _encodable(e.data)
    called = [e.data for e in events if e.type == "model.called"]
    assert any(CLEAN in json.dumps(d, ensure_ascii=False) for d in called)
    ops = await store.get_ops(tid)
    assert any(o.args.get("path") == CLEAN for o in ops)
    await assert_honest(store, tid, spec)
    await assert_status_agrees(store, tid)


async def test_a_tools_result_error_and_reconcile_note_never_stop_a_run(
    store: Store, tmp_path: Path
) -> None:
    async def reconcile(op: Any, ctx: ToolContext) -> Reconciliation:
        return Reconciliation("not_done", "looked" + ODD)

    @tool(effect="read")
    def odd_text(n: int) -> str:
        """Text with lone surrogates."""
        return f"page {n} " + ODD

    @tool(effect="read")
    def odd_doc(n: int) -> dict[str, Any]:
        """A document with lone surrogates in keys and values."""
        return {"k\ud800": [ODD, {"n": n}]}

    @tool(effect="write", reconcile=reconcile)
    def odd_failure(n: int) -> str:
        """Fails with lone surrogates in its message."""
        raise ValueError("bad input" + ODD)

    spec = contract(
        [{"id": "a", "title": "read odd pages"}],
        tools=["odd_text", "odd_doc", "odd_failure"],
        models={"judge": "rules"},
        limits={"max_rounds": 4, "no_progress_rounds": 100, "max_attempts_per_item": 100},
    )
    rounds = 0

    def actor(request: ModelRequest) -> ModelResponse:
        nonlocal rounds
        rounds += 1
        return say(
            f"round {rounds}",
            tool_call("odd_text", n=rounds),
            tool_call("odd_doc", n=rounds),
            tool_call("odd_failure", n=rounds),
        )

    model = ScriptedModel(policy=actor)
    tid, res = await run_task(
        store, spec, tmp_path, model, registry=ToolRegistry([odd_text, odd_doc, odd_failure])
    )
    assert res.status == "waiting" and _stopped_at_max_rounds(res.waiting), res
    assert rounds == 4
    for e in await store.read_events(tid):
        _encodable(e.data)
    ops = await store.get_ops(tid)
    texts = [o.result["content"] for o in ops if o.tool == "odd_text" and o.result]
    assert texts and all(t.endswith(CLEAN) for t in texts)
    docs = [o.result["content"] for o in ops if o.tool == "odd_doc" and o.result]
    assert docs and all(json.loads(d)["k\ufffd"][0] == CLEAN for d in docs)
    errors = [o.error for o in ops if o.tool == "odd_failure"]
    assert errors and all(e and CLEAN in json.dumps(e, ensure_ascii=False) for e in errors)
    for o in ops:
        _encodable([o.args, o.result, o.error])
    # What the model read back of the results: the cleaned text.
    last = act_requests(model)[-1]
    seen = all_text(last)
    seen.encode("utf-8")
    assert CLEAN in seen


async def test_a_summary_with_lone_surrogates_is_stored_clean(store: Store, tmp_path: Path) -> None:
    spec = contract(
        [{"id": "a", "title": "read"}],
        tools=["list_files"],
        models={"judge": "rules"},
        context={"input_budget_tokens": 2000, "preview_chars": 4000},
        limits={"max_rounds": 8, "no_progress_rounds": 100, "max_attempts_per_item": 100},
    )
    (tmp_path / ("f" * 200)).write_text("x")

    def actor(request: ModelRequest) -> ModelResponse:
        return say("listing " + "y" * 1500, tool_call("list_files", path="."))

    def compact(request: ModelRequest) -> str:
        return "summary" + ODD

    tid, res = await run_task(
        store,
        spec,
        tmp_path,
        ScriptedModel(policy=actor),
        compact=ScriptedModel(policy=compact),
    )
    assert res.status == "waiting" and _stopped_at_max_rounds(res.waiting), res
    events = await store.read_events(tid)
    for e in events:
        _encodable(e.data)
    assert any(e.type == "context.compacted" for e in events)


def _stopped_at_max_rounds(waiting: Any) -> bool:
    """The run went on to its round limit (no error stopped it)."""
    return str(dict(waiting or {}).get("reason", "")).startswith("max_rounds")


def test_the_sql_stores_json_never_holds_a_lone_surrogate() -> None:
    """What reaches a SQL store's encoders anyway (an event made by hand, a record) is
    cleaned there: the text encodes as UTF-8 and reads back cleaned, clean text as it was."""
    from tether.store._rows import dumps, json_text
    from tether.store._sql import _dumps_no_nul

    for encode in (dumps, json_text, _dumps_no_nul):
        out = encode({"k\ud800": [ODD, "a\x01"], "n": 1.5})
        out.encode("utf-8")
        assert json.loads(out) == {"k\ufffd": [CLEAN, "a\x01"], "n": 1.5}
        plain = {"a": ["é\U0001f600", 2]}
        assert encode(plain) == json.dumps(plain, ensure_ascii=False, separators=(",", ":"))
