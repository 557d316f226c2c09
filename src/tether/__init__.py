"""tether: a durable runtime for long-running LLM agents.

The public Python API. Everything else is importable but may change without notice.

The names below are loaded on first use (PEP 562): `import tether` stays cheap, so the
`tether` command starts fast and a command that needs no extra never imports one.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tether.clock import Clock, FakeClock, SystemClock
    from tether.decisions import abandon_task, retry_item, waive_item
    from tether.edits import edit_task, tell
    from tether.errors import (
        ApprovalRequired,
        OutcomeUnknown,
        RetryLater,
        SpecError,
        StaleLease,
        TaskNotFound,
        TetherError,
        ToolFailed,
        UserError,
        ValidationFailed,
    )
    from tether.ledger import Ledger
    from tether.models.base import Message, Model, ModelRequest, ModelResponse, ToolCall, Usage
    from tether.models.scripted import ScriptedModel, tool_call
    from tether.runtime.engine import Engine, ModelSet, RunResult
    from tether.runtime.takeover import confirm_stopped
    from tether.runtime.tasks import TaskStatus, create_task, status_dict, task_status
    from tether.runtime.watch.sweep import sweep
    from tether.spec import TaskSpec, load_spec, parse_spec
    from tether.store import Store, open_store
    from tether.store.base import OpRecord
    from tether.tools.builtin.files import default_registry
    from tether.tools.registry import (
        Compensation,
        Reconciliation,
        Tool,
        ToolContext,
        ToolRegistry,
        tool,
    )
    from tether.tools.retry import RetryPolicy

    __version__: str

#: Where each public name lives (the module is imported when the name is first used).
_WHERE: dict[str, str] = {
    **dict.fromkeys(("Clock", "FakeClock", "SystemClock"), "tether.clock"),
    **dict.fromkeys(("abandon_task", "retry_item", "waive_item"), "tether.decisions"),
    **dict.fromkeys(("edit_task", "tell"), "tether.edits"),
    **dict.fromkeys(
        (
            "ApprovalRequired",
            "OutcomeUnknown",
            "RetryLater",
            "SpecError",
            "StaleLease",
            "TaskNotFound",
            "TetherError",
            "ToolFailed",
            "UserError",
            "ValidationFailed",
        ),
        "tether.errors",
    ),
    "Ledger": "tether.ledger",
    **dict.fromkeys(
        ("Message", "Model", "ModelRequest", "ModelResponse", "ToolCall", "Usage"),
        "tether.models.base",
    ),
    **dict.fromkeys(("ScriptedModel", "tool_call"), "tether.models.scripted"),
    "default_registry": "tether.tools.builtin.files",
    **dict.fromkeys(("Engine", "ModelSet", "RunResult"), "tether.runtime.engine"),
    "confirm_stopped": "tether.runtime.takeover",
    **dict.fromkeys(
        ("TaskStatus", "create_task", "status_dict", "task_status"), "tether.runtime.tasks"
    ),
    "sweep": "tether.runtime.watch.sweep",
    **dict.fromkeys(("TaskSpec", "load_spec", "parse_spec"), "tether.spec"),
    **dict.fromkeys(("Store", "open_store"), "tether.store"),
    "OpRecord": "tether.store.base",
    **dict.fromkeys(
        ("Compensation", "Reconciliation", "Tool", "ToolContext", "ToolRegistry", "tool"),
        "tether.tools.registry",
    ),
    "RetryPolicy": "tether.tools.retry",
}


def __getattr__(name: str) -> Any:
    """Load a public name on first use and keep it (later lookups skip this)."""
    if name == "__version__":
        from tether._version import installed_version

        value: Any = installed_version()
    elif name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
    else:
        raise AttributeError(f"module 'tether' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "ApprovalRequired",
    "Clock",
    "Compensation",
    "Engine",
    "FakeClock",
    "Ledger",
    "Message",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "ModelSet",
    "OpRecord",
    "OutcomeUnknown",
    "Reconciliation",
    "RetryLater",
    "RetryPolicy",
    "RunResult",
    "ScriptedModel",
    "SpecError",
    "StaleLease",
    "Store",
    "SystemClock",
    "TaskNotFound",
    "TaskSpec",
    "TaskStatus",
    "TetherError",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolFailed",
    "ToolRegistry",
    "Usage",
    "UserError",
    "ValidationFailed",
    "__version__",
    "abandon_task",
    "confirm_stopped",
    "create_task",
    "default_registry",
    "edit_task",
    "load_spec",
    "open_store",
    "parse_spec",
    "retry_item",
    "status_dict",
    "sweep",
    "task_status",
    "tell",
    "tool",
    "tool_call",
    "waive_item",
]
