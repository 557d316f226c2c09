-- tether schema 6: a task's contract (its spec) in a table of its own. The spec of a
-- long checklist is megabytes and changes only when the task is created or its contract
-- edited, while its row in `tasks` changes with every commit (usage, last_seq): the
-- commit's row version no longer carries it. The existing specs are moved here.
CREATE TABLE task_specs (
    task_id TEXT PRIMARY KEY REFERENCES tasks (task_id),
    spec JSONB NOT NULL
);
INSERT INTO task_specs (task_id, spec) SELECT task_id, spec FROM tasks;
ALTER TABLE tasks DROP COLUMN spec;
-- The claimable tasks are found by status, the lease's expiry is not in the index, so a
-- lease renewal (lease_expiry, heartbeat_at) changes no indexed column: a HOT update.
DROP INDEX tasks_by_status;
CREATE INDEX tasks_by_status ON tasks (status);
