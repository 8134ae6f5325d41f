-- Several nodes (used with Postgres; kept here so both backends hold the
-- same tables): the nodes alive and where they are reached, which node owns
-- each node-local thing (a live kernel, a run), and the shared rate limits.

-- One row per running node, refreshed by its heartbeat (Unix ms).
CREATE TABLE nodes (
    node_id      TEXT    NOT NULL PRIMARY KEY,
    url          TEXT    NOT NULL,
    started_at   INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    draining     BOOLEAN NOT NULL DEFAULT FALSE
);

-- kind: `session` (a live kernel) or `run`; no foreign key to `nodes`: a
-- row whose node is gone reads as lost.
CREATE TABLE owners (
    kind       TEXT    NOT NULL,
    id         TEXT    NOT NULL,
    node_id    TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (kind, id)
);
CREATE INDEX owners_by_node ON owners (node_id);

-- GCRA state per limiter key: the theoretical arrival time (Unix µs).
CREATE TABLE rate_limits (
    key TEXT    NOT NULL PRIMARY KEY,
    tat INTEGER NOT NULL
);
