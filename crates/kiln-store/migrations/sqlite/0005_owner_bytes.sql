-- What each owner keeps in the store (the bytes of the objects in every
-- session they created), kept by triggers as objects come and go, so that a
-- put's quota check reads one row instead of summing all of the owner's
-- objects (a sum that grew with every upload the owner had made).
CREATE TABLE owner_bytes (
    owner TEXT    NOT NULL PRIMARY KEY,
    bytes INTEGER NOT NULL
);

INSERT INTO owner_bytes (owner, bytes)
    SELECT s.owner, SUM(o.size) FROM objects o JOIN sessions s ON s.id = o.session_id
    WHERE s.owner IS NOT NULL GROUP BY s.owner;

CREATE TRIGGER owner_bytes_added AFTER INSERT ON objects
BEGIN
    INSERT INTO owner_bytes (owner, bytes)
        SELECT owner, NEW.size FROM sessions WHERE id = NEW.session_id AND owner IS NOT NULL
        ON CONFLICT (owner) DO UPDATE SET bytes = bytes + excluded.bytes;
END;

CREATE TRIGGER owner_bytes_removed AFTER DELETE ON objects
BEGIN
    UPDATE owner_bytes SET bytes = bytes - OLD.size
        WHERE owner = (SELECT owner FROM sessions WHERE id = OLD.session_id);
END;

-- An object is written once (a new version is a new row), which is what
-- keeps the totals true: a change of its size or session is refused.
CREATE TRIGGER objects_written_once BEFORE UPDATE OF size, session_id ON objects
BEGIN
    SELECT RAISE(ABORT, 'an object''s size and session are written once');
END;
