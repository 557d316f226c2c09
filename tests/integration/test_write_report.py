"""The report a sourced task delivers, and what the model hears about its sources.

- `write_report` writes the report file from the cited sections (each with its claim
  ids) and the open questions, and stores a `report` artifact that depends on the
  sections and records the file's hash: a deleted file is a broken deliverable, and a
  source change invalidates the report with its sections.
- Verification names every break of a report (its file, the evidence below it).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.e2e.ab_policies import analyst, cited_claims
from tests.support.compare import compare_contract
from tests.support.loop import ledger_of, run_task
from tether import artifacts as A
from tether.edits import edit_task
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel
from tether.runtime.recovery import deliverables
from tether.spec import parse_spec
from tether.store.base import Store

DATA = Path(__file__).resolve().parents[1] / "data"


def _spec() -> Any:
    return parse_spec(compare_contract())


class Recorder:
    """The e2e analyst, keeping every request it was sent."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    def __call__(self, request: ModelRequest) -> ModelResponse | str:
        self.requests.append(request)
        return analyst(request)


async def test_the_report_cites_its_sections_and_breaks_when_its_file_goes(
    store: Store, tmp_path: Path
) -> None:
    shutil.copytree(DATA / "corpus_ab", tmp_path / "corpus")
    model = Recorder()
    tid, result = await run_task(store, _spec(), tmp_path, ScriptedModel(policy=model))
    assert result.status == "satisfied", result
    # The contract the model read names the sources with their versions.
    system = model.requests[0].system
    assert "  - A version 1.0 (document: A)" in system and "  - B version 2.0 (document)" in system

    arts = {a.artifact_id: a for a in await store.get_artifacts(tid)}
    (report,) = [a for a in arts.values() if a.kind == "report"]
    sections = [d.partition(":")[2] for d in report.deps]
    assert sorted(arts[s].name for s in sections) == ["price", "sso"]
    text = (tmp_path / "report.md").read_text()
    assert (await store.get_blob(report.blob_hash)).decode() == text
    assert report.meta[deliverables.DELIVERABLE_KEY] == "report.md"
    # Each section with the claims it cites; the open questions at the end.
    cited = {
        c for s in sections for c in json.loads(await store.get_blob(arts[s].blob_hash))["claims"]
    }
    assert set(cited_claims(text)) == cited and len(cited) == 4
    assert text.endswith(
        "## Open questions\n\n- A 1.0: residency is not documented\n"
        "- B 2.0: residency is not documented\n"
    )

    # The file is gone: the report's item no longer holds.
    (tmp_path / "report.md").unlink()
    _, broken, stale = await deliverables.verify(store, tid, await ledger_of(store, tid), tmp_path)
    assert [(b.item, b.reason) for b in broken] == [
        ("report", "deliverable report.md is missing from the workspace")
    ]
    # It no longer stands for the file: invalid, so it can never prove the item again.
    assert [(a.artifact_id, a.valid) for a in stale] == [(report.artifact_id, False)]
    assert stale[0].meta[A.INVALIDATED]["reason"] == (
        "its file in the workspace is missing or changed"
    )


async def test_a_report_whose_file_is_gone_is_written_again_not_accepted_again(
    store: Store, tmp_path: Path
) -> None:
    """After recovery finds the report's file deleted, a round that does not rewrite it
    does not make the item done again on the old report artifact: only a new report
    (with its file) does."""
    shutil.copytree(DATA / "corpus_ab", tmp_path / "corpus")
    tid, result = await run_task(store, _spec(), tmp_path, ScriptedModel(policy=analyst))
    assert result.status == "satisfied", result
    (old,) = [a for a in await store.get_artifacts(tid) if a.kind == "report"]
    (tmp_path / "report.md").unlink()
    await edit_task(store, tid, {"budget": {"rounds": 90}})  # goes on: recovery runs
    thought: list[int] = []

    def slow_analyst(request: ModelRequest) -> ModelResponse | str:
        if request.purpose == "act" and not thought:
            thought.append(1)
            return ModelResponse("Let me look at the ledger first.")
        return analyst(request)

    _, again = await run_task(
        store, _spec(), tmp_path, ScriptedModel(policy=slow_analyst), task_id=tid
    )
    assert again.status == "satisfied", again
    led = await ledger_of(store, tid)
    (evidence,) = led.item("report").evidence
    assert evidence != A.artifact_ref(old.artifact_id)
    proved = [
        change["after"]
        for e in await store.read_events(tid, types={"ledger.updated"})
        for change in e.data.get("diff", [])
        if change["item"] == "report" and change["field"] == "evidence"
    ]
    assert proved.count([A.artifact_ref(old.artifact_id)]) == 1  # the first delivery only
    assert (tmp_path / "report.md").is_file()


async def test_verification_reports_every_break_of_a_report(
    sql_backend: Any, tmp_path: Path
) -> None:
    """The report's file is deleted and the content of evidence below it too: the
    finding names both, not only the first."""
    shutil.copytree(DATA / "corpus_ab", tmp_path / "corpus")
    store = await sql_backend.open()
    try:
        tid, result = await run_task(store, _spec(), tmp_path, ScriptedModel(policy=analyst))
        assert result.status == "satisfied", result
        evidence = next(a for a in await store.get_artifacts(tid) if a.kind == "evidence")
        conn = sql_backend.raw()
        try:
            param = "?" if sql_backend.kind == "sqlite" else "%s"
            conn.cursor().execute(f"DELETE FROM blobs WHERE hash = {param}", (evidence.blob_hash,))
            conn.commit()
        finally:
            conn.close()
        (tmp_path / "report.md").unlink()
        led = await ledger_of(store, tid)
        _, broken, stale = await deliverables.verify(store, tid, led, tmp_path)
        reason = {b.item: b.reason for b in broken}["report"]
        assert f"cites artifact {evidence.artifact_id} is missing from the store" in reason
        assert reason.endswith("; deliverable report.md is missing from the workspace")
        assert evidence.artifact_id in {a.artifact_id for a in stale}
    finally:
        await store.close()
