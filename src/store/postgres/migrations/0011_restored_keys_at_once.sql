-- A restore writes every API key of a backup in its one transaction. The trigger of 0007
-- bumped auth_cache_version's one row for each of them; inside one transaction every update of
-- that row walks each version of it the transaction made before, so a restore of N keys took
-- time in N squared (40,000 keys 11.8 s here, two million some eight hours). A restore now says
-- so, with a setting local to its transaction (orderly.restoring_keys): the keys it writes keep
-- the change number it gives them all, from one bump of the version (store/postgres/backup.rs).
-- Every other insert or revocation, by this version or the one before, is counted as before.
CREATE OR REPLACE FUNCTION orderly_api_key_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' AND current_setting('orderly.restoring_keys', true) = 'on' THEN
        RETURN NEW;
    END IF;
    UPDATE auth_cache_version SET version = version + 1 RETURNING version INTO NEW.changed_in;
    RETURN NEW;
END
$$;
