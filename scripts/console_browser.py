#!/usr/bin/env python3
"""The console in a real browser (Debian's chromium through chromedriver, Python selenium):
sign in, see the demo accounts, run the retry demonstration, watch a failing callback's
attempts appear without a reload, top up, and check that partner text stays text, that the
page asks only for itself and documented API paths, and that the token stays in the tab.

  ORDERLY_BIN=target/release/orderly SHOTS_DIR=/tmp/shots python3 scripts/console_browser.py

Prints one line per check and a closing "console browser test: N passed, M failed".
"""
import concurrent.futures
import http.client
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import (NoAlertPresentException, StaleElementReferenceException,
                                        TimeoutException)
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BIN = os.path.abspath(os.environ.get("ORDERLY_BIN", os.path.join(REPO, "target/release/orderly")))
SHOTS = os.environ.get("SHOTS_DIR") or tempfile.mkdtemp(prefix="orderly-console-shots-")
os.makedirs(SHOTS, exist_ok=True)
XSS = "<img src=x onerror=alert(1)>"
results = []


def check(name, ok, detail=""):
    results.append(bool(ok))
    print(f"{'ok  ' if ok else 'FAIL'} {name}{'' if ok or not detail else ': ' + str(detail)}", flush=True)


class Failing(http.server.BaseHTTPRequestHandler):
    """A partner's receiver that always answers 500."""
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def start_orderly(scratch, extra):
    os.makedirs(os.path.join(scratch, "data"), exist_ok=True)
    shutil.copy(os.path.join(REPO, "data", "demo.json"), os.path.join(scratch, "data"))
    proc = subprocess.Popen([BIN, "serve", "--listen", "127.0.0.1:0", *extra], cwd=scratch,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    printed = []
    deadline = time.time() + 30
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        printed.append(line.strip())
        if line.startswith("orderly listening on "):
            threading.Thread(target=lambda: proc.stdout.read(), daemon=True).start()
            return proc, line.split()[-1], printed
    proc.kill()
    raise SystemExit(f"orderly did not start: {printed}")


def api(base, method, path, body=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method, headers=dict(headers or {}))
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


# The bulk writes of the long-ledger check come from their own address, with a budget of their
# own: the console (on 127.0.0.1) keeps the default 500/min it must live within.
BULK_ADDRESS = "127.0.0.2"
LONG_LEDGER = 6000


def bulk_credits(base, admin, account, count, keys="bulk"):
    """`count` credits of 1 (minor unit) to `account`, eight at a time, from BULK_ADDRESS."""
    host, port = base.split("//")[1].split(":")
    def credit(i):
        conn = http.client.HTTPConnection(host, int(port), timeout=30, source_address=(BULK_ADDRESS, 0))
        conn.request("POST", f"/admin/accounts/{account}/credits", json.dumps({"amount": 1}),
                     {**admin, "Content-Type": "application/json", "X-Idempotency-Key": f"{keys}-{i}"})
        status = conn.getresponse().status
        conn.close()
        return status
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return list(pool.map(credit, range(count)))


def requests_to(base, route):
    """orderly's count of requests to `route` so far, from /metrics."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
               if l.startswith("orderly_http_requests_total{") and f'route="{route}"' in l)


def wait(driver, what, predicate, seconds=15):
    """Waits (bounded) for `predicate` to give something; the page re-renders every 1.5 s, so
    an element that went stale meanwhile just means: look again."""
    try:
        return WebDriverWait(driver, seconds, poll_frequency=0.1,
                             ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda d: predicate(d))
    except TimeoutException:
        return None


EVENT_ROWS = """return [...document.querySelectorAll('#events tbody tr')].map(r => ({
  text: r.textContent, attempts: Number(r.querySelector('.attempts').textContent),
  last: r.querySelector('.last-result').textContent}));"""


def retrying_attempts(driver):
    """Attempts shown for the event whose callback is retrying (0 while there is none)."""
    rows = [r for r in driver.execute_script(EVENT_ROWS) if "retrying" in r["text"]]
    return (rows[0]["attempts"], rows[0]["last"]) if rows else (0, "")


def shot(driver, name, size, show=None):
    driver.set_window_size(*size)
    if show:
        driver.execute_script(f"document.getElementById('{show}').scrollIntoView()")
    time.sleep(0.3)  # let the layout settle at the new width before the picture
    path = os.path.join(SHOTS, f"{name}-{size[0]}x{size[1]}.png")
    driver.save_screenshot(path)
    return path


def main():
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    hook = f"http://127.0.0.1:{receiver.server_address[1]}/hooks/orders"
    scratch = tempfile.mkdtemp(prefix="orderly-console-")
    proc, base, printed = start_orderly(scratch, [
        "--demo", "--fulfillment-delay", "300ms", "--allow-private-callbacks",
        "--webhook-retry-schedule", "1s,1s,1s,1s,1s,1s,1s,1s,1s,1s",
        "--rate-limit-override", f"{BULK_ADDRESS}/32=100000000"])
    token = next(l.split(": ")[-1] for l in printed if l.startswith("demo: admin token: "))
    partner = next(re.search(r"gc_live_[0-9a-f]{32}", l).group(0) for l in printed
                   if "wholesale)" in l)
    check("--demo prints the console's address", f"demo: console: {base}/console" in printed)
    admin = {"Authorization": f"Bearer {token}"}

    # Partner-supplied text that looks like markup: an account, a product, delivery data.
    s, acc = api(base, "POST", "/admin/accounts", {"name": XSS, "wholesale": True}, admin)
    xss_account = acc["account"]["id"]
    api(base, "PUT", "/admin/products/prd_xss", {"name": XSS, "price": 100, "deliveryFields": ["username"]}, admin)
    api(base, "POST", f"/admin/accounts/{xss_account}/credits", {"amount": 1000},
        {**admin, "X-Idempotency-Key": "xss-credit"})
    s, key = api(base, "POST", f"/admin/accounts/{xss_account}/api-keys", {}, admin)
    api(base, "POST", "/b2b/orders", {"items": [{"productId": "prd_xss", "quantity": 1,
        "deliveryData": {"username": XSS}}]}, {"X-Api-Key": key["apiKey"]["key"], "X-Idempotency-Key": "xss"})
    # An order whose callback keeps failing.
    s, _ = api(base, "POST", "/b2b/orders", {"items": [{"productId": "prd_uc_660", "quantity": 1,
        "deliveryData": {"username": "@Player1"}}], "callbackUrl": hook},
        {"X-Api-Key": partner, "X-Idempotency-Key": "with-callback"})
    check("an order with a failing callback is placed", s == 200, s)

    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for flag in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 f"--user-data-dir={tempfile.mkdtemp(prefix='orderly-chromium-')}", "--window-size=1280,800"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    alerts = []
    try:
        driver.get(base + "/console")
        check("the sign-in form shows", wait(driver, "form", lambda d: d.find_element(By.ID, "token").is_displayed()))
        driver.find_element(By.ID, "token").send_keys("not-the-token\n")
        refused = wait(driver, "error", lambda d: "refused" in d.find_element(By.ID, "sign-in-error").text)
        check("a wrong token shows a clear message", refused, driver.find_element(By.ID, "sign-in-error").text)
        check("nothing of the accounts shows before signing in", not driver.find_element(By.ID, "app").is_displayed())
        shot(driver, "sign-in-refused", (1280, 800))

        driver.find_element(By.ID, "token").send_keys(token + "\n")
        names = wait(driver, "accounts", lambda d: d.execute_script(
            "return [...document.querySelectorAll('.account .name')].map(e => e.textContent)") or None)
        check("the demo accounts are listed", names and "Demo Wholesale Partner" in names and "Demo Retail Shop" in names, names)
        check("an account named like markup is shown as that text", names and XSS in names, names)
        check("no element was made from partner text", not driver.find_elements(By.CSS_SELECTOR, "img"))

        driver.find_element(By.CSS_SELECTOR, f'[data-account="{partner_account(base, partner)}"]').click()
        first = wait(driver, "retrying", lambda d: retrying_attempts(d)[0] or None, 20) or 0
        more = wait(driver, "attempts", lambda d: retrying_attempts(d)[0] if retrying_attempts(d)[0] > first else None, 20)
        check("a failing callback's attempts appear without a reload", first and more, f"{first} then {more}")
        last = retrying_attempts(driver)[1]
        check("the last status of the delivery is shown", "HTTP 500" in last, last)
        shot(driver, "account-callbacks", (1280, 800), "events-title")

        # The delivery filter, the redeliver button and the secret's rotation (docs/contract.md "7. Webhooks").
        def filter_events(state):
            driver.execute_script("const f = document.getElementById('events-filter');"
                                  "f.value = arguments[0]; f.dispatchEvent(new Event('change'));", state)
        filter_events("retrying")
        only = wait(driver, "filtered", lambda d: (lambda rows: rows if rows and all(
            "retrying" in r["text"] for r in rows) else None)(d.execute_script(EVENT_ROWS)))
        check("the callback filter shows only events in that state", only, only)
        filter_events("")
        clicked = wait(driver, "a redeliver button", lambda d: d.execute_script(
            "const b = document.querySelector('#events [data-redeliver]'); if (b) b.click(); return !!b;"))
        queued = wait(driver, "redelivery", lambda d: "queued" in d.find_element(By.ID, "events-result").text)
        check("an event with a callback has a redeliver button that queues a redelivery",
              clicked and queued, driver.find_element(By.ID, "events-result").text)
        rotate_button = driver.find_element(By.ID, "rotate-secret")
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", rotate_button)
        rotate_button.click()
        WebDriverWait(driver, 5).until(lambda d: d.switch_to.alert).accept()
        shown = wait(driver, "new secret", lambda d: d.find_elements(By.ID, "new-secret")
                     and d.find_element(By.ID, "new-secret").text or None)
        s, account = api(base, "GET", f"/admin/accounts/{partner_account(base, partner)}", headers=admin)
        check("a rotation shows the new secret once, the one the account now has",
              shown and shown.startswith("whsec_") and account["account"]["webhookSecret"] == shown, shown)

        s, before = api(base, "GET", "/b2b/balance", headers={"X-Api-Key": partner})
        driver.find_element(By.ID, "demo-key").send_keys(partner)
        driver.find_element(By.CSS_SELECTOR, "#demo-form button").click()
        answers_js = ("return [...document.querySelectorAll('.answer')]"
                      ".map(a => [a.dataset.status, a.dataset.replayed])")
        got = wait(driver, "answers", lambda d: (lambda a: a if len(a) == 3 else None)(d.execute_script(answers_js)), 20) or []
        got = [tuple(a) for a in got]
        check("the first answer is a 200 and not a replay", got[:1] == [("200", "")], got)
        check("the same request again is a replay", got[1:2] == [("200", "true")], got)
        check("the same key with a changed basket is a 409", got[2:3] == [("409", "")], got)
        shown_ids = driver.execute_script(
            "return [...document.querySelectorAll('.answer dl')].map(dl => {"
            " const dts = [...dl.querySelectorAll('dt')];"
            " const id = dts.find(d => d.textContent === 'Request-Id');"
            " const code = dts.find(d => d.textContent === 'code');"
            " return [id ? id.nextElementSibling.textContent : '', code ? code.nextElementSibling.textContent : '']; })")
        ids = [i for i, _ in shown_ids]
        check("each of the three requests shows its own Request-Id",
              len(set(ids)) == 3 and all(i.startswith("req_") for i in ids), shown_ids)
        check("the 409 shows its code", shown_ids[2:3] and shown_ids[2][1] == "IDEMPOTENCY_KEY_REUSED", shown_ids)
        summary = driver.find_element(By.ID, "demo-summary").text
        s, after = api(base, "GET", "/b2b/balance", headers={"X-Api-Key": partner})
        moved = before["balance"]["available"] - after["balance"]["available"]
        check("the page says the balance moved once", summary.startswith("Charged once"), summary)
        first_order = driver.execute_script(
            "const dl = document.querySelector('.answer dl'); const dts = [...dl.querySelectorAll('dt')];"
            "return dts.find(d => d.textContent === 'Order').nextElementSibling.textContent;")
        s, placed = api(base, "GET", f"/b2b/orders/{first_order}", headers={"X-Api-Key": partner})
        check("and it did: by the one order's total", s == 200 and moved == placed["order"]["total"],
              f"moved {moved}, order {placed}")
        shot(driver, "retry-demonstration", (1280, 800), "demo-results")
        shot(driver, "retry-demonstration", (390, 844), "demo-results")
        driver.set_window_size(1280, 800)

        shown = driver.find_element(By.ID, "balance").text
        driver.find_element(By.ID, "topup-amount").send_keys("12.34")
        driver.find_element(By.CSS_SELECTOR, "#topup-form button").click()
        changed = wait(driver, "top-up", lambda d: d.find_element(By.ID, "balance").text != shown and "Credited" in d.find_element(By.ID, "topup-result").text)
        s, topped = api(base, "GET", "/b2b/balance", headers={"X-Api-Key": partner})
        check("a top-up changes the balance shown", changed and topped["balance"]["available"] == after["balance"]["available"] + 1234,
              driver.find_element(By.ID, "balance").text)
        shot(driver, "account-callbacks", (390, 844), "events-title")

        # An account with more ledger entries than the old 50-page reading could sum.
        s, long = api(base, "POST", "/admin/accounts", {"name": "Long Ledger", "wholesale": True}, admin)
        long_id = long["account"]["id"]
        statuses = bulk_credits(base, admin, long_id, LONG_LEDGER)
        check(f"{LONG_LEDGER} credits are written", statuses.count(200) == LONG_LEDGER, set(statuses))
        # The list re-renders at each poll: a button may go stale between finding and clicking.
        wait(driver, "the account's button", lambda d: d.execute_script(
            "const b = document.querySelector(`[data-account='${arguments[0]}']`);"
            "if (b) b.click(); return !!b;", long_id))
        summed = wait(driver, "long ledger", lambda d: "matches" in d.find_element(By.ID, "ledger-sum").text
                      and d.find_element(By.ID, "account-name").text == "Long Ledger", 60)
        check(f"a ledger of {LONG_LEDGER} entries sums to the balance", summed,
              driver.find_element(By.ID, "ledger-sum").text)
        ledger_route = "/admin/accounts/{id}/transactions"
        events_route = "/admin/accounts/{id}/events"
        before = (requests_to(base, ledger_route), requests_to(base, events_route))
        time.sleep(6)
        reads = (requests_to(base, ledger_route) - before[0], requests_to(base, events_route) - before[1])
        # About four polls in 6 s, each one page of each when nothing changed (the full ledger
        # is 61 pages).
        check("a poll reads one page of the ledger and of the events, not the whole history",
              0 < reads[0] <= 8 and 0 < reads[1] <= 8, reads)
        live = driver.find_element(By.ID, "live").text
        check("the page keeps updating within the rate limit", live.startswith("live"), live)
        bulk_credits(base, admin, long_id, 3, keys="later")
        total = f"{(LONG_LEDGER + 3) / 100:.2f}"
        grew = wait(driver, "new entries", lambda d: total in d.find_element(By.ID, "balance").text
                    and "matches" in d.find_element(By.ID, "ledger-sum").text
                    and d.find_element(By.ID, "ledger-sum").text.startswith(d.find_element(By.ID, "balance").text), 15)
        check("entries written after the first read are added to the sum", grew,
              driver.find_element(By.ID, "ledger-sum").text)

        try:
            driver.switch_to.alert
            alerts.append("alert")
        except NoAlertPresentException:
            pass
        check("no script from partner text ran", not alerts)
        stored = driver.execute_script("return JSON.stringify(localStorage)")
        check("the token is not in localStorage", token not in stored, stored)
        check("the token is not in the URL", token not in driver.current_url, driver.current_url)
        check("the token is in sessionStorage", driver.execute_script(
            "return sessionStorage.getItem('orderly.adminToken')") == token)

        s, doc = api(base, "GET", "/openapi.json")
        templates = [re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", p) + "$") for p in doc["paths"]]
        console_paths = {"/console", "/console/app.js", "/console/app.css", "/console/favicon.svg"}
        requested = set()
        for entry in driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message.get("method") == "Network.requestWillBeSent":
                url = message["params"]["request"]["url"]
                # The browser's own pages (chrome://, data:) are not the console's requests.
                if url.startswith(("http://", "https://")):
                    requested.add(url)
        outside = [u for u in requested if not u.startswith(base + "/")]
        undocumented = [u for u in requested if u.startswith(base + "/") and
                        (lambda p: p not in console_paths and not any(t.match(p) for t in templates))(
                            u[len(base):].split("?")[0])]
        check("every request is same-origin", not outside, outside)
        check("every request is /console or a documented API path", not undocumented, undocumented)
        check("no request URL carries the token", not [u for u in requested if token in u])
    finally:
        driver.quit()
        proc.terminate()
        proc.wait(timeout=30)

    other, base2, _ = start_orderly(tempfile.mkdtemp(prefix="orderly-console-"), ["--data-dir", "db"])
    try:
        urllib.request.urlopen(base2 + "/console", timeout=10)
        check("without an admin token the console is 404", False, "answered 200")
    except urllib.error.HTTPError as e:
        check("without an admin token the console is 404", e.code == 404, e.code)
    finally:
        other.terminate()
        other.wait(timeout=30)
    receiver.shutdown()

    print(f"screenshots in {SHOTS}")
    failed = results.count(False)
    print(f"console browser test: {results.count(True)} passed, {failed} failed")
    sys.exit(1 if failed else 0)


def partner_account(base, partner):
    """The wholesale demo account's id, from data/demo.json."""
    with open(os.path.join(REPO, "data", "demo.json")) as f:
        return next(a["id"] for a in json.load(f)["accounts"] if a["wholesale"])


if __name__ == "__main__":
    main()
