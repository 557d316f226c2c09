-- tether schema 12: an op's result in a row of its own, written once (issue 22). An
-- op's row in `ops` is written three times (intended, dispatched, result), and under
-- MVCC each write is a new version of the whole row: with the result (a tool's output,
-- a kilobyte or more) in it, the versions filled the pages before a read pruned the
-- old ones, and the pages settled at about 4 ops each, 2 KB per op, growing with the
-- task (measured: 1,757 bytes per round from 100 to 1,000 rounds, 2,176 from 1,000 to
-- 10,000). Now `ops` keeps the small columns that change (status, attempts, error...),
-- whose versions are HOT updates on the op's page, and `op_results` holds the result,
-- inserted once when the op gets it (only ever inserted, packed full; rewritten only if
-- an op's result changes, dropped if it is cleared), its summary stored as a length
-- when it starts the content (`_rules.op_result_stored`, as SQLite stores it). The
-- store reads an op's row joined with its result: `get_ops` returns the same records.
-- Code of schema 11 would write results to a column that is gone: no older code runs
-- on a PostgreSQL database at 12. The existing results are moved there, under the
-- migration's lock (the old rows keep their bytes until the table is rewritten, VACUUM
-- FULL, as after schema 5).
CREATE TABLE op_results (
    op_id TEXT PRIMARY KEY,
    result JSONB NOT NULL
);
INSERT INTO op_results (op_id, result)
SELECT op_id, CASE
    WHEN jsonb_typeof(result -> 'summary') = 'string'
        AND jsonb_typeof(result -> 'content') = 'string'
        AND starts_with(result ->> 'content', result ->> 'summary')
    THEN jsonb_set(result, '{summary}', to_jsonb(length(result ->> 'summary')))
    ELSE result END
FROM ops WHERE result IS NOT NULL AND jsonb_typeof(result) <> 'null';
ALTER TABLE ops DROP COLUMN result;
ANALYZE op_results;
