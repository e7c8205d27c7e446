-- Each instance knows every API key that can authenticate (store/postgres/shared_cache.rs), so
-- that a key it does not know is refused with no statement at all, however many arrive. A
-- creation or a revocation records in the key's row the change of auth_cache_version it made;
-- an instance catches up by reading the rows changed after the last change it applied.
ALTER TABLE api_keys ADD COLUMN changed_in bigint NOT NULL DEFAULT 0;
CREATE INDEX api_keys_by_change ON api_keys (changed_in);
