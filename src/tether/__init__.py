"""tether: a durable runtime for long-running LLM agents.

The public Python API. Everything else is importable but may change without notice.
"""

from importlib.metadata import PackageNotFoundError, version

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
from tether.runtime.builtins import default_registry
from tether.runtime.engine import Engine, ModelSet, RunResult
from tether.runtime.takeover import confirm_stopped
from tether.runtime.tasks import TaskStatus, create_task, status_dict, task_status
from tether.runtime.watch import sweep
from tether.spec import TaskSpec, load_spec, parse_spec
from tether.store import Store, open_store
from tether.store.base import OpRecord
from tether.tools.registry import (
    Compensation,
    Reconciliation,
    Tool,
    ToolContext,
    ToolRegistry,
    tool,
)
from tether.tools.retry import RetryPolicy

try:
    __version__ = version("tether")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

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
