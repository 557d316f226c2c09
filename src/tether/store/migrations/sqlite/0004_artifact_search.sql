-- tether schema 4: the artifact search index (search_artifacts). `artifact_text` holds
-- each artifact's indexed text (see tether.store._search), written in the transaction
-- that writes the artifact, and `artifact_search` is the FTS5 index over it (external
-- content, rowid = artifact_text.id). Existing artifacts are indexed by the migration.
CREATE TABLE artifact_text (
    id INTEGER PRIMARY KEY,
    artifact_id TEXT NOT NULL UNIQUE,
    task_id TEXT NOT NULL,
    body TEXT NOT NULL
) STRICT;
CREATE INDEX artifact_text_by_task ON artifact_text (task_id);
CREATE VIRTUAL TABLE artifact_search USING fts5(
    body,
    content = 'artifact_text',
    content_rowid = 'id',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
