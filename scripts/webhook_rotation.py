"""Secret rotation checked with the official Standard Webhooks library, not orderly's code.

Against a running orderly (started with --allow-private-callbacks and a short
--webhook-secret-overlap): rotates an account's secret, has an order's callback delivered to a
receiver here, and verifies it with `standardwebhooks.Webhook` under the old and under the new
secret (both must pass, a stranger's must not). Once the overlap is over it redelivers the
same event and checks that the new secret alone verifies it, with the same webhook-id and body.

    python3 webhook_rotation.py BASE_URL ADMIN_TOKEN
"""

import base64
import json
import os
import sys
import threading
import time
import urllib.request
import uuid
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

BASE, ADMIN = sys.argv[1], sys.argv[2]
received = []
arrived = threading.Condition()


class Hook(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with arrived:
            received.append(({k.lower(): v for k, v in self.headers.items()}, body))
            arrived.notify_all()
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def call(method, path, body=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(BASE + path, data=data, method=method)
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def admin(method, path, body=None):
    return call(method, path, body, {"Authorization": f"Bearer {ADMIN}",
                                     "X-Idempotency-Key": str(uuid.uuid4())})


def wait_for(n, within=15):
    deadline = time.monotonic() + within
    with arrived:
        while len(received) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                sys.exit(f"FAIL: {len(received)} deliveries arrived, {n} expected")
            arrived.wait(left)
        return received[n - 1]


def verifies(secret, delivery):
    headers, body = delivery
    try:
        Webhook(secret).verify(body, headers)
        return True
    except WebhookVerificationError:
        return False


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hooks"

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
    during = wait_for(1)
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
    after = wait_for(2)
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
    server.shutdown()
    if failed:
        sys.exit(f"FAIL: {len(failed)} of {len(checks)} checks")
    print(f"webhook rotation: {len(checks)} checks passed with standardwebhooks")


main()
