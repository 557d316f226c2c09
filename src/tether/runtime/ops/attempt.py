"""One attempt of a tool call: wait for its stored retry time, pass the service guard,
send it (with the `dispatched` mark when the tool needs it), and say what happened.

`Attempts.once` returns a value (`results.Step`) and never decides what comes after:
a transient failure stores the next attempt's time (`Retry`), a lost response that
reconcile cannot settle is `InDoubt`, retries that ran out under an `ask_human` or
`compensate` policy are `Exhausted`; the runner dispatches on these.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import time
from collections.abc import Awaitable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from tether import errors, failpoints, loop_hold, telemetry
from tether import events as ev
from tether.artifacts import CALL_KEY
from tether.models.base import ToolCall
from tether.runtime.ops import results as R
from tether.runtime.ops.human.requests import Requests
from tether.runtime.ops.journal import evolve
from tether.runtime.ops.ports import RoundOps, ToolEnv
from tether.runtime.run import outcome as out
from tether.store.base import ArtifactRecord, OpRecord
from tether.text import clean_text, exc_text
from tether.tools import failures
from tether.tools.breaker import Transition
from tether.tools.registry import (
    Reconciliation,
    Tool,
    ToolContext,
    render_result,
    start_in_thread,
)
from tether.tools.retry import RetryPolicy, decide

T = TypeVar("T")
if TYPE_CHECKING:
    from collections.abc import Iterable

    from tether.runtime.run.ports import OpsHost


def _timed(call: Awaitable[T], what: str, run: OpsHost, book: RoundOps) -> Awaitable[T]:
    """`call` (a coroutine) timed on the loop (`loop_hold`): a stretch of it that held
    the loop is journaled with the round as an `audit.warning`, once it ends."""
    if not inspect.iscoroutine(call):
        return call  # an awaitable of another kind: awaited as it is
    return _told(loop_hold.Held(call, what, run.journal.task_id), book)


async def _told(held: loop_hold.Held[T], book: RoundOps) -> T:
    try:
        return await held
    finally:
        warning = loop_hold.warning(held)
        if warning is not None:
            book.events.append(warning)


@dataclass(frozen=True)
class _Asks:
    """A tool's `ApprovalRequired`: why it wants a human's approval."""

    why: str


def policy(run: OpsHost, tool: Tool) -> RetryPolicy:
    """The tool's retry policy, with the contract's overrides (attempts, what to do
    once they are exhausted)."""
    perm = run.view.spec.permission(tool.name)
    found = tool.retry
    if perm is not None and perm.max_attempts is not None:
        found = replace(found, max_attempts=perm.max_attempts)
    if perm is not None and perm.on_exhausted is not None:
        found = replace(found, on_exhausted=perm.on_exhausted)
    return found


def classify(tool: Tool, exc: Exception, first: bool = False) -> failures.Classified:
    """A tool's failure by class, the tool's own `classify` first (`first`: on the op's
    first attempt)."""
    cls_msg = failures.classify(exc, has_effect=tool.effect != "read", first=first)
    if tool.classify is not None:
        override = tool.classify(exc)
        if override is not None:
            cls_msg = failures.Classified(override, cls_msg.message, cls_msg.delay)
    return cls_msg


def validate(tool: Tool, raw: Any) -> str | None:
    """Run the tool's post-condition; a message when it is broken."""
    if tool.validate is None:
        return None
    try:
        verdict = tool.validate(raw)
    except errors.ValidationFailed as exc:
        return str(exc) or "the result failed validation"
    except Exception as exc:
        return f"validator raised {type(exc).__name__}: {exc_text(exc)}"
    if verdict is None or verdict is True:
        return None
    if verdict is False:
        return "the result failed validation"
    return str(verdict)


#: The loggers of the tools by name (`logging.getLogger` takes the logging module's
#: lock every call; a logger, once made, is the same object for good).
_LOGGERS: dict[str, logging.Logger] = {}


def _logger(tool: str) -> logging.Logger:
    found = _LOGGERS.get(tool)
    if found is None:
        found = _LOGGERS[tool] = logging.getLogger(f"tether.tool.{tool}")
    return found


class Attempts:
    """Sends the tool calls of one round, one attempt at a time."""

    def __init__(self, run: OpsHost, book: RoundOps, requests: Requests) -> None:
        self.run = run
        self.book = book
        self.requests = requests
        self.env: ToolEnv = run.tool_env
        self._rng: random.Random | None = None

    @property
    def rng(self) -> random.Random:
        """The retry jitter's generator, seeded on first use (seeding one from the OS
        costs more than most rounds' other bookkeeping, and most rounds retry nothing)."""
        if self._rng is None:
            self._rng = random.Random()
        return self._rng

    def context(self, tool: Tool, record: OpRecord, attempt: int) -> ToolContext:
        """The context a tool function receives."""
        run, env = self.run, self.env
        # A compensation (`<tool>.compensate`) has the secrets its tool was granted.
        perm = run.view.spec.permission(tool.name.removesuffix(".compensate"))
        return ToolContext(
            op_id=record.op_id,
            task_id=run.journal.task_id,
            task_version=run.view.task.version,
            fencing_token=env.token,
            workspace=env.workspace,
            logger=_logger(tool.name),
            services=env.services,
            attempt=attempt,
            approved=record.op_id in self.book.approved,
            owner_check=env.owner_check,
            secret_names=frozenset(perm.secrets if perm is not None else ()),
            round=record.round,
            call_index=record.call_index,
            private_files=env.private_files,
        )

    def count_validation(self) -> None:
        """Validation failures are counted (they go back to the model, limited)."""
        self.run.view.state.validation_failures += 1

    def success(
        self, call: ToolCall, tool: Tool, record: OpRecord, raw: Any, ms: float
    ) -> R.OpOutcome:
        """A call that succeeded; a large output becomes an artifact with a preview."""
        run = self.run
        text = render_result(raw)
        limit = run.view.spec.context.preview_chars
        artifact = None
        content = text
        # A tool that returns the slice the model asked for (read_artifact) is not
        # previewed again: that would send the model round in circles.
        if len(text) > limit and tool.previews:
            ref = run.journal.stage_blob(text.encode("utf-8"))
            artifact = ArtifactRecord(
                artifact_id=f"{record.op_id}.out",
                task_id=run.journal.task_id,
                kind="tool_output",
                name=f"{tool.name} output",
                blob_hash=ref,
                size=len(text),
                source=record.op_id,
                task_version=run.view.task.version,
                deps=(f"op:{record.op_id}",),
                meta={CALL_KEY: record.args_hash},
            )
            content = (
                f"{text[:limit]}\n[... {len(text) - limit} more characters. The full output is "
                f"artifact {artifact.artifact_id}; call read_artifact(artifact_id="
                f'"{artifact.artifact_id}", offset={limit}) to read on.]'
            )
        result: dict[str, Any] = {
            "summary": text[:200],
            "content": content,
            "artifact_id": artifact.artifact_id if artifact else None,
        }
        if record.task_version < self.book.goal_version:
            # A result that arrives for an op decided for an older goal is marked so.
            result = {**result, "superseded_by": run.view.task.version}
        rec = evolve(record, status="succeeded", result=result, error=None, next_attempt_at=None)
        return R.OpOutcome(
            call,
            record.op_id,
            tool.name,
            tool.effect,
            "succeeded",
            content,
            text[:200],
            artifact=artifact,
            record=rec,
            duration_ms=ms,
            args_hash=record.args_hash,
            volatile=R.waits(tool, rec),
            shifting=R.shifts(tool),
        )

    async def reconcile(self, tool: Tool, record: OpRecord) -> Reconciliation:
        """Ask the outside world whether an op happened (journaled)."""
        if tool.reconcile is None:
            return Reconciliation("unknown")
        found = policy(self.run, tool)
        attempt = 0
        while True:
            attempt += 1
            try:
                rec = await asyncio.wait_for(
                    _timed(
                        tool.reconcile(record, self.context(tool, record, record.attempts)),
                        f"the reconcile of tool {tool.name}",
                        self.run,
                        self.book,
                    ),
                    tool.timeout,
                )
                break
            except Exception as exc:  # a failing reconcile tells us nothing (yet)
                rec = Reconciliation(
                    "unknown", f"reconcile failed: {type(exc).__name__}: {exc_text(exc)}"
                )
                cls = classify(tool, exc).cls
                # A passing fault of the service (a 503, a timeout) is asked again on the
                # tool's schedule before a human has to decide.
                step = decide(
                    found, attempt, "transient" if cls == "unknown" else cls, rng=self.rng
                )
                if not step.retry or step.delay > self.env.inline_wait_max:
                    break
                await self.env.clock.sleep(step.delay)
        await self.run.journal.commit(
            [
                ev.OpReconciled(
                    op_id=record.op_id,
                    outcome=rec.outcome,
                    detail=clean_text(str(rec.result)[:200]),  # as a tool's text (`tether.text`)
                )
            ]
        )
        return rec

    async def wait(self, record: OpRecord, at: float) -> R.Wait | None:
        """Wait for a stored retry time in the worker if short; else the task parks."""
        clock = self.env.clock
        delay = at - clock.now()
        if delay <= 0:
            return None
        if delay <= self.env.inline_wait_max:
            await clock.sleep(delay)
            return None
        return R.Wait(
            out.waiting(
                "retry",
                f"{record.tool} failed transiently; attempt {record.attempts + 1} "
                f"is scheduled for {at:.0f}",
                why="retry scheduled",
                until=at,
            )
        )

    async def once(self, tool: Tool, call: ToolCall, record: OpRecord, t0: float) -> R.Step:
        """One attempt of a call, from its stored retry time to what happened (`t0`:
        when the call's first attempt began)."""
        if record.status == "retry_wait" and record.next_attempt_at is not None:
            wait = await self.wait(record, record.next_attempt_at)
            if wait is not None:
                return wait
        # No coroutine for a call no guard looks at (a tool of no service: most).
        held = await self._admit(tool, call, record) if tool.service else None
        if held is not None:
            return R.Settled(held)
        record = evolve(record, attempts=record.attempts + 1)
        raw, cls_msg, ms = await self._send(tool, record)
        if isinstance(raw, _Asks):
            return R.AsksApproval(record, raw.why)
        if cls_msg is None:
            problem = validate(tool, raw)
            if problem is not None:
                self.count_validation()
                return R.Settled(R.failure(call, tool, record, "validation", problem, ms))
            return R.Settled(self.success(call, tool, record, raw, ms))
        return await self._settle(tool, call, record, cls_msg, ms, t0)

    # ------------------------------------------------------------------ the service guard

    def _holder(self, record: OpRecord, attempt: int) -> str:
        """Who holds a concurrency slot: one attempt of this op."""
        return f"{self.run.journal.task_id}:{record.op_id}:{attempt}"

    def _breaker_events(self, transitions: Iterable[Transition]) -> None:
        for t in transitions:
            self.book.events.append(
                ev.BreakerChanged(service=t.service, src=t.src, dst=t.dst, reason=t.reason)
            )

    async def _admit(self, tool: Tool, call: ToolCall, record: OpRecord) -> R.OpOutcome | None:
        """The service guard's answer: None to go, or the outcome of a call held back."""
        guard = self.env.guard
        if guard is None or not tool.service:
            return None
        adm = await guard.admit(tool.service, self._holder(record, record.attempts + 1))
        self._breaker_events(adm.transitions)
        if adm.allowed:
            return None
        when = f" until {adm.retry_at:.0f}" if adm.retry_at else ""
        msg = f"service {tool.service} is unavailable{when}: {adm.reason}; work on something else"
        held = R.failure(call, tool, record, "transient", msg, 0.0)
        # Held back by the service's breaker (before any attempt, or after this call's
        # own failures opened it): the service is down, not the item's work; the round
        # waits for the breaker's next chance and costs the item nothing.
        held.retry_at = adm.retry_at
        return held

    async def _send(
        self, tool: Tool, record: OpRecord
    ) -> tuple[Any, failures.Classified | None, float]:
        """One attempt: (result, failure class or None, milliseconds). The guard's slot
        is given back and the outcome counted for the service's breaker."""
        run = self.run
        effectful = tool.effect != "read"
        # Only a non-idempotent tool that cannot reconcile needs the extra `dispatched`
        # mark: for the others a crash before or after sending is handled the same way.
        if effectful and not tool.idempotent and tool.reconcile is None:
            record = evolve(record, status="dispatched")
            await run.journal.commit(
                [ev.OpDispatched(op_id=record.op_id, attempt=record.attempts)], ops=[record]
            )
        guard = self.env.guard if tool.service else None
        holder = self._holder(record, record.attempts)
        t1 = time.perf_counter()
        raw: Any = None
        cls_msg: failures.Classified | None = None
        attrs = telemetry.tool_call_attributes(
            tool.name, record.op_id, run.journal.task_id, record.round
        )
        try:
            with telemetry.span(f"execute_tool {tool.name}", attrs):
                ctx = self.context(tool, record, record.attempts)
                # A sync tool runs in a thread: its future keeps the deadline, without
                # the task `wait_for` starts (no tool code runs in this task).
                started = start_in_thread(tool, record.args, ctx, tool.timeout)
                if started is not None:
                    raw = await started
                else:
                    raw = await asyncio.wait_for(
                        _timed(tool.fn(record.args, ctx), f"tool {tool.name}", self.run, self.book),
                        tool.timeout,
                    )
        except asyncio.CancelledError:
            if guard is not None and tool.service:
                # Give the slot back now; a leaked one would hold the limit for its ttl.
                await asyncio.shield(guard.release(tool.service, holder))
            raise
        except errors.ApprovalRequired as exc:
            if record.op_id in self.book.approved:
                # Asking twice for one call would loop: once approved, it is a failure.
                cls_msg = failures.Classified(
                    "deterministic", f"the tool asked for approval again: {exc_text(exc)}", None
                )
            else:
                raw = _Asks(str(exc) or "the tool asks for a human's approval")
        except errors.StaleLease:
            raise  # `ctx.ensure_owner()`: the task is another worker's now
        except Exception as exc:  # classified here; a tool's bug is the tool's failure
            # A first attempt of an op no earlier run took up: no request before it
            # carried its key (a 409 then did nothing, `retry.classify_status`).
            first = record.attempts == 1 and record.op_id not in self.book.recovered
            cls_msg = classify(tool, exc, first=first)
        failpoints.hit("after_op_dispatch")
        ms = (time.perf_counter() - t1) * 1000
        if guard is not None and tool.service:
            # The service answered unless the failure is on the way to or from it; a 429
            # is an answer too (it is up, asking for less): the retry waits as told.
            ok = (
                cls_msg is None or cls_msg.cls in ("deterministic", "validation") or cls_msg.limited
            )
            transitions: list[Transition] = []
            if self._verdict_waits(tool, cls_msg):
                # A lost response the tool can reconcile: the breaker's verdict waits
                # for the reconcile (`_settle`), which may prove the call done.
                await guard.release(tool.service, holder)
            else:
                transitions = await guard.finish(tool.service, ok, holder)
            self._breaker_events(transitions)
        return raw, cls_msg, ms

    def _verdict_waits(self, tool: Tool, cls_msg: failures.Classified | None) -> bool:
        """Whether a call's outcome is counted for its service's breaker only after a
        reconcile: a lost response that reconcile proves done is a success, not one of
        the failures that open the breaker for every task on the database."""
        return (
            self.env.guard is not None
            and bool(tool.service)
            and tool.reconcile is not None
            and cls_msg is not None
            and cls_msg.cls == "unknown"
        )

    async def _count(self, tool: Tool, record: OpRecord, *, ok: bool) -> None:
        """Give the service's breaker the verdict of a reconciled call."""
        guard = self.env.guard
        if guard is None or not tool.service:
            return
        holder = self._holder(record, record.attempts)
        self._breaker_events(await guard.record(tool.service, ok, holder))

    # ------------------------------------------------------------------ settling

    async def _settle(
        self,
        tool: Tool,
        call: ToolCall,
        record: OpRecord,
        cls_msg: failures.Classified,
        ms: float,
        t0: float,
    ) -> R.Step:
        """A failed attempt: what happened by class (see the module's docstring)."""
        cls, msg = cls_msg.cls, cls_msg.message
        if cls == "unknown":
            rec = await self.reconcile(tool, record)
            if self._verdict_waits(tool, cls_msg):
                await self._count(tool, record, ok=rec.outcome == "done")
            if rec.outcome == "done":
                return R.Settled(self.success(call, tool, record, rec.result, ms))
            if rec.outcome == "unknown" and not tool.idempotent:
                return R.InDoubt(record, cls_msg, ms)
            # not done, or idempotent: sending again with the same key is safe.
            return await self.schedule(tool, call, record, cls_msg, ms)
        if cls in ("deterministic", "validation"):
            if cls == "validation":
                self.count_validation()
            ran = (time.perf_counter() - t0) * 1000
            return R.Settled(R.failure(call, tool, record, cls, msg, ran))
        return await self.schedule(tool, call, record, cls_msg, ms)

    async def schedule(
        self,
        tool: Tool,
        call: ToolCall,
        record: OpRecord,
        cls_msg: failures.Classified,
        ms: float,
    ) -> R.Settled | R.Retry | R.Exhausted:
        """A transient failure: the next attempt stored, or the retries ran out."""
        msg = cls_msg.message
        found = policy(self.run, tool)
        # After a human's "try again" the schedule starts afresh (same op, same key).
        attempt = record.attempts - await self.requests.attempt_base(record)
        decision = decide(found, attempt, "transient", hint=cls_msg.delay, rng=self.rng)
        clock = self.env.clock
        if not decision.retry:
            failed = R.failure(call, tool, record, "transient", f"{msg} ({decision.reason})", ms)
            # A volatile tool's transient failure that outlasted its retries (a status
            # page answering 503 through an outage) is its "not now", as `RetryLater`'s:
            # asked again, it is waiting on the service, bounded by the rounds cap. So is
            # any tool's refusal that said when to come back (a 503 or 429 with
            # `Retry-After`: a maintenance window, a rate limit): never a loop of the
            # item's own (`phases.track_failures`).
            later = cls_msg.later or cls_msg.delay is not None or cls_msg.limited
            if (later or tool.volatile) and failed.record is not None:
                failed.record = R.said_later(failed.record)
                failed.volatile = R.waits(tool, failed.record)
            if cls_msg.down:
                # The service is down, not the item's work: held back like a call an open
                # breaker stopped, at no cost to the item; the task waits for the service.
                failed.retry_at = clock.now() + max(1.0, found.max_delay)
            elif found.on_exhausted == "ask_human":
                return R.Exhausted(failed, record, "ask_human")
            elif found.on_exhausted == "compensate":
                return R.Exhausted(failed, record, "compensate")
            return R.Settled(failed)
        next_at = clock.now() + decision.delay
        record = evolve(
            record,
            status="retry_wait",
            next_attempt_at=next_at,
            error={"class": "transient", "message": msg},
        )
        await self.run.journal.commit(
            [
                ev.OpRetryScheduled(
                    op_id=record.op_id,
                    attempt=record.attempts,
                    next_attempt_at=next_at,
                    delay=decision.delay,
                    error_class="transient",
                    error=msg[:300],
                )
            ],
            ops=[record],
        )
        return R.Retry(record)
