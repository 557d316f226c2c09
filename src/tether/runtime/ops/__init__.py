"""Tool calls as journaled operations: attempts, approvals, ops in doubt, exhaustion
and compensation."""
