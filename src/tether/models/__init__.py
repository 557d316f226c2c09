"""Models: the `Model` protocol and its adapters (OpenAI-compatible, Anthropic, scripted)."""

from tether.models.base import (
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    Purpose,
    ToolCall,
    ToolSchema,
    Usage,
)

__all__ = [
    "Message",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "Purpose",
    "ToolCall",
    "ToolSchema",
    "Usage",
]
