"""What a server's answers hand the runtime: tool descriptions and input schemas as
the model is shown them and calls are checked against, and call results as values."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final

from tether._extras import needs

with needs("mcp", "a contract with mcp_servers"):
    import jsonschema  # type: ignore[import-untyped]
    import mcp_types

logger = logging.getLogger("tether.tools.mcp")

DESCRIPTION_MAX: Final = 4096
"""The most characters of a server's tool description the model is shown: every request
carries every allowed tool's description, so one server's megabyte of text would take
the whole context (longer ones are cut, with a note, and logged)."""


def compile_schema(schema: Mapping[str, Any]) -> Any:
    """A JSON-schema validator for a tool's input schema, or None if it does not compile."""
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
        return cls(schema)
    except Exception:
        return None


def shown_description(name: str, text: str) -> str:
    """A server's tool description as the model is shown it (`DESCRIPTION_MAX`)."""
    if len(text) <= DESCRIPTION_MAX:
        return text
    logger.warning(
        "MCP tool %s: its description of %d characters is cut to %d",
        name,
        len(text),
        DESCRIPTION_MAX,
    )
    return f"{text[:DESCRIPTION_MAX]} [description cut by tether: {len(text)} characters]"


def text_of(content: Sequence[mcp_types.ContentBlock]) -> str:
    """A result's content blocks as text: text joined, other blocks named."""
    parts: list[str] = []
    for block in content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, mcp_types.EmbeddedResource):
            res = block.resource
            text = getattr(res, "text", None)
            parts.append(text if isinstance(text, str) else f"[resource {res.uri}]")
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(f"[resource {block.uri}]")
        else:
            parts.append(f"[{block.type} {getattr(block, 'mime_type', '')}]".replace(" ]", "]"))
    return "\n".join(parts)


def value_of(result: mcp_types.CallToolResult, output_schema: Mapping[str, Any] | None) -> Any:
    """A call's result as the tool's value: its structured content when there is some
    (unwrapped from a lone `result` the output schema names), else its text."""
    structured = result.structured_content
    if structured is not None:
        if (
            isinstance(structured, dict)
            and set(structured) == {"result"}
            and output_schema is not None
            and set(output_schema.get("properties") or {}) == {"result"}
        ):
            return structured["result"]
        return structured
    text = text_of(result.content)
    return text if result.content else None
