"""`write_report` is a file write like `write_file`: over a file that was in the
workspace before the task started it is an `overwrite`, which waits for a human's
approval (nothing written meanwhile); re-writing the task's own report is not."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.support.adversarial import say
from tests.support.loop import events_of, run_task
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.spec import parse_spec
from tether.store.base import Store

NOTES = "the user's own notes\n"


def _spec() -> object:
    return parse_spec(
        {
            "objective": "write a report",
            "items": [
                {
                    "id": "report",
                    "title": "write the report",
                    "done_when": {"kind": "artifact", "artifact_kind": "report"},
                }
            ],
            "sources": [{"id": "B", "version": "1", "location": "b.md"}],
            "tools": [
                "read_source",
                "record_evidence",
                "record_claim",
                "write_report_section",
                "write_report",
            ],
            "limits": {"max_rounds": 8},
        }
    )


def _reporter(path: str, rounds: int = 1) -> Callable[[ModelRequest], ModelResponse]:
    """An actor that reads, quotes, claims, writes a section and the report at `path`
    in one round; then writes the report there again for `rounds - 1` more rounds."""

    def actor(request: ModelRequest) -> ModelResponse:
        tid = request.task_id
        done = sum(m.role == "assistant" for m in request.messages)
        if done >= rounds:
            return say("the report is written")
        r = done + 1
        return say(
            "report",
            tool_call("read_source", source="B"),
            tool_call("record_evidence", source_artifact=f"{tid}.r1.c0.snap", excerpt="B costs"),
            tool_call("record_claim", text="B costs 35", evidence=[f"{tid}.r{r}.c1.ev"]),
            tool_call(
                "write_report_section", title="P", text="35", claims=[f"{tid}.r{r}.c2.claim"]
            ),
            tool_call("write_report", path=path, title="R", sections=[f"{tid}.r{r}.c3.section"]),
        )

    return actor


async def test_a_report_over_a_preexisting_file_waits_for_approval(
    store: Store, tmp_path: Path
) -> None:
    (tmp_path / "b.md").write_text("B costs 35 euros.\n")
    (tmp_path / "notes.md").write_text(NOTES)

    actor = ScriptedModel(policy=_reporter("notes.md"))

    _, res = await run_task(store, _spec(), tmp_path, actor)
    assert (tmp_path / "notes.md").read_text() == NOTES
    assert res.status == "waiting" and res.waiting and res.waiting["kind"] == "approval", res


async def test_rewriting_its_own_report_needs_no_approval(store: Store, tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("B costs 35 euros.\n")
    actor = ScriptedModel(policy=_reporter("out/report.md", rounds=2))
    tid, res = await run_task(store, _spec(), tmp_path, actor)
    assert res.status == "satisfied", res
    assert (tmp_path / "out" / "report.md").read_text().startswith("# R\n")
    assert not await events_of(store, tid, "approval.requested")
