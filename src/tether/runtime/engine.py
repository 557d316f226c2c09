"""The engine: claims a task and drives it, turn by turn and round by round.

A round has six phases (DESIGN.md section 3): read state, assemble context, decide
(one model call, journaled and committed before any tool runs), act (each call checked
against the allowlist and journaled as an op), verify, and write back (one commit,
guarded by the fencing token). Then the judge runs and its audited verdict is committed.

Crash points are marked with fail points. On restart the engine recovers in the order
of DESIGN.md section 6 and continues in a new turn; a round whose model response was
committed is finished from the recorded response, so a crash never pays twice for the
same decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether import errors, failpoints, lifecycle
from tether import events as ev
from tether import ledger as L
from tether.clock import Clock, SystemClock
from tether.models.base import Message, Model, ModelRequest, ModelResponse
from tether.runtime import judge as J
from tether.runtime.builtins import READ_ARTIFACT, default_registry
from tether.runtime.compaction import compact_context
from tether.runtime.completion import parse_review, review_request, run_acceptance
from tether.runtime.context import (
    Context,
    Entry,
    continuation_message,
    render_system,
    turn_message,
)
from tether.runtime.ops import Guard, OpOutcome, OpRunner, Pause
from tether.spec import TaskSpec, parse_spec
from tether.store.base import (
    UNSET,
    ApprovalRecord,
    ArtifactRecord,
    LedgerWrite,
    OpRecord,
    Store,
    TaskPatch,
    TaskRecord,
    blob_hash,
)
from tether.tools.registry import Tool, ToolRegistry

log = logging.getLogger("tether.engine")


@dataclass
class ModelSet:
    """Models by purpose. `judge=None` means rule judging only."""

    actor: Model
    judge: Model | None = None
    compact: Model | None = None
    review: Model | None = None

    @classmethod
    def single(cls, model: Model, *, review: bool = False) -> ModelSet:
        """One model for every purpose."""
        return cls(model, model, model, model if review else None)

    async def aclose(self) -> None:
        """Close the models' HTTP clients (each distinct model once)."""
        seen: set[int] = set()
        for m in (self.actor, self.judge, self.compact, self.review):
            if m is None or id(m) in seen:
                continue
            seen.add(id(m))
            close = getattr(m, "aclose", None)
            if close is not None:
                await close()


@dataclass(frozen=True)
class Snapshot:
    """What a progress display shows after each step."""

    task_id: str
    status: str
    round: int
    focus: str | None
    progress: L.Progress
    tokens: int
    cached_tokens: int
    input_tokens: int
    cost_usd: float
    message: str

    @property
    def cache_hit_rate(self) -> float:
        """Cached share of input tokens so far."""
        return self.cached_tokens / self.input_tokens if self.input_tokens else 0.0


@dataclass(frozen=True)
class RunResult:
    """How a run ended."""

    task_id: str
    status: str
    stop_reason: str | None
    waiting: Mapping[str, Any] | None
    rounds: int
    interrupted: bool = False


class _Stop(Exception):
    """The loop must stop (terminal, waiting, suspended, interrupted)."""


def _default_worker_id() -> str:
    import os

    return f"{socket.gethostname()}:{os.getpid()}"


def owner_is_dead(owner: str | None) -> bool:
    """True when a lease owner is a process of this machine that no longer exists."""
    if not owner:
        return False
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    import os

    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _preview(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit]


def _cost(model: str, response: ModelResponse) -> float:
    try:
        from tether.models import pricing
    except ImportError:  # pragma: no cover - pricing ships with the package
        return 0.0
    fn = getattr(pricing, "cost_usd", None)
    return float(fn(model, response.usage)) if fn else 0.0


class Engine:
    """Claims tasks and runs them. One engine instance runs one task at a time."""

    def __init__(
        self,
        store: Store,
        models: ModelSet,
        *,
        registry: ToolRegistry | None = None,
        clock: Clock | None = None,
        worker_id: str | None = None,
        lease_ttl: float = 60.0,
        on_progress: Callable[[Snapshot], None] | None = None,
        stop: asyncio.Event | None = None,
        max_rounds_this_run: int | None = None,
        services: Mapping[str, Any] | None = None,
        epoch_every_turn: bool = False,
        guard: Guard | None = None,
    ) -> None:
        self.store = store
        self.models = models
        self.registry = registry or default_registry(lambda: self.store)
        if self.registry.get(READ_ARTIFACT) is None:
            self.registry.add(default_registry(lambda: self.store).get(READ_ARTIFACT))  # type: ignore[arg-type]
        self.clock: Clock = clock or SystemClock()
        self.worker_id = worker_id or _default_worker_id()
        self.lease_ttl = lease_ttl
        self.on_progress = on_progress
        self.stop = stop or asyncio.Event()
        self.max_rounds_this_run = max_rounds_this_run
        self.services = dict(services or {})
        # The naive cache policy (re-render the system tail at every turn), for benchmarks.
        self.epoch_every_turn = epoch_every_turn
        # Shared breakers and concurrency limits per service (None: no limits).
        self.guard = guard

    # ---------------------------------------------------------------- entry point

    async def run(self, task_id: str, *, force: bool = False) -> RunResult:
        """Claim `task_id` and drive it until it is terminal, waiting or interrupted.

        A lease held by a dead process on this machine is taken over; `force` takes over
        any lease (for a worker known to be gone). Fencing keeps that safe.
        """
        before = await self.store.get_task(task_id)
        lease = await self.store.claim(self.worker_id, self.lease_ttl, task_id=task_id)
        if lease is None:
            task = await self.store.get_task(task_id)
            if lifecycle.is_terminal(task.status):
                return RunResult(task_id, task.status, task.stop_reason, task.waiting, 0)
            if force or owner_is_dead(task.lease_owner):
                lease = await self.store.claim(
                    self.worker_id, self.lease_ttl, task_id=task_id, force=True
                )
            if lease is None:
                raise errors.TaskBusy(task_id, task.lease_owner, task.lease_expiry)
        run = _TaskRun(self, task_id, lease.token, previous_owner=before.lease_owner)
        beat = asyncio.create_task(run.heartbeat())
        try:
            return await run.drive()
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
            with contextlib.suppress(errors.StaleLease, errors.TaskNotFound):
                await self.store.release(task_id, lease.token)

    async def run_next(self) -> RunResult | None:
        """Claim any claimable task and run it; None when there is nothing to do."""
        lease = await self.store.claim(self.worker_id, self.lease_ttl)
        if lease is None:
            return None
        run = _TaskRun(self, lease.task_id, lease.token)
        beat = asyncio.create_task(run.heartbeat())
        try:
            return await run.drive()
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
            with contextlib.suppress(errors.StaleLease, errors.TaskNotFound):
                await self.store.release(lease.task_id, lease.token)


class _TaskRun:
    """The state of one claimed task while an engine drives it."""

    def __init__(
        self, engine: Engine, task_id: str, token: int, previous_owner: str | None = None
    ) -> None:
        self.e = engine
        self.previous_owner = previous_owner
        self.store = engine.store
        self.task_id = task_id
        self.token = token
        self.rounds_this_run = 0
        self.started = time.monotonic()
        self.wall_mark = time.monotonic()
        self.lease_lost = False
        # Loaded in `load`.
        self.task: TaskRecord
        self.spec: TaskSpec
        self.ledger: L.Ledger
        self.usage: dict[str, Any] = {}
        self.ctx: Context
        self.workspace: Path | None = None
        self.user_words: list[str] = []
        self.preexisting: dict[str, str] = {}
        self.tools: list[Tool] = []
        self.status = "queued"

    # ------------------------------------------------------------ plumbing

    async def heartbeat(self) -> None:
        """Renew the lease while the run goes on; stop when it is lost."""
        interval = max(0.05, self.e.lease_ttl / 3)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.store.renew(self.task_id, self.token, self.e.lease_ttl)
            except errors.StaleLease:
                self.lease_lost = True
                return
            except errors.TetherError as exc:  # a passing store fault: try again next beat
                log.warning("lease renewal failed: %s", exc)

    def _tick_wall(self) -> None:
        now = time.monotonic()
        self.usage["wall_seconds"] = (
            float(self.usage.get("wall_seconds", 0.0)) + now - self.wall_mark
        )
        self.wall_mark = now

    async def commit(
        self,
        events: Sequence[ev.Event],
        *,
        status: str | None = None,
        stop_reason: str | None = None,
        ledger: L.Ledger | None = None,
        ops: Sequence[OpRecord] = (),
        artifacts: Sequence[ArtifactRecord] = (),
        approvals: Sequence[ApprovalRecord] = (),
        waiting: Any = UNSET,
        wake_at: Any = UNSET,
    ) -> int:
        """Commit events and projections (usage always) under our fencing token."""
        self._tick_wall()
        write = None
        if ledger is not None and ledger.version != self.ledger.version:
            write = LedgerWrite.of(ledger, self.ledger.version)
        patch = TaskPatch(
            status=status,
            stop_reason=stop_reason,
            usage=dict(self.usage),
            waiting=waiting,
            wake_at=wake_at,
            current_milestone=(ledger or self.ledger).current_milestone(),
        )
        res = await self.store.commit(
            self.task_id,
            self.token,
            events,
            task=patch,
            ledger=write,
            ops=ops,
            artifacts=artifacts,
            approvals=approvals,
        )
        if ledger is not None:
            self.ledger = ledger
        if status is not None:
            self.status = status
        self.usage["last_seq"] = res.last_seq
        return res.last_seq

    def _status_event(self, dst: str, stop_reason: str | None = None, reason: str = "") -> ev.Event:
        return ev.TaskStatusChanged(
            src=self.status, dst=dst, stop_reason=stop_reason, reason=reason
        )

    async def set_status(
        self,
        dst: str,
        stop_reason: str | None = None,
        reason: str = "",
        *,
        extra: Sequence[ev.Event] = (),
        waiting: Any = UNSET,
        wake_at: Any = UNSET,
        ops: Sequence[OpRecord] = (),
        approvals: Sequence[ApprovalRecord] = (),
    ) -> None:
        """Move the task (with its event) in one commit."""
        if waiting is UNSET and dst != "waiting":
            waiting = None
        await self.commit(
            [*extra, self._status_event(dst, stop_reason, reason)],
            status=dst,
            stop_reason=stop_reason,
            waiting=waiting,
            wake_at=wake_at,
            ops=ops,
            approvals=approvals,
        )

    def snapshot(self, message: str) -> None:
        """Tell the progress display."""
        if self.e.on_progress is None:
            return
        u = self.usage
        self.e.on_progress(
            Snapshot(
                task_id=self.task_id,
                status=self.status,
                round=int(u.get("rounds", 0)),
                focus=self.ledger.next_item(),
                progress=self.ledger.progress(),
                tokens=int(u.get("input_tokens", 0)) + int(u.get("output_tokens", 0)),
                cached_tokens=int(u.get("cached_tokens", 0)),
                input_tokens=int(u.get("input_tokens", 0)),
                cost_usd=float(u.get("cost_usd", 0.0)),
                message=message,
            )
        )

    async def put_json(self, obj: Any) -> str:
        """Store a JSON document as a blob."""
        return await self.store.put_blob(
            json.dumps(obj, ensure_ascii=False, sort_keys=True).encode("utf-8")
        )

    async def get_json(self, ref: str) -> Any:
        """Read a JSON blob."""
        return json.loads((await self.store.get_blob(ref)).decode("utf-8"))

    # ------------------------------------------------------------ the drive

    async def drive(self) -> RunResult:
        await self.load()
        if self.spec.mcp_servers and not lifecycle.is_terminal(self.status):
            from tether.tools.mcp import McpSources

            # MCP servers live as long as this run; their tools join the registry.
            async with McpSources(self.spec.mcp_servers) as sources:
                self.add_tools(sources.tools())
                return await self.drive_loaded()
        return await self.drive_loaded()

    def add_tools(self, tools: Sequence[Tool]) -> None:
        """Tools from a source opened for this run (MCP), filtered by the allowlist."""
        by_name = {t.name: t for t in tools}
        if self.spec.tools:
            extra = [by_name[n] for n in self.spec.tool_names() if n in by_name]
        else:
            extra = list(tools)
        have = {t.name for t in self.tools}
        self.tools.extend(t for t in extra if t.name not in have)
        self.known_tools.update(by_name)

    async def drive_loaded(self) -> RunResult:
        try:
            if lifecycle.is_terminal(self.status):
                return self.result()
            await self.start_turn()
            while True:
                await self.round()
        except _Stop:
            pass
        except errors.StaleLease:
            # Another worker owns the task now; nothing we tried was stored.
            log.warning("task %s: lease lost, stopping", self.task_id)
            self.task = await self.store.get_task(self.task_id)
            return RunResult(
                self.task_id,
                self.task.status,
                self.task.stop_reason,
                self.task.waiting,
                self.rounds_this_run,
                interrupted=True,
            )
        self.task = await self.store.get_task(self.task_id)
        return self.result()

    def result(self) -> RunResult:
        return RunResult(
            self.task_id,
            self.status,
            self.task.stop_reason if lifecycle.is_terminal(self.status) else None,
            self.task.waiting,
            self.rounds_this_run,
            interrupted=self.status in ("queued", "running") and self.e.stop.is_set(),
        )

    async def load(self) -> None:
        """Phase 1: read state from projections (never from chat memory)."""
        self.task = await self.store.get_task(self.task_id)
        self.status = self.task.status
        try:
            self.spec = parse_spec(self.task.spec, source=f"task {self.task_id}")
        except errors.SpecError as exc:
            raise errors.StoreError(
                f"stored spec of task {self.task_id} is invalid: {exc}"
            ) from exc
        self.ledger = (await self.store.get_ledger(self.task_id)).to_ledger()
        self.usage = dict(self.task.usage)
        self.usage.setdefault("last_seq", self.task.last_seq)
        self.workspace = Path(self.task.workspace) if self.task.workspace else None
        allow = self.spec.tool_names() if self.spec.tools else self.e.registry.names()
        if READ_ARTIFACT not in allow:
            allow.append(READ_ARTIFACT)
        self.tools = self.e.registry.allowed(allow)
        self.known_tools: dict[str, Tool] = {
            n: t for n in self.e.registry.names() if (t := self.e.registry.get(n))
        }
        words = await self.store.read_events(self.task_id, types={"user.message"})
        self.user_words = [str(w.data.get("text", "")) for w in words]
        created = await self.store.read_events(self.task_id, limit=1, types={"task.created"})
        self.preexisting = dict(created[0].data.get("preexisting", {})) if created else {}

    # ------------------------------------------------------------ turns and recovery

    async def start_turn(self) -> None:
        """Recover if needed, move to running, assemble the context, open a turn."""
        events: list[ev.Event] = []
        first = int(self.usage.get("turns", 0)) == 0
        kind = "start" if first else "resume"
        ledger = self.ledger
        if self.task.cancel_requested:
            await self.set_status("cancelled", "cancelled_by_user", "cancel requested")
            raise _Stop
        events.append(
            ev.LeaseClaimed(
                worker_id=self.e.worker_id,
                token=self.token,
                expires_at=self.e.clock.now() + self.e.lease_ttl,
            )
        )
        reopened: list[str] = []
        in_doubt: list[OpRecord] = []
        if not first:
            events.append(
                ev.RecoveryStarted(worker_id=self.e.worker_id, previous_owner=self.previous_owner)
            )
            events.append(
                ev.RecoveryStep(
                    step="version",
                    details={"version": self.task.version, "cancel": self.task.cancel_requested},
                )
            )
            artifacts = await self.store.get_artifacts(self.task_id)
            missing = []
            for art in artifacts:
                if not art.valid:
                    continue
                try:
                    data = await self.store.get_blob(art.blob_hash)
                    ok = blob_hash(data) == art.blob_hash
                except KeyError:
                    ok = False
                if not ok:
                    missing.append(art.artifact_id)
            events.append(
                ev.RecoveryStep(
                    step="artifacts", details={"checked": len(artifacts), "invalid": missing}
                )
            )
            ops = await self.store.get_ops(self.task_id)
            # Ops in doubt are settled by the interrupted round when it resumes: each one
            # is reconciled, re-sent with its original op id, or left to a human.
            in_doubt = [
                o
                for o in ops
                if o.status
                in ("intended", "dispatched", "unknown", "retry_wait", "awaiting_approval")
            ]
            events.append(
                ev.RecoveryStep(step="ops", details={"in_doubt": [o.op_id for o in in_doubt]})
            )
            good_ops = {o.op_id for o in ops if o.status == "succeeded"}
            good_arts = {
                a.artifact_id for a in artifacts if a.valid and a.artifact_id not in missing
            }

            def resolves(ref: str) -> bool:
                kind_, _, ident = ref.partition(":")
                return (kind_ == "op" and ident in good_ops) or (
                    kind_ == "artifact" and ident in good_arts
                )

            for d, s in ledger.items():
                if s.status == "done" and not any(resolves(r) for r in s.evidence):
                    ledger = L.reopen(ledger, d.id, "evidence no longer resolves").ledger
                    reopened.append(d.id)
            events.append(ev.RecoveryStep(step="ledger", details={"reopened": reopened}))
            if reopened:
                events.append(
                    ev.LedgerUpdated(
                        version=ledger.version,
                        diff=[{"item": i, "field": "status", "after": "pending"} for i in reopened],
                        cause="recovery",
                    )
                )
        if self.status != "running":
            events.append(self._status_event("running", reason=kind))
        await self.rebuild_context()
        epoch, why = self.epoch_needed(first)
        if epoch:
            self.ctx.system = render_system(self.spec, ledger)
            self.usage["system_blob"] = await self.store.put_blob(self.ctx.system.encode())
            self.usage["system_version"] = self.task.version
            self.usage["system_at"] = self.e.clock.now()
        text = turn_message(kind, ledger, epoch=epoch)
        turn = int(self.usage.get("turns", 0)) + 1
        self.usage["turns"] = turn
        self.usage["turn_started_round"] = int(self.usage.get("rounds", 0))
        if not first:
            events.append(
                ev.RecoveryStep(step="context", details={"entries": len(self.ctx.entries)})
            )
        events.append(
            ev.TurnStarted(
                turn=turn,
                kind=kind,
                epoch=epoch,
                epoch_reason=why,
                system_blob=self.usage.get("system_blob"),
                system_chars=len(self.ctx.system),
                message=text,
            )
        )
        await self.commit(events, status="running", ledger=ledger, waiting=None, wake_at=None)
        self.ctx.append(Entry("turn", [Message("user", text)]))
        self.snapshot(f"turn {turn} ({kind})")
        inflight = self.usage.get("inflight")
        if inflight:
            await self.round(resume=inflight)
        unjudged = self.usage.get("unjudged")
        if unjudged:
            facts = self.facts_from_dict(unjudged)
            await self.judge_round(facts, text="")

    def epoch_needed(self, first: bool) -> tuple[bool, str]:
        """Whether this turn re-renders the system prompt (DESIGN.md section 4)."""
        if first or not self.usage.get("system_blob") or not self.ctx.system:
            return True, "task start"
        if self.e.epoch_every_turn:
            return True, "every turn (naive policy)"
        if int(self.usage.get("system_version", 0)) != self.task.version:
            return True, "goal changed"
        if self.usage.get("epoch_due"):
            return True, "after compaction"
        last = float(self.usage.get("last_call_at", 0.0))
        if self.e.clock.now() - last > self.spec.context.cache_ttl_seconds:
            return True, "provider cache expired"
        return False, ""

    async def rebuild_context(self) -> None:
        """Context from the last snapshot plus the history entries after it."""
        schemas = tuple(t.schema() for t in self.tools)
        self.ctx = Context(system="", tools=schemas)
        if self.usage.get("system_blob"):
            with contextlib.suppress(KeyError):
                self.ctx.system = (await self.store.get_blob(self.usage["system_blob"])).decode()
        after = 0
        snap = self.usage.get("ctx_blob")
        if snap:
            doc = await self.get_json(snap)
            for e in doc["entries"]:
                self.ctx.append(
                    Entry(e["kind"], [Message.from_dict(m) for m in e["messages"]], e.get("round"))
                )
            after = int(self.usage.get("ctx_after_seq", 0))
        hist = await self.store.read_events(
            self.task_id,
            after=after,
            types={"turn.started", "round.committed", "judge.verdict", "user.message"},
        )
        pending_round = int((self.usage.get("inflight") or {}).get("round", 0))
        for h in hist:
            d = h.data
            if h.type == "turn.started" and d.get("message"):
                self.ctx.append(Entry("turn", [Message("user", d["message"])]))
            elif h.type == "round.committed" and d.get("messages_blob"):
                if pending_round and d.get("round") == pending_round:
                    continue
                msgs = await self.get_json(d["messages_blob"])
                self.ctx.append(
                    Entry("round", [Message.from_dict(m) for m in msgs], d.get("round"))
                )
            elif h.type == "judge.verdict" and d.get("continuation"):
                self.ctx.append(
                    Entry("continuation", [Message("user", d["continuation"])], d.get("round"))
                )
            elif h.type == "user.message":
                self.ctx.append(
                    Entry("turn", [Message("user", f"Message from the user: {d['text']}")])
                )
        ratio = self.usage.get("token_ratio")
        if ratio:
            self.ctx.calibrator.ratio = float(ratio)
            self.ctx.calibrator.samples = 1

    # ------------------------------------------------------------ the round

    async def guard(self) -> None:
        """Checks between steps: stop request, cancellation, lease, loop guards, budget."""
        if self.lease_lost:
            raise errors.StaleLease(self.task_id, self.token, None)
        if self.e.stop.is_set():
            await self.set_status("queued", reason="interrupted; resume to continue")
            raise _Stop
        task = await self.store.get_task(self.task_id)
        if task.cancel_requested:
            await self.set_status("cancelled", "cancelled_by_user", "cancel requested")
            raise _Stop
        if task.version != self.task.version:
            # The goal changed under us: re-read everything in a fresh turn.
            await self.set_status("queued", reason="goal changed; restarting the turn")
            raise _Stop
        if (
            self.e.max_rounds_this_run is not None
            and self.rounds_this_run >= self.e.max_rounds_this_run
        ):
            await self.set_status("queued", reason="round limit for this run reached")
            raise _Stop
        rounds = int(self.usage.get("rounds", 0))
        if rounds >= self.spec.limits.max_rounds:
            await self.set_status(
                "waiting",
                reason="max_rounds",
                waiting={
                    "kind": "human",
                    "reason": f"max_rounds ({self.spec.limits.max_rounds}) reached with "
                    f"{len(self.ledger.open_items())} items open; raise the limit and resume",
                },
            )
            raise _Stop
        ms = self.ledger.current_milestone()
        per_ms = self.spec.limits.max_rounds_per_milestone
        if ms is not None and per_ms is not None:
            used = int(self.usage.get("milestone_rounds", {}).get(ms, 0))
            if used >= per_ms:
                await self.set_status(
                    "waiting",
                    reason="max_rounds_per_milestone",
                    waiting={
                        "kind": "human",
                        "reason": f"milestone {ms} used its {per_ms} rounds; raise the limit "
                        "and resume",
                    },
                )
                raise _Stop
        await self.check_budget()

    async def check_budget(self) -> None:
        """Threshold events at 50% and 80%; suspension at 100% (DESIGN.md section 7)."""
        b = self.spec.budget
        u = self.usage
        used = {
            "tokens": (b.tokens, int(u.get("input_tokens", 0)) + int(u.get("output_tokens", 0))),
            "money_usd": (b.money_usd, float(u.get("cost_usd", 0.0))),
            "wall_seconds": (b.wall_seconds, float(u.get("wall_seconds", 0.0))),
            "rounds": (b.rounds, int(u.get("rounds", 0))),
        }
        marks = set(u.get("budget_marks", []))
        out: list[ev.Event] = []
        exhausted = None
        for res, (limit, val) in used.items():
            if not limit:
                continue
            pct = 100.0 * float(val) / float(limit)
            for level in (50, 80, 100):
                key = f"task:{res}:{level}"
                if pct >= level and key not in marks:
                    marks.add(key)
                    out.append(
                        ev.BudgetThreshold(
                            scope="task",
                            resource=res,
                            percent=level,
                            used=float(val),
                            limit=float(limit),
                        )
                    )
            if pct >= 100:
                exhausted = res
        u["budget_marks"] = sorted(marks)
        if exhausted:
            await self.set_status(
                "suspended",
                reason="budget_exhausted",
                extra=out,
                waiting={
                    "kind": "budget",
                    "reason": f"the {exhausted} budget is used up; raise it and resume",
                },
            )
            raise _Stop
        if out:
            await self.commit(out)

    async def call_model(self, model: Model, request: ModelRequest) -> ModelResponse:
        """One model call with latency measured; errors become `ModelError`."""
        t0 = time.perf_counter()
        try:
            resp = await model.complete(request)
        except errors.ModelError:
            raise
        except Exception as exc:
            raise errors.ModelError(f"{type(exc).__name__}: {exc}", transient=False) from exc
        if not resp.latency_ms:
            resp = ModelResponse(
                resp.text,
                resp.tool_calls,
                resp.usage,
                resp.model or model.name,
                (time.perf_counter() - t0) * 1000,
                resp.finish_reason,
            )
        return resp

    async def record_call(
        self,
        purpose: str,
        model: Model,
        request: ModelRequest,
        response: ModelResponse,
        round_no: int | None,
    ) -> ev.ModelCalled:
        """Blobs for the full request and response; the event keeps a summary."""
        req_blob = await self.put_json(request.to_dict())
        resp_blob = await self.put_json(response.to_dict())
        cost = _cost(response.model or model.name, response)
        u = response.usage
        self.usage["model_calls"] = int(self.usage.get("model_calls", 0)) + 1
        self.usage["input_tokens"] = int(self.usage.get("input_tokens", 0)) + u.input_tokens
        self.usage["output_tokens"] = int(self.usage.get("output_tokens", 0)) + u.output_tokens
        self.usage["cached_tokens"] = (
            int(self.usage.get("cached_tokens", 0)) + u.cached_input_tokens
        )
        self.usage["cost_usd"] = float(self.usage.get("cost_usd", 0.0)) + cost
        self.usage["last_call_at"] = self.e.clock.now()
        by_purpose = dict(self.usage.get("by_purpose", {}))
        p = dict(by_purpose.get(purpose, {}))
        for k, v in (
            ("calls", 1),
            ("input", u.input_tokens),
            ("output", u.output_tokens),
            ("cached", u.cached_input_tokens),
        ):
            p[k] = int(p.get(k, 0)) + v
        p["cost_usd"] = float(p.get("cost_usd", 0.0)) + cost
        by_purpose[purpose] = p
        self.usage["by_purpose"] = by_purpose
        names = ", ".join(c.name for c in response.tool_calls)
        summary = (response.text[:160] + (f" [calls: {names}]" if names else "")).strip()
        return ev.ModelCalled(
            call_id=f"{self.task_id}.{purpose}.{self.usage['model_calls']}",
            purpose=purpose,
            model=response.model or model.name,
            round=round_no,
            request_blob=req_blob,
            response_blob=resp_blob,
            input_tokens=u.input_tokens,
            output_tokens=u.output_tokens,
            cached_tokens=u.cached_input_tokens,
            cache_write_tokens=u.cache_write_tokens,
            latency_ms=response.latency_ms,
            cost_usd=cost,
            summary=summary,
            tool_calls=len(response.tool_calls),
        )

    async def model_failed(self, purpose: str, model: Model, exc: errors.ModelError) -> None:
        """A model call failed after its retries: wait, never die silently."""
        event = ev.ModelFailed(
            call_id=f"{self.task_id}.{purpose}.failed",
            purpose=purpose,
            model=model.name,
            error=str(exc),
            transient=exc.transient,
        )
        if exc.transient:
            wake = self.e.clock.now() + 60.0
            await self.set_status(
                "waiting",
                reason="model provider unavailable",
                extra=[event],
                waiting={
                    "kind": "external",
                    "reason": f"model provider failed: {exc}",
                    "until": wake,
                },
                wake_at=wake,
            )
        else:
            await self.set_status(
                "waiting",
                reason="model provider error",
                extra=[event],
                waiting={"kind": "human", "reason": f"model provider refused the call: {exc}"},
            )
        raise _Stop

    async def round(self, resume: Mapping[str, Any] | None = None) -> None:
        """One round: decide, act, verify, write back, judge."""
        if resume is None:
            await self.guard()
        round_no = int(resume["round"]) if resume else int(self.usage.get("rounds", 0)) + 1
        ledger = self.ledger
        events: list[ev.Event] = []
        if resume is None:
            focus = ledger.next_item()
            if focus is not None and ledger.item(focus).status == "pending":
                up = L.start(ledger, focus)
                ledger = up.ledger
                events.append(
                    ev.LedgerUpdated(
                        version=ledger.version, diff=up.diff.to_list(), cause="runtime"
                    )
                )
            await self.ensure_fits()
            request = self.ctx.request("act", task_id=self.task_id)
            estimate = self.ctx.raw_estimate()
            failpoints.hit("before_model_call")
            try:
                response = await self.call_model(self.e.models.actor, request)
            except errors.ModelError as exc:
                await self.model_failed("act", self.e.models.actor, exc)
                raise
            failpoints.hit("after_model_response")
            if response.usage.input_tokens:
                self.ctx.calibrator.observe(estimate, response.usage.input_tokens)
                self.usage["token_ratio"] = self.ctx.calibrator.ratio
            called = await self.record_call("act", self.e.models.actor, request, response, round_no)
            ms = ledger.current_milestone()
            if ms is not None:
                mr = dict(self.usage.get("milestone_rounds", {}))
                mr[ms] = int(mr.get(ms, 0)) + 1
                self.usage["milestone_rounds"] = mr
            self.usage["inflight"] = {
                "round": round_no,
                "focus": focus,
                "response_blob": called.response_blob,
            }
            turn = int(self.usage.get("turns", 1))
            # The decision is durable before any tool runs: a crash never pays twice.
            await self.commit(
                [ev.RoundStarted(round=round_no, turn=turn, item=focus), *events, called],
                ledger=ledger,
            )
        else:
            focus = resume.get("focus")
            response = ModelResponse.from_dict(await self.get_json(resume["response_blob"]))
        runner = OpRunner(self)
        try:
            outcomes = await runner.act(round_no, response)
        except Pause:
            raise _Stop from None
        await self.write_back(round_no, focus, response, outcomes, runner.pending_events)
        facts = J.RoundFacts(
            round=round_no,
            focus=focus,
            text=response.text,
            non_convergent=(self.usage.get("unjudged") or {}).get("non_convergent"),
            ops=tuple(
                J.OpSummary(
                    o.op_id,
                    o.tool,
                    dict(o.call.arguments or {}),
                    o.status,
                    o.summary,
                    o.error,
                    o.artifact.artifact_id if o.artifact else None,
                )
                for o in outcomes
            ),
        )
        if "NEED_HELP" in response.text:
            help_text = response.text[response.text.find("NEED_HELP") :][:500]
            self.usage.pop("unjudged", None)
            await self.set_status(
                "waiting",
                reason="needs_user_input",
                waiting={"kind": "human", "reason": help_text},
            )
            raise _Stop
        await self.judge_round(facts, response.text)

    # ------------------------------------------------------------ act

    async def write_back(
        self,
        round_no: int,
        focus: str | None,
        response: ModelResponse,
        outcomes: list[OpOutcome],
        extra: Sequence[ev.Event] = (),
    ) -> None:
        """Phase 6: one commit with the round's results, then the judge runs."""
        failpoints.hit("after_op_result")
        assistant = Message("assistant", response.text, tool_calls=response.tool_calls)
        msgs = [assistant] + [
            Message("tool", o.content, tool_call_id=o.call.id, name=o.call.name) for o in outcomes
        ]
        blob = await self.put_json([m.to_dict() for m in msgs])
        ops: list[OpRecord] = []
        arts: list[ArtifactRecord] = []
        events: list[ev.Event] = list(extra)
        for o in outcomes:
            if o.replayed:
                # Its result was committed before a crash or a pause: commit it, no more.
                events.append(ev.OpCommitted(op_id=o.op_id, round=round_no))
                continue
            events.append(
                ev.OpResult(
                    op_id=o.op_id,
                    tool=o.tool,
                    status=o.status,
                    summary=o.summary,
                    artifact_id=o.artifact.artifact_id if o.artifact else None,
                    error_class=o.error_class,
                    error=o.error,
                    duration_ms=o.duration_ms,
                )
            )
            if o.artifact is not None:
                arts.append(o.artifact)
                events.append(
                    ev.ArtifactStored(
                        artifact_id=o.artifact.artifact_id,
                        kind=o.artifact.kind,
                        name=o.artifact.name,
                        blob=o.artifact.blob_hash,
                        size=o.artifact.size,
                        source=o.op_id,
                    )
                )
            if o.record is not None:
                rec = o.record
                if rec.round == 0:
                    rec = OpRecord(
                        **{**rec.__dict__, "round": round_no, "call_index": outcomes.index(o)}
                    )
                ops.append(rec)
            events.append(ev.OpCommitted(op_id=o.op_id, round=round_no))
        events.append(
            ev.RoundCommitted(
                round=round_no,
                turn=int(self.usage.get("turns", 1)),
                ops=len(outcomes),
                text=response.text[:500],
                messages_blob=blob,
                item=focus,
            )
        )
        self.usage["rounds"] = round_no
        self.usage.pop("inflight", None)
        non_convergent = self.track_failures(outcomes)
        self.usage["unjudged"] = {
            "round": round_no,
            "focus": focus,
            "non_convergent": non_convergent,
            "ops": [
                {
                    "op_id": o.op_id,
                    "tool": o.tool,
                    "args": dict(o.call.arguments or {}),
                    "status": o.status,
                    "summary": o.summary,
                    "error": o.error,
                    "artifact_id": o.artifact.artifact_id if o.artifact else None,
                }
                for o in outcomes
            ],
            "text": response.text[:2000],
        }
        await self.commit(events, ops=ops, artifacts=arts)
        failpoints.hit("after_round_commit")
        self.rounds_this_run += 1
        self.ctx.append(Entry("round", msgs, round_no))
        self.snapshot(f"round {round_no}: {len(outcomes)} tool calls")

    def track_failures(self, outcomes: Sequence[OpOutcome]) -> str | None:
        """Count identical failures (same tool, same arguments, same error class); the
        first key that reaches the limit makes the round non-convergent."""
        counts = dict(self.usage.get("failure_keys", {}))
        hit = None
        limit = self.spec.limits.same_failure_repeats
        for o in outcomes:
            if o.status != "failed" or o.replayed:
                continue
            key = f"{o.tool}|{o.args_hash[-16:]}|{o.error_class}"
            counts[key] = int(counts.get(key, 0)) + 1
            if counts[key] >= limit and hit is None:
                hit = (
                    f"{o.tool} failed {counts[key]} times with the same arguments "
                    f"({o.error_class}: {(o.error or '')[:120]})"
                )
        # Keep the map small: only the most recent keys matter.
        self.usage["failure_keys"] = dict(list(counts.items())[-200:])
        return hit

    def facts_from_dict(self, d: Mapping[str, Any]) -> J.RoundFacts:
        return J.RoundFacts(
            round=int(d["round"]),
            focus=d.get("focus"),
            text=str(d.get("text", "")),
            non_convergent=d.get("non_convergent"),
            ops=tuple(
                J.OpSummary(
                    o["op_id"],
                    o["tool"],
                    o.get("args", {}),
                    o["status"],
                    o.get("summary", ""),
                    o.get("error"),
                    o.get("artifact_id"),
                )
                for o in d.get("ops", [])
            ),
        )

    # ------------------------------------------------------------ judge

    async def judge_round(self, facts: J.RoundFacts, text: str) -> None:
        """Rule judge, LLM judge, audit; commit the verdict; act on the decision."""
        env = _RuleEnv(self)
        verdicts = [await J.rule_verdict(self.spec, self.ledger, env)]
        extra_events: list[ev.Event] = list(env.events)
        judge_model = self.e.models.judge
        judges = ["rules"]
        if judge_model is not None:
            judges.append(judge_model.name)
            retry_note = None
            verdict = None
            for _attempt in range(2):
                req = J.judge_request(
                    self.spec,
                    self.ledger,
                    facts,
                    user_words=self.user_words,
                    task_id=self.task_id,
                    retry_note=retry_note,
                )
                try:
                    resp = await self.call_model(judge_model, req)
                except errors.ModelError as exc:
                    await self.commit(extra_events, artifacts=env.artifacts)
                    await self.model_failed("judge", judge_model, exc)
                    raise
                extra_events.append(
                    await self.record_call("judge", judge_model, req, resp, facts.round)
                )
                try:
                    verdict = J.parse_verdict(resp.text)
                    break
                except J.VerdictParseError as exc:
                    retry_note = str(exc)
            if verdict is None:
                extra_events.append(
                    ev.AuditWarning(
                        code="verdict_unparsed",
                        message=f"the judge's verdict could not be parsed twice ({retry_note}); "
                        "treated as no change",
                    )
                )
            else:
                verdicts.append(verdict)
        ops = await self.store.get_ops(self.task_id, statuses={"succeeded"})
        good_ops = {o.op_id for o in ops}
        good_arts = {a.artifact_id for a in await self.store.get_artifacts(self.task_id) if a.valid}
        good_arts |= {a.artifact_id for a in env.artifacts}

        def resolves(ref: str) -> bool:
            kind, _, ident = ref.partition(":")
            return (kind == "op" and ident in good_ops) or (
                kind == "artifact" and ident in good_arts
            )

        item_limits = {i.id: i.max_attempts for i in self.spec.items if i.max_attempts}
        outcome = J.audit(
            self.ledger,
            verdicts,
            resolves=resolves,
            facts=facts,
            limits=self.spec.limits,
            item_limits=item_limits,
            rule_items=frozenset(i.id for i in self.spec.items if i.done_when is not None),
        )
        new = outcome.update.ledger
        p = new.progress()
        for w in outcome.warnings:
            extra_events.append(
                ev.AuditWarning(code=w.code, message=w.message, details=dict(w.details))
            )
        continuation = ""
        if outcome.decision == "continue":
            changed = list(dict.fromkeys(outcome.update.diff.status_changes()))
            continuation = continuation_message(new, outcome.reason, changed=changed)
        verdict_event = ev.JudgeVerdict(
            round=facts.round,
            decision=outcome.decision,
            reason=outcome.reason,
            goal=self.spec.objective,
            done=p.done,
            total=p.total,
            percent=p.percent,
            changes=outcome.update.diff.to_list(),
            judges=judges,
            continuation=continuation,
        )
        events: list[ev.Event] = [*extra_events, verdict_event]
        if outcome.update.changed:
            events.append(ev.LedgerUpdated(version=new.version, diff=outcome.update.diff.to_list()))
        self.usage.pop("unjudged", None)
        failpoints.hit("before_ledger_write")
        await self.commit(events, ledger=new, artifacts=env.artifacts)
        if continuation:
            self.ctx.append(Entry("continuation", [Message("user", continuation)], facts.round))
        self.snapshot(f"round {facts.round}: {outcome.decision} ({p.done}/{p.total} done)")
        if outcome.decision == "satisfied":
            await self.complete(facts.round)
        elif outcome.decision == "abandon":
            await self.set_status("abandoned", "environment_unrecoverable", outcome.reason)
            raise _Stop
        elif outcome.decision == "need_user":
            await self.set_status(
                "waiting",
                reason="needs_user_input",
                waiting={"kind": "human", "reason": outcome.reason or "the judge asks for a human"},
            )
            raise _Stop

    async def complete(self, round_no: int) -> None:
        """The completion check on a proposed `satisfied`."""
        checks = await run_acceptance(self.spec, self.workspace)
        gaps = [f"acceptance {c.id} failed: {c.detail}" for c in checks if not c.passed]
        reviewer = self.e.models.review if self.spec.review else None
        if self.spec.review and reviewer is None:
            reviewer = self.e.models.judge or self.e.models.actor
        events: list[ev.Event] = []
        reopen: tuple[str, ...] = ()
        if not gaps and reviewer is not None:
            arts = [
                {"artifact_id": a.artifact_id, "name": a.name, "kind": a.kind, "size": a.size}
                for a in (await self.store.get_artifacts(self.task_id))[-50:]
                if a.valid
            ]
            req = review_request(self.spec, self.ledger, checks, arts, self.task_id)
            try:
                resp = await self.call_model(reviewer, req)
            except errors.ModelError as exc:
                await self.model_failed("review", reviewer, exc)
                raise
            events.append(await self.record_call("review", reviewer, req, resp, round_no))
            review = parse_review(resp.text)
            if not review.passed:
                gaps += list(review.gaps) or ["the reviewer did not accept the work"]
                reopen = tuple(r for r in review.reopen if self.ledger.has_item(r))
        passed = not gaps
        events.append(
            ev.CompletionChecked(
                passed=passed,
                results=[c.to_dict() for c in checks],
                reviewer=reviewer.name if reviewer else None,
                gaps=gaps,
            )
        )
        if passed:
            await self.set_status("satisfied", "delivered", "completion check passed", extra=events)
            self.snapshot("delivered")
            raise _Stop
        failures = int(self.usage.get("completion_failures", 0)) + 1
        self.usage["completion_failures"] = failures
        ledger = self.ledger
        for r in reopen:
            ledger = L.reopen(ledger, r, "reviewer: redo").ledger
        if ledger.version != self.ledger.version:
            events.append(ev.LedgerUpdated(version=ledger.version, diff=[], cause="review"))
        if failures >= 3 or (not ledger.open_items() and failures >= 2):
            await self.commit(events, ledger=ledger)
            await self.set_status(
                "waiting",
                reason="needs_user_input",
                waiting={
                    "kind": "human",
                    "reason": "the completion check failed "
                    f"{failures} times: " + "; ".join(gaps)[:800],
                },
            )
            raise _Stop
        text = continuation_message(ledger, "the completion check failed", gaps)
        events.append(
            ev.JudgeVerdict(
                round=round_no,
                decision="continue",
                reason="completion check failed",
                goal=self.spec.objective,
                done=ledger.progress().done,
                total=ledger.progress().total,
                percent=ledger.progress().percent,
                continuation=text,
                judges=["completion"],
            )
        )
        await self.commit(events, ledger=ledger)
        self.ctx.append(Entry("continuation", [Message("user", text)], round_no))

    # ------------------------------------------------------------ context budget

    async def ensure_fits(self) -> None:
        """Compact when the next request would exceed the input budget."""
        budget = self.spec.context.input_budget_tokens
        if self.ctx.estimate() > budget:
            await compact_context(self, budget)


class _RuleEnv:
    """What the rule judge may look at, with evidence artifacts it creates."""

    def __init__(self, run: _TaskRun) -> None:
        self.run = run
        self.workspace = run.workspace
        self.preexisting = run.preexisting
        self.artifacts: list[ArtifactRecord] = []
        self.events: list[ev.Event] = []

    async def succeeded_ops(self) -> list[OpRecord]:
        return await self.run.store.get_ops(self.run.task_id, statuses={"succeeded"})

    async def valid_artifacts(self) -> list[ArtifactRecord]:
        return [a for a in await self.run.store.get_artifacts(self.run.task_id) if a.valid]

    async def record_evidence(self, item_id: str, text: str) -> str:
        ref = await self.run.store.put_blob(text.encode("utf-8"))
        n = int(self.run.usage.get("evidence_count", 0)) + 1
        self.run.usage["evidence_count"] = n
        art = ArtifactRecord(
            artifact_id=f"{self.run.task_id}.ev{n}",
            task_id=self.run.task_id,
            kind="evidence",
            name=item_id,
            blob_hash=ref,
            size=len(text),
            source="rule judge",
            task_version=self.run.task.version,
        )
        self.artifacts.append(art)
        self.events.append(
            ev.ArtifactStored(
                artifact_id=art.artifact_id,
                kind="evidence",
                name=item_id,
                blob=ref,
                size=len(text),
                source="rule judge",
            )
        )
        return f"artifact:{art.artifact_id}"
