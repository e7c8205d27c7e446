-- Many instances on one database (docs/contract.md "6. Many instances").

-- The per-client rate budget shared by every instance: one row per client bucket holding its
-- GCRA theoretical arrival time, in nanoseconds on the database's clock (one clock for every
-- instance, however theirs drift), and what the last statement on it decided (how many of its
-- requests were granted, at which now). UNLOGGED: no WAL for a write per request; a crash of
-- the database server empties it, which only hands every client a full budget again.
CREATE UNLOGGED TABLE rate_limits (
    bucket  text COLLATE "C" PRIMARY KEY,
    tat     bigint NOT NULL,
    granted bigint NOT NULL,
    seen    bigint NOT NULL
);

-- A delivery being attempted is claimed by one instance until claimed_until (milliseconds):
-- longer than one attempt can take, so that a live claim is never taken over, and short
-- enough that the claim of an instance that died lapses within 30 s.
ALTER TABLE outbox ADD COLUMN claimed_by text, ADD COLUMN claimed_until bigint;
