"""Built-in tools: workspace files, artifacts, and the contract's sources."""
