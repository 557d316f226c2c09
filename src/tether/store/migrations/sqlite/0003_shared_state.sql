-- tether schema 3: small JSON documents shared by all workers of a database, by key
-- (circuit breakers and concurrency slots of services, for one).
CREATE TABLE shared_state (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    updated_at REAL NOT NULL
) STRICT;
