-- tether schema 2: op journal, artifacts, approvals.
CREATE TABLE ops (
    op_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL REFERENCES tasks (task_id),
    round INTEGER NOT NULL,
    call_index INTEGER NOT NULL,
    tool TEXT NOT NULL,
    args TEXT NOT NULL,
    args_hash TEXT NOT NULL,
    effect TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL,
    result TEXT,
    error TEXT,
    task_version INTEGER NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
) STRICT;
CREATE INDEX ops_by_task ON ops (task_id, round, call_index);
CREATE TABLE artifacts (
    artifact_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL REFERENCES tasks (task_id),
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    blob_hash TEXT NOT NULL,
    size INTEGER NOT NULL,
    source TEXT NOT NULL DEFAULT '',
    task_version INTEGER NOT NULL,
    deps TEXT NOT NULL DEFAULT '[]',
    valid INTEGER NOT NULL DEFAULT 1,
    meta TEXT NOT NULL DEFAULT '{}',
    created_at REAL NOT NULL
) STRICT;
CREATE INDEX artifacts_by_task ON artifacts (task_id, created_at);
CREATE TABLE approvals (
    request_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL REFERENCES tasks (task_id),
    op_id TEXT,
    status TEXT NOT NULL,
    request TEXT NOT NULL,
    decision TEXT,
    decided_by TEXT,
    created_at REAL NOT NULL,
    decided_at REAL
) STRICT;
CREATE INDEX approvals_by_task ON approvals (task_id, status);
