"""The commit path's quick ways give what the slow ways gave (issue 22):

- `rules.replaced` is `dataclasses.replace` for the store's records;
- the memory store's copy of the run state (`_copy_usage`, progress marks taken from
  the `MarksWrite` as the SQL stores take them) equals the plain copy of what the run
  sent, for any sequence of rounds, and shares no list with the sender;
- a measured model response (`model_calls._measured`) is the `dataclasses.replace` one;
- `telemetry.span` (a class now) keeps its contract: log fields, listeners, errors.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether import telemetry
from tether.models.base import ModelResponse, ToolCall, Usage
from tether.runtime.round import progress as P
from tether.runtime.run import model_calls
from tether.runtime.run.state import RunState
from tether.store import _rules as rules
from tether.store import memory
from tether.store.base import ApprovalRecord, ArtifactRecord, OpRecord, TaskRecord

# --- rules.replaced -----------------------------------------------------------------------

_RECORDS: list[Any] = [
    OpRecord("o1", "t1", 3, 0, "tool", {"a": [1, 2]}, "h", "write", "pending"),
    ArtifactRecord("a1", "t1", "file", "x.txt", "sha256:00", 3, meta={"k": 1}),
    ApprovalRecord("r1", "t1", "pending", {"tool": "x"}),
    TaskRecord(**{f.name: None for f in dataclasses.fields(TaskRecord)}),
]


@pytest.mark.parametrize("rec", _RECORDS, ids=lambda r: type(r).__name__)
def test_replaced_is_dataclasses_replace(rec: Any) -> None:
    cls = type(rec)
    # What makes the quick copy right: fields in `__dict__`, nothing run at creation.
    assert "__slots__" not in vars(cls) and not hasattr(cls, "__post_init__")
    names = [f.name for f in dataclasses.fields(cls)]
    for n, name in enumerate(names):
        changes = {name: f"v{n}", names[0]: "first"}
        new = rules.replaced(rec, **changes)
        assert new == dataclasses.replace(rec, **changes)
        assert type(new) is cls and new is not rec
    assert rules.replaced(rec) == rec
    with pytest.raises(TypeError):
        rules.replaced(rec, no_such_field=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rules.replaced(rec, **{names[0]: "x"}).__setattr__(names[0], "y")


def test_merge_op_keeps_the_identity_and_takes_the_outcome() -> None:
    first = _RECORDS[0]
    stored = rules.merge_op(None, first, 5.0)
    assert stored == dataclasses.replace(first, created_at=5.0, updated_at=5.0)
    later = dataclasses.replace(
        first, tool="other", status="succeeded", attempts=2, result={"ok": True}, round=9
    )
    merged = rules.merge_op(stored, later, 6.0)
    assert merged == dataclasses.replace(
        stored, status="succeeded", attempts=2, result={"ok": True}, updated_at=6.0
    )


def test_task_patch_is_the_one_init_makes() -> None:
    """`journal.task_patch` puts the fields in the instance's `__dict__` (what makes that
    right: fields in `__dict__`, nothing run at creation)."""
    from tether.runtime.run.journal import task_patch
    from tether.store.base import MarksWrite, TaskPatch

    assert "__slots__" not in vars(TaskPatch) and not hasattr(TaskPatch, "__post_init__")
    assert task_patch() == TaskPatch()
    names = [f.name for f in dataclasses.fields(TaskPatch)]
    for n, name in enumerate(names):
        given = {name: f"v{n}", "marks": MarksWrite({})}
        made = task_patch(**given)
        assert made == TaskPatch(**given) and type(made) is TaskPatch
        assert list(vars(made)) == names
    with pytest.raises(TypeError):
        task_patch(no_such_field=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        task_patch().__setattr__("status", "x")


def test_merge_op_makes_a_new_record() -> None:
    """The memory store copies the caller's containers into the merged record, which
    must then be one nobody holds yet (`memory._stored_op`)."""
    first = _RECORDS[0]
    stored = rules.merge_op(None, first, 5.0)
    assert stored is not first
    later = dataclasses.replace(first, status="succeeded")
    merged = rules.merge_op(stored, later, 6.0)
    assert merged is not stored and merged is not later


# --- the memory store's copy of the run state ---------------------------------------------

_marks = st.lists(st.sampled_from([f"m{n}" for n in range(12)]), max_size=4)
_round = st.tuples(st.sampled_from(["a", "b", "c"]), _marks, st.booleans())


def _unshared(a: Any, b: Any) -> bool:
    """No list or dict of `a` is one of `b`'s."""
    ids: set[int] = set()

    def walk(v: Any, into: set[int]) -> None:
        if isinstance(v, dict | list):
            into.add(id(v))
            for x in v.values() if isinstance(v, dict) else v:
                walk(x, into)

    walk(b, ids)
    mine: set[int] = set()
    walk(a, mine)
    return not (mine & ids)


@settings(max_examples=150, deadline=None)
@given(st.lists(_round, max_size=25), st.integers(2, 6), st.sets(st.integers(0, 24)))
def test_the_stored_run_state_is_what_the_run_sent(
    rounds: list[tuple[str, list[str], bool]], cap: int, unsure: set[int]
) -> None:
    """Rounds add marks to items (oldest dropped past `cap`), forget items, and some
    commits fail (the next sends `seen` whole): every commit stores a copy equal to
    the run's `to_dict`, sharing nothing with it."""
    state = RunState()
    state.marks_write()  # the load
    held: Any = {}
    for n, (item, marks, forget) in enumerate(rounds):
        if forget:
            state.seen.pop(item, None)
        else:
            state.seen[item] = P.remember(state.seen.get(item, []), marks)[-cap:]
        if n in unsure:
            state.marks_unsure()
        usage, write = state.to_dict(), state.marks_write()
        stored = memory._copy_usage(usage, write, held)
        assert stored == memory._copy(usage) == usage
        assert list(stored) == list(usage)
        assert _unshared(stored, usage)
        held = stored


def test_marks_that_disagree_with_the_stored_lists_are_copied_as_given() -> None:
    held = {"seen": {"a": ["x", "y"], "b": ["p"]}}
    usage = {"rounds": 2, "seen": {"a": ["x", "y", "z"], "b": ["q"], "c": ["r"]}}
    write = RunState().marks_write()  # None: the whole `seen`
    assert memory._copy_usage(usage, write, held) == usage
    from tether.store.base import MarksWrite

    # An item the write does not name keeps its stored marks, as on the SQL stores
    # ("b"), unless the stored list has another length ("a"): then the given list.
    got = memory._copy_usage(usage, MarksWrite({}), held)
    assert got["seen"] == {"a": ["x", "y", "z"], "b": ["p"], "c": ["r"]}
    # A trim that does not give the given length: the given list.
    got = memory._copy_usage(usage, MarksWrite({"a": (0, ("z", "w"))}), held)
    assert got["seen"]["a"] == ["x", "y", "z"]
    got = memory._copy_usage(usage, MarksWrite({"a": (1, ("y", "z"))}), held)
    assert got["seen"]["a"] == ["y", "y", "z"]
    # A non-string key goes the JSON way, as before.
    odd = {"seen": {1: ["a"]}}
    assert memory._copy_usage(odd, MarksWrite({}), held) == {"seen": {"1": ["a"]}}


# --- model calls --------------------------------------------------------------------------


@given(
    st.text(max_size=20),
    st.integers(0, 10**6),
    st.floats(0, 1e6, allow_nan=False),
    st.sampled_from(["", "m"]),
    st.integers(1, 5),
)
def test_a_measured_response_is_the_replaced_one(
    text: str, tokens: int, latency: float, name: str, attempts: int
) -> None:
    resp = ModelResponse(
        text, (ToolCall("c1", "t", {"a": 1}),), Usage(tokens, 1), name, 0.0, "stop", attempts
    )
    got = model_calls._measured(resp, name or "configured", latency)
    assert got == dataclasses.replace(resp, model=name or "configured", latency_ms=latency)
    assert type(got) is ModelResponse and resp.latency_ms == 0.0


def test_a_response_subclass_is_replaced() -> None:
    @dataclasses.dataclass(frozen=True)
    class Mine(ModelResponse):
        extra: int = 0

    got = model_calls._measured(Mine("x", extra=3), "m", 2.0)
    assert type(got) is Mine and got.extra == 3 and got.latency_ms == 2.0


# --- telemetry.span -----------------------------------------------------------------------


class _Listener:
    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []

    def span_started(self, name: str, attributes: Mapping[str, Any]) -> None:
        self.seen.append(("start", name, dict(attributes)))

    def span_ended(
        self, name: str, attributes: Mapping[str, Any], seconds: float, error: str | None
    ) -> None:
        assert seconds >= 0
        self.seen.append(("end", name, dict(attributes), error))


class _Stopped(Exception):
    outcome = "waiting"


def test_span_log_fields_and_listeners() -> None:
    listener = _Listener()
    remove = telemetry.add_listener(listener)
    try:
        assert dict(telemetry.log_fields()) == {}
        with telemetry.span("turn", {"tether.task_id": "t1", "x": None, "o": object}) as s:
            assert dict(telemetry.log_fields()) == {"task_id": "t1"}
            with telemetry.span("tether.round") as r:
                r.set_attribute("tether.round", 4)
                assert dict(telemetry.log_fields()) == {"task_id": "t1", "round": 4}
            assert dict(telemetry.log_fields()) == {"task_id": "t1"}
            s.set_attribute("k", 1)
        assert dict(telemetry.log_fields()) == {}
        with pytest.raises(ValueError), telemetry.span("bad"):
            raise ValueError("x")
        with pytest.raises(_Stopped), telemetry.span("stopped"):
            raise _Stopped
        assert dict(telemetry.log_fields()) == {}
    finally:
        remove()
    turn = {"tether.task_id": "t1", "o": str(object)}
    assert listener.seen == [
        ("start", "turn", turn),
        ("start", "tether.round", {}),
        ("end", "tether.round", {"tether.round": 4}, None),
        ("end", "turn", {**turn, "k": 1}, None),
        ("start", "bad", {}),
        ("end", "bad", {}, "ValueError"),
        ("start", "stopped", {}),
        ("end", "stopped", {}, None),
    ]


def test_quiet_while_nobody_is_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """A round's phase spans are left out (`NO_SPAN`) only while a span would tell
    nobody: no listener and no tracer."""
    monkeypatch.setattr(telemetry, "_tracer", False)
    assert telemetry.quiet()
    remove = telemetry.add_listener(_Listener())
    try:
        assert not telemetry.quiet()
    finally:
        remove()
    assert telemetry.quiet()
    monkeypatch.setattr(telemetry, "_tracing", lambda: object())
    assert not telemetry.quiet()
    with telemetry.NO_SPAN as nothing:
        assert nothing is None


def test_span_without_opentelemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(telemetry, "_tracer", False)
    with telemetry.span("x", {"a": 1, "tether.round": 2}) as s:
        s.set_attribute("b", 2)
        assert telemetry.log_fields()["round"] == 2
    assert "round" not in telemetry.log_fields()


# --- the stop request during model calls --------------------------------------------------


class _Journal:
    task_id = "t1"

    def __init__(self) -> None:
        self.staged_events: list[Any] = ["decision"]
        self.staged_ledger: Any = "ledger"


class _Model:
    name = "scripted:m"

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def complete(self, request: Any) -> ModelResponse:
        self.started.set()
        await self.release.wait()
        return ModelResponse("ok", (), Usage(1, 1), "m", 1.0)


class _Request:
    purpose = "act"


async def test_a_stop_cancels_the_call_in_flight_with_one_watcher_per_run() -> None:
    from tether.runtime.run.outcome import Stop

    stop, journal, model = asyncio.Event(), _Journal(), _Model()
    calls = model_calls.ModelCalls(Any, Any, journal, stop)  # type: ignore[arg-type]
    model.release.set()
    for _ in range(5):  # calls that finish: one watcher, no waiter left per call
        resp = await calls.call_model(model, _Request())  # type: ignore[arg-type]
        assert resp.text == "ok"
    watcher = calls._watcher
    assert watcher is not None and not watcher.done() and not calls._calling
    await asyncio.sleep(0)  # the watcher's first step
    assert len(stop._waiters) == 1  # type: ignore[attr-defined]

    model.release.clear()
    model.started.clear()
    call = asyncio.ensure_future(calls.call_model(model, _Request()))  # type: ignore[arg-type]
    await model.started.wait()
    stop.set()
    with pytest.raises(Stop) as stopped:
        await call
    assert "interrupted during a model call" in stopped.value.outcome.reason
    assert journal.staged_events == [] and journal.staged_ledger is None
    assert not calls._calling and call.cancelling() == 0
    never = asyncio.get_running_loop().create_future()
    with pytest.raises(Stop):  # asked again: refused at once
        await calls._unless_stopped(never, "act")

    stop.clear()
    model.release.set()
    assert (await calls.call_model(model, _Request())).text == "ok"  # type: ignore[arg-type]
    assert calls._watcher is not watcher and not calls._watcher.done()  # type: ignore[union-attr]
    calls.close()
    await asyncio.sleep(0)
    assert calls._watcher is None and not stop._waiters  # type: ignore[attr-defined]


async def test_an_error_of_the_call_is_its_own() -> None:
    stop = asyncio.Event()
    calls = model_calls.ModelCalls(Any, Any, _Journal(), stop)  # type: ignore[arg-type]

    async def boom() -> ModelResponse:
        raise SystemExit(3)

    with pytest.raises(SystemExit):
        await calls._unless_stopped(boom(), "act")
    assert not calls._calling
    calls.close()


# --- models.base.direct_init ---------------------------------------------------------------


def _both(**options: Any) -> tuple[type, type]:
    """The same frozen dataclass twice: with the `__init__` `dataclass` made, and with
    `direct_init`'s."""
    from tether.models.base import direct_init

    def make() -> type:
        @dataclasses.dataclass(frozen=True, **options)
        class Rec:
            a: int
            b: str = "b"
            c: list[int] = dataclasses.field(default_factory=list)
            d: Any = None

            def __post_init__(self) -> None:
                if self.a < 0:
                    raise ValueError("a < 0")

        return Rec

    return make(), direct_init(make())


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((1,), {}), ((1, "x"), {"d": 4}), ((), {"a": 2, "c": [1]}), ((1, "x", [2], 3), {})],
)
def test_direct_init_makes_what_dataclass_init_makes(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    made, direct = _both()
    want, got = made(*args, **kwargs), direct(*args, **kwargs)
    assert dataclasses.astuple(got) == dataclasses.astuple(want)
    assert repr(got).split("(", 1)[1] == repr(want).split("(", 1)[1]
    if len(args) < 3 and "c" not in kwargs:
        assert got.c is not direct(*args, **kwargs).c  # a fresh default each time
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.a = 5  # type: ignore[misc]


def test_direct_init_refuses_what_dataclass_init_refuses() -> None:
    made, direct = _both()
    for cls in (made, direct):
        with pytest.raises(TypeError):
            cls()
        with pytest.raises(TypeError):
            cls(1, e=2)
        with pytest.raises(ValueError):
            cls(-1)  # its __post_init__ runs


def test_direct_init_takes_only_the_classes_it_can_stand_for() -> None:
    from tether.models.base import direct_init

    @dataclasses.dataclass
    class Loose:
        a: int

    @dataclasses.dataclass(frozen=True)
    class Hidden:
        a: int
        b: int = dataclasses.field(default=0, init=False)

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Named:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Slotted:
        a: int

    @dataclasses.dataclass(frozen=True)
    class WithInitVar:
        a: int
        b: dataclasses.InitVar[int] = 0

    for cls in (Loose, Hidden, Named, Slotted, WithInitVar):
        with pytest.raises(TypeError):
            direct_init(cls)
