"""Ops a person decides: approvals before a call is sent, ops in doubt, exhausted
retries under `on_exhausted: ask_human`, and the requests that ask for those decisions."""
