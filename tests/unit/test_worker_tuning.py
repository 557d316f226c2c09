"""`runtime.worker.tuning`: the collector settings `tether worker` gives its process."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from tether import errors
from tether.runtime.worker import tuning
from tether.runtime.worker.tuning import GC_ENV, GC_THRESHOLDS, settle_process, tune_process


@pytest.fixture(autouse=True)
def _restore_gc() -> Iterator[None]:
    before, enabled = gc.get_threshold(), gc.isenabled()
    settled = tuning._settled
    yield
    tuning._settled = settled
    if tuning.collector is not None:
        tuning.collector.stop()
        tuning.collector = None
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
    # A frozen object freed meanwhile (by another thread, or a finaliser) leaves the
    # permanent generation, so the count may fall (CI saw 630,815 -> 630,812); a second
    # freeze would raise it by at least the 101 objects made just above.
    assert gc.get_freeze_count() <= frozen
    del kept


def test_settling_leaves_a_process_with_the_collector_off_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tuning, "_settled", False)
    gc.unfreeze()
    gc.disable()
    settle_process()
    assert gc.get_freeze_count() == 0


def test_the_thresholds_are_set_when_settling_after_a_paused_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `tether` keeps the collector off while a command starts: `tune_process` then finds
    # it off, and the worker's thresholds come from `settle_process`, which runs later.
    monkeypatch.setattr(tuning, "_settled", False)
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    gc.disable()
    tune_process()
    assert gc.get_threshold() == (700, 10, 10)
    gc.enable()
    settle_process()
    assert gc.get_threshold() == GC_THRESHOLDS
    assert tuning.collector is None  # no running loop: CPython collects the older ones


async def test_settling_in_a_loop_hands_the_older_generations_to_a_quiet_collector(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tuning, "_settled", False)
    monkeypatch.delenv(GC_ENV, raising=False)
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    settle_process()
    assert tuning.collector is not None
    assert gc.get_threshold()[0] == GC_THRESHOLDS[0]
    assert gc.get_threshold()[1] > GC_THRESHOLDS[1]  # generation 1: a backstop only
    tuning.collector.stop()
    assert gc.get_threshold() == GC_THRESHOLDS


async def test_thresholds_only_leaves_the_older_generations_to_cpython(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tuning, "_settled", False)
    monkeypatch.setenv(GC_ENV, "thresholds")
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    settle_process()
    assert tuning.collector is None
    assert gc.get_threshold() == GC_THRESHOLDS
    assert gc.get_freeze_count() > 0


async def test_python_leaves_the_collector_as_the_process_has_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tuning, "_settled", False)
    monkeypatch.setenv(GC_ENV, "python")
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    tune_process()
    settle_process()
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0
    assert tuning.collector is None


async def test_thresholds_of_the_process_own_are_kept_and_collected_by_cpython(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tuning, "_settled", False)
    monkeypatch.delenv(GC_ENV, raising=False)
    gc.unfreeze()
    gc.set_threshold(50_000, 20, 20)
    settle_process()
    assert gc.get_threshold() == (50_000, 20, 20)
    assert tuning.collector is None


def test_an_unknown_policy_is_refused_when_settling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tuning, "_settled", False)
    monkeypatch.setenv(GC_ENV, "sometimes")
    tune_process()  # outside the command's error handling: refused by settle_process
    with pytest.raises(errors.UserError, match=GC_ENV):
        settle_process()


def test_the_models_pydantic_defers_are_built_before_the_first_claim() -> None:
    """A worker builds them while nothing runs (`settle_process`), not the first runs'
    rounds while the others wait; tether's own models only."""
    from pydantic import ConfigDict, create_model

    from tether import events, spec

    deferred = ConfigDict(defer_build=True)
    later = create_model("Later", __config__=deferred, __module__="tether.later", x=(int, ...))
    theirs = create_model("Theirs", __config__=deferred, __module__="elsewhere", x=(int, ...))
    assert not later.__pydantic_complete__ and not theirs.__pydantic_complete__
    tuning.build_models()
    assert later.__pydantic_complete__ and not theirs.__pydantic_complete__
    assert spec.TaskSpec.__pydantic_complete__ and events.OpIntended.__pydantic_complete__
    assert later(x=1).x == 1  # type: ignore[attr-defined]
