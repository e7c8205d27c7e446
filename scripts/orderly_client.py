#!/usr/bin/env python3
"""Stdlib-only HTTP client used by bench.sh, crash-trials.sh, soak.sh and downgrade.sh (not meant to be run by hand).

  setup         PUT products prd_bench, prd_large, prd_a, prd_b and prd_c (price 1); create N
                wholesale accounts, each with an API key and a credit; write "account_id<TAB>api_key" lines
  precreate     place one order per idempotency key, to build a replay pool for wrk
  place         COUNT orders, keeping each answer's order id and the SHA-256 of its bytes
  replay-check  every key `place` kept replays to the same order, byte for byte
  verify        for every account: the ledger (all pages) sums to the balance
  crash-load    mixed new/replay order load until the server dies (or the limits hit); writes the
                keys it sent and the keys that got a 200 with their order id
  crash-verify  after the restart: acknowledged keys replay to their order, no orphan or duplicate
                orders, ledger == balance; writes the number of lost acknowledged orders
  large-fill    COUNT orders with 300 KB of delivery data each
  backup-pause  N orders, then a backup taken while one client keeps ordering: how long the
                backup took and how long the orders placed meanwhile waited
  fill-disk     new orders until the first answer that is not a 200 (the disk is full), then the
                same request again under that key; writes the files crash-verify reads
"""
import argparse
import gc
import hashlib
import http.client
import json
import os
import random
import sys
import subprocess
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

ORDER_BODY = b'{"items":[{"productId":"prd_bench","quantity":1}]}'
SCOPES = ["orders:write", "orders:read", "balance:read", "catalog:read"]


class Client:
    """One keep-alive HTTP/1.1 connection. retry=True resends once after a dropped connection."""

    def __init__(self, base, timeout=15):
        url = urllib.parse.urlsplit(base)
        self.host, self.port, self.timeout = url.hostname, url.port, timeout
        self.conn = None

    def call(self, method, path, body=None, headers=None, retry=True):
        hdrs = dict(headers or {})
        if body is not None and not isinstance(body, bytes):
            body = json.dumps(body).encode()
        if body is not None:
            hdrs["Content-Type"] = "application/json"
        for attempt in (0, 1):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
                self.conn.request(method, path, body=body, headers=hdrs)
                resp = self.conn.getresponse()
                raw = resp.read()
                self.raw = raw
                data = json.loads(raw) if raw else None
                return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
            except (OSError, http.client.HTTPException):
                self.close()
                if not retry or attempt:
                    raise

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


_local = threading.local()


def client(base):
    if getattr(_local, "client", None) is None:
        _local.client = Client(base)
    return _local.client


def pmap(fn, items, threads=8):
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(fn, items))


def expect(status, data, what):
    if status != 200:
        raise SystemExit(f"{what}: HTTP {status}: {data}")
    return data


LARGE = "-L"  # a key ending so orders prd_large with 300 KB of delivery data
MEDIUM = "-M"  # a key ending so orders prd_large with 3 to 8 KiB of delivery data


def incompressible(seed, size):
    """`size` hex characters drawn from `seed`, each 64 a digest of the seed and their place."""
    chunks = (hashlib.sha256(f"{seed}/{n}".encode()).hexdigest() for n in range(size // 64 + 1))
    return "".join(chunks)[:size]


def body_for(idem_key):
    """The order a key stands for, the same every time it is sent: a bench order; for a key
    ending in LARGE one with 300 KB of delivery data drawn from the key (sled keeps such values
    in files of their own); for one ending in MEDIUM one whose delivery data is 3 to 8 KiB
    (its stored answer and order row as large: 33 rows of such pages pass sled's blob
    threshold). The filler does not compress (sled compresses the pages of a store it
    creates): a chain of digests, not one repeated."""
    digest = hashlib.sha256(idem_key.encode()).hexdigest()
    if idem_key.endswith(MEDIUM):
        size = 3 * 1024 + int(digest[:8], 16) % (5 * 1024)
        filler = incompressible(digest, size)
        return json.dumps({"items": [{"productId": "prd_large", "quantity": 1,
                                      "deliveryData": {"username": filler}}]}).encode()
    if not idem_key.endswith(LARGE):
        return ORDER_BODY
    filler = incompressible(digest, 300 * 1024)
    return json.dumps({"items": [{"productId": "prd_large", "quantity": 1,
                                  "deliveryData": {"username": filler}}]}).encode()


def order_answer(base, api_key, idem_key, retry=False):
    """POST the order of `idem_key`. Returns (status, replayed?, order id or None, SHA-256 of
    the answer's bytes)."""
    c = client(base)
    status, hdrs, data = c.call(
        "POST", "/b2b/orders", body_for(idem_key),
        {"X-Api-Key": api_key, "X-Idempotency-Key": idem_key}, retry=retry)
    oid = data["order"]["id"] if status == 200 else None
    return status, hdrs.get("idempotency-replayed") == "true", oid, hashlib.sha256(c.raw).hexdigest()


def order(base, api_key, idem_key, retry=False):
    """POST the order of `idem_key`. Returns (status, replayed?, order id or None)."""
    return order_answer(base, api_key, idem_key, retry)[:3]


def read_accounts(path):
    with open(path) as f:
        return [line.rstrip("\n").split("\t") for line in f if line.strip()]


def list_all(base, api_key, resource):
    """Every item of a paginated /b2b list, checking the pages do not repeat an id."""
    items, seen, cursor = [], set(), None
    for _ in range(100000):
        q = "limit=100" + (f"&cursor={urllib.parse.quote(cursor)}" if cursor else "")
        s, _, data = client(base).call("GET", f"/b2b/{resource}?{q}", headers={"X-Api-Key": api_key})
        expect(s, data, f"GET /b2b/{resource}")
        for it in data[resource]:
            if it["id"] in seen:
                raise SystemExit(f"/b2b/{resource}: id {it['id']} appears on two pages")
            seen.add(it["id"])
            items.append(it)
        cursor = data.get("nextCursor")
        if not cursor:
            return items
    raise SystemExit(f"/b2b/{resource}: pagination did not end")


def ledger_check(base, api_key):
    """Returns (ok, available, ledger sum, entries)."""
    s, _, data = client(base).call("GET", "/b2b/balance", headers={"X-Api-Key": api_key})
    available = expect(s, data, "GET /b2b/balance")["balance"]["available"]
    txns = list_all(base, api_key, "transactions")
    total = sum(t["amount"] for t in txns)
    ok = total == available and (not txns or txns[0]["balanceAfter"] == available)
    return ok, available, total, len(txns)


# ---------------------------------------------------------------------------------- commands

def cmd_setup(a):
    admin = {"Authorization": f"Bearer {a.token}"}
    product = {"name": "bench", "price": 1, "regions": [], "deliveryFields": [], "active": True}
    s, _, d = client(a.base).call("PUT", "/admin/products/prd_bench", product, admin)
    expect(s, d, "PUT /admin/products/prd_bench")
    large = {**product, "name": "large", "deliveryFields": ["username"]}
    s, _, d = client(a.base).call("PUT", "/admin/products/prd_large", large, admin)
    expect(s, d, "PUT /admin/products/prd_large")
    # The products of the orders partners send (scripts/orders.lua's default bodies).
    for pid in ("prd_a", "prd_b", "prd_c"):
        s, _, d = client(a.base).call("PUT", f"/admin/products/{pid}", large, admin)
        expect(s, d, f"PUT /admin/products/{pid}")

    def one(i):
        c = client(a.base)
        s, _, d = c.call("POST", "/admin/accounts", {"name": f"load-{i}", "wholesale": True,
                                                     "creditLimit": 0, "region": "EU"}, admin, retry=False)
        acc = expect(s, d, "POST /admin/accounts")["account"]["id"]
        s, _, d = c.call("POST", f"/admin/accounts/{acc}/api-keys", {"scopes": SCOPES}, admin, retry=False)
        key = expect(s, d, "POST api-keys")["apiKey"]["key"]
        s, _, d = c.call("POST", f"/admin/accounts/{acc}/credits", {"amount": a.balance, "reason": "load test"},
                         {**admin, "X-Idempotency-Key": f"setup-credit-{acc}"})
        expect(s, d, "POST credits")
        return f"{acc}\t{key}\n"

    rows = pmap(one, range(a.accounts))
    with open(a.out, "w") as f:
        f.writelines(rows)


def cmd_precreate(a):
    accounts = read_accounts(a.accounts)

    def one(i):
        api_key, idem = accounts[i % len(accounts)][1], f"{a.prefix}-{i}"
        s, _, _ = order(a.base, api_key, idem, retry=True)
        if s != 200:
            raise SystemExit(f"precreate {idem}: HTTP {s}")
        return f"{api_key}\t{idem}\n"

    rows = pmap(one, range(a.count), threads=16)
    with open(a.out, "w") as f:
        f.writelines(rows)


def cmd_place(a):
    """New orders with keys PREFIX-0 ... spread over the accounts, each answer kept as
    api key, idempotency key, order id and the SHA-256 of its bytes (for `replay-check`)."""
    accounts = read_accounts(a.accounts)

    def one(i):
        api_key, idem = accounts[i % len(accounts)][1], f"{a.prefix}-{i}"
        s, _, oid, digest = order_answer(a.base, api_key, idem, retry=True)
        if s != 200:
            raise SystemExit(f"place {idem}: HTTP {s}")
        return f"{api_key}\t{idem}\t{oid}\t{digest}\n"

    rows = pmap(one, range(a.count), threads=16)
    with open(a.out, "w") as f:
        f.writelines(rows)


def cmd_replay_check(a):
    """Every key `place` kept, sent again: a replay (Idempotency-Replayed: true) of the same
    order, byte for byte the answer first given. Prints the counts; exits 1 on any other."""
    with open(a.placed) as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]

    def one(row):
        api_key, idem, oid, digest = row
        s, replayed, got, got_digest = order_answer(a.base, api_key, idem, retry=True)
        if s != 200 or not replayed or got != oid or got_digest != digest:
            return f"{idem}: HTTP {s}, replayed={replayed}, order {got} (was {oid}), same bytes: {got_digest == digest}"
        return None

    wrong = [w for w in pmap(one, rows, threads=16) if w]
    for w in wrong[:20]:
        print(f"NOT REPLAYED {w}")
    print(f"replay check: {len(rows)} keys, {len(rows) - len(wrong)} replayed byte for byte, {len(wrong)} not")
    sys.exit(1 if wrong else 0)


def cmd_verify(a):
    accounts = read_accounts(a.accounts)
    results = pmap(lambda row: (row[0],) + ledger_check(a.base, row[1]), accounts)
    bad = [r for r in results if not r[1]]
    for acc, _, avail, total, n in bad:
        print(f"LEDGER MISMATCH {acc}: available={avail} ledger sum={total} entries={n}")
    entries = sum(r[4] for r in results)
    print(f"ledger check: {len(results)} accounts, {entries} ledger entries, "
          f"{len(results) - len(bad)} balanced, {len(bad)} mismatched")
    sys.exit(1 if bad else 0)


def cmd_crash_load(a):
    """Each thread: new orders with fresh keys, and (replay_ratio) replays of its own acknowledged
    keys, checked on the spot. Stops at the first connection error (the server was killed)."""
    deadline = time.monotonic() + a.seconds
    sent, acked, lock = [], [], threading.Lock()
    stats = {"replays_ok": 0, "replays_bad": 0, "other_status": {}, "new_200": 0}

    def worker(t):
        mine, c = [], Client(a.base)
        _local.client = c
        for i in range(a.max_per_thread):
            if time.monotonic() > deadline:
                break
            try:
                if mine and random.random() < a.replay_ratio:
                    key, oid = random.choice(mine)
                    s, replayed, got = order(a.base, a.api_key, key)
                    with lock:
                        if s == 200 and replayed and got == oid:
                            stats["replays_ok"] += 1
                        elif a.storage_may_fail and s in (500, 503):
                            # The disk was taken from under the server: an error is the honest
                            # answer (the partner retries), a wrong order never is.
                            stats["other_status"][s] = stats["other_status"].get(s, 0) + 1
                        else:
                            stats["replays_bad"] += 1
                            print(f"live replay of {key}: HTTP {s} replayed={replayed} {got} != {oid}",
                                  file=sys.stderr)
                    continue
                draw = random.random()
                key = f"{a.prefix}-{t}-{i}" + (LARGE if draw < a.large_ratio else
                                               MEDIUM if draw < a.large_ratio + a.medium_ratio else "")
                with lock:
                    sent.append(key)
                s, _, oid, digest = order_answer(a.base, a.api_key, key)
                with lock:
                    if s == 200:
                        stats["new_200"] += 1
                        acked.append((key, oid, digest))
                        mine.append((key, oid))
                    else:
                        stats["other_status"][s] = stats["other_status"].get(s, 0) + 1
            except (OSError, http.client.HTTPException):
                return  # server gone

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(a.threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    with open(os.path.join(a.dir, "sent.txt"), "w") as f:
        f.writelines(k + "\n" for k in sent)
    with open(os.path.join(a.dir, "acked.tsv"), "w") as f:
        f.writelines(f"{k}\t{o}\t{d}\n" for k, o, d in acked)
    with open(os.path.join(a.dir, "load.json"), "w") as f:
        json.dump({**stats, "sent": len(sent), "acked": len(acked)}, f)


def cmd_crash_verify(a):
    base, key = a.base, a.api_key
    with open(os.path.join(a.dir, "sent.txt")) as f:
        sent = [line.strip() for line in f if line.strip()]
    acked, answers = {}, {}  # key -> order id, key -> SHA-256 of the 200's bytes (if kept)
    with open(os.path.join(a.dir, "acked.tsv")) as f:
        for line in f:
            if line.strip():
                k, oid, *digest = line.rstrip("\n").split("\t")
                acked[k] = oid
                answers.update({k: digest[0]} if digest else {})
    with open(os.path.join(a.dir, "load.json")) as f:
        load = json.load(f)
    problems = []
    if len(set(sent)) != len(sent):
        problems.append("the client sent a key twice as new")

    # 1. the orders that survived the kill
    before = {o["id"] for o in list_all(base, key, "orders")}
    lost = {k for k, oid in acked.items() if oid not in before}

    # 2. replay every key the client sent, acknowledged or not
    answered = dict(zip(sent, pmap(lambda k: order_answer(base, key, k, retry=True), sent, threads=16)))
    pass1 = {k: v[:3] for k, v in answered.items()}
    committed_unacked = new_now = 0
    for k, (s, replayed, oid) in pass1.items():
        if k in acked:
            if not (s == 200 and replayed and oid == acked[k]):
                lost.add(k)
            elif k in answers and answered[k][3] != answers[k]:
                problems.append(f"key {k} replays other bytes than its acknowledged answer")
        elif s != 200:
            problems.append(f"key {k} (unacknowledged) answered HTTP {s} on replay")
        elif replayed:
            committed_unacked += 1   # committed, but the 200 died with the server
            if oid not in before:
                problems.append(f"key {k} replays order {oid}, which is not in the order list")
        else:
            new_now += 1             # never committed: this replay created it now
    replayed_ids = {oid for s, r, oid in pass1.values() if s == 200 and r}
    orphans = before - replayed_ids
    if orphans:
        problems.append(f"{len(orphans)} orders in the list belong to no key the client sent")
    if len(before) != len(acked) - len(lost & set(acked)) + committed_unacked:
        problems.append(f"{len(before)} orders before replay != {len(acked)} acked + "
                        f"{committed_unacked} committed-unacked - lost")

    # 3. every sent key now replays to the one order it got in pass 1; one order per key
    pass2 = pmap(lambda k: order(base, key, k, retry=True), sent, threads=16)
    for k, (s, replayed, oid) in zip(sent, pass2):
        if not (s == 200 and replayed and oid == pass1[k][2]):
            problems.append(f"key {k}: second replay HTTP {s} replayed={replayed} {oid} != {pass1[k][2]}")
    after = [o["id"] for o in list_all(base, key, "orders")]
    if len(after) != len(sent) or set(after) != {v[2] for v in pass1.values()}:
        problems.append(f"{len(after)} orders after replaying {len(sent)} distinct keys")

    # 4. money: ledger sums to the balance, and the balance is the credit minus one per order
    ok, available, total, entries = ledger_check(base, key)
    if not ok:
        problems.append(f"ledger sum {total} != available {available}")
    if available != a.credit - len(after):
        problems.append(f"available {available} != credit {a.credit} - {len(after)} orders")
    if load["replays_bad"]:
        problems.append(f"{load['replays_bad']} live replays during the load were wrong")

    with open(os.path.join(a.dir, "lost"), "w") as f:
        f.write(f"{len(lost)}\n")
    print(f"sent={len(sent)} acked={len(acked)} live-replays={load['replays_ok']} "
          f"non200={sum(load['other_status'].values())} committed-unacked={committed_unacked} "
          f"uncommitted={new_now} orders={len(after)} ledger={'ok' if ok else 'BAD'} lost={len(lost)}")
    for p in problems[:20]:
        print(f"  PROBLEM: {p}")
    for k in sorted(lost)[:20]:
        print(f"  LOST: key {k} acked as {acked.get(k)} now {pass1.get(k)}")
    sys.exit(1 if problems or lost else 0)


def cmd_fill_disk(a):
    """Orders from a few threads until one is refused; then the probe's question: does the same
    request under the first refused key ever get a 200 while the disk is full?"""
    sent, acked, other = [], {}, {}
    lock, stop = threading.Lock(), threading.Event()
    first_failure = {}

    def run(t):
        for n in range(a.max_per_thread):
            if stop.is_set():
                return
            k = f"{a.prefix}-{t}-{n}"
            with lock:
                sent.append(k)
            try:
                s, _, oid = order(a.base, a.api_key, k)
            except (OSError, http.client.HTTPException):
                s, oid = "conn", None
            with lock:
                if s == 200:
                    acked[k] = oid
                    continue
                other[str(s)] = other.get(str(s), 0) + 1
                first_failure.setdefault("key", k)
                first_failure.setdefault("at", time.time())
                first_failure.setdefault("status", s)
            stop.set()
            return

    threads = [threading.Thread(target=run, args=(t,)) for t in range(a.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not first_failure:
        raise SystemExit(f"the disk never filled: {len(acked)} orders acknowledged")
    try:
        again, _, _ = Client(a.base, timeout=5).call(
            "POST", "/b2b/orders", ORDER_BODY,
            {"X-Api-Key": a.api_key, "X-Idempotency-Key": first_failure["key"]}, retry=False)
    except (OSError, http.client.HTTPException):
        again = "conn"
    with open(os.path.join(a.dir, "sent.txt"), "w") as f:
        f.writelines(k + "\n" for k in sent)
    with open(os.path.join(a.dir, "acked.tsv"), "w") as f:
        f.writelines(f"{k}\t{oid}\n" for k, oid in acked.items())
    with open(os.path.join(a.dir, "load.json"), "w") as f:
        json.dump({"replays_ok": 0, "replays_bad": 0, "other_status": other}, f)
    with open(os.path.join(a.dir, "first_failure"), "w") as f:
        f.write(f"{first_failure['at']:.3f}\n")
    print(f"acked={len(acked)} first-refusal={first_failure['status']} "
          f"same-key-again={again} refusals={other}")
    sys.exit(1 if again == 200 else 0)


def cmd_large_fill(a):
    """COUNT orders each with 300 KB of delivery data (see body_for), 16 at a time."""
    keys = [f"{a.prefix}-{i}{LARGE}" for i in range(a.count)]
    statuses = pmap(lambda k: order(a.base, a.api_key, k, retry=True)[0], keys, threads=16)
    if any(s != 200 for s in statuses):
        raise SystemExit(f"large orders refused: {sorted(set(statuses))}")


def cmd_backup_pause(a):
    keys = [f"{a.prefix}-{i}" for i in range(a.orders)]
    statuses = pmap(lambda k: order(a.base, a.api_key, k, retry=True)[0], keys, threads=16)
    if any(s != 200 for s in statuses):
        raise SystemExit("loading the orders failed")

    def timed(prefix, stop):
        out, n = [], 0
        c = Client(a.base)
        while not stop.is_set() and n < 100000:
            t = time.time()
            s, _, _ = c.call("POST", "/b2b/orders", ORDER_BODY,
                             {"X-Api-Key": a.api_key, "X-Idempotency-Key": f"{prefix}-{n}"})
            out.append((t, time.time() - t, s))
            n += 1
        return out

    # The interpreter's collector would pause the timing thread as the lists of timings grow.
    gc.disable()
    base_stop = threading.Event()
    threading.Timer(3, base_stop.set).start()
    baseline = timed(f"{a.prefix}-base", base_stop)
    stop, during = threading.Event(), []
    worker = threading.Thread(target=lambda: during.extend(timed(f"{a.prefix}-during", stop)))
    worker.start()
    time.sleep(0.5)

    def rss_mib():
        with open(f"/proc/{a.server_pid}/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) / 1024

    sampling, peak = threading.Event(), [0.0]
    rss_before = rss_mib() if a.server_pid else 0.0

    def sample():
        while not sampling.is_set():
            peak[0] = max(peak[0], rss_mib())
            time.sleep(0.05)
    if a.server_pid:
        threading.Thread(target=sample, daemon=True).start()
    started = time.time()
    # Read by curl, a process of its own: reading 1 GB in this one would hold the interpreter's
    # lock against the thread that times the orders.
    curl = subprocess.run(
        ["curl", "-sS", "-o", "/dev/null", "-H", f"Authorization: Bearer {a.token}",
         "-w", "%{http_code} %{size_download} %{time_starttransfer}",
         f"{a.base}/admin/backup"], capture_output=True, text=True, check=True)
    ended = time.time()
    status, size, first_byte = curl.stdout.split()
    status, size, first_byte = int(status), int(size), started + float(first_byte)
    sampling.set()
    time.sleep(0.5)
    stop.set()
    worker.join()
    overlapping = sorted(lat for t, lat, s in during if t + lat >= started and t <= ended)
    ms = lambda x: f"{x * 1000:.1f}"
    p99 = lambda xs: xs[min(len(xs) - 1, int(len(xs) * 0.99))] if xs else 0
    lats = sorted(lat for _, lat, _ in baseline)
    print(json.dumps({
        "orders": a.orders, "backupStatus": status, "backupBytes": size,
        "untilFirstByteMs": float(ms(first_byte - started)), "backupMs": float(ms(ended - started)),
        "baselineP50Ms": float(ms(lats[len(lats) // 2])), "baselineP99Ms": float(ms(p99(lats))),
        "baselineMaxMs": float(ms(lats[-1])),
        "ordersDuringBackup": len(overlapping),
        "p99DuringBackupMs": float(ms(p99(overlapping))),
        "longestWaitDuringBackupMs": float(ms(max(overlapping, default=0))),
        "waitsOver50MsAtSecond": [round(t - started, 1) for t, lat, _ in during
                                  if lat > 0.05 and t + lat >= started and t <= ended],
        "non200During": sum(1 for _, _, s in during if s != 200),
        "serverRssBeforeMiB": round(rss_before, 1), "serverRssPeakDuringBackupMiB": round(peak[0], 1)}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    def add(name, fn, *args):
        sp = sub.add_parser(name)
        sp.add_argument("--base", required=True)
        for arg, kw in args:
            sp.add_argument(arg, **kw)
        sp.set_defaults(fn=fn)

    add("setup", cmd_setup, ("--token", {"required": True}), ("--accounts", {"type": int, "default": 1}),
        ("--balance", {"type": int, "default": 10**12}), ("--out", {"required": True}))
    add("precreate", cmd_precreate, ("--accounts", {"required": True}), ("--count", {"type": int, "default": 1000}),
        ("--prefix", {"required": True}), ("--out", {"required": True}))
    add("place", cmd_place, ("--accounts", {"required": True}), ("--count", {"type": int, "default": 1000}),
        ("--prefix", {"required": True}), ("--out", {"required": True}))
    add("replay-check", cmd_replay_check, ("--placed", {"required": True}))
    add("verify", cmd_verify, ("--accounts", {"required": True}))
    add("crash-load", cmd_crash_load, ("--api-key", {"required": True}), ("--dir", {"required": True}),
        ("--prefix", {"required": True}), ("--threads", {"type": int, "default": 16}),
        ("--seconds", {"type": float, "default": 8}), ("--max-per-thread", {"type": int, "default": 2000}),
        ("--replay-ratio", {"type": float, "default": 0.2}),
        ("--large-ratio", {"type": float, "default": 0.0}),
        ("--medium-ratio", {"type": float, "default": 0.0}),
        ("--storage-may-fail", {"action": "store_true"}))
    add("crash-verify", cmd_crash_verify, ("--api-key", {"required": True}), ("--dir", {"required": True}),
        ("--credit", {"type": int, "default": 10**12}))
    add("large-fill", cmd_large_fill, ("--api-key", {"required": True}), ("--count", {"type": int, "required": True}),
        ("--prefix", {"required": True}))
    add("backup-pause", cmd_backup_pause, ("--api-key", {"required": True}), ("--token", {"required": True}),
        ("--server-pid", {"type": int, "default": 0}),
        ("--orders", {"type": int, "default": 100000}), ("--prefix", {"required": True}))
    add("fill-disk", cmd_fill_disk, ("--api-key", {"required": True}), ("--dir", {"required": True}),
        ("--prefix", {"required": True}), ("--threads", {"type": int, "default": 4}),
        ("--max-per-thread", {"type": int, "default": 1000000}))
    a = p.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
