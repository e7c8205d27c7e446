-- Webhook operations: secret rotation, redelivery, recovery (docs/contract.md "7. Webhooks").

-- The webhook secret an account's last rotation replaced: it signs beside the current one
-- until valid_until (milliseconds), read with each due delivery, so every instance signs alike.
CREATE TABLE previous_webhook_secrets (
    account_id  text COLLATE "C" PRIMARY KEY,
    secret      text   NOT NULL,
    valid_until bigint NOT NULL
);
