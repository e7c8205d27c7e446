"""Secret rotation checked with the official Standard Webhooks library, not orderly's code.

Against a running orderly (started with --allow-private-callbacks and a short
--webhook-secret-overlap): rotates an account's secret, has an order's callback delivered to a
receiver here, and verifies it with `standardwebhooks.Webhook` under the old and under the new
secret (both must pass, a stranger's must not). Once the overlap is over it redelivers the
same event and checks that the new secret alone verifies it, with the same webhook-id and body.

    python3 webhook_rotation.py BASE_URL ADMIN_TOKEN
"""

import base64
import os
import sys
import time
from datetime import datetime

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from webhook_receiver import Receiver, admin as admin_call, call as call_status

BASE, ADMIN = sys.argv[1], sys.argv[2]


def call(method, path, body=None, headers=None):
    return call_status(BASE, method, path, body, headers)[1]


def admin(method, path, body=None):
    return admin_call(BASE, ADMIN, method, path, body)


def verifies(secret, delivery):
    headers, body = delivery
    try:
        Webhook(secret).verify(body, headers)
        return True
    except WebhookVerificationError:
        return False


def main():
    receiver = Receiver()
    url = f"{receiver.base}/hooks"

    admin("PUT", "/admin/products/prd_rot", {"name": "Rotation", "price": 100, "regions": [],
                                             "deliveryFields": [], "active": True})
    account = admin("POST", "/admin/accounts", {"name": "Rotation", "wholesale": True,
                                                "region": "EU"})["account"]
    admin("POST", f"/admin/accounts/{account['id']}/credits", {"amount": 10_000})
    key = admin("POST", f"/admin/accounts/{account['id']}/api-keys", {})["apiKey"]["key"]
    old = account["webhookSecret"]
    rotated = admin("POST", f"/admin/accounts/{account['id']}/webhook-secret")
    new, until = rotated["webhookSecret"], rotated["previousSecretValidUntil"]
    stranger = "whsec_" + base64.b64encode(os.urandom(32)).decode()

    call("POST", "/b2b/orders", {"items": [{"productId": "prd_rot", "quantity": 1}],
                                 "callbackUrl": url},
         {"X-Api-Key": key, "X-Idempotency-Key": "rotation-1"})
    during = receiver.nth(1)
    checks = [
        ("during the overlap, the old secret verifies", verifies(old, during)),
        ("during the overlap, the new secret verifies", verifies(new, during)),
        ("a stranger's secret does not verify", not verifies(stranger, during)),
    ]

    # Past the overlap (whole seconds on the wire: one more second for the fraction).
    ends = datetime.fromisoformat(until.replace("Z", "+00:00")).timestamp() + 1.0
    time.sleep(max(0.0, ends - time.time()))
    event_id = during[0]["webhook-id"]
    answer = admin("POST", f"/admin/events/{event_id}/redeliver")
    after = receiver.nth(2)
    checks += [
        ("the redelivery is queued", answer == {"success": True, "delivery": "pending"}),
        ("the redelivery has the same webhook-id", after[0]["webhook-id"] == event_id),
        ("the redelivery has the same body", after[1] == during[1]),
        ("after the overlap, the new secret verifies", verifies(new, after)),
        ("after the overlap, the old secret no longer does", not verifies(old, after)),
    ]
    failed = [name for name, ok in checks if not ok]
    for name, ok in checks:
        print(("ok   " if ok else "FAIL ") + name)
    receiver.stop()
    if failed:
        sys.exit(f"FAIL: {len(failed)} of {len(checks)} checks")
    print(f"webhook rotation: {len(checks)} checks passed with standardwebhooks")


main()
