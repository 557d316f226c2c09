"""One run of a task: its state, the ports its parts use, outcomes, and the liveness probe."""
