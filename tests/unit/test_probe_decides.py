"""The status probe decides; the run acts. It reads the run's parts through the small
`ProbedRun` protocol, cancels the round through the heartbeat, and never writes the task's status:
under `ask_human` it returns the wait (`AskHuman`) for the run to commit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tether import events as ev
from tether import ledger as L
from tether.clock import FakeClock
from tether.models.scripted import ScriptedModel
from tether.runtime import hints
from tether.runtime.run.liveness import probe
from tether.runtime.run.liveness.heartbeat import Heartbeat
from tether.runtime.run.ports import ModelSet
from tether.runtime.run.state import RunView
from tether.spec import TaskSpec, parse_spec


def _spec(on_failure: str) -> TaskSpec:
    return parse_spec(
        {
            "name": "t",
            "objective": "o",
            "items": [{"id": "i1", "title": "one", "done_when": {"kind": "file", "path": "a"}}],
            "limits": {"probe_after": 60, "on_probe_failure": on_failure},
        }
    )


@dataclass
class FakeJournal:
    """The probe's journal: its commits are only recorded."""

    task_id: str = "t1"
    committed: list[ev.Event] = field(default_factory=list)

    async def commit_aside(self, events: Sequence[ev.Event], blobs: Sequence[bytes]) -> None:
        self.committed.extend(events)


class FakeBeat(Heartbeat):
    """The run's heartbeat with no store and no lease: it records the cancels."""

    def __init__(self, view: RunView) -> None:
        super().__init__(None, "t1", None, view, 60.0)  # type: ignore[arg-type]
        self.round_started = 0.0
        self.cancelled: list[tuple[str, str]] = []

    def cancel_round(self, why: str, code: str) -> None:
        self.cancelled.append((why, code))
        super().cancel_round(why, code)


class FakeRun:
    """A run as the probe sees it: no store, no engine."""

    def __init__(self, spec: TaskSpec) -> None:
        self.view = RunView(FakeClock())
        self.view.spec = spec
        self.view.ledger = L.from_spec("o", [("i1", "one", None)])
        self.beat = FakeBeat(self.view)
        self.journal = FakeJournal()
        self.models = ModelSet(ScriptedModel(["WORKING"]))

    @property
    def cancelled(self) -> list[tuple[str, str]]:
        return self.beat.cancelled

    @property
    def committed(self) -> list[ev.Event]:
        return self.journal.committed


def test_a_failed_probe_cancels_the_round_through_the_protocol() -> None:
    run = FakeRun(_spec("restart_round"))
    prober = probe.Prober(run, FakeClock())
    prober.fail("silent for 61s: STUCK", ["stuck"])
    assert run.cancelled == [("silent for 61s: STUCK", probe.CODE)]
    assert (prober.ask_human, prober.answers) == (False, ["stuck"])
    # Cancelled already: a second failure changes nothing.
    prober.fail("again", [])
    assert len(run.cancelled) == 1


def test_under_ask_human_it_returns_the_wait_for_the_run_to_commit() -> None:
    run = FakeRun(_spec("ask_human"))
    run.view.state.rounds = 4
    prober = probe.Prober(run, FakeClock())
    prober.fail("silent for 61s: 2 unusable answers", ["?", ""])
    assert prober.ask_human
    ask = prober.escalation("silent for 61s: 2 unusable answers")
    assert ask.reason == probe.CODE
    assert ask.warning == ev.AuditWarning(
        code=probe.CODE, message="silent for 61s: 2 unusable answers", details={"round": 5}
    )
    assert ask.waiting["kind"] == "human"
    assert ask.waiting["probe"] == {"answers": ["?", ""]}
    reason: Any = ask.waiting["reason"]
    assert reason.startswith("silent for 61s: 2 unusable answers; ")
    assert hints.resume("t1") in reason and hints.tell("t1") in reason
    # Nothing was written: the probe only said what should happen.
    assert run.committed == []
