"""tether's errors, in three families.

1. **User mistakes** (`UserError`): a bad spec, a bad database URL, an unknown task.
   The CLI prints them as one paragraph and exits with code 2 (3 for an unknown task).
2. **Runtime failures** (`TetherError` and its subclasses that are not user errors):
   stale leases, illegal transitions, storage faults.
3. **Signals** that tools raise to steer the loop (`ToolSignal`): `RetryLater`,
   `ToolFailed`, `OutcomeUnknown`, `ValidationFailed`, `ApprovalRequired` (the call
   waits for a human, then runs again approved).

Every class carries structured fields; its docstring's first line is its default
message. Driver errors (sqlite3, psycopg) are translated once at the store boundary and
kept as `__cause__`.
"""

from __future__ import annotations

import time
from typing import Any

from tether.text import ts


class TetherError(Exception):
    """Something went wrong inside tether."""

    def __init__(self, message: str | None = None, **fields: Any) -> None:
        doc = (type(self).__doc__ or "").strip().splitlines()
        self.message = message or (doc[0] if doc else type(self).__name__)
        self.fields = fields
        super().__init__(self.message)


class UserError(TetherError):
    """The input given to tether is not usable."""

    exit_code = 2


# --- user mistakes -------------------------------------------------------------------


class SpecError(UserError):
    """The task spec is not valid."""

    def __init__(self, message: str, *, source: str = "<spec>", problems: list[str] | None = None):
        self.source = source
        self.problems = problems or []
        text = f"{source}: {message}"
        if self.problems:
            text += "\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(text, source=source, problems=self.problems)


class StoreConfigError(UserError):
    """The database URL or file cannot be used."""


class StoreUnavailable(TetherError):
    """The database does not answer: infrastructure, not the user's input (the command
    line exits 4, `run` and `resume` after waiting `--reconnect-for`; a worker retries)."""

    exit_code = 4


class StoreBusy(StoreUnavailable):
    """Another process holds the lock this step needs for longer than tether waits (a
    frozen or very slow process inside a transaction); nothing was written."""


class SchemaOutdated(UserError):
    """The database needs migrating, and this command only reads."""


class CorruptDatabase(UserError):
    """The database file is not a tether database or is damaged."""


class SchemaTooNew(UserError):
    """The database was written by a newer tether."""

    def __init__(self, found: int, supported: int, *, needs: int | None = None) -> None:
        needs = found if needs is None else needs
        super().__init__(
            f"the database schema is version {found}, but this tether understands up to "
            f"version {supported}, and the database's migrations need a tether of schema "
            f"{needs} or later (an old worker beside a newer database?); upgrade tether "
            "(pip install -U tether) to open it",
            found=found,
            supported=supported,
            needs=needs,
        )


class TaskNotFound(UserError):
    """No task with that id."""

    exit_code = 3

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        super().__init__(f"no task with id {task_id!r}", task_id=task_id)


# --- runtime failures ----------------------------------------------------------------


class StoreError(TetherError):
    """The store failed to carry out an operation."""


class StaleLease(TetherError):
    """The lease on this task is no longer ours: another worker owns it now."""

    def __init__(self, task_id: str, token: int, current: int | None) -> None:
        self.task_id = task_id
        self.token = token
        self.current = current
        super().__init__(
            f"task {task_id}: commit with fencing token {token} refused, "
            f"current token is {current}",
            task_id=task_id,
            token=token,
            current=current,
        )


class IllegalTransition(TetherError):
    """The task cannot move between these states."""

    def __init__(self, task_id: str | None, src: str, dst: str, why: str = "") -> None:
        self.task_id = task_id
        self.src = src
        self.dst = dst
        msg = f"illegal task transition {src} -> {dst}"
        if task_id:
            msg = f"task {task_id}: {msg}"
        if why:
            msg += f" ({why})"
        super().__init__(msg, task_id=task_id, src=src, dst=dst)


class LedgerError(TetherError):
    """The ledger transition is not allowed."""


class ConcurrentUpdate(TetherError):
    """Someone else changed this record since it was read."""


class ReplayMismatch(TetherError):
    """A replayed step does not match the recorded one."""


class ModelError(TetherError):
    """The model provider failed."""

    def __init__(
        self,
        message: str,
        *,
        transient: bool = False,
        status: int | None = None,
        attempts: int = 1,
    ):
        self.transient = transient
        self.status = status
        #: Requests sent to the provider before giving up.
        self.attempts = attempts
        super().__init__(message, transient=transient, status=status, attempts=attempts)


# --- signals tools raise -------------------------------------------------------------


class ToolSignal(Exception):
    """Base of the exceptions a tool raises to steer the loop."""


class ToolFailed(ToolSignal):
    """The tool failed; the message goes back to the model."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        self.retryable = retryable
        super().__init__(message)


class ServiceDown(ToolFailed):
    """The service behind the tool is down and the call was not sent (say, an MCP
    server that died and could not be restarted): the service's failure, not the call's.

    It is retried like any retryable failure; when the tool's retries run out the call
    is held back like one an open breaker stopped: the round costs its item nothing
    (no attempt, no step towards blocking it) and the task waits for the service.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=True)


class RetryLater(ToolSignal):
    """The tool cannot run now; try again after a delay."""

    def __init__(self, message: str = "retry later", *, delay: float = 1.0) -> None:
        self.delay = delay
        super().__init__(message)


class ApprovalRequired(ToolSignal):
    """The tool decided, while running, that this call needs a human's approval.

    Raise it before doing anything with effects (`raise ApprovalRequired("refund of
    $420 is over the $100 limit")`). The task waits with an approval request whose text
    is the message; once a human approves, the call runs again with the same op id and
    `ctx.approved` set, and the tool goes ahead; a rejection goes back to the model as
    "not permitted". For calls that always need approval, declare a risky `effect`
    instead (`overwrite`, `delete`, `send`, `pay`, `publish`), or refine it per call
    with `effect_of`.
    """


class TaskBusy(UserError):
    """Another worker holds this task's lease."""

    def __init__(
        self,
        task_id: str,
        owner: str | None,
        expires_at: float | None,
        now: float | None = None,
    ) -> None:
        self.task_id = task_id
        super().__init__(
            f"task {task_id} is being run by worker {owner!r} (lease until "
            f"{lease_time(expires_at, now)}); wait for it to finish or for its lease to "
            f"expire (its worker gone for good: tether resume {task_id} --force)",
            task_id=task_id,
            owner=owner,
        )


class AlreadySettled(UserError):
    """A decision about something already settled: a request decided or closed (the
    task ended, its item was waived or removed), or a task that has ended. Exit 2; the
    web API answers 409 with the reason."""


def lease_time(at: float | None, now: float | None = None) -> str:
    """A lease's end for a person, in UTC as `tether status` gives times, and how far off
    it is (`2026-12-05 01:02:03 UTC, in 42 s`)."""
    if at is None:
        return "unknown"
    stamp = f"{ts(at)} UTC"
    left = at - (time.time() if now is None else now)
    when = f"in {left:.0f} s" if left >= 0.5 else f"{-left:.0f} s ago" if left <= -0.5 else "now"
    return f"{stamp}, {when}"


class ValidationFailed(ToolSignal):
    """The call worked but its result breaks the tool's post-condition."""


class OutcomeUnknown(ToolSignal):
    """The request may have reached the service, but no answer came back."""
