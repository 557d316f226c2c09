"""Creating tasks from specs, reading their status, pausing and cancelling them."""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import stat
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from tether import artifacts, errors, failpoints, lifecycle, placement
from tether import ledger as L
from tether.ledger import Ledger, Progress
from tether.runtime.run.state import RunState
from tether.runtime.takeover import owner_gone, take_from_gone
from tether.store.base import Store, TaskPatch, TaskRecord

if TYPE_CHECKING:  # reading a task's status needs no contract models
    from tether.spec import TaskSpec


def new_task_id() -> str:
    """A short, sortable, unique task id."""
    return f"t{int(time.time()):x}{secrets.token_hex(3)}"


def ledger_from_spec(spec: TaskSpec) -> L.Ledger:
    """A fresh ledger whose skeleton is the spec's objective, acceptance and items."""
    return L.from_spec(
        spec.objective,
        [(i.id, i.title, i.milestone, i.optional, tuple(i.after)) for i in spec.items],
        acceptance=[(a.id, a.description) for a in spec.acceptance],
        milestones=[(m.id, m.title) for m in spec.milestones],
    )


async def create_task(
    store: Store,
    spec: TaskSpec,
    *,
    task_id: str | None = None,
    workspace: str | Path | None = None,
    allow_broad_workspace: bool = False,
    reconnect_for: float = 0.0,
    launch: Mapping[str, Any] | None = None,
) -> TaskRecord:
    """Store a new queued task with its ledger; returns the task record.

    `launch`: how it is started, kept with it (`runtime.launch.record`: the model of
    `--model`, ...), so that `resume` and workers run it the same way.

    The workspace (`workspace`, else the spec's) is resolved and checked first (see
    `workspace_folder`): a bad one raises `UserError` and nothing is written.

    `reconnect_for`: for how many seconds a lost database is waited out. The task id is
    chosen here, before anything is sent, so a creation cut off by a lost connection is
    settled by looking the id up once the store answers again, never by blindly
    creating again (which could make a second task, or fail on the first)."""
    from tether import events as ev  # here: reading a task needs no event models

    tid = task_id or new_task_id()
    ws = workspace if workspace is not None else spec.workspace
    folder = workspace_folder(ws, allow_broad=allow_broad_workspace) if ws is not None else None
    ws_str = str(folder) if folder is not None else None
    ledger = ledger_from_spec(spec)
    preexisting = _preexisting(spec, folder) if folder is not None else {}
    # The workspace's identity: workers run the task only where this folder is.
    # (a folder not made yet, e.g. submitted from another machine, gets none).
    workspace_id = placement.mark(folder) if folder is not None and folder.is_dir() else None

    async def create() -> TaskRecord:
        return await store.create_task(
            task_id=tid,
            name=spec.name,
            spec=spec.model_dump(mode="json"),
            ledger=ledger,
            workspace=ws_str,
            events=[
                ev.TaskCreated(
                    name=spec.name,
                    objective=spec.objective,
                    items=len(spec.items),
                    workspace=ws_str,
                    preexisting=preexisting,
                    launch=dict(launch) if launch is not None else None,
                    workspace_id=workspace_id,
                )
            ],
        )

    if reconnect_for <= 0:
        return await create()
    deadline = time.monotonic() + reconnect_for
    delay = 0.1
    while True:
        try:
            return await create()
        except errors.StoreBusy:
            raise  # a peer's held lock, not an outage
        except errors.StoreUnavailable as exc:
            lost = exc
        while True:  # the creation's outcome is unknown: wait, then look
            left = deadline - time.monotonic()
            if left <= 0:
                raise errors.StoreUnavailable(
                    f"{lost.message} — the database went away and did not come back in "
                    f"{reconnect_for:g} s while task {tid} was being stored; whether it "
                    f"was is unknown: `tether status {tid}` tells once the database is back"
                ) from lost
            await asyncio.sleep(min(delay, left))
            delay = min(2.0, delay * 2)
            try:
                return await store.get_task(tid)  # it landed: the answer was lost
            except errors.TaskNotFound:
                break  # it did not land: create it now
            except errors.StoreUnavailable as exc:
                lost = exc


def _home() -> Path | None:
    try:
        return Path.home().resolve()
    except (OSError, RuntimeError, KeyError):
        return None


#: Folders that hold the system's own files: neither they nor anything in them is a
#: task's workspace without `allow_broad`.
SYSTEM_TREES = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/proc",
    "/run",
    "/sbin",
    "/sys",
    "/usr",
)
#: Folders shared by everything under them: not a workspace themselves.
SHARED_FOLDERS = (
    "/home",
    "/media",
    "/mnt",
    "/opt",
    "/srv",
    "/tmp",
    "/var",
    "/Users",
    "/Volumes",
    "/private",
    "/private/tmp",
)


def _broad(resolved: Path) -> str | None:
    """Why `resolved` is too broad a workspace, or None."""
    home = _home()
    for tree in SYSTEM_TREES:
        if resolved == Path(tree) or resolved.is_relative_to(tree):
            return f"is a system folder ({resolved}); the file tools would change the system"
    if str(resolved) in SHARED_FOLDERS:
        return f"is a shared folder ({resolved}); the file tools would reach what others keep there"
    if home is not None and resolved == home:
        return (
            f"is your home folder ({resolved}); the file tools would reach all your files "
            "(keys, settings)"
        )
    if home is not None and home.is_relative_to(resolved):
        return f"holds your home folder ({resolved}); the file tools would reach all your files"
    return None


def workspace_folder(
    path: str | Path, *, must_exist: bool = False, allow_broad: bool = False
) -> Path:
    """`path` resolved (symlinks followed), or `UserError` when it cannot be a task's
    workspace: not a usable path (empty, a NUL character, a symlink loop), the filesystem
    root, or — unless `allow_broad` (`--allow-broad-workspace`) — a system folder, a
    shared one (`/tmp`, `/home`, ...) or the home folder or one holding it (the file
    tools would reach every private key and setting); with `must_exist`, not an
    existing folder."""
    text = str(path)
    if not text.strip() or "\x00" in text:
        raise errors.UserError(f"workspace {text!r} is not a usable path")
    try:
        resolved = Path(path).resolve()
    except (OSError, RuntimeError, ValueError) as exc:
        raise errors.UserError(f"workspace {text}: cannot resolve the path ({exc})") from None
    if resolved.parent == resolved:
        raise errors.UserError(
            f"workspace {text} is the filesystem root ({resolved}); the file tools would "
            "reach every file: give the task a folder of its own"
        )
    why = None if allow_broad else _broad(resolved)
    if why is not None:
        raise errors.UserError(
            f"workspace {text} {why}; give the task a folder of its own, or pass "
            "--allow-broad-workspace if you mean it"
        )
    if must_exist:
        try:
            is_dir = resolved.is_dir()
        except OSError:
            is_dir = False
        if not is_dir:
            raise errors.UserError(f"workspace {text} is not a folder")
    return resolved


def _preexisting(spec: TaskSpec, workspace: Path) -> dict[str, str]:
    """Hashes of the files `done_when` file rules name that already exist, so that a
    leftover from an earlier run does not count as this task's work.

    A path the rule judge would not read (missing, not a regular file, out of the
    workspace through a symlink, too long for the file system) has no hash; an existing
    file that cannot be read is a `UserError` (the task could not tell later whether it
    changed)."""
    from tether.spec import FileRule

    out: dict[str, str] = {}
    root = workspace.resolve()
    for item in spec.items:
        rule = item.done_when
        if isinstance(rule, FileRule) and rule.fresh:
            digest = _digest_inside(root, rule.path, item.id)
            if digest is not None:
                out[rule.path] = digest
    return out


def _digest_inside(root: Path, rel: str, item_id: str) -> str | None:
    try:
        # Most named files do not exist yet: one `stat` says so, without resolving the
        # path part by part (with ten thousand items that was most of the creation).
        # A path `stat` cannot reach cannot be a regular file once resolved either.
        if not stat.S_ISREG(os.stat(os.path.join(root, rel)).st_mode):
            return None
    except (OSError, ValueError):
        return None
    try:
        path = (root / rel).resolve()
        if not path.is_relative_to(root) or not path.is_file():
            return None
    except (OSError, RuntimeError, ValueError):
        return None
    try:
        with path.open("rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise errors.UserError(
            f"item {item_id}: cannot read {rel} in the workspace to note what is there "
            f"before the task ({exc.strerror or exc})"
        ) from None


def budget_view(task: TaskRecord) -> dict[str, Any]:
    """Limits and use of the task's budget."""
    spec_budget = dict(task.spec.get("budget", {}))
    st = RunState.from_dict(task.usage)
    return {
        "limits": spec_budget,
        "used": {
            "tokens": st.tokens,
            "input_tokens": st.input_tokens,
            "output_tokens": st.output_tokens,
            "cached_tokens": st.cached_tokens,
            "money_usd": round(st.cost_usd, 6),
            "wall_seconds": round(st.wall_seconds, 3),
            "rounds": st.rounds,
            "model_calls": st.model_calls,
        },
    }


@dataclass(frozen=True)
class TaskStatus:
    """Where a task stands, as one object: its record, its goal ledger, and what its
    artifacts and sources say. `to_dict()` is the `status --json` document (a public
    contract: its fields are kept)."""

    task: TaskRecord
    ledger: Ledger
    artifacts: Mapping[str, Any]

    @property
    def status(self) -> str:
        """The lifecycle status."""
        return self.task.status

    @property
    def progress(self) -> Progress:
        """Items done, open, blocked and skipped."""
        return self.ledger.progress()

    @property
    def budget(self) -> dict[str, Any]:
        """Limits and use of the budget."""
        return budget_view(self.task)

    def to_dict(self) -> dict[str, Any]:
        """The `status --json` document."""
        return _status_doc(self.task, self.ledger, self.artifacts)


async def task_status(store: Store, task_id: str) -> TaskStatus:
    """The task's `TaskStatus` (`TaskNotFound` for an unknown id)."""
    task = await store.get_task(task_id)
    ledger = (await store.get_ledger(task_id)).to_ledger()
    views = dict(await artifacts.status_view(store, task_id, task.spec))
    undo = await compensations(store, task_id)
    if undo:
        views["compensations"] = undo
    from tether.runtime import launch

    # How it was started (model names, tool modules; no secrets), when it was recorded.
    views["launch"] = await launch.read(store, task_id)
    # A `running` task whose worker is provably gone: "running (owner gone)".
    views["owner_gone"] = owner_gone(task, store.clock.now())
    views["passed_over"] = await passed_over(store, task)
    return TaskStatus(task, ledger, views)


async def passed_over(store: Store, task: TaskRecord) -> list[dict[str, Any]]:
    """While the task is queued with nobody on it: the workers that passed it over (a
    tool, host tag or workspace they lack; `tether.placement`), newest first, each with
    its `worker`, `reason` and `at`."""
    if task.status != "queued" or (task.lease_expiry or 0) > store.clock.now():
        return []
    doc = await store.get_shared(placement.passed_key(task.task_id)) or {}
    return [{"worker": w, **seen} for w, seen in (doc.get("workers") or {}).items()]


async def compensations(store: Store, task_id: str) -> list[dict[str, Any]]:
    """The task's compensations, from its journal: each op a plan named to be undone
    (`op.exhausted`, policy `compensate`; `after`: the failed call), its compensation op
    (`by`) and how it ended (`op.compensated`: `compensated`, `done_by_hand`, `left`)
    or `pending`."""
    found: dict[str, dict[str, Any]] = {}
    for e in await store.read_events(task_id, types={"op.exhausted", "op.compensated"}):
        if e.type == "op.exhausted":
            for op_id in e.data.get("compensate") or ():
                found.setdefault(
                    str(op_id),
                    {"op_id": op_id, "by": f"{op_id}.compensate", "outcome": "pending",
                     "after": e.data.get("op_id")},
                )  # fmt: skip
        else:
            op_id = str(e.data.get("op_id"))
            row = found.setdefault(op_id, {"op_id": op_id, "after": None})
            row.update(by=e.data.get("by"), outcome=e.data.get("outcome"))
    return list(found.values())


async def status_dict(store: Store, task_id: str) -> dict[str, Any]:
    """The `status --json` document: `(await task_status(store, task_id)).to_dict()`."""
    return (await task_status(store, task_id)).to_dict()


def item_rows(ledger: Ledger) -> list[dict[str, Any]]:
    """The ledger's items as `status --json` lists them."""
    return [
        {
            "id": d.id,
            "title": d.title,
            "milestone": d.milestone,
            "status": s.status,
            "evidence": list(s.evidence),
            "attempts": s.attempts,
            "breaker": s.breaker,
            "note": s.note,
        }
        for d, s in ledger.items()
    ]


def _status_doc(task: TaskRecord, ledger: Ledger, views: Mapping[str, Any]) -> dict[str, Any]:
    items = item_rows(ledger)
    return {
        "task_id": task.task_id,
        "name": task.name,
        "version": task.version,
        "status": task.status,
        "stop_reason": task.stop_reason,
        "current_milestone": task.current_milestone,
        "workspace": task.workspace,
        "ledger": {
            "objective": ledger.skeleton.objective,
            "version": ledger.version,
            "progress": ledger.progress().to_dict(),
            "items": items,
        },
        "waivers": [
            {"id": d.id, "status": s.status, "reason": s.note}
            for d, s in ledger.items()
            if s.status in ("waived", "skipped")
        ],
        "budget": budget_view(task),
        "limits": dict(task.spec.get("limits", {})),
        "waiting": task.waiting,
        "lease": {
            "owner": task.lease_owner,
            "expires_at": task.lease_expiry,
            "fencing_token": task.fencing_token,
        },
        "heartbeat_at": task.heartbeat_at,
        **views,
        "created_at": task.created_at,
        "updated_at": task.updated_at,
        "last_seq": task.last_seq,
    }


@dataclass(frozen=True)
class Asked:
    """What asking a task to stop did (`cancel`, `pause`): done at once when nobody ran
    it, `requested` of the worker that holds its lease (`lease_owner`), or nothing when
    it had ended already. `status` is the task's status after it."""

    task_id: str
    outcome: str
    status: str
    lease_owner: str | None = None
    #: Per outcome, the line for a person (a format of the fields above).
    MESSAGES: ClassVar[Mapping[str, str]] = {}

    @property
    def message(self) -> str:
        """One line for a person."""
        return self.MESSAGES[self.outcome].format(**asdict(self))


@dataclass(frozen=True)
class CancelResult(Asked):
    """What `cancel` did: `outcome` is `already_ended` (the task was terminal; nothing
    written), `cancelled` (nobody ran it: it is cancelled now) or `requested` (a worker
    holds a live lease and stops between steps)."""

    outcome: Literal["already_ended", "cancelled", "requested"]

    MESSAGES: ClassVar[Mapping[str, str]] = {
        "already_ended": "task {task_id} is already {status}",
        "cancelled": "task {task_id} cancelled",
        "requested": "cancel requested; worker {lease_owner} stops between steps",
    }


async def cancel(store: Store, task_id: str, *, by: str = "user") -> CancelResult:
    """Ask a task to stop.

    A task nobody runs (no lease, an expired one by the store's clock, or one whose
    process is gone: `takeover.take_from_gone`) is cancelled at once
    (`cancelled_by_user`); a task a worker is running gets `cancel_requested`, and the
    worker stops between steps. A terminal task is left as it is. Raises
    `TaskNotFound` for an unknown id.
    """
    from tether import events as ev

    task = await take_from_gone(store, task_id, by=by)
    if lifecycle.is_terminal(task.status):
        return CancelResult(task_id, "already_ended", task.status)
    now = store.clock.now()
    if task.lease_owner is None or (task.lease_expiry or 0) <= now:
        change, patch = lifecycle.transition(
            task, "cancelled", "cancelled", stop_reason="cancelled_by_user", wake_at=lifecycle.KEEP
        )
        await store.commit(
            task_id,
            None,
            [ev.CancelRequested(by=by), change],
            task=TaskPatch(**patch, cancel_requested=True),
        )
        return CancelResult(task_id, "cancelled", "cancelled")
    await store.commit(
        task_id, None, [ev.CancelRequested(by=by)], task=TaskPatch(cancel_requested=True)
    )
    return CancelResult(task_id, "requested", task.status, task.lease_owner)


@dataclass(frozen=True)
class PauseResult(Asked):
    """What `pause` did: `already_ended` (terminal; nothing written), `already_paused`,
    `paused` (nobody ran it: it is paused now) or `requested` (a worker holds a live
    lease and pauses it at its next round boundary)."""

    outcome: Literal["already_ended", "already_paused", "paused", "requested"]

    MESSAGES: ClassVar[Mapping[str, str]] = {
        "already_ended": "task {task_id} is already {status}; nothing to pause",
        "already_paused": "task {task_id} is already paused",
        "paused": "task {task_id} paused",
        "requested": "pause requested; worker {lease_owner} pauses it at its next round boundary",
    }


async def pause(store: Store, task_id: str, *, by: str = "user", reason: str = "") -> PauseResult:
    """Pause a task until `resume` (`paused`: no worker takes it meanwhile).

    The request is journaled (`task.pause_requested`). A task nobody runs — queued,
    waiting, suspended, stalled, or running for an owner that is gone (taken from it
    first: `takeover.take_from_gone`) — is paused at once, its wait kept for the
    record; a task a live worker runs is paused by that worker at its next round
    boundary. Raises `TaskNotFound` for an unknown id."""
    from tether import events as ev
    from tether._validation import free_text

    why = free_text(reason, "the reason", limit=8000)
    task = await take_from_gone(store, task_id, by=by)
    if lifecycle.is_terminal(task.status):
        return PauseResult(task_id, "already_ended", task.status)
    if task.status == "paused":
        return PauseResult(task_id, "already_paused", task.status)
    request = ev.PauseRequested(by=by, reason=why)
    live = bool(task.lease_owner) and (task.lease_expiry or 0.0) > store.clock.now()
    if task.status == "running" or live:
        await store.commit(task_id, None, [request])
        failpoints.hit("after_pause_request")
        return PauseResult(task_id, "requested", task.status, task.lease_owner)
    change, patch = lifecycle.transition(
        task,
        "paused",
        f"paused by {by}" + (f": {why}" if why else ""),
        waiting=lifecycle.KEEP,
        wake_at=lifecycle.KEEP,
    )
    await store.commit(task_id, None, [request, change], task=TaskPatch(**patch))
    return PauseResult(task_id, "paused", "paused")


async def unpause(store: Store, task_id: str, *, by: str = "user") -> TaskRecord:
    """Queue a paused task again for the workers (the API's and dashboard's resume;
    `tether resume` runs it here instead). `UserError` unless it is paused."""
    task = await store.get_task(task_id)
    if task.status != "paused":
        raise errors.UserError(f"task {task_id} is {task.status}, not paused; nothing to resume")
    change, patch = lifecycle.transition(
        task, "queued", f"resumed by {by}", waiting=None, wake_at=None
    )
    await store.commit(task_id, None, [change], task=TaskPatch(**patch))
    return await store.get_task(task_id)
