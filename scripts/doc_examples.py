"""Every answer body README.md and docs/api.md show is the body the real server gives.

Used by check-docs.py (with --bin). Each example of a response body in those pages carries a
label in an HTML comment, which GitHub does not show:

- before a ```json block: a line `<!-- answer: LABEL -->`;
- before an inline body (`{"success"…`, `{"error"…`, `{"detail"…` in backticks): the
  comment right before its backtick, on the same line;
- before a shell block whose `# {…}` / `# 409 {…}` comment lines show answers:
  `<!-- answers: LABEL, LABEL -->`, one label per such line, in order.

`scenario()` starts the binary with `--demo` and sends, for each label, the request the page
describes; `check()` compares each example with the answer sent for its label: the same
status where the page gives one, the same fields in the same order (an example may elide
fields with `"...": "..."` or a bare `…`), and the same values but for what differs from one
run to the next: ids (`ord_` and 32 hex digits: the same prefix), keys, secrets and times (the
same form), numbers (an integer), and strings with `…` (the parts around it, in order). An
example that is a shape and not an answer (`<CODE>`, `[...]`) is labelled `shape`; one the
check cannot provoke says why in its label (`not sent: …`), and is counted.
"""

import hashlib
import hmac
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

PAGES = ["README.md", "docs/api.md"]
ADMIN = "doc-examples-admin"
PROVIDER_SECRET = "doc-examples-secret"
PARTNER = "gc_live_00000000000000000000000000000001"
RETAIL = "gc_live_00000000000000000000000000000002"
MARKER = re.compile(r"<!-- answers?: (.+?) -->")
INLINE = re.compile(r"(?:<!-- answer: (.+?) -->)?`(\{\"(?:success|error|detail)\"[^`]*)`")
SHELL_ANSWER = re.compile(r"^#\s*(?:(\d{3})\s+)?(\{.*\})\s*$")
ID = re.compile(r"^([a-z]+)_[0-9a-f]{32}$")
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
HASH = re.compile(r"^[0-9a-f]{64}$")
RUN_SPECIFIC = [ID, TIME, HASH, re.compile(r"^gc_live_[0-9a-f]{32}$"), re.compile(r"^whsec_\S+$")]
DEMO_ACCOUNT = "acc_0193a0c0000070008000000000000001"


class Example:
    def __init__(self, page, line, label, text, status=None):
        self.page, self.line, self.label, self.text, self.status = page, line, label, text, status

    def where(self):
        return f"{self.page}:{self.line}"


def examples(page, text):
    """Every answer example of `page`, with its label (None when it has none)."""
    found = []
    lines = text.split("\n")
    fence, block, block_start, label, labels = None, [], 0, None, []
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if fence is None:
            if stripped.startswith("```"):
                fence = stripped[3:].strip() or "text"
                block, block_start = [], number + 1
                previous = lines[number - 2].strip() if number > 1 else ""
                marker = MARKER.fullmatch(previous)
                label = marker.group(1).strip() if marker else None
                labels = [l.strip() for l in label.split(",")] if label and fence != "json" else []
                continue
            for match in INLINE.finditer(line):
                found.append(Example(page, number, match.group(1), match.group(2)))
            continue
        if stripped.startswith("```"):
            if fence == "json":
                found.append(Example(page, block_start, label, "\n".join(block)))
            fence = None
            continue
        block.append(line)
        if fence in ("sh", "bash", "shell"):
            answer = SHELL_ANSWER.match(stripped)
            if answer:
                own = labels.pop(0) if labels else None
                found.append(Example(page, number, own, answer.group(2), answer.group(1)))
    return found


def parse(text):
    """The example as JSON, a bare `…` member read as `"...": "..."`; None if it is not JSON."""
    text = re.sub(r"(?<=[{,])\s*…\s*(?=[,}])", '"...":"..."', text)
    try:
        return json.loads(text)
    except ValueError:
        return None


def differences(shown, sent, path="$"):
    """Where the example `shown` is not the answer `sent`."""
    if isinstance(shown, dict):
        if not isinstance(sent, dict):
            return [f"{path}: an object in the example, {type(sent).__name__} sent"]
        elided = "..." in shown
        keys = [k for k in shown if k != "..."]
        sent_keys = list(sent)
        problems = []
        if elided:
            order = [k for k in sent_keys if k in keys]
            missing = [k for k in keys if k not in sent]
            if missing:
                problems.append(f"{path}: {', '.join(missing)} not in the answer")
            elif order != keys:
                problems.append(f"{path}: fields in another order than the answer's ({', '.join(order)})")
        elif keys != sent_keys:
            problems.append(f"{path}: fields {keys}, the answer has {sent_keys}")
        for key in keys:
            if key in sent:
                problems += differences(shown[key], sent[key], f"{path}.{key}")
        return problems
    if isinstance(shown, list):
        if not isinstance(sent, list):
            return [f"{path}: a list in the example, {type(sent).__name__} sent"]
        if shown and not sent:
            return [f"{path}: the answer's list is empty"]
        return differences(shown[0], sent[0], f"{path}[0]") if shown else []
    if isinstance(shown, bool) or shown is None:
        return [] if shown == sent else [f"{path}: {json.dumps(shown)} shown, {json.dumps(sent)} sent"]
    if isinstance(shown, (int, float)):
        ok = isinstance(sent, (int, float)) and not isinstance(sent, bool)
        return [] if ok else [f"{path}: a number shown, {json.dumps(sent)} sent"]
    if not isinstance(sent, str):
        return [f"{path}: {json.dumps(shown)} shown, {json.dumps(sent)} sent"]
    if "…" in shown or shown == "...":
        parts = [p for p in re.split(r"…|\.\.\.", shown) if p]
        at, fits = 0, not parts or sent.startswith(parts[0]) or shown.startswith(("…", "..."))
        for part in parts:
            found = sent.find(part, at)
            fits = fits and found >= 0
            at = found + len(part)
        return [] if fits else [f"{path}: {json.dumps(shown)} shown, {json.dumps(sent)} sent"]
    for pattern in RUN_SPECIFIC:
        if pattern.match(shown) and pattern.match(sent):
            same_kind = pattern is not ID or ID.match(shown).group(1) == ID.match(sent).group(1)
            if same_kind:
                return []
    return [] if shown == sent else [f"{path}: {json.dumps(shown)} shown, {json.dumps(sent)} sent"]


class Server:
    """`orderly serve --demo` on a free port, in a scratch directory."""

    def __init__(self, binary, root, extra=()):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.scratch = tempfile.TemporaryDirectory()
        self.process = subprocess.Popen(
            [binary, "serve", "--demo", "--listen", f"127.0.0.1:{self.port}",
             "--data-dir", f"{self.scratch.name}/db", "--admin-token", ADMIN,
             "--provider-secret", f"acmepay={PROVIDER_SECRET}", *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=root,  # --demo reads data/demo.json
        )
        deadline = time.time() + 30
        while self.send("GET", "/healthz")[0] != 200:
            if time.time() > deadline or self.process.poll() is not None:
                self.stop()
                raise SystemExit("check-docs: the server for the examples did not start")
            time.sleep(0.2)

    def send(self, method, path, body=None, key=None, admin=False, headers=None, raw=None):
        """(status, JSON body or None)."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if key:
            request.add_header("X-Api-Key", key)
        if admin:
            request.add_header("Authorization", f"Bearer {ADMIN}")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                status, payload = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, payload = e.code, e.read()
        except OSError:
            return 0, None
        try:
            return status, json.loads(payload)
        except ValueError:
            return status, None

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.scratch.cleanup()


def until(what, check, within=20):
    deadline = time.time() + within
    while True:
        result = check()
        if result:
            return result
        if time.time() > deadline:
            raise SystemExit(f"check-docs: {what} did not happen within {within} s")
        time.sleep(0.1)


def ledger_example(server, root):
    """docs/ledger/verify.py, as docs/api.md "Verifying your ledger" shows it, against the demo
    partner's ledger: it verifies every entry, then nothing new, and a kept head the server's
    history does not contain is a divergence (exit 3)."""
    script = os.path.join(root, "docs", "ledger", "verify.py")
    base = f"http://127.0.0.1:{server.port}"
    with tempfile.TemporaryDirectory() as scratch:
        state = os.path.join(scratch, "head.json")

        def run():
            done = subprocess.run([sys.executable, script, base, PARTNER, DEMO_ACCOUNT, state],
                                  capture_output=True, text=True, timeout=60)
            return done.returncode, done.stdout.strip()

        code, out = run()
        entries = server.send("GET", "/b2b/transactions", key=PARTNER)[1]["transactions"]
        if code != 0 or json.loads(out)["new"] != len(entries) or len(entries) < 2:
            raise SystemExit(f"check-docs: docs/ledger/verify.py did not verify the demo ledger: {code} {out}")
        code, out = run()
        if code != 0 or json.loads(out)["new"] != 0:
            raise SystemExit(f"check-docs: docs/ledger/verify.py, run again: {code} {out}")
        with open(state) as f:
            head = json.load(f)
        head["hash"] = "0" * 64
        with open(state, "w") as f:
            json.dump(head, f)
        code, out = run()
        if code != 3 or "divergence" not in out:
            raise SystemExit(f"check-docs: docs/ledger/verify.py took a head the server never had: {code} {out}")


def scenario(binary, root):
    """Each label's answer: (status, body), from requests against the real binary."""
    sent = {}
    order_body = {
        "items": [{"productId": "prd_uc_660", "quantity": 2, "deliveryData": {"username": "@Player1"}}],
        "callbackUrl": "https://partner.example/hooks/orders",
        "externalOrderId": "checkout-8812",
    }
    server = Server(binary, root, ["--fulfillment-delay", "1s"])
    try:
        s = server.send
        sent["healthz"] = s("GET", "/healthz")
        sent["readyz"] = s("GET", "/readyz")
        sent["order-placed"] = s("POST", "/b2b/orders", order_body, PARTNER,
                                 headers={"X-Idempotency-Key": "checkout-8812"})
        order = sent["order-placed"][1]["order"]["id"]
        sent["balance"] = s("GET", "/b2b/balance", key=PARTNER)
        sent["transactions"] = s("GET", "/b2b/transactions", key=PARTNER)
        ledger_example(server, root)
        changed = dict(order_body, items=[dict(order_body["items"][0], quantity=3)])
        sent["key-reused"] = s("POST", "/b2b/orders", changed, PARTNER,
                               headers={"X-Idempotency-Key": "checkout-8812"})
        wrong_type = {"items": [{"productId": "prd_uc_660", "quantity": 1, "deliveryData": {"username": 5}}]}
        sent["validation"] = s("POST", "/b2b/orders", wrong_type, PARTNER,
                               headers={"X-Idempotency-Key": "doc-422"})
        sent["invalid-api-key"] = s("GET", "/b2b/balance", key="gc_live_ffffffffffffffffffffffffffffffff")
        sent["invalid-admin-token"] = s("GET", "/admin/accounts", headers={"Authorization": "Bearer nope"})
        sent["not-wholesale"] = s("GET", "/b2b/balance", key=RETAIL)
        sent["products"] = s("GET", "/b2b/products?limit=1&cursor=prd_free_sample", key=PARTNER)
        until("the order's completion", lambda: s("GET", f"/b2b/orders/{order}", key=PARTNER)[1]["order"]["status"] == "completed")
        sent["refund"] = s("POST", f"/b2b/orders/{order}/refunds", {"amount": 500, "reason": "one code unused"},
                           PARTNER, headers={"X-Idempotency-Key": "doc-refund"})
        sent["events"] = s("GET", "/b2b/events", key=PARTNER)
        event = sent["events"][1]["events"][0]["id"]
        account = "acc_0193a0c0000070008000000000000001"
        until("the first callback attempt", lambda: s("GET", f"/admin/accounts/{account}/events?limit=1", admin=True)[1]["events"][0].get("deliveries"))
        sent["admin-events"] = s("GET", f"/admin/accounts/{account}/events?limit=1", admin=True)
        # After the completion: the first event is the order's, as the pages show.
        gift = {"items": [{"productId": "prd_gift_eu_50", "quantity": 1}]}
        placed = s("POST", "/b2b/orders", gift, PARTNER, headers={"X-Idempotency-Key": "doc-cancel"})
        sent["cancelled"] = s("POST", f"/b2b/orders/{placed[1]['order']['id']}/cancel", key=PARTNER)
        sent["redeliver"] = s("POST", f"/b2b/events/{event}/redeliver", key=PARTNER)
        sent["admin-redeliver"] = s("POST", f"/admin/events/{event}/redeliver", admin=True)
        sent["accounts"] = s("GET", "/admin/accounts?limit=1", admin=True)
        sent["account-created"] = s("POST", "/admin/accounts", {"name": "Acme", "wholesale": True, "creditLimit": 10000, "region": "EU"}, admin=True)
        acme = sent["account-created"][1]["account"]["id"]
        sent["account"] = s("GET", f"/admin/accounts/{acme}", admin=True)
        end = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60 * 86400))
        sent["api-key-created"] = s("POST", f"/admin/accounts/{acme}/api-keys",
                                    {"scopes": ["orders:read", "catalog:read"], "expiresAt": end}, admin=True)
        sent["scope-missing"] = s("GET", "/b2b/balance", key=sent["api-key-created"][1]["apiKey"]["key"])
        sent["credited"] = s("POST", f"/admin/accounts/{acme}/credits", {"amount": 50000, "reason": "wire 2211"},
                             admin=True, headers={"X-Idempotency-Key": "doc-credit"})
        sent["recovered"] = s("POST", f"/admin/accounts/{acme}/deliveries/recover", {"since": "2026-12-01T00:00:00Z"}, admin=True)
        sent["webhook-secret"] = s("POST", f"/admin/accounts/{acme}/webhook-secret", admin=True)
        sent["revoked"] = s("DELETE", f"/admin/api-keys/{sent['api-key-created'][1]['apiKey']['id']}", admin=True)
        sent["product-put"] = s("PUT", "/admin/products/prd_new", {"name": "New", "price": 100, "regions": ["EU"], "deliveryFields": ["username"]}, admin=True)

        def notify(body, signature=None):
            raw = json.dumps(body).encode()
            mac = hmac.new(PROVIDER_SECRET.encode(), raw, hashlib.sha256).hexdigest()
            return s("POST", "/webhooks/providers/acmepay", raw=raw,
                     headers={"X-Signature": signature or f"sha256={mac}"})

        payment = {"id": "pay_1", "type": "payment.succeeded", "accountId": acme, "amount": 1000, "currency": "USD"}
        sent["payment-credited"] = notify(payment)
        sent["payment-duplicate"] = notify(payment)
        sent["payment-ignored"] = notify(dict(payment, id="pay_2", type="payment.refunded"))
        sent["invalid-signature"] = notify(payment, "sha256=" + "0" * 64)
    finally:
        server.stop()
    limited = Server(binary, root, ["--rate-limit", "1"])
    try:
        sent["rate-limited"] = until("a 429", lambda: (lambda r: r if r[0] == 429 else None)(limited.send("GET", "/b2b/balance", key=PARTNER)))
    finally:
        limited.stop()
    return sent


def check(root, sent, overlay=None):
    """One line per example that is not what the server sent, or that has no label."""
    problems, counts = [], {"sent": 0, "shape": 0, "not sent": 0}
    for page in PAGES:
        text = (overlay or {}).get(page)
        if text is None:
            with open(os.path.join(root, page), encoding="utf-8") as f:
                text = f.read()
        for example in examples(page, text):
            shown = parse(example.text)
            label = example.label
            if label is None:
                problems.append(f"{example.where()}: an answer example without a label (<!-- answer: … -->)")
            elif label == "shape":
                counts["shape"] += 1
                if shown is not None and "<" not in example.text:
                    problems.append(f"{example.where()}: labelled a shape, but it is an answer: give its label")
            elif label.startswith("not sent"):
                counts["not sent"] += 1
            elif label not in sent:
                problems.append(f"{example.where()}: no request sends the answer {label!r}")
            elif shown is None:
                problems.append(f"{example.where()}: {label}: not JSON (a shape? label it `shape`)")
            else:
                counts["sent"] += 1
                status, body = sent[label]
                if example.status and int(example.status) != status:
                    problems.append(f"{example.where()}: {label}: {example.status} shown, {status} sent")
                for difference in differences(shown, body):
                    problems.append(f"{example.where()}: {label}: {difference}")
    return problems, counts
