"""The status probe: a round in flight that went silent is asked whether it still works.

A worker whose loop is alive renews its lease, so the watchdog (`runtime.watch`) never
calls its task stalled, however long a round hangs on a provider connection or a tool.
`limits.round_timeout` is the hard stop; the probe is the early, cheap question. When a
round has committed nothing for `limits.probe_after` seconds (5 min by default), the
run's heartbeat asks the actor's model, in a separate tiny request, "still working on
ITEM? answer DONE, WORKING or STUCK":

- `WORKING` or `DONE`: recorded, and the silence clock starts again. `DONE` is never
  taken as completion: the verdicts still come from the ledger's rules and judges.
- `STUCK`, or two unusable answers in a row (no clear word, an error, no answer within
  `PROBE_TIMEOUT`): the contract's `limits.on_probe_failure` decides. `restart_round`
  cancels the round, recorded like a `round_timeout` cancel (an `audit.warning`
  `status_probe`) and recovered by the next claim like a crash, counted towards
  `limits.max_crash_restarts`; `ask_human` cancels the round and the task waits for a
  person with the reason, announced like a `NEED_HELP` (`runtime.notices`).

Each probe is a journaled model call (`model.called`, purpose `probe`, its request as a
blob and its response inline, as every call's), counted in the run's usage and spend
like any other and redacted, followed by a `probe.answered` event. A probe's events are
committed on their own, next to the round rather than with it: the round's staged
decision and blobs are left alone.

The probe runs only while a round is in flight and not waiting: a sleep on the run's
clock (an inline backoff until a retry time, a breaker's cooldown, a concurrency slot)
is waiting, not silence, and a task parked as `waiting` has no run at all. Time comes
from the run's clock, so tests move it by minutes in no time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from tether import errors, telemetry
from tether import events as ev
from tether.clock import Clock
from tether.models.base import Message, ModelRequest, ModelResponse, clean_response
from tether.runtime import hints
from tether.runtime.round import history
from tether.runtime.run.liveness.heartbeat import Heartbeat
from tether.runtime.run.model_calls import called_event
from tether.runtime.run.ports import ModelSet
from tether.runtime.run.state import RunView
from tether.store.base import blob_hash
from tether.text import exc_text

log = logging.getLogger("tether.probe")

#: Seconds a probe's model call may take before its answer counts as unusable.
PROBE_TIMEOUT = 60.0
#: Unusable answers in a row before the contract's `on_probe_failure` applies.
MAX_UNUSABLE = 2
#: The code of the `audit.warning` a failed probe records (and the reason of the wait
#: it may start: see `runtime.notices`).
CODE = "status_probe"

Answer = Literal["DONE", "WORKING", "STUCK"]
_WORDS: tuple[Answer, ...] = ("DONE", "WORKING", "STUCK")
_WORD = re.compile(r"\b(done|working|stuck)\b", re.IGNORECASE)
_LEAD = re.compile(r"^[\s\W_]*([A-Za-z]+)")

SYSTEM = (
    "You are an agent in the middle of a task; the runtime checks on you because your "
    "current step has been silent for a while. Reply with exactly one word: DONE, "
    "WORKING or STUCK."
)


def parse(text: str) -> Answer | None:
    """The answer in a probe's reply, or None when it is unusable.

    The first word decides when it is one of the three (`**Working.**`, `stuck - the
    tool hangs`); otherwise the reply must name exactly one of them (`I am still
    WORKING on it`). A reply naming several (`not stuck, working`) is unusable: asking
    again is cheaper than guessing."""
    lead = _LEAD.match(text)
    if lead is not None and lead.group(1).upper() in _WORDS:
        return _answer(lead.group(1))
    found = {m.upper() for m in _WORD.findall(text)}
    if len(found) == 1:
        return _answer(found.pop())
    return None


def _answer(word: str) -> Answer:
    up = word.upper()
    for a in _WORDS:
        if a == up:
            return a
    raise ValueError(word)  # pragma: no cover - callers pass one of the words


def request(task_id: str, item: str | None, title: str | None, round_no: int) -> ModelRequest:
    """The probe's request: no tools, no history, a handful of output tokens."""
    what = f"item {item} ({title})" if item and title else f"item {item}" if item else "the task"
    return ModelRequest(
        purpose="probe",
        system=SYSTEM,
        messages=(
            Message(
                "user",
                f"Status check for round {round_no}: are you still working on {what}? "
                "Answer DONE, WORKING or STUCK.",
            ),
        ),
        max_output_tokens=16,
        temperature=0.0,
        task_id=task_id,
        metadata={"probe": True},
    )


class ProbedJournal(Protocol):
    """The run's journal as the probe uses it: the task's id, and a commit next to the
    round in flight for the probe's own events."""

    task_id: str

    async def commit_aside(self, events: Sequence[ev.Event], blobs: Sequence[bytes]) -> None:
        """Commit the probe's events next to the round in flight."""
        ...


class ProbedRun(Protocol):
    """The parts of the run the probe watches: what it knows of its task (`view`: the
    contract's `limits`, read only once `loaded`; the usage the probe's calls count in;
    the ledger's item), the heartbeat (`beat`: the round in flight, and the one thing the
    probe does to the run, `cancel_round`), the journal and the models (the probe asks
    the actor's). It never writes the task's status: a failed probe that asks for a
    person says so (`Prober.escalation`) and the run applies it."""

    view: RunView
    beat: Heartbeat
    models: ModelSet

    @property
    def journal(self) -> ProbedJournal: ...


@dataclass(frozen=True)
class AskHuman:
    """What a failed probe asks for under `ask_human`: the task waits for a person, with
    the reason (`waiting`), after an `audit.warning` (`warning`); the status event's
    reason is `CODE`."""

    warning: ev.AuditWarning
    waiting: dict[str, Any]
    reason: str = CODE


class _WaitAwareClock:
    """The run's clock, telling the prober when the round sleeps on it (a backoff, a
    breaker's cooldown, a concurrency slot): waiting is not silence."""

    def __init__(self, inner: Clock, prober: Prober) -> None:
        self.inner = inner
        self.prober = prober

    def now(self) -> float:
        """The inner clock's time."""
        return self.inner.now()

    async def sleep(self, seconds: float) -> None:
        """Sleep on the inner clock; the probe holds off meanwhile."""
        self.prober.waits += 1
        try:
            await self.inner.sleep(seconds)
        finally:
            self.prober.waits -= 1
            self.prober.heard()


class Prober:
    """The status probe of one run (see the module docstring). The run's heartbeat calls
    `tick` at each beat; the run's commits call `heard`."""

    def __init__(self, run: ProbedRun, clock: Clock, *, enabled: bool = True) -> None:
        self.run = run
        self.inner = clock
        #: What the round's parts use as the run's clock (sleeps are seen).
        self.clock: Clock = _WaitAwareClock(clock, self)
        self.enabled = enabled
        self.timeout = PROBE_TIMEOUT
        self.waits = 0
        self.quiet_since = clock.now()
        self.task: asyncio.Task[None] | None = None
        #: Set when a failed probe cancels the round for a person (see `escalate`).
        self.ask_human = False
        #: What the model said to the failed probe (shown to the person).
        self.answers: list[str] = []
        #: When the last probe's answer came (the run's clock), before its commit.
        self.answered_at = self.quiet_since

    def heard(self, at: float | None = None) -> None:
        """The round committed something (or came back from a wait), or the model said
        it works (`at`: when its answer came; never before a commit heard meanwhile):
        not silent since."""
        self.quiet_since = self.inner.now() if at is None else max(at, self.quiet_since)

    def due(self) -> float | None:
        """Seconds of silence when a probe is due now, else None."""
        run = self.run
        if not self.enabled or run.beat.overdue is not None or not run.view.loaded:
            return None
        limit = run.view.spec.limits.probe_after
        # Every round starts right after a commit (the turn's, or the round's before),
        # so the silence counts from the last commit.
        if limit is None or run.beat.round_started is None:
            return None
        if self.waits or (self.task is not None and not self.task.done()):
            return None
        silent = self.inner.now() - self.quiet_since
        return silent if silent >= limit else None

    def tick(self) -> None:
        """Start a probe when one is due (never blocks the heartbeat)."""
        silent = self.due()
        if silent is not None:
            self.task = asyncio.create_task(self.probe(silent))

    async def close(self) -> None:
        """Stop a probe under way (the run ends)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def probe(self, silent: float) -> None:
        """Ask up to `MAX_UNUSABLE` times; act on the answer (see the module)."""
        run = self.run
        round_no = run.view.state.rounds + 1
        item = run.view.ledger.next_item()
        title = next((d.title for d, _ in run.view.ledger.items() if d.id == item), None)
        texts: list[str] = []
        since = self.quiet_since
        try:
            for attempt in range(1, MAX_UNUSABLE + 1):
                if self.quiet_since != since:
                    return  # the round committed meanwhile: it was not stuck after all
                answer, text = await self._ask(round_no, item, title, attempt, silent)
                if answer in ("WORKING", "DONE"):
                    # From the answer, not from this line: the answer's commit may let
                    # the run's clock move on before this coroutine resumes.
                    self.heard(at=self.answered_at)
                    return
                texts.append(text[:200])
                if answer == "STUCK":
                    why = f"the model says it is STUCK on {item or 'the task'}"
                    break
            else:
                why = f"{MAX_UNUSABLE} unusable answers to the status probe"
        except errors.TetherError as exc:
            # The store is away or the lease was lost: the probe can decide nothing now;
            # the heartbeat and the round see to the rest.
            log.warning("task %s: status probe abandoned: %s", run.journal.task_id, exc)
            self.heard()
            return
        if self.quiet_since != since:
            # The round committed while the model was asked: whatever it said, the loop
            # moves; the next silence is asked about afresh.
            log.info(
                "task %s: round %d moved on during its status probe", run.journal.task_id, round_no
            )
            return
        self.fail(
            f"round {round_no} silent for {silent:.0f}s (limits.probe_after "
            f"{run.view.spec.limits.probe_after:g}s): {why}",
            texts,
        )

    def fail(self, why: str, texts: Sequence[str]) -> None:
        """Cancel the round in flight; the engine records it per the contract."""
        run = self.run
        if run.beat.overdue is not None:
            return  # cancelled already (`limits.round_timeout`)
        self.ask_human = run.view.spec.limits.on_probe_failure == "ask_human"
        log.error(
            "task %s: %s; %s",
            run.journal.task_id,
            why,
            "asking a person" if self.ask_human else "restarting the round",
        )
        self.answers = list(texts)
        run.beat.cancel_round(why, CODE)

    def escalation(self, why: str) -> AskHuman:
        """After a failed probe cancelled the round (`ask_human`): what the run commits
        so the task waits for a person, with the reason. Nothing of the round's memory
        is committed (as after a `round_timeout`); the next turn recovers what the round
        left, like after a crash. Where the wait cannot be stored (the task was cancelled
        or taken over meanwhile, the store is away), the round ends like one past its
        `round_timeout`."""
        task_id = self.run.journal.task_id
        waiting: dict[str, Any] = {
            "kind": "human",
            "reason": f"{why}; to try again as it is: {hints.resume(task_id)}; to answer: "
            f"{hints.tell(task_id)}",
            "probe": {"answers": list(self.answers)},
        }
        warning = ev.AuditWarning(
            code=CODE, message=why, details={"round": self.run.view.state.rounds + 1}
        )
        return AskHuman(warning, waiting)

    async def _ask(
        self, round_no: int, item: str | None, title: str | None, attempt: int, silent: float
    ) -> tuple[Answer | Literal["unusable"], str]:
        """One probe call, journaled with its answer."""
        run = self.run
        model = run.models.actor
        req = request(run.journal.task_id, item, title, round_no)
        response: ModelResponse | None = None
        events: list[ev.Event] = []
        blobs: list[bytes] = []
        t0 = time.perf_counter()
        attrs = telemetry.model_call_attributes("probe", model.name, run.journal.task_id)
        try:
            # Not through the round's model port: a stop request ends the run, and the
            # run's end cancels the probe (`close`).
            with telemetry.span(f"chat {model.name}", attrs):
                response = await asyncio.wait_for(model.complete(req), self.timeout)
        except TimeoutError:
            text = f"no answer within {self.timeout:g}s"
        except Exception as exc:  # any failure of the call is an unusable answer
            text = f"model error: {type(exc).__name__}: {exc_text(exc)}"
            events.append(
                ev.ModelFailed(
                    call_id=f"{run.journal.task_id}.probe.failed",
                    purpose="probe",
                    model=model.name,
                    error=text,
                    transient=isinstance(exc, errors.ModelError) and exc.transient,
                )
            )
        if response is not None:
            response = clean_response(response)
            if not response.latency_ms:
                # To the microsecond, as `ModelCalls.call_model` measures (and the event
                # keeps: a finer latency would be stored in its response as well).
                ms = round((time.perf_counter() - t0) * 1000, 3)
                response = replace(response, latency_ms=ms)
            text = response.text
            called, blobs = self._record(model.name, req, response, round_no)
            events.append(called)
        answer = parse(text) if response is not None else None
        self.answered_at = self.inner.now()
        events.append(
            ev.ProbeAnswered(
                round=round_no,
                answer=answer or "unusable",
                item=item,
                attempt=attempt,
                silent_for=round(silent, 3),
                text=text[:500],
            )
        )
        await run.journal.commit_aside(events, blobs)
        return (answer or "unusable"), text

    def _record(
        self, model_name: str, req: ModelRequest, response: ModelResponse, round_no: int
    ) -> tuple[ev.ModelCalled, list[bytes]]:
        """The call's event and its request's blob, and its spend added to the run's usage
        (like the engine's `record_call`, without the round's staged blobs: see the
        module)."""
        from tether.models import pricing

        run = self.run
        req_data = history.pack(req.to_dict())
        name = response.model or model_name
        cost = float(pricing.cost_usd(name, response.usage))
        st = run.view.state
        # Not `last_call_at`: a probe's prompt warms none of the actor's prefix cache
        # (which `context.cache_ttl_seconds` is about).
        st.count_call("probe", response.usage, cost, run.view.ledger.current_milestone())
        called = called_event(
            f"{run.journal.task_id}.probe.{st.model_calls}",
            "probe",
            name,
            round_no,
            response,
            cost,
            response.text[:100].strip(),
            request_blob=blob_hash(req_data),
        )
        return called, [req_data]
