-- tether schema 5: the rows each round rewrites suit HOT updates. A task's row in
-- `tasks`, its ledger in `ledgers` and a service's breaker document in `shared_state`
-- (one write per tool call) get a new version with every change; with room left on
-- their pages (fillfactor) the new version stays on the same page, no index changes (a
-- HOT update) and the old one is pruned when the page is next read, without waiting
-- for VACUUM. The documents rewritten each round (the run state in `usage`, the
-- ledger's `state`, a shared document's `value`) stay in the row, compressed (STORAGE
-- MAIN), instead of taking new TOAST chunks each time; the spec, which a round never
-- changes, may still be stored out of line (schema 6 moved it to `task_specs`, and
-- schema 7 the ledger's state to `ledger_items`). Existing pages keep their layout until
-- rewritten (VACUUM FULL); new rows and new versions follow the new settings. See
-- docs/operations.md.
ALTER TABLE tasks SET (fillfactor = 25);
ALTER TABLE tasks ALTER COLUMN usage SET STORAGE MAIN;
ALTER TABLE tasks ALTER COLUMN waiting SET STORAGE MAIN;
ALTER TABLE ledgers SET (fillfactor = 25);
ALTER TABLE ledgers ALTER COLUMN state SET STORAGE MAIN;
ALTER TABLE shared_state SET (fillfactor = 25);
ALTER TABLE shared_state ALTER COLUMN value SET STORAGE MAIN;
