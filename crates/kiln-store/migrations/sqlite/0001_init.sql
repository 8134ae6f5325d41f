-- Kiln storage metadata: storage sessions and the objects stored in them.
-- Timestamps are Unix milliseconds.

CREATE TABLE sessions (
    id          TEXT    NOT NULL PRIMARY KEY,
    session_key TEXT    NOT NULL,
    created_at  INTEGER NOT NULL
);

-- GC: sessions older than the retention.
CREATE INDEX sessions_by_created_at ON sessions (created_at);

CREATE TABLE objects (
    session_id   TEXT    NOT NULL REFERENCES sessions (id),
    file_id      TEXT    NOT NULL,
    name         TEXT    NOT NULL,
    size         INTEGER NOT NULL CHECK (size >= 0),
    sha256       TEXT    NOT NULL,
    content_type TEXT    NOT NULL,
    read_only    INTEGER NOT NULL CHECK (read_only IN (0, 1)),
    created_at   INTEGER NOT NULL,
    version      TEXT    NOT NULL,
    PRIMARY KEY (session_id, file_id)
);

-- Listing a session ordered by name.
CREATE INDEX objects_by_session_name ON objects (session_id, name);
-- GC: objects older than the retention.
CREATE INDEX objects_by_created_at ON objects (created_at);
