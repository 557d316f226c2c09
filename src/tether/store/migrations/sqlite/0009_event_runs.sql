-- tether schema 9: a commit's events written to one b-tree. `events` had PRIMARY KEY
-- (task_id, seq) beside its rowid: every event went to the table and to that key's
-- index, and SQLite rebalances an index it appends to with the neighbouring pages
-- again and again (about 2.8 of the ~9 pages a round's commit wrote were the events',
-- half of them the index's, measured). Now the key's index is gone and `event_runs`
-- says where a task's events are: each row is a run of its events, `seq` from
-- `first_seq` on (up to the next run's), at rowids `first_id + (seq - first_seq)`. A
-- commit appends its events at the end of the table, extending its task's last run
-- when that run ends there (a task running alone: no row), else starting a run (one
-- small row per commit, not an index entry per event). Rows of a run are the task's
-- alone: the store checks `task_id` when reading all the same. (WITHOUT ROWID keyed
-- by (task_id, seq) would be one b-tree too, but its interior pages hold whole rows:
-- measured, more pages per commit than before.) The existing events are moved there,
-- task after task, one run each.
CREATE TABLE event_runs (
    task_id TEXT NOT NULL REFERENCES tasks (task_id),
    first_seq INTEGER NOT NULL,
    first_id INTEGER NOT NULL,
    PRIMARY KEY (task_id, first_seq)
) STRICT, WITHOUT ROWID;
INSERT INTO event_runs (task_id, first_seq, first_id)
SELECT task_id, lo, 1 + COALESCE(SUM(hi - lo + 1) OVER (
    ORDER BY task_id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
FROM (SELECT task_id, MIN(seq) AS lo, MAX(seq) AS hi FROM events GROUP BY task_id);
CREATE TABLE events_in_runs (
    id INTEGER PRIMARY KEY,
    task_id TEXT NOT NULL REFERENCES tasks (task_id),
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    schema_version INTEGER NOT NULL,
    data TEXT NOT NULL,
    task_version INTEGER NOT NULL,
    fencing_token INTEGER,
    at REAL NOT NULL
) STRICT;
INSERT INTO events_in_runs (id, task_id, seq, type, schema_version, data, task_version,
    fencing_token, at)
SELECT r.first_id + e.seq - r.first_seq, e.task_id, e.seq, e.type, e.schema_version,
    e.data, e.task_version, e.fencing_token, e.at
FROM events e JOIN event_runs r ON r.task_id = e.task_id
ORDER BY 1;
DROP TABLE events;
ALTER TABLE events_in_runs RENAME TO events;
