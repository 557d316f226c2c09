-- tether schema 11: a commit's events in ONE row (issue 22). A row of `events` cost
-- about 150 bytes besides its data (tuple header, item pointer, the task id again, the
-- primary key's index entry), and a round's commits wrote 8 of them. Now
-- `event_batches` holds a row per commit: the events' common fields once (task,
-- version, fencing token, time) and `events`, a JSON array of `[type, schema_version,
-- data]`, the event numbered `last_seq - length + 1` first. Its key, `(task_id,
-- last_seq)`, finds the commits holding the events after any number. `events` stays,
-- as a view of the same columns (for queries by hand, and the tests'). The existing
-- events are moved there, runs of a task's consecutive events with the same version,
-- token and time (a commit's) one row each, under the migration's lock.
CREATE TABLE event_batches (
    last_seq BIGINT NOT NULL,
    at DOUBLE PRECISION NOT NULL,
    fencing_token BIGINT,
    task_version INTEGER NOT NULL,
    task_id TEXT NOT NULL REFERENCES tasks (task_id),
    events JSON NOT NULL,
    PRIMARY KEY (task_id, last_seq)
);
INSERT INTO event_batches (last_seq, at, fencing_token, task_version, task_id, events)
SELECT MAX(seq), at, fencing_token, task_version, task_id,
    json_agg(json_build_array(type, schema_version, data) ORDER BY seq)
FROM (SELECT e.*, seq - row_number() OVER (
    PARTITION BY task_id, task_version, fencing_token, at ORDER BY seq) AS run
    FROM events e) r
GROUP BY task_id, task_version, fencing_token, at, run;
DROP TABLE events;
-- Its statistics at once: a read of the first events of a type, or at most some, walks
-- the key in order and stops (planned without them, it reads all the task's rows).
ANALYZE event_batches;
CREATE VIEW events AS
SELECT b.task_id, b.last_seq - c.k + e.n AS seq, e.v ->> 0 AS type,
    (e.v ->> 1)::int AS schema_version, e.v -> 2 AS data, b.task_version,
    b.fencing_token, b.at
FROM event_batches b, json_array_length(b.events) AS c(k),
    json_array_elements(b.events) WITH ORDINALITY AS e(v, n);
