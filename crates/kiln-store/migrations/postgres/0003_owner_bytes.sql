-- What each owner keeps in the store (the bytes of the objects in every
-- session they created), kept by triggers as objects come and go, so that a
-- put's quota check reads one row instead of summing all of the owner's
-- objects (a sum that grew with every upload the owner had made). SQLite's
-- 0005.
CREATE TABLE owner_bytes (
    owner TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    bytes BIGINT           NOT NULL
);

INSERT INTO owner_bytes (owner, bytes)
    SELECT s.owner, SUM(o.size) FROM objects o JOIN sessions s ON s.id = o.session_id
    WHERE s.owner IS NOT NULL GROUP BY s.owner;

-- A put inserts one row: its owner's row is the only one it locks.
CREATE FUNCTION owner_bytes_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO owner_bytes (owner, bytes)
        SELECT owner, NEW.size FROM sessions WHERE id = NEW.session_id AND owner IS NOT NULL
        ON CONFLICT (owner) DO UPDATE SET bytes = owner_bytes.bytes + EXCLUDED.bytes;
    RETURN NULL;
END
$$;

CREATE TRIGGER owner_bytes_added AFTER INSERT ON objects
    FOR EACH ROW EXECUTE FUNCTION owner_bytes_added();

-- A collection deletes a batch of rows of many owners: their rows are locked
-- in one order first, so that batches on several nodes at once never
-- deadlock on each other.
CREATE FUNCTION owner_bytes_removed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM owner_bytes WHERE owner IN
        (SELECT s.owner FROM removed r JOIN sessions s ON s.id = r.session_id)
        ORDER BY owner FOR UPDATE;
    UPDATE owner_bytes b SET bytes = b.bytes - d.bytes
        FROM (SELECT s.owner, SUM(r.size) AS bytes FROM removed r
              JOIN sessions s ON s.id = r.session_id GROUP BY s.owner) d
        WHERE b.owner = d.owner;
    RETURN NULL;
END
$$;

CREATE TRIGGER owner_bytes_removed AFTER DELETE ON objects
    REFERENCING OLD TABLE AS removed
    FOR EACH STATEMENT EXECUTE FUNCTION owner_bytes_removed();

-- An object is written once (a new version is a new row), which is what
-- keeps the totals true: a change of its size or session is refused.
CREATE FUNCTION objects_written_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'an object''s size and session are written once';
END
$$;

CREATE TRIGGER objects_written_once BEFORE UPDATE OF size, session_id ON objects
    FOR EACH ROW EXECUTE FUNCTION objects_written_once();
