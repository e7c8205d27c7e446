-- orderly's tables on PostgreSQL: one per keyspace of the embedded engine. Ids are their
-- public text forms (a prefix and a UUIDv7, so they sort by creation time under the "C"
-- collation); times are milliseconds since the Unix epoch.

CREATE TABLE accounts (
    id             text COLLATE "C" PRIMARY KEY,
    name           text    NOT NULL,
    wholesale      boolean NOT NULL,
    credit_limit   bigint  NOT NULL,
    region         text,
    webhook_secret text    NOT NULL,
    created_at     bigint  NOT NULL
);

-- The one row an order's debit updates, with the limit it is checked against beside it.
CREATE TABLE balances (
    account_id   text COLLATE "C" PRIMARY KEY,
    available    bigint NOT NULL,
    credit_limit bigint NOT NULL
);

CREATE TABLE api_keys (
    hash       bytea PRIMARY KEY,
    id         text COLLATE "C" NOT NULL UNIQUE,
    account_id text COLLATE "C" NOT NULL,
    scopes     jsonb   NOT NULL,
    revoked    boolean NOT NULL,
    created_at bigint  NOT NULL
);

CREATE TABLE products (
    id              text COLLATE "C" PRIMARY KEY,
    name            text    NOT NULL,
    price           bigint  NOT NULL,
    regions         jsonb   NOT NULL,
    delivery_fields jsonb   NOT NULL,
    active          boolean NOT NULL,
    updated_at      bigint  NOT NULL
);

CREATE TABLE orders (
    id                text COLLATE "C" PRIMARY KEY,
    account_id        text COLLATE "C" NOT NULL,
    status            text   NOT NULL,
    items             jsonb  NOT NULL,
    total             bigint NOT NULL,
    currency          text   NOT NULL,
    callback_url      text,
    external_order_id text COLLATE "C",
    refunded          bigint NOT NULL,
    created_at        bigint NOT NULL,
    updated_at        bigint NOT NULL
);
CREATE INDEX orders_by_account ON orders (account_id, id);
CREATE INDEX orders_by_external ON orders (account_id, external_order_id, id)
    WHERE external_order_id IS NOT NULL;
-- The fulfillment queue.
CREATE INDEX orders_processing ON orders (id) WHERE status = 'Processing';

CREATE TABLE ledger (
    id            text COLLATE "C" PRIMARY KEY,
    account_id    text COLLATE "C" NOT NULL,
    amount        bigint NOT NULL,
    reason        text   NOT NULL,
    reference     text   NOT NULL,
    balance_after bigint NOT NULL,
    created_at    bigint NOT NULL
);
CREATE INDEX ledger_by_account ON ledger (account_id, id);

CREATE TABLE refunds (
    id         text COLLATE "C" PRIMARY KEY,
    order_id   text COLLATE "C" NOT NULL,
    amount     bigint NOT NULL,
    reason     text,
    created_at bigint NOT NULL
);

-- An event keeps the snapshot it was sent with (the order as it was then).
CREATE TABLE events (
    id         text COLLATE "C" PRIMARY KEY,
    account_id text COLLATE "C" NOT NULL,
    created_at bigint NOT NULL,
    snapshot   jsonb  NOT NULL
);
CREATE INDEX events_by_account ON events (account_id, id);

-- Pending callbacks: one per event at a time, due at due_at.
CREATE TABLE outbox (
    event_id   text COLLATE "C" PRIMARY KEY,
    due_at     bigint  NOT NULL,
    account_id text COLLATE "C" NOT NULL,
    url        text    NOT NULL,
    attempt    integer NOT NULL
);
CREATE INDEX outbox_due ON outbox (due_at, event_id);

CREATE TABLE delivery_logs (
    event_id text COLLATE "C" PRIMARY KEY,
    log      jsonb NOT NULL
);

CREATE TABLE provider_payments (
    provider    text COLLATE "C" NOT NULL,
    external_id text COLLATE "C" NOT NULL,
    txn_id      text COLLATE "C" NOT NULL,
    account_id  text COLLATE "C" NOT NULL,
    amount      bigint NOT NULL,
    received_at bigint NOT NULL,
    PRIMARY KEY (provider, external_id)
);

-- A used key: what it was used for and the exact bytes answered, in one row.
CREATE TABLE idempotency_keys (
    account_id   text COLLATE "C" NOT NULL,
    key          text COLLATE "C" NOT NULL,
    operation    text    NOT NULL,
    fingerprint  bytea   NOT NULL,
    expires_at   bigint  NOT NULL,
    status       integer NOT NULL,
    content_type text    NOT NULL,
    body         bytea   NOT NULL,
    PRIMARY KEY (account_id, key)
);
CREATE INDEX idempotency_keys_expiry ON idempotency_keys (expires_at);
