-- The egress gateway's ledger: one row per call a jail made through the services
-- gateway, allowed or refused (kiln-egress writes it when the call ends).
-- Timestamps are Unix milliseconds.

CREATE TABLE egress_calls (
    id          INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    grant_id    TEXT    NOT NULL,
    -- who held the grant: run:<storage session id>
    owner       TEXT    NOT NULL,
    tenant      TEXT    NOT NULL,
    user_id     TEXT    NOT NULL,
    service     TEXT    NOT NULL,
    method      TEXT    NOT NULL,
    path        TEXT    NOT NULL,
    status      INTEGER NOT NULL,
    -- ok, or why the gateway refused or cut the call
    outcome     TEXT    NOT NULL,
    bytes_up    INTEGER NOT NULL CHECK (bytes_up >= 0),
    bytes_down  INTEGER NOT NULL CHECK (bytes_down >= 0),
    started_at  INTEGER NOT NULL,
    duration_ms INTEGER NOT NULL CHECK (duration_ms >= 0)
);

-- What did this run (or grant owner) call?
CREATE INDEX egress_calls_by_owner ON egress_calls (owner, id);
-- Pruning, and per-user reports over a time window.
CREATE INDEX egress_calls_by_started_at ON egress_calls (started_at);
