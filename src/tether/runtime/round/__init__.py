"""One round of a task: its phases, the checks between rounds, the model's context,
history and compaction (with the reading of a summary's completion claims), progress."""
