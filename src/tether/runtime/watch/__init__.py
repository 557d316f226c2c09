"""The watchdog: sweeps for stale tasks, notices, and the sinks that deliver them; and
the schedules of recurring tasks, whose due occurrences workers start."""
