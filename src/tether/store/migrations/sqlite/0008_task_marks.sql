-- tether schema 8: the progress marks of a task's open items one row each. The run
-- state (`tasks.usage`) held them as `seen` (item -> up to a thousand fingerprints),
-- and every commit rewrote them with the task's row. Now `task_marks` holds them, a
-- row per mark numbered per item (`n`, oldest first), added and removed by the commit
-- that changes them, and `usage` keeps `seen` as item -> how many marks. The existing
-- marks are moved there.
CREATE TABLE task_marks (
    task_id TEXT NOT NULL REFERENCES tasks (task_id),
    item_id TEXT NOT NULL,
    n INTEGER NOT NULL,
    mark TEXT NOT NULL,
    PRIMARY KEY (task_id, item_id, n)
) STRICT, WITHOUT ROWID;
INSERT INTO task_marks (task_id, item_id, n, mark)
SELECT t.task_id, i.key, m.key + 1, m.value
FROM tasks t
JOIN json_each(t.usage, '$.seen') i
JOIN json_each(CASE WHEN i.type = 'array' THEN i.value ELSE '[]' END) m
WHERE json_type(t.usage, '$.seen') = 'object';
UPDATE tasks SET usage = json_set(usage, '$.seen', (
    SELECT json_group_object(i.key, CASE WHEN i.type = 'array'
        THEN json_array_length(i.value) ELSE 0 END)
    FROM json_each(tasks.usage, '$.seen') i
))
WHERE json_type(usage, '$.seen') = 'object';
