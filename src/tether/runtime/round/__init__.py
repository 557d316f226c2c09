"""One round of a task: its phases, guards, the model's context, history and
compaction, progress."""
