-- tether schema 4: the artifact search index (search_artifacts). `artifact_text` holds
-- each artifact's indexed text (see tether.store._search), written in the statement
-- that writes the artifact, with its tsvector kept by the table itself. Existing
-- artifacts are indexed by the migration.
CREATE TABLE artifact_text (
    artifact_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    body TEXT NOT NULL,
    tsv TSVECTOR GENERATED ALWAYS AS (to_tsvector('english'::regconfig, body)) STORED
);
CREATE INDEX artifact_text_by_task ON artifact_text (task_id);
CREATE INDEX artifact_text_tsv ON artifact_text USING GIN (tsv);
-- A blob as text, or NULL if it is not UTF-8 text (NUL bytes included): lets a commit
-- index an artifact whose blob was stored by an earlier commit within its one statement.
CREATE FUNCTION tether_blob_text(data BYTEA) RETURNS TEXT
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
BEGIN
    RETURN convert_from(data, 'UTF8');
EXCEPTION WHEN OTHERS THEN
    RETURN NULL;
END
$$;
