"""Where a task may run: its workspace's identity and the hosts it is pinned to.

A task's workspace is a folder on the machine that runs it. With workers on several
machines, the same path may be missing on one, or be another folder altogether. So
`create_task` leaves a marker file (`MARKER`) in the workspace holding a workspace id
(made once per folder, kept when the folder already has one) and records that id with
the task; a worker runs the task only where the folder is present and its marker holds
the same id, and passes the task over otherwise (`refusal`). A contract's `runs_on`
pins a task to workers started with one of those `--host-tag`s.

Nothing here touches the store: the worker records the reasons it passed a task over
in the shared document `passed_key(task_id)`, which `tether status` shows."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from tether import errors

#: The marker file a task's workspace holds: `{"workspace_id": "..."}`.
MARKER = ".tether-workspace"

#: A host tag: `tether worker --host-tag TAG`, a contract's `runs_on: [TAG, ...]`.
HOST_TAG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,62}$"
HostTag = Annotated[str, Field(pattern=HOST_TAG_PATTERN)]


def workspace_text(value: Any) -> Any:
    """A spec's `workspace` before validation: a bounded length (a NUL character is
    refused by `load_spec` and `create_task` with its own message)."""
    if isinstance(value, str) and len(value) > 4096:
        raise ValueError(f"is {len(value):,} characters long; at most 4096")
    return value


def host_tags(tags: Sequence[str]) -> tuple[str, ...]:
    """Checked host tags (`tether worker --host-tag`): `UserError` for a bad one."""
    for tag in tags:
        if not re.match(HOST_TAG_PATTERN, tag):
            raise errors.UserError(
                f"host tag {tag!r}: use letters, digits, '.', '_', ':' or '-' "
                "(at most 63 characters, starting with a letter or digit)"
            )
    return tuple(dict.fromkeys(tags))


def read_marker(folder: Path) -> str | None:
    """The workspace id in the folder's marker, or None (no marker, or not readable)."""
    try:
        doc = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    found = doc.get("workspace_id") if isinstance(doc, dict) else None
    return found if isinstance(found, str) and found else None


def mark(folder: Path) -> str:
    """The folder's workspace id: the one its marker holds, else a new one written
    there. `UserError` when the marker cannot be written."""
    found = read_marker(folder)
    if found is not None:
        return found
    new = uuid.uuid4().hex
    try:
        (folder / MARKER).write_text(json.dumps({"workspace_id": new}) + "\n", encoding="utf-8")
    except OSError as exc:
        raise errors.UserError(
            f"workspace {folder}: cannot write its marker {MARKER} ({exc.strerror or exc})"
        ) from None
    return new


def refusal(
    workspace: str | None,
    workspace_id: str | None,
    runs_on: Collection[str],
    tags: Collection[str],
) -> str | None:
    """Why a worker with host tags `tags` may not run a task here, or None: it is
    pinned to other hosts, or its workspace is missing or another folder."""
    if runs_on and not set(runs_on) & set(tags):
        return "waiting for a worker with host tag " + " or ".join(sorted(runs_on))
    problem = workspace_problem(workspace, workspace_id)
    if problem is None:
        return None
    return f"waiting for a worker with workspace {workspace} ({problem})"


def workspace_problem(workspace: str | None, workspace_id: str | None) -> str | None:
    """Why the task's workspace is not here, or None: the folder is missing (renamed,
    an unmounted share, another machine's), or it is another folder (its marker does not
    hold the task's workspace id)."""
    if workspace is None:
        return None
    folder = Path(workspace)
    if not folder.is_dir():
        return "not on this machine"
    if workspace_id is not None and read_marker(folder) != workspace_id:
        return (
            f"the folder there is another one: its {MARKER} does not hold workspace id "
            f"{workspace_id}"
        )
    return None


def not_here(task_id: str, workspace: str, problem: str, done: str) -> errors.UserError:
    """The refusal of a run or a check (`done`: "nothing was run") of a task whose
    workspace is not here (`workspace_problem`): its deliverables would all read as
    missing, its done items be reopened and their work redone in a new folder of the old
    name, so nothing is read or written in its name."""
    return errors.UserError(
        f"task {task_id}: its workspace {workspace} is not here ({problem}); {done}. "
        "Put the folder back (or mount it) and try again, or run it where the folder is "
        "(a worker there takes it up)"
    )


def passed_key(task_id: str) -> str:
    """The shared document of the workers that passed the task over, and why."""
    return f"passed-over:{task_id}"
