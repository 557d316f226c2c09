-- tether schema 8: the progress marks of a task's open items one row each. The run
-- state (`tasks.usage`) held them as `seen` (item -> up to a thousand fingerprints),
-- and every commit rewrote them with the task's row: each commit left a dead row
-- version as big as the list (TOAST chunks) behind. Now `task_marks` holds them, a row
-- per mark numbered per item (`n`, oldest first), only ever inserted, and deleted when
-- the item closes or passes the cap (no updates: no dead versions per round), written
-- by the commit that changes them; `usage` keeps `seen` as item -> how many marks. The
-- existing marks are moved there.
CREATE TABLE task_marks (
    task_id TEXT NOT NULL REFERENCES tasks (task_id),
    item_id TEXT NOT NULL,
    n INTEGER NOT NULL,
    mark TEXT NOT NULL,
    PRIMARY KEY (task_id, item_id, n)
);
INSERT INTO task_marks (task_id, item_id, n, mark)
SELECT t.task_id, i.key, m.n::int, m.mark
FROM tasks t,
    jsonb_each(CASE WHEN jsonb_typeof(t.usage -> 'seen') = 'object'
        THEN t.usage -> 'seen' ELSE '{}'::jsonb END) i,
    jsonb_array_elements_text(CASE WHEN jsonb_typeof(i.value) = 'array'
        THEN i.value ELSE '[]'::jsonb END) WITH ORDINALITY AS m(mark, n);
UPDATE tasks SET usage = jsonb_set(usage, '{seen}', (
    SELECT COALESCE(jsonb_object_agg(i.key, CASE WHEN jsonb_typeof(i.value) = 'array'
        THEN jsonb_array_length(i.value) ELSE 0 END), '{}'::jsonb)
    FROM jsonb_each(tasks.usage -> 'seen') i
))
WHERE jsonb_typeof(usage -> 'seen') = 'object';
