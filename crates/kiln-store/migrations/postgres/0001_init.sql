-- Kiln storage metadata on Postgres: the same tables as SQLite's migrations
-- 0001-0003 (sessions with their owner, objects, the egress ledger).
-- Timestamps are Unix milliseconds. Names sort byte-wise (COLLATE "C"), as
-- SQLite sorts them, whatever the database's locale.

CREATE TABLE sessions (
    id          TEXT   NOT NULL PRIMARY KEY,
    session_key TEXT   NOT NULL,
    created_at  BIGINT NOT NULL,
    -- who created the session (a principal's user key): the quota's owner
    owner       TEXT COLLATE "C"
);

-- GC: sessions older than the retention.
CREATE INDEX sessions_by_created_at ON sessions (created_at);
CREATE INDEX sessions_by_owner ON sessions (owner);

CREATE TABLE objects (
    session_id   TEXT    NOT NULL REFERENCES sessions (id),
    file_id      TEXT    COLLATE "C" NOT NULL,
    name         TEXT    COLLATE "C" NOT NULL,
    size         BIGINT  NOT NULL CHECK (size >= 0),
    sha256       TEXT    NOT NULL,
    content_type TEXT    NOT NULL,
    read_only    BOOLEAN NOT NULL,
    created_at   BIGINT  NOT NULL,
    version      TEXT    NOT NULL,
    PRIMARY KEY (session_id, file_id)
);

-- Listing a session ordered by name.
CREATE INDEX objects_by_session_name ON objects (session_id, name);
-- GC: objects older than the retention.
CREATE INDEX objects_by_created_at ON objects (created_at);

-- The egress gateway's ledger: one row per call a jail made through the
-- services gateway, allowed or refused.
CREATE TABLE egress_calls (
    id          BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    grant_id    TEXT    NOT NULL,
    -- who held the grant: run:<storage session id>
    owner       TEXT    NOT NULL,
    tenant      TEXT    NOT NULL,
    user_id     TEXT    NOT NULL,
    service     TEXT    NOT NULL,
    method      TEXT    NOT NULL,
    path        TEXT    NOT NULL,
    status      BIGINT  NOT NULL,
    -- ok, or why the gateway refused or cut the call
    outcome     TEXT    NOT NULL,
    bytes_up    BIGINT  NOT NULL CHECK (bytes_up >= 0),
    bytes_down  BIGINT  NOT NULL CHECK (bytes_down >= 0),
    started_at  BIGINT  NOT NULL,
    duration_ms BIGINT  NOT NULL CHECK (duration_ms >= 0)
);

CREATE INDEX egress_calls_by_owner ON egress_calls (owner, id);
CREATE INDEX egress_calls_by_started_at ON egress_calls (started_at);
