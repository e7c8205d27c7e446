-- A key's end (`expiresAt`), if it was given one: milliseconds since the epoch. Nullable, so
-- an instance of the previous version (which neither writes nor reads it) keeps working beside
-- this one during a rolling upgrade: its keys have no end.
ALTER TABLE api_keys ADD COLUMN expires_at bigint;
