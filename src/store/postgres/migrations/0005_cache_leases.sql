-- Each instance keeps API keys and their accounts in memory (a replay in no round
-- trip), and every change to them waits until no instance can still serve the old copy
-- (store/postgres/shared_cache.rs).

-- One counter bumped by each change to a key or an account that an instance may hold a copy
-- of (a revocation, a rotated webhook secret), in the change's own transaction.
CREATE TABLE auth_cache_version (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    version  bigint NOT NULL
);
INSERT INTO auth_cache_version (version) VALUES (0);

-- An instance may serve its copies while its lease is live (until valid_until, on the
-- database's clock), and has purged every copy read before change `acknowledged`. A change
-- answers once every live lease has acknowledged it. Rows of instances that stopped lapse by
-- themselves and are pruned by the others.
CREATE UNLOGGED TABLE auth_cache_leases (
    instance     text COLLATE "C" PRIMARY KEY,
    valid_until  timestamptz NOT NULL,
    acknowledged bigint NOT NULL
);

-- The shared rate limit lends a hot client's budget to an instance ahead of its requests
-- (store/postgres/rate_limit.rs): each row carries what its statement asked to reserve and
-- what it gives back, read from `excluded` as the terms are.
ALTER TABLE rate_limits
    ADD COLUMN reserve bigint NOT NULL DEFAULT 0,
    ADD COLUMN refund  bigint NOT NULL DEFAULT 0;

-- How many of `wanted` requests (and of `reserve` more, lent ahead) a GCRA bucket whose
-- arrival time starts at `start` grants at `now`: requests first, in full while they fit;
-- then a loan only from a budget with at least `floor` requests left over, and at most
-- 1/`share` of them, so that a client near its limit is decided request by request.
CREATE FUNCTION orderly_gcra_take(start bigint, now bigint, span bigint, emission bigint,
                                  wanted bigint, reserve bigint, floor bigint, share bigint)
RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT least(wanted, fit)
         + CASE WHEN fit - least(wanted, fit) >= floor
                THEN least(reserve, (fit - least(wanted, fit)) / share) ELSE 0 END
    FROM (SELECT greatest(0, (now + span - start) / emission) AS fit) AS budget
$$;
