"""What the model hears at a new turn after its sources changed: the artifacts that
became invalid (an edit of a source's version, content found missing by recovery) and
the items open again, with why, once."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tests.e2e.ab_policies import analyst
from tests.support.compare import compare_contract
from tests.support.loop import run_task
from tether import artifacts as A
from tether.edits import edit_task
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel
from tether.spec import parse_spec
from tether.store.base import Store

DATA = Path(__file__).resolve().parents[1] / "data"


def _spec() -> Any:
    return parse_spec(compare_contract(report=False))


class Recorder:
    """The e2e analyst, keeping every request it was sent."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    def __call__(self, request: ModelRequest) -> ModelResponse | str:
        self.requests.append(request)
        return analyst(request)


async def test_a_new_turn_tells_the_model_what_became_invalid(store: Store, tmp_path: Path) -> None:
    shutil.copytree(DATA / "corpus_ab", tmp_path / "corpus")
    model = Recorder()
    tid, _ = await run_task(store, _spec(), tmp_path, ScriptedModel(policy=model))
    before = {a.artifact_id: a for a in await store.get_artifacts(tid)}
    task = await store.get_task(tid)
    await edit_task(store, tid, A.source_changes(task.spec, ["B=3.0@corpus/b-3.0.md"]))
    invalid = {a.artifact_id for a in await store.get_artifacts(tid) if not a.valid}
    assert invalid and invalid <= set(before)

    model.requests.clear()
    _, result = await run_task(store, _spec(), tmp_path, ScriptedModel(policy=model), task_id=tid)
    assert result.status == "satisfied", result
    opening = next(m.content for m in model.requests[0].messages[::-1] if m.role == "user")
    assert "Invalidated since your last turn" in opening
    for ident in invalid:
        assert f"  - {ident}: source B changed from version 2.0 to 3.0" in opening
    assert "Open again:\n  - claims: source B changed from version 2.0 to 3.0" in opening
    # The new contract names B 3.0.
    assert "  - B version 3.0 (document)" in model.requests[0].system
    # Announced once: later requests carry that one message, no new notice.
    notices = {
        m.content
        for r in model.requests
        for m in r.messages
        if m.role == "user" and "Invalidated since your last turn" in m.content
    }
    assert notices == {opening}
