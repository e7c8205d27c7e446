-- Each instance knows every API key that can authenticate (store/postgres/known_keys.rs), so
-- that a key it does not know is refused with no statement at all, however many arrive. Every
-- creation and revocation of a key, by whatever binary, bumps auth_cache_version and records
-- that change's number in the key's row (a trigger, so that an instance of an older version
-- still running during a rolling upgrade records its changes too); an instance catches up by
-- reading the rows changed after the last change it applied.
ALTER TABLE api_keys ADD COLUMN changed_in bigint NOT NULL DEFAULT 0;
CREATE INDEX api_keys_by_change ON api_keys (changed_in);

CREATE FUNCTION orderly_api_key_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE auth_cache_version SET version = version + 1 RETURNING version INTO NEW.changed_in;
    RETURN NEW;
END
$$;
CREATE TRIGGER api_key_changed BEFORE INSERT OR UPDATE OF revoked ON api_keys
    FOR EACH ROW EXECUTE FUNCTION orderly_api_key_changed();
