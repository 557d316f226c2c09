"""A model whose text and tool arguments carry control characters (NUL above all,
which PostgreSQL's jsonb and text cannot hold) and huge text: the run goes on, on
every store, and the task still ends only on its evidence."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.adversarial import (
    assert_honest,
    assert_status_agrees,
    change,
    contract,
    op_rule_items,
    say,
    statuses,
    verdict,
    write,
)
from tests.support.loop import run_task
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.store._sql import _dumps_no_nul as _dumps
from tether.store.base import Store

NASTY = "\x00\x01\x1b[31m\u2028\ud7ff\ufeff\\u0000 " * 50


async def test_control_characters_in_text_and_args_never_stop_a_run(
    store: Store, tmp_path: Path
) -> None:
    spec = contract(op_rule_items("a", "b"), limits={"max_rounds": 6})
    calls = 0

    def actor(request: ModelRequest) -> ModelResponse:
        nonlocal calls
        calls += 1
        if calls == 1:  # claims in text, junk args, a write whose content has a NUL
            return say(
                "DONE, all finished." + NASTY + "x" * 200_000,
                tool_call("write_file", path="out/\x00a.txt", content="a"),
                tool_call("list_files", path=NASTY),
                tool_call("read_artifact", artifact_id="\x00"),
                write("a", "a\x00\n"),
            )
        return say("b" + NASTY, write("b"))

    tid, res = await run_task(store, spec, tmp_path, ScriptedModel(policy=actor))
    assert res.status == "satisfied", res
    assert await statuses(store, tid) == {"a": "done", "b": "done"}
    assert (tmp_path / "out" / "a.txt").read_text() == "a\x00\n"
    await assert_honest(store, tid, spec)
    await assert_status_agrees(store, tid)


def test_a_nul_is_stored_as_a_replacement_character_only() -> None:
    """The JSON the SQL stores write has no NUL escape, and nothing else changes: an
    escaped backslash followed by `u0000` is text, not a NUL."""
    for value, want in (
        ("a\x00b", "a\ufffdb"),
        ("\\u0000", "\\u0000"),
        ("\\\x00", "\\\ufffd"),
        ({"k\x00": ["\x00", 1]}, {"k\ufffd": ["\ufffd", 1]}),
    ):
        out = _dumps(value)
        assert json.loads(out) == want
        assert "\x00" not in json.loads(out.replace("\\\\", ""))  # no NUL escape left


async def test_a_judge_citing_ids_with_a_nul_proves_nothing_and_stops_nothing(
    store: Store, tmp_path: Path
) -> None:
    spec = contract([*op_rule_items("a"), {"id": "b", "title": "b"}], limits={"max_rounds": 3})
    odd = ["artifact:\x00", "op:\x00", "op:a\x00b", "artifact:" + "\x00" * 3, "\x00:x"]

    def judge(request: ModelRequest) -> str:
        return verdict([change("b", "done", odd), change("a", "done", odd)], "satisfied")

    tid, res = await run_task(
        store,
        spec,
        tmp_path,
        ScriptedModel(policy=lambda r: say("done")),
        judge=ScriptedModel(policy=judge),
    )
    assert res.status != "satisfied", res
    assert set((await statuses(store, tid)).values()) <= {"pending", "in_progress", "blocked"}
    await assert_honest(store, tid, spec)
