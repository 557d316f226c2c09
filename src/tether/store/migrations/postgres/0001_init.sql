-- tether schema 1: tasks, events, ledgers, blobs.
CREATE TABLE tasks (
    task_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    stop_reason TEXT,
    version INTEGER NOT NULL DEFAULT 1,
    current_milestone TEXT,
    spec JSONB NOT NULL,
    workspace TEXT,
    waiting JSONB,
    usage JSONB NOT NULL DEFAULT '{}'::jsonb,
    cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
    wake_at DOUBLE PRECISION,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    heartbeat_at DOUBLE PRECISION,
    lease_owner TEXT,
    lease_expiry DOUBLE PRECISION,
    fencing_token BIGINT NOT NULL DEFAULT 0,
    last_seq BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX tasks_by_status ON tasks (status, lease_expiry);
CREATE TABLE events (
    task_id TEXT NOT NULL REFERENCES tasks (task_id),
    seq BIGINT NOT NULL,
    type TEXT NOT NULL,
    schema_version INTEGER NOT NULL,
    data JSONB NOT NULL,
    task_version INTEGER NOT NULL,
    fencing_token BIGINT,
    at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (task_id, seq)
);
CREATE TABLE ledgers (
    task_id TEXT PRIMARY KEY REFERENCES tasks (task_id),
    skeleton JSONB NOT NULL,
    state JSONB NOT NULL,
    version INTEGER NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE blobs (
    hash TEXT PRIMARY KEY,
    size BIGINT NOT NULL,
    data BYTEA NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);
