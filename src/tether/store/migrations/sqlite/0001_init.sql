-- tether schema 1: tasks, events, ledgers, blobs.
CREATE TABLE tasks (
    task_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    stop_reason TEXT,
    version INTEGER NOT NULL DEFAULT 1,
    current_milestone TEXT,
    spec TEXT NOT NULL,
    workspace TEXT,
    waiting TEXT,
    usage TEXT NOT NULL DEFAULT '{}',
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    wake_at REAL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    heartbeat_at REAL,
    lease_owner TEXT,
    lease_expiry REAL,
    fencing_token INTEGER NOT NULL DEFAULT 0,
    last_seq INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE INDEX tasks_by_status ON tasks (status, lease_expiry);
CREATE TABLE events (
    task_id TEXT NOT NULL REFERENCES tasks (task_id),
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    schema_version INTEGER NOT NULL,
    data TEXT NOT NULL,
    task_version INTEGER NOT NULL,
    fencing_token INTEGER,
    at REAL NOT NULL,
    PRIMARY KEY (task_id, seq)
) STRICT;
CREATE TABLE ledgers (
    task_id TEXT PRIMARY KEY REFERENCES tasks (task_id),
    skeleton TEXT NOT NULL,
    state TEXT NOT NULL,
    version INTEGER NOT NULL,
    updated_at REAL NOT NULL
) STRICT;
CREATE TABLE blobs (
    hash TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    data BLOB NOT NULL,
    created_at REAL NOT NULL
) STRICT;
