"""`runtime.worker.tuning`: the collector settings `tether worker` gives its process."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from tether.runtime.worker.tuning import GC_THRESHOLDS, tune_process


@pytest.fixture(autouse=True)
def _restore_gc() -> Iterator[None]:
    before, enabled = gc.get_threshold(), gc.isenabled()
    yield
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
