"""`runtime.ops` as parts that return values: an attempt says what happened and the
runner dispatches on it; the parts stay small, know the run only through `OpsHost`, and
none reaches up into recovery, the judge, the round or the engine."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tether import events as ev
from tether.clock import FakeClock
from tether.models.base import ToolCall
from tether.runtime.ops import results as R
from tether.runtime.ops.attempt import Attempts
from tether.runtime.ops.human.requests import Requests
from tether.runtime.ops.ports import OpsStore, RoundOps, ToolEnv
from tether.runtime.ops.runner import OpRunner, Pause
from tether.runtime.run.ports import OpsHost
from tether.runtime.run.state import RunState
from tether.spec import parse_spec
from tether.store.base import ApprovalRecord, OpRecord
from tether.tools.registry import Tool, ToolContext
from tether.tools.retry import RetryPolicy

SRC = Path(__file__).resolve().parents[2] / "src" / "tether"
OPS = SRC / "runtime" / "ops"


@dataclass
class FakeStore:
    """The reads of `OpsStore`, over lists."""

    ops: list[OpRecord] = field(default_factory=list)
    approvals: list[ApprovalRecord] = field(default_factory=list)

    async def get_ops(
        self,
        task_id: str,
        statuses: Collection[str] | None = None,
        *,
        op_ids: Collection[str] | None = None,
        round: int | None = None,
        tools: Collection[str] | None = None,
    ) -> list[OpRecord]:
        return [
            o
            for o in self.ops
            if (statuses is None or o.status in statuses)
            and (op_ids is None or o.op_id in op_ids)
            and (round is None or o.round == round)
            and (tools is None or o.tool in tools)
        ]

    async def get_approvals(
        self, task_id: str, statuses: Collection[str] | None = None
    ) -> list[ApprovalRecord]:
        return [a for a in self.approvals if statuses is None or a.status in statuses]

    async def read_events(self, task_id: str, *a: Any, **k: Any) -> list[Any]:
        return []


class FakeJournal:
    """The journal of a `FakeHost`: commits are only recorded."""

    def __init__(self) -> None:
        self.task_id = "t"
        self.commits: list[tuple[list[ev.Event], dict[str, Any]]] = []

    async def commit(self, events: Sequence[ev.Event], **more: Any) -> int:
        self.commits.append((list(events), more))
        return len(self.commits)

    def stage_blob(self, data: bytes) -> str:
        return "blob"


class FakeHost:
    """An `OpsHost` with no engine behind it: commits are only recorded."""

    def __init__(self, *tools: Tool) -> None:
        self.journal = FakeJournal()
        self.view = SimpleNamespace(
            task=SimpleNamespace(version=1),
            spec=parse_spec({"objective": "o", "items": [{"id": "a", "title": "a"}]}),
            state=RunState(),
        )
        self.tools = list(tools)
        self.known_tools = {t.name: t for t in tools}
        self.store = FakeStore()
        self.tool_env = ToolEnv(
            token=1, workspace=None, services={}, guard=None, clock=FakeClock(), inline_wait_max=1e6
        )

    @property
    def commits(self) -> list[tuple[list[ev.Event], dict[str, Any]]]:
        """What the journal committed."""
        return self.journal.commits


def failing(exc: Exception, *, retry: RetryPolicy, **kw: Any) -> Tool:
    async def fn(args: Any, ctx: ToolContext) -> Any:
        raise exc

    return Tool("call_api", "", {"type": "object"}, fn, effect="write", retry=retry, **kw)


def record(tool: Tool, attempts: int = 0) -> OpRecord:
    return OpRecord(
        op_id="t.r1.c0",
        task_id="t",
        round=1,
        call_index=0,
        tool=tool.name,
        args={},
        args_hash="h",
        effect=tool.effect,
        status="intended",
        attempts=attempts,
    )


def attempts_for(host: FakeHost) -> Attempts:
    book = RoundOps()
    return Attempts(host, book, Requests(host))  # type: ignore[arg-type]


async def once(tool: Tool) -> tuple[R.Step, FakeHost]:
    host = FakeHost(tool)
    step = await attempts_for(host).once(tool, ToolCall("c0", tool.name, {}), record(tool), 0.0)
    return step, host


def asked_a_human(host: FakeHost) -> bool:
    return any(more.get("approvals") for _, more in host.commits) or any(
        isinstance(e, ev.ApprovalRequested) for events, _ in host.commits for e in events
    )


async def test_a_transient_failure_is_a_retry_with_its_next_attempt_stored() -> None:
    step, host = await once(failing(ConnectionRefusedError("down"), retry=RetryPolicy(3)))
    assert isinstance(step, R.Retry)
    assert step.record.status == "retry_wait" and step.record.attempts == 1
    assert step.record.next_attempt_at is not None
    *_, (events, more) = host.commits
    assert isinstance(events[0], ev.OpRetryScheduled) and more["ops"] == [step.record]


@pytest.mark.parametrize("policy", ["ask_human", "compensate"])
async def test_exhausted_retries_are_a_value_and_ask_no_one_yet(policy: str) -> None:
    tool = failing(ConnectionRefusedError("down"), retry=RetryPolicy(1, on_exhausted=policy))  # type: ignore[arg-type]
    step, host = await once(tool)
    assert isinstance(step, R.Exhausted) and step.policy == policy
    assert step.outcome.status == "failed" and step.outcome.error_class == "transient"
    # The attempt only says so: asking a human or compensating is the runner's next call.
    assert not asked_a_human(host)


async def test_a_lost_response_of_a_tool_that_cannot_be_resent_is_in_doubt() -> None:
    tool = failing(TimeoutError("no answer"), retry=RetryPolicy(3))
    step, host = await once(tool)
    assert isinstance(step, R.InDoubt) and step.failure.cls == "unknown"
    assert not asked_a_human(host)


async def test_the_runner_asks_a_human_about_an_op_in_doubt_once() -> None:
    tool = failing(TimeoutError("no answer"), retry=RetryPolicy(3))
    host = FakeHost(tool)
    runner = OpRunner(host)  # type: ignore[arg-type]
    with pytest.raises(Pause) as paused:
        await runner.execute(tool, ToolCall("c0", tool.name, {}), record(tool), fresh=True)
    outcome = paused.value.outcome
    assert outcome.status == "waiting" and outcome.reason == "op outcome unknown"
    assert [a.request_id for a in outcome.approvals] == ["t.r1.c0.in_doubt"]


async def test_the_runner_marks_a_call_to_compensate_and_asks_for_exhausted_ones() -> None:
    call = ToolCall("c0", "call_api", {})
    comp = failing(ConnectionRefusedError("down"), retry=RetryPolicy(1, on_exhausted="compensate"))
    done = await OpRunner(FakeHost(comp)).execute(comp, call, record(comp), fresh=True)  # type: ignore[arg-type]
    assert done.compensate and done.status == "failed"
    ask = failing(ConnectionRefusedError("down"), retry=RetryPolicy(1, on_exhausted="ask_human"))
    with pytest.raises(Pause) as paused:
        await OpRunner(FakeHost(ask)).execute(ask, call, record(ask), fresh=True)  # type: ignore[arg-type]
    assert [a.request_id for a in paused.value.outcome.approvals] == ["t.r1.c0.exhausted"]


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_call_past_its_timeout_is_one_outcome_whether_its_code_is_sync_or_async(
    kind: str,
) -> None:
    import asyncio
    import threading

    from tether.tools.registry import runs_in_thread, tool

    release = threading.Event()
    if kind == "sync":

        @tool(effect="write", idempotent=True, timeout=0.05, retry=RetryPolicy(1))
        def call_api() -> str:
            release.wait(10)
            return "late"

    else:

        @tool(effect="write", idempotent=True, timeout=0.05, retry=RetryPolicy(1))
        async def call_api() -> str:
            await asyncio.sleep(10)
            return "late"

    made: Tool = call_api  # type: ignore[assignment]
    # A sync function's deadline is kept without a task of its own; an async one's, or a
    # `fn` replaced by other code, in a task (`asyncio.wait_for`).
    assert runs_in_thread(made) is (kind == "sync")
    assert not runs_in_thread(failing(ValueError(), retry=RetryPolicy()))
    try:
        step, _ = await once(made)
    finally:
        release.set()
    # Both fail as a timeout, once (no retry left), after about the deadline.
    assert isinstance(step, R.Settled)
    out = step.outcome
    assert out.status == "failed" and out.error_class == "transient"
    assert out.error == "TimeoutError (gave up after 1 attempts)"
    assert out.duration_ms < 5000


def test_read_artifact_is_not_previewed_again() -> None:
    from tether.tools.builtin.files import READ_ARTIFACT, default_registry

    read = default_registry(lambda: None).get(READ_ARTIFACT)  # type: ignore[arg-type, return-value]
    assert read is not None and read.previews is False
    assert failing(ValueError(), retry=RetryPolicy()).previews is True


# --- the shape ---------------------------------------------------------------------------


def _members(proto: type) -> set[str]:
    """Every member a protocol declares, its bases' included."""
    found: set[str] = set()
    for cls in proto.__mro__:
        if cls.__module__ in ("typing", "builtins"):
            continue
        found |= {n for n in vars(cls) if not n.startswith("_")}
        found |= set(vars(cls).get("__annotations__", {}))
    return found


def test_the_ops_host_is_narrow_and_exposes_no_store() -> None:
    members = _members(OpsHost)
    assert len(members) <= 10, sorted(members)
    hints = inspect.get_annotations(OpsHost.store.fget)  # type: ignore[attr-defined]
    assert hints["return"] == "OpsStore"
    reads = {n for n in vars(OpsStore) if not n.startswith("_")}
    assert reads == {"get_ops", "get_approvals", "read_events"}


def test_ops_modules_and_classes_keep_their_size_budget() -> None:
    for path in OPS.rglob("*.py"):
        text = path.read_text()
        assert len(text.splitlines()) <= 600, path.name
        for node in ast.parse(text).body:
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                assert node.end_lineno - node.lineno + 1 <= 400, f"{path.name}:{node.name}"


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module, at the top level) of every `tether` import of a file."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tether"):
            found.append((node.module, id(node) in top))
    return found


def test_ops_reaches_down_only() -> None:
    above = (
        "tether.runtime.recovery",
        "tether.runtime.judge",
        "tether.runtime.round",
        "tether.runtime.run.liveness.probe",
        "tether.runtime.engine",
        "tether.runtime.worker",
    )
    for path in OPS.rglob("*.py"):
        bad = [m for m, _ in _imports(path) if m.startswith(above)]
        assert bad == [], path.name
        assert "getattr(" not in path.read_text(), path.name
    # Nothing under tools/ imports the runtime (ops may import tools, never the reverse).
    for path in (SRC / "tools").rglob("*.py"):
        assert not [m for m, _ in _imports(path) if m.startswith("tether.runtime")], path


def test_deliverables_imports_the_op_readers_at_the_top() -> None:
    path = SRC / "runtime" / "recovery" / "deliverables.py"
    ops_imports = [(m, top) for m, top in _imports(path) if m.startswith("tether.runtime.ops")]
    assert ops_imports == [("tether.runtime.ops.journal", True)]
