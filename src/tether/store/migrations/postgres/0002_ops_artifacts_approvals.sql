-- tether schema 2: op journal, artifacts, approvals.
CREATE TABLE ops (
    op_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL REFERENCES tasks (task_id),
    round INTEGER NOT NULL,
    call_index INTEGER NOT NULL,
    tool TEXT NOT NULL,
    args JSONB NOT NULL,
    args_hash TEXT NOT NULL,
    effect TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at DOUBLE PRECISION,
    result JSONB,
    error JSONB,
    task_version INTEGER NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX ops_by_task ON ops (task_id, round, call_index);
CREATE TABLE artifacts (
    artifact_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL REFERENCES tasks (task_id),
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    blob_hash TEXT NOT NULL,
    size BIGINT NOT NULL,
    source TEXT NOT NULL DEFAULT '',
    task_version INTEGER NOT NULL,
    deps JSONB NOT NULL DEFAULT '[]',
    valid BOOLEAN NOT NULL DEFAULT TRUE,
    meta JSONB NOT NULL DEFAULT '{}',
    created_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX artifacts_by_task ON artifacts (task_id, created_at);
CREATE TABLE approvals (
    request_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL REFERENCES tasks (task_id),
    op_id TEXT,
    status TEXT NOT NULL,
    request JSONB NOT NULL,
    decision JSONB,
    decided_by TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    decided_at DOUBLE PRECISION
);
CREATE INDEX approvals_by_task ON approvals (task_id, status);
