-- tether schema 5: the rows each round rewrites suit HOT updates. A task's row in
-- `tasks` and its ledger in `ledgers` get a new version with every commit; with room
-- left on their pages (fillfactor) the new version stays on the same page, no index
-- changes (a HOT update) and the old one is pruned when the page is next read, without
-- waiting for VACUUM. The per-round JSON documents (the run state in `usage`, the
-- ledger's `state`) stay in the row, compressed (STORAGE MAIN), instead of taking new
-- TOAST chunks with every round; the spec, which a round never changes, may still be
-- stored out of line. Existing pages keep their layout until rewritten (VACUUM FULL);
-- new rows and new versions follow the new settings. See docs/operations.md.
ALTER TABLE tasks SET (fillfactor = 25);
ALTER TABLE tasks ALTER COLUMN usage SET STORAGE MAIN;
ALTER TABLE tasks ALTER COLUMN waiting SET STORAGE MAIN;
ALTER TABLE ledgers SET (fillfactor = 25);
ALTER TABLE ledgers ALTER COLUMN state SET STORAGE MAIN;
