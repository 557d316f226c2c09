-- tether schema 7: a ledger's items one row each. A long checklist's ledger state is
-- megabytes, and a commit changes one item or a few: kept as one document in `ledgers`,
-- every commit that touched the ledger rewrote it whole (on SQLite with the skeleton
-- beside it, megabytes of item titles). Now `ledgers` keeps the version, the skeleton
-- has a table of its own (`ledger_skeletons`, written at creation and by a contract
-- edit only), and each item's state is a row of `ledger_items` (its place in the
-- contract, its status, its state as JSON, the ledger version that last wrote it),
-- rewritten only when it changes. The existing ledgers are moved there.
CREATE TABLE ledger_items (
    task_id TEXT NOT NULL REFERENCES tasks (task_id),
    item_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    status TEXT NOT NULL,
    body TEXT NOT NULL,
    version INTEGER NOT NULL,
    PRIMARY KEY (task_id, item_id)
) STRICT, WITHOUT ROWID;
INSERT INTO ledger_items (task_id, item_id, position, status, body, version)
SELECT l.task_id, json_extract(s.value, '$.id'), s.key,
       COALESCE(json_extract(e.value, '$.status'), 'pending'), COALESCE(e.value, '{}'),
       l.version
FROM ledgers l
JOIN json_each(l.skeleton, '$.items') s
LEFT JOIN json_each(l.state) e ON e.key = json_extract(s.value, '$.id');
CREATE TABLE ledger_skeletons (
    task_id TEXT PRIMARY KEY REFERENCES tasks (task_id),
    skeleton TEXT NOT NULL
) STRICT;
INSERT INTO ledger_skeletons (task_id, skeleton) SELECT task_id, skeleton FROM ledgers;
ALTER TABLE ledgers DROP COLUMN state;
ALTER TABLE ledgers DROP COLUMN skeleton;
