"""Verifies a webhook from orderly with the Standard Webhooks library, as a receiver does.

    pip install standardwebhooks
    python3 verify.py SECRET HEADERS_JSON BODY_FILE

SECRET is the account's webhook secret (`whsec_...`, from the operator). HEADERS_JSON is a file
holding the request's headers as a JSON object, BODY_FILE the request's body exactly as it
arrived. Prints the event's type and id and exits 0 when the delivery is genuine; exits 1
otherwise. In a receiver, call `verify` on the raw body before parsing it, and answer 2xx as soon
as the event is stored (within 10 s: orderly gives up on the attempt after that, and retries it).
"""

import json
import sys

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


def verify(secret: str, headers: dict, raw_body: bytes) -> dict:
    """The event, once its signature and timestamp are found right.

    - The raw body, byte for byte: JSON parsed and written again is other bytes, and the
      signature covers the bytes (`{webhook-id}.{webhook-timestamp}.{body}`).
    - The library decodes the secret (the base64 after `whsec_` is the key's bytes), accepts
      any one of the space-separated `v1,` signatures (during a rotation there are two), compares
      in constant time, and refuses a `webhook-timestamp` more than 5 minutes from this
      machine's clock (a replay of an old delivery).
    """
    lower = {k.lower(): v for k, v in headers.items()}
    return Webhook(secret).verify(raw_body, lower)


def main() -> int:
    secret, headers_file, body_file = sys.argv[1:4]
    with open(headers_file, encoding="utf-8") as f:
        headers = json.load(f)
    with open(body_file, "rb") as f:
        raw_body = f.read()
    try:
        event = verify(secret, headers, raw_body)
    except WebhookVerificationError as e:
        print(f"refused: {e}", file=sys.stderr)
        return 1
    # Deduplicate on webhook-id (the event's id): a retry carries the same one.
    print(f"verified {event['type']} {event['id']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
