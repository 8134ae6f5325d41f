-- Who created each session (a principal's user key), so that the bytes a
-- user stores can be summed and held to a quota. Sessions from before this
-- migration are owned by their own key (a user's key for user sessions).
ALTER TABLE sessions ADD COLUMN owner TEXT;
UPDATE sessions SET owner = session_key WHERE owner IS NULL;
CREATE INDEX sessions_by_owner ON sessions (owner);
