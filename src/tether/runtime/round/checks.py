"""Checks between rounds: stop requests, cancellation, goal changes, a person's requests
(pause, edit, a message), loop guards, budgets.

A person reaches a running task through the journal: `tether pause`, `edit` and `tell`
append an event (`task.pause_requested`, `task.edit_requested`, `user.message`) without
the lease. The run learns of them with the commit it makes anyway (a commit whose first
sequence number skips past its own last one: someone else wrote, see `Flow.committed`),
and `requests` reads them at the next round boundary: a message joins the context (the
next model request carries it, in the log's order), an edit is applied by the run as
the task's owner (a new version, then a fresh turn), a pause ends the run `paused`.

Budgets emit `budget.threshold` events at 50% and 80% and suspend
the task at 100%; since the check runs before every model call, the cap is never
exceeded by more than one call.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Protocol

from tether import errors, failpoints, lifecycle
from tether import events as ev
from tether.runtime import hints
from tether.runtime.round import history
from tether.runtime.run import outcome as out
from tether.runtime.run.outcome import Outcome
from tether.runtime.run.ports import ChecksHost
from tether.text import counted

if TYPE_CHECKING:
    from tether.runtime.round.context import Context
    from tether.runtime.run.ports import Journal, TaskView
    from tether.store.base import Store


class RequestHost(ChecksHost, Protocol):
    """What `requests` uses: the checks' objects, the run's store and token (an edit is
    applied as the task's owner), its context, and the words the judge hears."""

    store: Store
    token: int
    user_words: list[str]
    ctx: Context

    @property
    def task_id(self) -> str: ...


async def requests(run: RequestHost) -> Outcome | None:
    """A person's requests since the run last looked (at its first round, all those
    still pending): how the run must end (paused; a fresh turn after an edit), or None
    to go on, with new messages in the context."""
    flow, view = run.flow, run.view
    first = flow.scanned is None
    if not first and not flow.foreign:
        return None
    flow.foreign = False
    from tether import edits as E  # here: a run without requests needs no contract models

    upto = view.state.last_seq
    since = 0 if flow.scanned is None else flow.scanned
    found = [
        e
        for e in await run.store.read_events(run.task_id, after=since, types=set(E.REQUEST_TYPES))
        if e.seq <= upto
    ]
    flow.scanned = max(upto, since)
    pause, edits = E.pending_requests(found)
    if lifecycle.is_terminal(run.journal.status):
        pause = None  # an ended task is not paused (an edit still re-opens a finished one)
    if edits:
        for e in edits:
            request = ev.EditRequested.model_validate(e.data)
            await E.apply_requested(run.store, run.task_id, run.token, request, e.seq)
        return Outcome(
            "queued", reason="edited while running; a new turn", committed=True, again=True
        )
    if pause is not None:
        failpoints.hit("before_pause_apply")
        by = pause.data.get("by", "user")
        why = pause.data.get("reason") or ""
        return Outcome("paused", reason=f"paused by {by}" + (f": {why}" if why else ""))
    told = [e for e in found if e.type == "user.message"]
    if told and not first:  # a turn's start put the earlier ones in its context
        run.user_words.extend(str(e.data.get("text", "")) for e in told)
        # The context as the log orders it (the message before the round it preceded),
        # so that a request rebuilt from the log is the one the model saw.
        run.ctx.entries = await history.load_entries(
            run.store,
            run.task_id,
            snapshot=view.state.ctx_blob,
            after_seq=view.state.ctx_after_seq,
            upto_seq=upto,
        )
    return None


async def control(run: ChecksHost) -> Outcome | None:
    """The lease, a stop request, cancellation, a goal change, this run's round limit:
    how the run must end, or None to go on."""
    flow, task_id = run.flow, run.journal.task_id
    if flow.lease_lost:
        raise errors.StaleLease(task_id, flow.token, None)
    if flow.stop_requested():
        return out.interrupted("interrupted; resume to continue")
    if flow.commit_flags is not None and flow.commit_flags[1] is not None:
        # The task row as our last commit found it: no read of its own per round.
        cancel_requested, version = flow.commit_flags[0], flow.commit_flags[1]
    else:
        task = await run.records.task()
        cancel_requested, version = task.cancel_requested, task.version
    if cancel_requested:
        return out.cancelled()
    if version != run.view.task.version:
        # The goal changed under us: re-read everything in a fresh turn.
        return out.interrupted("goal changed; restarting the turn")
    most = run.config.max_rounds_this_run
    if most is not None and flow.rounds_this_run >= most:
        return out.interrupted("round limit for this run reached")
    return None


async def limits(view: TaskView, journal: Journal) -> Outcome | None:
    """Rounds per task and per milestone, and the budget: what the next model call may
    spend. The outcome that stops the run, or None."""
    rounds = view.state.rounds
    limit = view.spec.limits.max_rounds
    if rounds >= limit:
        return out.waiting(
            "human",
            f"max_rounds ({limit}) reached with {len(view.ledger.open_items())} items "
            "open; raise the limit: "
            + hints.raise_limit(journal.task_id, "max_rounds", rounds, limit),
            why="max_rounds",
        )
    ms = view.ledger.current_milestone()
    per_ms = view.spec.limits.max_rounds_per_milestone
    if ms is not None and per_ms is not None:
        used = view.state.milestone_rounds.get(ms, 0)
        if used >= per_ms:
            command = hints.raise_limit(journal.task_id, "max_rounds_per_milestone", used, per_ms)
            return out.waiting(
                "human",
                f"milestone {ms} used its {counted(per_ms, 'round')}; raise the limit: {command}",
                why="max_rounds_per_milestone",
            )
    return await check_budget(view, journal, ms)


#: No milestone given: `_budget_scopes` asks the ledger.
_ASK = "\0ask"


def _budget_scopes(
    view: TaskView, ms: str | None = _ASK
) -> list[tuple[str, dict[str, tuple[float | None, float]]]]:
    """(scope, {resource: (limit, used)}) for the task and the current milestone
    (`ms`, when the caller has it)."""
    b = view.spec.budget
    st = view.state
    scopes = [
        (
            "task",
            {
                "tokens": (b.tokens, st.tokens),
                "money_usd": (b.money_usd, st.cost_usd),
                "wall_seconds": (b.wall_seconds, st.wall_seconds),
                "rounds": (b.rounds, st.rounds),
            },
        )
    ]
    if ms == _ASK:
        ms = view.ledger.current_milestone()
    spec_ms = next((m for m in view.spec.milestones if m.id == ms), None)
    if spec_ms is not None:
        mb = spec_ms.budget
        mu = st.milestone_usage.get(spec_ms.id, {})
        scopes.append(
            (
                f"milestone:{ms}",
                {
                    "tokens": (mb.tokens, int(mu.get("tokens", 0))),
                    "money_usd": (mb.money_usd, float(mu.get("cost_usd", 0.0))),
                    "wall_seconds": (mb.wall_seconds, float(mu.get("wall_seconds", 0.0))),
                    "rounds": (mb.rounds, st.milestone_rounds.get(spec_ms.id, 0)),
                },
            )
        )
    return scopes


async def check_budget(
    view: TaskView, journal: Journal, milestone: str | None = _ASK
) -> Outcome | None:
    """Threshold events at 50% and 80%; suspension at 100%, for
    the task and for the current milestone (`milestone`, when the caller has it). The
    check runs before every model call, so a cap is never exceeded by more than one
    call."""
    b = view.spec.budget
    if (
        not view.state.budget_marks
        and not view.spec.milestones
        and not (b.tokens or b.money_usd or b.wall_seconds or b.rounds)
    ):
        # Nothing is capped and no mark was crossed: what the walk below finds (it runs
        # before every model call, and most tasks cap nothing).
        return None
    marks = set(view.state.budget_marks)
    marks_crossed: list[ev.Event] = []
    exhausted = None
    for scope, used in _budget_scopes(view, milestone):
        for res, (limit, val) in used.items():
            if not limit:
                continue
            pct = 100.0 * float(val) / float(limit)
            for level in (50, 80, 100):
                key = f"{scope}:{res}:{level}"
                if pct >= level and key not in marks:
                    marks.add(key)
                    marks_crossed.append(
                        ev.BudgetThreshold(
                            scope=scope,
                            resource=res,
                            percent=level,
                            used=float(val),
                            limit=float(limit),
                        )
                    )
            if pct >= 100 and exhausted is None:
                exhausted = (scope, res, float(limit))
    view.state.budget_marks = sorted(marks)
    if exhausted:
        scope, res, limit = exhausted
        how = "raise it in the milestone's budget (tether edit) and resume"
        if scope == "task":
            whole = res in ("tokens", "rounds")
            raised = str(int(limit * 2)) if whole else f"{limit * 2:.6f}".rstrip("0").rstrip(".")
            how = (
                f"raise it: tether edit {shlex.quote(journal.task_id)} --set budget.{res}={raised}"
            )
        return out.suspended(
            f"the {res} budget of the {scope.replace(':', ' ')} is used up; {how}",
            why="budget_exhausted",
            events=marks_crossed,
            kind="budget",
            scope=scope,
        )
    if marks_crossed:
        await journal.commit(marks_crossed)
    return None
