-- The ledger's chain (docs/api.md "Verifying your ledger"): each entry's place in its
-- account's ledger (`seq`, 1, 2, 3 ...) and its SHA-256 (`hash`). Nullable: an instance of the
-- previous version, still running during a rolling upgrade, writes entries without them, and
-- this version chains those (they are always the newest of their account) before it writes
-- the account's next entry, and at its start. The unique index is the chain's order and the
-- way to the entries after a seq (`afterSeq`); the partial one finds what is left to chain
-- without reading the ledger, and holds nothing once it is chained.
ALTER TABLE ledger ADD COLUMN seq bigint, ADD COLUMN hash bytea;
CREATE UNIQUE INDEX ledger_account_seq ON ledger (account_id, seq);
CREATE INDEX ledger_unchained ON ledger (account_id) WHERE seq IS NULL;
