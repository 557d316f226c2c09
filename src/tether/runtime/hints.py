"""The commands a wait tells a person to run, spelled one way everywhere.

Every wait ends with the exact command that answers it (the task id quoted for a
shell), so that what `status`, a notice or the CLI prints can be run as printed.
"""

from __future__ import annotations

import shlex


def resume(task_id: str, db: str | None = None) -> str:
    """`tether resume T`: goes on with the models and tools the task was started with;
    with `db`, the `--db` the printing command was given (`TETHER_DB` carries over by
    itself), so that the command works as printed from any folder."""
    return f"tether resume {shlex.quote(task_id)}" + (f" --db {shlex.quote(db)}" if db else "")


def tell(task_id: str) -> str:
    """`tether tell T '...'`: the answer to a question of the agent's."""
    return f"tether tell {shlex.quote(task_id)} 'YOUR ANSWER'"


def new_goal(task_id: str) -> str:
    """`tether edit T --objective '...'`: a new version of an ended task's goal (the edit
    queues it again and says how to continue)."""
    return f"tether edit {shlex.quote(task_id)} --objective 'NEW GOAL'"


def set_field(task_id: str, path: str, value: int) -> str:
    """`tether edit T --set PATH=VALUE`: the edit queues the task again and says how to
    continue."""
    return f"tether edit {shlex.quote(task_id)} --set {path}={value}"


def raise_limit(task_id: str, limit: str, used: int, current: int) -> str:
    """The command that raises a round limit (to twice what is used, at least twice the
    limit)."""
    return set_field(task_id, f"limits.{limit}", max(used, current) * 2)


def approve(task_id: str, request_id: str) -> str:
    """`tether approve T REQUEST` (the request id in full)."""
    return f"tether approve {shlex.quote(task_id)} {shlex.quote(request_id)}"


def reject(task_id: str, request_id: str) -> str:
    """`tether reject T REQUEST` (the request id in full)."""
    return f"tether reject {shlex.quote(task_id)} {shlex.quote(request_id)}"
