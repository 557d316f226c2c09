"""`verify_task` (`tether verify`) on a delivered task, through the Python API on SQLite
and PostgreSQL: the whole chain checked again, what broke reopened and redone, a pinned
source's lost snapshot restored from the same bytes or, when the file changed, never
stored again as that version (a person decides)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.ab_policies import analyst
from tests.support.compare import compare_contract
from tests.support.loop import ledger_of, run_task
from tether import errors
from tether.edits import edit_task
from tether.models.scripted import ScriptedModel
from tether.rebuild import rebuild
from tether.runtime.recovery.verify import verify_task
from tether.spec import Source, parse_spec
from tether.store.base import Store
from tether.tools.builtin.pinned import guard

DATA = Path(__file__).resolve().parents[1] / "data"


def _spec() -> Any:
    return parse_spec(compare_contract())


def _drop_blob(backend: Any, blob: str) -> None:
    conn = backend.raw()
    try:
        param = "?" if backend.kind == "sqlite" else "%s"
        conn.cursor().execute(f"DELETE FROM blobs WHERE hash = {param}", (blob,))
        conn.commit()
    finally:
        conn.close()


async def _delivered(store: Store, ws: Path) -> str:
    shutil.copytree(DATA / "corpus_ab", ws / "corpus")
    tid, result = await run_task(store, _spec(), ws, ScriptedModel(policy=analyst))
    assert result.status == "satisfied", result
    return tid


async def _verifications(store: Store, tid: str) -> list[dict[str, Any]]:
    """The findings each verification journaled."""
    steps = await store.read_events(tid, types={"recovery.step"})
    return [e.data["details"] for e in steps if e.data["step"] == "verify"]


@pytest.fixture
async def sql_store(sql_backend: Any) -> Any:
    store = await sql_backend.open()
    try:
        yield store
    finally:
        await store.close()


async def test_a_delivered_task_whose_evidence_is_lost_goes_back_to_work_and_is_redone(
    sql_backend: Any, sql_store: Store, tmp_path: Path
) -> None:
    store = sql_store
    tid = await _delivered(store, tmp_path)
    # Nothing broke: nothing is written.
    seq = (await store.get_task(tid)).last_seq
    result = await verify_task(store, tid)
    assert result.outcome == "holds" and result.status == "satisfied", result.to_dict()
    assert {r["what"] for r in result.to_dict()["checked"]} >= {
        "source snapshots", "evidence", "claims", "report sections", "reports",
    }  # fmt: skip
    assert (await store.get_task(tid)).last_seq == seq

    arts = await store.get_artifacts(tid)
    lost = next(a for a in arts if a.kind == "evidence" and a.name == "A")
    _drop_blob(sql_backend, lost.blob_hash)
    result = await verify_task(store, tid, by="ops")
    assert result.outcome == "reopened" and result.status == "queued", result.to_dict()
    assert lost.artifact_id in result.invalidated
    assert set(result.reopened) == {"claims", "sections", "report"}
    assert f"{lost.artifact_id}" in result.broken[0].reason
    task = await store.get_task(tid)
    assert (task.status, task.stop_reason) == ("queued", None)
    change = (await store.read_events(tid, types={"task.status"}))[-1].data
    assert (change["src"], change["dst"]) == ("satisfied", "queued")
    assert "verify reopened" in change["reason"] and lost.artifact_id in change["reason"]
    (step,) = await _verifications(store, tid)
    assert step["by"] == "ops" and step["outcome"] == "reopened"
    led = await ledger_of(store, tid)
    assert led.item("claims").status == "pending" and "missing" in led.item("claims").note
    assert (await rebuild(store, tid))["consistent"]
    # B's claims are kept; only what rested on the lost evidence goes to history.
    valid_before = {a.artifact_id for a in arts if a.valid}
    now = {a.artifact_id: a for a in await store.get_artifacts(tid)}
    b_claims = [a for a in arts if a.kind == "claim" and a.name == "B"]
    assert b_claims and all(now[a.artifact_id].valid for a in b_claims)

    # Verified again before it runs: nothing new broke, nothing is written twice.
    seq = (await store.get_task(tid)).last_seq
    again = await verify_task(store, tid)
    assert again.outcome == "holds" and (await store.get_task(tid)).last_seq == seq

    _, resumed = await run_task(
        store, _spec(), tmp_path, ScriptedModel(policy=analyst), task_id=tid
    )
    assert resumed.status == "satisfied", resumed
    after = await store.get_artifacts(tid)
    redone = [a for a in after if a.valid and a.artifact_id not in valid_before]
    assert {a.kind for a in redone} <= {"evidence", "claim", "report_section", "report"}
    assert not [a for a in redone if a.kind == "source_snapshot"]  # nothing re-read
    assert (await verify_task(store, tid)).outcome == "holds"
    assert (await rebuild(store, tid))["consistent"]


async def test_a_lost_snapshot_is_restored_from_the_same_bytes(
    sql_backend: Any, sql_store: Store, tmp_path: Path
) -> None:
    store = sql_store
    tid = await _delivered(store, tmp_path)
    snap = next(a for a in await store.get_artifacts(tid) if a.kind == "source_snapshot")
    _drop_blob(sql_backend, snap.blob_hash)
    result = await verify_task(store, tid)
    assert result.outcome == "holds" and result.restored == [snap.artifact_id]
    assert (await store.get_task(tid)).status == "satisfied"
    assert await store.get_blob(snap.blob_hash)


async def test_a_pinned_source_changed_under_its_version_goes_to_a_person(
    sql_backend: Any, sql_store: Store, tmp_path: Path
) -> None:
    store = sql_store
    tid = await _delivered(store, tmp_path)
    arts = await store.get_artifacts(tid)
    snap = next(a for a in arts if a.kind == "source_snapshot" and a.name == "B")
    _drop_blob(sql_backend, snap.blob_hash)
    doc = tmp_path / "corpus" / "b-2.0.md"
    doc.write_text(doc.read_text().replace("costs", "now costs"))
    result = await verify_task(store, tid)
    assert result.outcome == "gap" and result.status == "waiting", result.to_dict()
    (drift,) = result.drifts
    assert (drift.source, drift.version) == ("B", "2.0")
    assert "source B changed under version 2.0" in result.gaps[0]
    assert f"tether edit {tid} --source B=" in result.gaps[0]
    task = await store.get_task(tid)
    assert task.waiting is not None and task.waiting["kind"] == "decision"
    assert "source B changed under version 2.0" in task.waiting["reason"]
    (asked,) = await store.read_events(tid, types={"decision.requested"})
    assert "source B changed under version 2.0" in asked.data["reason"]
    # No second snapshot of B 2.0, and the tool refuses to store one.
    snaps = [a for a in await store.get_artifacts(tid) if a.kind == "source_snapshot"]
    assert len([a for a in snaps if a.name == "B"]) == 1
    src = Source(id="B", version="2.0", location="corpus/b-2.0.md")
    with pytest.raises(errors.ToolFailed, match=r"source B changed under version 2\.0"):
        await guard(store, tid, src, doc.read_bytes())
    await guard(store, tid, src, (DATA / "corpus_ab" / "b-2.0.md").read_bytes())  # same bytes
    assert (await rebuild(store, tid))["consistent"]


async def test_a_running_task_is_not_verified_under_its_worker(store: Store) -> None:
    from tests.support.loop import create_task

    task = await create_task(store, _spec())
    claimed = await store.claim("w", 30)
    assert claimed is not None and claimed.task_id == task.task_id
    with pytest.raises(errors.UserError, match="a worker holds it"):
        await verify_task(store, task.task_id)


async def test_a_worker_verifies_delivered_tasks_and_redoes_what_broke(
    sql_backend: Any, sql_store: Store, tmp_path: Path
) -> None:
    from tether.runtime.engine import ModelSet
    from tether.runtime.worker import Worker

    store = sql_store
    tid = await _delivered(store, tmp_path)
    lost = next(a for a in await store.get_artifacts(tid) if a.kind == "evidence")
    _drop_blob(sql_backend, lost.blob_hash)
    # Off by default: a worker leaves the delivered task alone.
    idle = Worker(store, ModelSet(ScriptedModel(policy=analyst)), once=True, watch_every=None)
    assert (await idle.run()).ran == 0
    assert (await store.get_task(tid)).status == "satisfied"
    results: list[Any] = []
    worker = Worker(
        store,
        ModelSet(ScriptedModel(policy=analyst)),
        once=True,
        watch_every=None,
        verify_every=3600.0,
        on_result=results.append,
    )
    stats = await worker.run()
    assert stats.ran == 1 and [r.status for r in results] == ["satisfied"], results
    step = await _verifications(store, tid)
    assert step[0]["outcome"] == "reopened" and step[0]["by"].startswith("worker ")
    assert (await verify_task(store, tid)).outcome == "holds"


async def test_recovery_restores_a_lost_snapshot_or_asks_when_its_source_changed(
    sql_backend: Any, sql_store: Store, tmp_path: Path
) -> None:
    """A new turn's recovery reads a lost snapshot's source again: the same bytes are
    stored again (nothing reopens); other bytes are never stored as that version and
    the task waits for a person's decision naming the source and the version."""
    store = sql_store
    tid = await _delivered(store, tmp_path)
    arts = await store.get_artifacts(tid)
    a_snap = next(a for a in arts if a.kind == "source_snapshot" and a.name == "A")
    b_snap = next(a for a in arts if a.kind == "source_snapshot" and a.name == "B")
    _drop_blob(sql_backend, a_snap.blob_hash)
    _drop_blob(sql_backend, b_snap.blob_hash)
    doc = tmp_path / "corpus" / "b-2.0.md"
    doc.write_text(doc.read_text().replace("costs", "now costs"))
    await edit_task(store, tid, {"budget": {"rounds": 90}})  # goes on: recovery runs
    _, result = await run_task(store, _spec(), tmp_path, ScriptedModel(policy=analyst), task_id=tid)
    assert result.status == "waiting", result
    task = await store.get_task(tid)
    assert task.waiting is not None and task.waiting["kind"] == "decision"
    assert "source B changed under version 2.0" in task.waiting["reason"]
    (asked,) = await store.read_events(tid, types={"decision.requested"})
    assert "source B changed under version 2.0" in asked.data["reason"]
    restored = [
        e.data["details"]
        for e in await store.read_events(tid, types={"recovery.step"})
        if e.data["step"] == "restore"
    ]
    assert restored == [{"restored": [a_snap.artifact_id], "by": "recovery"}]
    assert await store.get_blob(a_snap.blob_hash)
    now = {a.artifact_id: a for a in await store.get_artifacts(tid)}
    assert now[a_snap.artifact_id].valid and not now[b_snap.artifact_id].valid
    assert [a.name for a in now.values() if a.kind == "source_snapshot"] == ["A", "B"]
    assert (await rebuild(store, tid))["consistent"]
