-- Delivery claims are fenced (store/postgres/outbox.rs): two instances must never send one webhook-id at once.

-- Each claim takes a number of its own from this sequence; an attempt's outcome is written
-- (the row removed or moved to its next attempt, the claim released) only under the number
-- it was claimed with, so a holder whose claim lapsed can no longer touch what another
-- instance holds now.
CREATE SEQUENCE outbox_claims;

-- `attempting`: the holder has extended its claim to outlast the attempt it is about to send
-- (claimed_until, on the database's clock). Such a claim is taken over only once it runs out,
-- never because its holder's heartbeat lapsed: a POST may be on the wire.
ALTER TABLE outbox
    ADD COLUMN claim bigint,
    ADD COLUMN attempting boolean NOT NULL DEFAULT false;
