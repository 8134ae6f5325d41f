-- Several nodes: the nodes alive and where they are reached, which node owns
-- each node-local thing (a live kernel, a run), and the shared rate limits
-- (SQLite's 0004).

-- One row per running node, refreshed by its heartbeat (Unix ms).
CREATE TABLE nodes (
    node_id      TEXT    NOT NULL PRIMARY KEY,
    url          TEXT    NOT NULL,
    started_at   BIGINT  NOT NULL,
    heartbeat_at BIGINT  NOT NULL,
    draining     BOOLEAN NOT NULL DEFAULT FALSE
);

-- kind: `session` (a live kernel) or `run`; no foreign key to `nodes`: a
-- row whose node is gone reads as lost.
CREATE TABLE owners (
    kind       TEXT   NOT NULL,
    id         TEXT   NOT NULL,
    node_id    TEXT   NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (kind, id)
);
CREATE INDEX owners_by_node ON owners (node_id);

-- GCRA state per limiter key: the theoretical arrival time (Unix µs).
CREATE TABLE rate_limits (
    key TEXT   NOT NULL PRIMARY KEY,
    tat BIGINT NOT NULL
);
