"""What runtime/ reads of a store or a model is declared, not looked up by name."""

from __future__ import annotations

from pathlib import Path

from tether.clock import FakeClock
from tether.models.scripted import ScriptedModel
from tether.runtime.run.ports import ClosableModel, ModelSet
from tether.runtime.run.task_run import StoreFile
from tether.store.base import Store
from tether.store.memory import MemoryStore
from tether.store.sqlite import SQLiteStore


async def test_every_store_declares_its_clock_and_only_sqlite_a_file(tmp_path: Path) -> None:
    clock = FakeClock()
    memory = MemoryStore(clock)
    sqlite = await SQLiteStore.open(tmp_path / "t.db", clock=clock)
    try:
        for store in (memory, sqlite):
            assert isinstance(store, Store) and store.clock is clock
        assert isinstance(sqlite, StoreFile) and sqlite.path == str(tmp_path / "t.db")
        assert not isinstance(memory, StoreFile)
    finally:
        await sqlite.close()


class Closing(ScriptedModel):
    closed = 0

    async def aclose(self) -> None:
        Closing.closed += 1


async def test_a_model_set_closes_each_closable_model_once() -> None:
    shared, scripted = Closing(["done"]), ScriptedModel(["done"])
    assert isinstance(shared, ClosableModel) and not isinstance(scripted, ClosableModel)
    await ModelSet(shared, shared, scripted, shared).aclose()
    assert Closing.closed == 1
