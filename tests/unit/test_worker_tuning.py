"""`runtime.worker.tuning`: the collector settings `tether worker` gives its process."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from tether.runtime.worker import tuning
from tether.runtime.worker.tuning import GC_THRESHOLDS, settle_process, tune_process


@pytest.fixture(autouse=True)
def _restore_gc() -> Iterator[None]:
    before, enabled = gc.get_threshold(), gc.isenabled()
    settled = tuning._settled
    yield
    tuning._settled = settled
    gc.unfreeze()
    gc.set_threshold(*before)
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_the_default_thresholds_are_raised() -> None:
    gc.set_threshold(700, 10, 10)
    tune_process()
    assert gc.get_threshold() == GC_THRESHOLDS


def test_a_process_that_chose_higher_thresholds_keeps_them() -> None:
    gc.set_threshold(50_000, 20, 20)
    tune_process()
    assert gc.get_threshold() == (50_000, 20, 20)


def test_a_process_with_the_collector_off_is_left_alone() -> None:
    gc.set_threshold(700, 10, 10)
    gc.disable()
    tune_process()
    assert gc.get_threshold() == (700, 10, 10)
    assert not gc.isenabled()


def test_settling_imports_a_rounds_modules_and_freezes_the_heap_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    monkeypatch.setattr(tuning, "_settled", False)
    gc.unfreeze()
    settle_process()
    assert "tether.runtime.round.phases" in sys.modules
    frozen = gc.get_freeze_count()
    assert frozen > 0
    kept = [[] for _ in range(100)]  # new objects: a second call must not freeze them
    settle_process()
    assert gc.get_freeze_count() == frozen
    del kept


def test_settling_leaves_a_process_with_the_collector_off_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tuning, "_settled", False)
    gc.unfreeze()
    gc.disable()
    settle_process()
    assert gc.get_freeze_count() == 0
