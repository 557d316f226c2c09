-- tether schema 10: PostgreSQL stores the rows a round writes as SQLite does (issue 22).
-- An event's data is `json`, its text as the store writes it, with the fields at their
-- plain defaults left out (`_rules.compact`), instead of `jsonb` (a 4-byte entry for
-- each key and value, numbers as `numeric`: measured, a round's events took 2,100 bytes
-- of jsonb, 1,350 of compact text). The run state (`usage`) and `waiting`, rewritten
-- with the task's row by every commit, are `json` too: a smaller row, so more of its
-- versions fit on its page before an update has to leave it (no HOT update, a new
-- page). Nothing queries inside these documents, and the store reads them back whole
-- (`_rules.expand`), the rows written before as they are. Code of schema 9 would read
-- the compacted events with their default fields missing: no older code runs on a
-- PostgreSQL database at 10. The existing rows take the new types (`events` is
-- rewritten once, under the migration's lock).
ALTER TABLE events ALTER COLUMN data TYPE json USING data::json;
ALTER TABLE tasks ALTER COLUMN usage DROP DEFAULT;
ALTER TABLE tasks ALTER COLUMN usage TYPE json USING usage::json;
ALTER TABLE tasks ALTER COLUMN usage SET DEFAULT '{}'::json;
ALTER TABLE tasks ALTER COLUMN usage SET STORAGE MAIN;
ALTER TABLE tasks ALTER COLUMN waiting TYPE json USING waiting::json;
ALTER TABLE tasks ALTER COLUMN waiting SET STORAGE MAIN;
