-- What instances keep from the database (copies of API keys and key rows, the known keys, the
-- counter they acknowledged, delivery claims) belongs to one history of it. A database can go
-- back in time under running instances: an asynchronous standby promoted after it missed the
-- newest transactions, a point-in-time restore. Both start a new timeline; a restore into
-- another cluster has another system identifier. store/postgres/shared_cache.rs compares this
-- id, and the counter, with what it saw, and starts over when either went back.

-- The history the database is on: its system identifier, the timeline it writes WAL on now,
-- and when its server started, each where the role may read it (migration 0010 says why each).
-- PL/pgSQL, not SQL: PostgreSQL checks the privilege to call a function when it plans the
-- statement that calls it, even in a branch never taken, and PL/pgSQL plans a statement only
-- when it first runs it.
CREATE FUNCTION orderly_history_id() RETURNS text LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    system text := '';
    timeline text := '';
    started text := '';
BEGIN
    IF has_function_privilege('pg_control_system()', 'EXECUTE') THEN
        SELECT system_identifier::text INTO system FROM pg_control_system();
    END IF;
    IF has_function_privilege('pg_current_wal_lsn()', 'EXECUTE')
       AND has_function_privilege('pg_walfile_name(pg_lsn)', 'EXECUTE') THEN
        timeline := substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8);
    END IF;
    IF has_function_privilege('pg_postmaster_start_time()', 'EXECUTE') THEN
        started := extract(epoch FROM pg_postmaster_start_time())::text;
    END IF;
    RETURN system || '/' || timeline || '/' || started;
END
$$;

-- The history seen last, and since when (on the database's clock) it is the one in force. A
-- change to the keys answers only once the history is older than the cache lease (an
-- instance may still serve copies from before it until then), and no delivery is sent until
-- it is older than an attempt's lease (one sent before it, which the database no longer
-- knows, may still be on the wire). '-infinity': the history the schema was made on.
CREATE TABLE orderly_history (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    id       text NOT NULL,
    since    timestamptz NOT NULL
);
INSERT INTO orderly_history (id, since) VALUES (orderly_history_id(), '-infinity');

-- Notes a history not seen before (its first observer sets `since`) and returns `since`.
CREATE FUNCTION orderly_note_history() RETURNS timestamptz LANGUAGE sql VOLATILE AS $$
    UPDATE orderly_history SET id = orderly_history_id(), since = clock_timestamp()
        WHERE id IS DISTINCT FROM orderly_history_id();
    SELECT since FROM orderly_history;
$$;

-- A stopping instance marks its lease released rather than deleting it: a renewal it sent
-- before it stopped, still in flight, must not bring the lease back when it commits later.
ALTER TABLE auth_cache_leases ADD COLUMN released boolean NOT NULL DEFAULT false;
