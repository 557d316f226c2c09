"""Tools the agent can call: the registry and `@tool` (`registry`), failure classes
(`failures`), retries (`retry`, the one `tether.retry` policy), shared breakers and
concurrency limits (`breaker`), post-conditions (`validators`), the workspace file
operations behind the built-in file tools (`files`) and MCP servers' tools (`mcp`).
"""
