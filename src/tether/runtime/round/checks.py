"""Checks between rounds: stop requests, cancellation, goal changes, loop guards, budgets.

Budgets emit `budget.threshold` events at 50% and 80% and suspend
the task at 100%; since the check runs before every model call, the cap is never
exceeded by more than one call.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from tether import errors
from tether import events as ev
from tether.runtime import hints
from tether.runtime.run import outcome as out
from tether.runtime.run.outcome import Outcome

if TYPE_CHECKING:
    from tether.runtime.run.ports import ChecksHost, Journal, TaskView


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
                f"milestone {ms} used its {per_ms} rounds; raise the limit: {command}",
                why="max_rounds_per_milestone",
            )
    return await check_budget(view, journal)


def _budget_scopes(view: TaskView) -> list[tuple[str, dict[str, tuple[float | None, float]]]]:
    """(scope, {resource: (limit, used)}) for the task and the current milestone."""
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


async def check_budget(view: TaskView, journal: Journal) -> Outcome | None:
    """Threshold events at 50% and 80%; suspension at 100%, for
    the task and for the current milestone. The check runs before every model call, so
    a cap is never exceeded by more than one call."""
    marks = set(view.state.budget_marks)
    marks_crossed: list[ev.Event] = []
    exhausted = None
    for scope, used in _budget_scopes(view):
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
