"""Verify your orderly ledger: every entry since the head you kept, chained onto it.

    python3 verify.py BASE_URL API_KEY ACCOUNT_ID STATE_FILE

STATE_FILE holds the head you verified last (absent: none yet, the account's genesis). Prints
the new head and exits 0; on a divergence (the server's history no longer contains the head
you kept, or an entry does not verify) prints what and exits 3, keeping the old head.
Python's standard library only: hashlib for SHA-256, urllib for HTTP.
"""

import hashlib
import json
import sys
import urllib.request

BASE, API_KEY, ACCOUNT, STATE = sys.argv[1:5]


def field(text):
    data = text.encode()
    return len(data).to_bytes(4, "big") + data


def digest(*texts):
    return hashlib.sha256(b"".join(field(t) for t in texts)).hexdigest()


def genesis(account):
    return digest("orderly-ledger-v1", "genesis", account)


def entry_hash(account, e):
    return digest("orderly-ledger-v1", account, e["id"], str(e["seq"]), str(e["amount"]),
                  e["reason"], e["reference"], str(e["balanceAfter"]), e["createdAt"],
                  e["previousHash"])


def get(path):
    request = urllib.request.Request(BASE + path, headers={"X-Api-Key": API_KEY})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def diverged(seq, what):
    print(json.dumps({"divergence": {"firstSeq": seq, "what": what}}))
    sys.exit(3)


try:
    with open(STATE) as f:
        head = json.load(f)
except FileNotFoundError:
    head = {"seq": 0, "hash": genesis(ACCOUNT), "balanceAfter": 0}
kept = dict(head)

server_head = get("/b2b/balance")["ledgerHead"]
if server_head["seq"] < kept["seq"]:
    diverged(server_head["seq"] + 1, "the server's ledger ends before the head you kept")
while True:
    page = get(f"/b2b/transactions?afterSeq={head['seq']}&limit=100")["transactions"]
    for e in page:
        if e["seq"] != head["seq"] + 1 or e["previousHash"] != head["hash"]:
            diverged(head["seq"], "this entry is no longer the one you kept")
        if entry_hash(ACCOUNT, e) != e["hash"]:
            diverged(e["seq"], "the entry's hash is not what its fields give")
        if e["balanceAfter"] != head["balanceAfter"] + e["amount"]:
            diverged(e["seq"], "balanceAfter is not the sum")
        head = {"seq": e["seq"], "hash": e["hash"], "balanceAfter": e["balanceAfter"]}
    if len(page) < 100:
        break
if server_head["seq"] == kept["seq"] and server_head["hash"] != kept["hash"]:
    diverged(kept["seq"], "the server's head at the seq you kept is another entry")

with open(STATE, "w") as f:
    json.dump(head, f)
print(json.dumps({"seq": head["seq"], "hash": head["hash"], "new": head["seq"] - kept["seq"]}))
