"""`rebuild`: the projections folded again from the event log; a damaged ledger is
found and, with `fix`, replaced, on every store."""

from __future__ import annotations

from pathlib import Path

from tests.support.loop import honest_actor, ledger_of, run_task, spec_of
from tether import ledger as L
from tether.models.scripted import ScriptedModel
from tether.rebuild import rebuild
from tether.store.base import LedgerWrite, Store


async def test_a_damaged_ledger_is_found_and_fixed(store: Store, tmp_path: Path) -> None:
    tid, result = await run_task(store, spec_of(3), tmp_path, ScriptedModel(policy=honest_actor))
    assert result.status == "satisfied"
    assert await rebuild(store, tid) == {
        "task_id": tid,
        "consistent": True,
        "ledger": [],
        "task": [],
        "approvals": [],
        "state": [],
        "fixed": False,
    }
    good = await ledger_of(store, tid)
    # A bad restore: i2 back to pending with its evidence gone, written behind the log.
    bad = L.reopen(good, "i2", "damaged").ledger
    await store.commit(tid, None, [], ledger=LedgerWrite.of(bad, good.version))
    found = await rebuild(store, tid)
    assert not found["consistent"] and not found["fixed"]
    assert {(d["item"], d["field"]) for d in found["ledger"]} >= {
        ("i2", "status"),
        ("i2", "evidence"),
    }
    status = next(d for d in found["ledger"] if d["field"] == "status")
    assert (status["stored"], status["from_log"]) == ("pending", "done")

    fixed = await rebuild(store, tid, fix=True)
    assert fixed["fixed"]
    repaired = await ledger_of(store, tid)
    assert repaired.item("i2") == good.item("i2") and repaired.version == bad.version + 1
    assert (await rebuild(store, tid))["consistent"]
