-- The shared rate limit spends every client bucket of one tick in one multi-row upsert
-- (store/postgres/rate_limit.rs): each row carries the terms it was spent under, so that ON CONFLICT can read them
-- from `excluded` (the row proposed for that bucket) rather than from one statement-wide
-- parameter. UNLOGGED as before; what these columns hold matters only within a statement.
ALTER TABLE rate_limits
    ADD COLUMN wanted   bigint NOT NULL DEFAULT 0,
    ADD COLUMN emission bigint NOT NULL DEFAULT 1,
    ADD COLUMN span     bigint NOT NULL DEFAULT 0;
