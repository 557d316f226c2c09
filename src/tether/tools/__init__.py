"""Tools the agent can call: built-in file tools confined to a task's workspace, and
(later) the registry, the op journal, retries, breakers and MCP adapters.
"""
