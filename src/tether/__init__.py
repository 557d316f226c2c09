"""tether: a durable runtime for long-running LLM agents.

The public Python API. Everything else is importable but may change without notice.
"""

from tether.clock import Clock, FakeClock, SystemClock
from tether.decisions import abandon_task, retry_item, waive_item
from tether.errors import (
    ApprovalRequired,
    RetryLater,
    SpecError,
    StaleLease,
    TaskCancelled,
    TaskNotFound,
    TetherError,
    ToolFailed,
    UserError,
)
from tether.ledger import Ledger
from tether.models.base import Message, Model, ModelRequest, ModelResponse, ToolCall, Usage
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.engine import Engine, ModelSet, RunResult
from tether.runtime.tasks import create_task, status_dict
from tether.spec import TaskSpec, load_spec, parse_spec
from tether.store import Store, open_store
from tether.tools.registry import Reconciliation, Tool, ToolContext, ToolRegistry, tool
from tether.tools.retry import RetryPolicy

__version__ = "0.1.0"

__all__ = [
    "ApprovalRequired",
    "Clock",
    "Engine",
    "FakeClock",
    "Ledger",
    "Message",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "ModelSet",
    "Reconciliation",
    "RetryLater",
    "RetryPolicy",
    "RunResult",
    "ScriptedModel",
    "SpecError",
    "StaleLease",
    "Store",
    "SystemClock",
    "TaskCancelled",
    "TaskNotFound",
    "TaskSpec",
    "TetherError",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolFailed",
    "ToolRegistry",
    "Usage",
    "UserError",
    "__version__",
    "abandon_task",
    "create_task",
    "load_spec",
    "open_store",
    "parse_spec",
    "retry_item",
    "status_dict",
    "tool",
    "tool_call",
    "waive_item",
]
