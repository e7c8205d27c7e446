"""What the webhook scripts share (webhook_rotation.py, webhook_examples.py): a receiver on
127.0.0.1 that records every POST (its headers, lowercased, and its raw body) and answers 200,
and calls to an orderly server."""

import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """Every POST it got, in arrival order, as (headers, body)."""

    def __init__(self):
        self.received = []
        self.arrived = threading.Condition()
        outer = self

        class Hook(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with outer.arrived:
                    outer.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                    outer.arrived.notify_all()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    def first(self, matching, within, what):
        """The first POST `matching(headers, body)` accepts, waiting at most `within` s; exits
        the script with a failure naming `what` when none comes."""
        deadline = time.monotonic() + within
        with self.arrived:
            while True:
                for delivery in self.received:
                    if matching(*delivery):
                        return delivery
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SystemExit(f"FAIL: {what} did not arrive within {within} s "
                                     f"({len(self.received)} deliveries)")
                self.arrived.wait(left)

    def nth(self, n, within=15):
        """The n-th POST (from 1), waiting at most `within` s for it."""
        deadline = time.monotonic() + within
        with self.arrived:
            while len(self.received) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SystemExit(f"FAIL: {len(self.received)} deliveries arrived, {n} expected")
                self.arrived.wait(left)
            return self.received[n - 1]

    def stop(self):
        self.server.shutdown()


def call(base, method, path, body=None, headers=None):
    """(status, the JSON answer) of a call to the server at `base`."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method)
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def admin(base, token, method, path, body=None):
    """The JSON answer of an admin call, each with a fresh idempotency key."""
    return call(base, method, path, body, {"Authorization": f"Bearer {token}",
                                           "X-Idempotency-Key": str(uuid.uuid4())})[1]
