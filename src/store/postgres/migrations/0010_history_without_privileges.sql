-- orderly_history_id() as migration 0009 has it now, for databases migrated before:
-- - 0009 first had a SQL function whose CASE was meant to skip pg_control_system() where the
--   role may not call it; PostgreSQL checks that privilege when it plans the call, taken or
--   not, so a role without it could not migrate at all. Each function is now called only
--   where the role may (store/postgres/privileges.rs names, at start, what is withheld).
-- - The server's start time joins the system identifier and the timeline. A restart of
--   PostgreSQL in place empties auth_cache_leases (UNLOGGED); with the same history, a key
--   revoked right after could be answered while another instance still served its copy under
--   a lease the database had forgotten. A new history makes every change wait `LEASE` first
--   (shared_cache.rs), longer than any lease held from before. It also stands in for the
--   other two where a hardened cluster withholds them: a promotion or a restore starts
--   another server. Every restart counts as going back in time (copies forgotten, webhooks
--   held 20 s): safe, and rare.
-- Applying this changes the id once: every running instance, of this version or the one
-- before, starts over once (CHANGELOG, "Several versions").
CREATE OR REPLACE FUNCTION orderly_history_id() RETURNS text LANGUAGE plpgsql VOLATILE AS $$
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
