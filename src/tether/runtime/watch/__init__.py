"""The watchdog: sweeps for stale tasks, notices, and the sinks that deliver them."""
