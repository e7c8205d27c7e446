"""The webhook verification examples of docs/api.md, run against real deliveries.

Against a running orderly (started with --allow-private-callbacks and a short
--fulfillment-delay): has one delivery of each event type (order.completed, order.cancelled,
order.refunded) POSTed to a receiver here, then for each delivery
  - runs docs/webhooks/verify.py (the Standard Webhooks library) and docs/webhooks/verify.sh
    (openssl) as a partner would: both must verify it, and both must refuse it with one byte
    of the body changed, or with a stranger's secret;
  - validates the body against the schema `/openapi.json` gives its type under `webhooks`.

    python3 webhook_examples.py BASE_URL ADMIN_TOKEN
"""

import base64
import json
import os
import subprocess
import sys
import tempfile

import jsonschema
import referencing
import referencing.jsonschema

from webhook_receiver import Receiver, admin as admin_call, call as call_status

BASE, ADMIN = sys.argv[1], sys.argv[2]
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
receiver = Receiver()


def call(method, path, body=None, headers=None):
    return call_status(BASE, method, path, body, headers)


def admin(method, path, body=None):
    return admin_call(BASE, ADMIN, method, path, body)


def delivery_of(kind, within=20):
    """The first delivery of an event of type `kind`."""
    return receiver.first(lambda _, body: json.loads(body)["type"] == kind, within,
                          f"a {kind} delivery")


def examples_verify(secret, headers, body):
    """(verify.py verified, verify.sh verified) for one delivery."""
    with tempfile.TemporaryDirectory() as scratch:
        headers_file = os.path.join(scratch, "headers.json")
        body_file = os.path.join(scratch, "body")
        with open(headers_file, "w", encoding="utf-8") as f:
            json.dump(headers, f)
        with open(body_file, "wb") as f:
            f.write(body)
        python = subprocess.run(
            [sys.executable, os.path.join(ROOT, "docs/webhooks/verify.py"), secret,
             headers_file, body_file], capture_output=True, text=True, timeout=30)
        shell = subprocess.run(
            ["bash", os.path.join(ROOT, "docs/webhooks/verify.sh"), secret,
             headers["webhook-id"], headers["webhook-timestamp"], headers["webhook-signature"],
             body_file], capture_output=True, text=True, timeout=30)
        return python.returncode == 0, shell.returncode == 0


def main():
    url = f"{receiver.base}/hooks/orders?token=abc"

    admin("PUT", "/admin/products/prd_ex", {"name": "Examples", "price": 250, "regions": [],
                                            "deliveryFields": [], "active": True})
    account = admin("POST", "/admin/accounts", {"name": "Examples", "wholesale": True,
                                                "region": "EU"})["account"]
    admin("POST", f"/admin/accounts/{account['id']}/credits", {"amount": 100_000})
    key = admin("POST", f"/admin/accounts/{account['id']}/api-keys", {})["apiKey"]["key"]
    secret = account["webhookSecret"]
    partner = lambda idem: {"X-Api-Key": key, "X-Idempotency-Key": idem}
    order = {"items": [{"productId": "prd_ex", "quantity": 2}], "callbackUrl": url}

    # order.completed, then order.refunded of the same order.
    status, placed = call("POST", "/b2b/orders", order, partner("ex-complete"))
    assert status == 200, placed
    delivery_of("order.completed")
    status, refunded = call("POST", f"/b2b/orders/{placed['order']['id']}/refunds",
                            {"amount": 100, "reason": "examples"}, partner("ex-refund"))
    assert status == 200, refunded
    # order.cancelled: cancelled before its fulfillment (retried if fulfillment won the race).
    for attempt in range(5):
        status, placed = call("POST", "/b2b/orders", order, partner(f"ex-cancel-{attempt}"))
        assert status == 200, placed
        status, _ = call("POST", f"/b2b/orders/{placed['order']['id']}/cancel", None,
                         {"X-Api-Key": key})
        if status == 200:
            break

    status, document = call("GET", "/openapi.json")
    registry = referencing.Registry().with_resource(
        "urn:orderly:openapi", referencing.jsonschema.DRAFT202012.create_resource(document))
    stranger = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    checks = []
    for kind in ["order.completed", "order.refunded", "order.cancelled"]:
        headers, body = delivery_of(kind)
        pointer = "/webhooks/" + kind + "/post/requestBody/content/application~1json/schema"
        validator = jsonschema.Draft202012Validator(
            {"$ref": "urn:orderly:openapi#" + pointer}, registry=registry)
        errors = [e.message for e in validator.iter_errors(json.loads(body))]
        python, shell = examples_verify(secret, headers, body)
        changed = bytearray(body)
        changed[len(changed) // 2] ^= 0x01
        python_changed, shell_changed = examples_verify(secret, headers, bytes(changed))
        python_stranger, shell_stranger = examples_verify(stranger, headers, body)
        checks += [
            (f"{kind}: verify.py verifies the delivery", python),
            (f"{kind}: verify.sh verifies the delivery", shell),
            (f"{kind}: both refuse it with one byte of the body changed",
             not python_changed and not shell_changed),
            (f"{kind}: both refuse it under a stranger's secret",
             not python_stranger and not shell_stranger),
            (f"{kind}: its body is valid against /openapi.json's webhooks ({errors[:2]})",
             not errors),
        ]
    # The schemas tell the types apart: a completed order's body is not a cancellation.
    headers, body = delivery_of("order.completed")
    pointer = "/webhooks/order.cancelled/post/requestBody/content/application~1json/schema"
    other = jsonschema.Draft202012Validator({"$ref": "urn:orderly:openapi#" + pointer},
                                            registry=registry)
    checks.append(("order.completed's body is invalid against order.cancelled's schema",
                   not other.is_valid(json.loads(body))))
    failed = [name for name, ok in checks if not ok]
    for name, ok in checks:
        print(("ok   " if ok else "FAIL ") + name)
    receiver.stop()
    if failed:
        sys.exit(f"FAIL: {len(failed)} of {len(checks)} checks")
    print(f"webhook examples: {len(checks)} checks passed")


main()
