// orderly console: reads and acts only through the public API. The admin token lives in this
// tab's sessionStorage and travels as a bearer token; everything partners typed is shown as
// text (textContent), never parsed as markup.
"use strict";

const TOKEN_KEY = "orderly.adminToken";
const POLL_MS = 1500;
const currency = document.querySelector('meta[name="orderly-currency"]').content || "USD";
const money = new Intl.NumberFormat(undefined, { style: "currency", currency });
let selected = null;
let timer = null;
let partnerKey = "";

const $ = (id) => document.getElementById(id);

/** An element with attributes and children; strings become text nodes. */
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== null && value !== undefined && value !== false) node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const formatMoney = (minor) => money.format(minor / 100);
const when = (iso) => (iso ? new Date(iso).toLocaleString() : "—");
const token = () => sessionStorage.getItem(TOKEN_KEY);

class HttpError extends Error {
  constructor(status, body) {
    super((body && (body.error || body.message)) || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

async function call(method, path, { body, headers = {}, partner = false } = {}) {
  const init = { method, headers: { ...headers } };
  if (partner) init.headers["X-Api-Key"] = partnerKey;
  else init.headers["Authorization"] = `Bearer ${token()}`;
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  let data = null;
  try { data = await response.json(); } catch (_) { data = null; }
  return { response, data };
}

async function admin(path, options) {
  const { response, data } = await call(options && options.body ? "POST" : "GET", path, options);
  if (!response.ok) throw new HttpError(response.status, data);
  return data;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** One admin read. A 429 waits its Retry-After and tries again: the first read of a long
 *  ledger can meet the rate limit, and must go on rather than show a partial sum. */
async function read(path) {
  for (let attempt = 0; ; attempt++) {
    const { response, data } = await call("GET", path);
    if (response.status === 429 && attempt < 60) {
      $("live").textContent = "reading (rate-limited, waiting)…";
      await sleep(1000 * Math.max(1, parseInt(response.headers.get("Retry-After"), 10) || 1));
      continue;
    }
    if (!response.ok) throw new HttpError(response.status, data);
    return data;
  }
}

/** Every page of an admin list, following nextCursor to the end. */
async function allPages(path, field) {
  let items = [];
  let cursor = null;
  for (;;) {
    const data = await read(`${path}?limit=100${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
    items = items.concat(data[field]);
    if (!data.nextCursor) return items;
    cursor = data.nextCursor;
  }
}

/** Rows shown per table. */
const SHOWN = 50;

/** What has been read of the selected account, so that each poll reads only what changed.
 *  The ledger never changes an entry: the sum is kept, and a poll reads newest first until
 *  an entry it already has. Events change (their deliveries), so a poll re-reads from just
 *  before the shown window onward: one page, whatever the account's history. */
function freshView(account) {
  return { account, ledgerSum: 0, ledgerTop: null, ledger: [], eventsFrom: null, events: [] };
}
let view = null;

async function readLedger(base, v) {
  let cursor = null;
  const fresh = [];
  let sum = 0;
  for (;;) {
    const data = await read(`${base}/transactions?limit=100${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
    const known = v.ledgerTop ? data.transactions.findIndex((t) => t.id === v.ledgerTop) : -1;
    const page = known >= 0 ? data.transactions.slice(0, known) : data.transactions;
    for (const entry of page) sum += entry.amount;
    if (fresh.length < SHOWN) fresh.push(...page.slice(0, SHOWN - fresh.length));
    if (known >= 0 || !data.nextCursor) break;
    cursor = data.nextCursor;
  }
  if (fresh.length) {
    v.ledgerTop = fresh[0].id;
    v.ledger = fresh.concat(v.ledger).slice(0, SHOWN);
    v.ledgerSum += sum;
  }
}

async function readEvents(base, v) {
  let after = v.eventsFrom;
  let got = [];
  for (;;) {
    const data = await read(`${base}/events?limit=100${after ? `&after=${encodeURIComponent(after)}` : ""}`);
    // Keep the newest SHOWN and the one before them, which becomes the next poll's start.
    got = got.concat(data.events).slice(-(SHOWN + 1));
    if (!data.nextCursor) break;
    after = data.nextCursor;
  }
  if (got.length > SHOWN) {
    v.eventsFrom = got[0].id;
    got = got.slice(1);
  }
  v.events = got;
}

/** With a delivery filter: the newest SHOWN events in that state. The server scans a bounded
 *  number of events per request, so a short page can still carry a cursor; at most
 *  FILTER_READS requests per poll. */
const FILTER_READS = 10;
async function readFiltered(base, v, state) {
  let after = null;
  let got = [];
  for (let n = 0; n < FILTER_READS; n++) {
    const data = await read(`${base}/events?limit=100&delivery=${encodeURIComponent(state)}${after ? `&after=${encodeURIComponent(after)}` : ""}`);
    got = got.concat(data.events).slice(-SHOWN);
    if (!data.nextCursor) break;
    after = data.nextCursor;
  }
  v.events = got;
}

function badge(state) {
  const labels = { given_up: "given up" };
  const marks = { processing: "◐", completed: "●", cancelled: "○", pending: "…", delivered: "✓", retrying: "↻", given_up: "✕", none: "—" };
  return el("span", { class: `badge s-${state}` }, `${marks[state] || ""} ${labels[state] || state}`.trim());
}

function showSignIn(message) {
  clearInterval(timer);
  $("app").hidden = true;
  $("sign-out").hidden = true;
  $("sign-in").hidden = false;
  $("live").textContent = "";
  const error = $("sign-in-error");
  error.hidden = !message;
  error.textContent = message || "";
  $("token").focus();
}

async function signIn(candidate) {
  sessionStorage.setItem(TOKEN_KEY, candidate);
  try {
    await admin("/admin/accounts?limit=1");
  } catch (e) {
    sessionStorage.removeItem(TOKEN_KEY);
    const why = e.status === 401 ? "That admin token was refused. Check it and try again."
      : e.status === 404 ? "This server has no admin API (start it with --admin-token)."
      : `The server could not be reached (${e.message}).`;
    showSignIn(why);
    return;
  }
  $("sign-in").hidden = true;
  $("app").hidden = false;
  $("sign-out").hidden = false;
  view = null;
  await refresh();
  clearInterval(timer);
  timer = setInterval(refresh, POLL_MS);
}

function renderAccounts(accounts) {
  const list = $("accounts");
  list.replaceChildren(...accounts.map((a) => {
    const button = el("button", { class: "account", type: "button", "data-account": a.id, "aria-current": a.id === selected ? "true" : "false" },
      el("span", { class: "name" }, a.name),
      el("span", { class: "money" }, formatMoney(a.balance)),
      el("span", { class: "meta" }, `${a.wholesale ? "wholesale" : "retail"}${a.region ? " · " + a.region : ""}${a.creditLimit ? " · credit " + formatMoney(a.creditLimit) : ""}`));
    button.addEventListener("click", () => { selected = a.id; refresh(); });
    return el("li", {}, button);
  }));
}

function renderAccount(account, orders, v) {
  $("nothing-selected").hidden = true;
  $("account").hidden = false;
  $("account-name").textContent = account.name;
  $("account-id").textContent = account.id;
  $("account-tags").replaceChildren(
    el("span", { class: "tag" }, account.wholesale ? "wholesale" : "retail"),
    account.region ? el("span", { class: "tag" }, `region ${account.region}`) : null);
  $("balance").textContent = formatMoney(account.balance);
  $("credit").textContent = account.creditLimit ? formatMoney(account.creditLimit) : "none";
  const sum = v.ledgerSum;
  $("ledger-sum").replaceChildren(
    el("span", { class: "money" }, formatMoney(sum)), " ",
    sum === account.balance ? el("span", { class: "match" }, "✓ matches") : el("span", { class: "mismatch" }, "✕ differs"));

  $("orders").tBodies[0].replaceChildren(...orders.map((o) => el("tr", {},
    el("td", { class: "mono", title: o.id }, o.id),
    el("td", {}, badge(o.status)),
    el("td", { class: "num" }, formatMoney(o.total)),
    el("td", {}, o.externalOrderId || "—"),
    el("td", {}, when(o.createdAt)))));

  $("ledger").tBodies[0].replaceChildren(...v.ledger.map((e) => el("tr", {},
    el("td", { class: "mono", title: e.id }, e.id),
    el("td", {}, e.reason),
    el("td", { class: "mono", title: e.reference }, e.reference),
    el("td", { class: `num${e.amount < 0 ? " neg" : ""}` }, formatMoney(e.amount)),
    el("td", { class: "num" }, formatMoney(e.balanceAfter)),
    el("td", {}, when(e.createdAt)))));

  const newest = v.events.slice().reverse();
  $("events").tBodies[0].replaceChildren(...newest.map((ev) => {
    const last = ev.deliveries[ev.deliveries.length - 1];
    const result = !last ? "—" : last.status !== null ? `HTTP ${last.status}` : (last.error || "no answer");
    return el("tr", { "data-event": ev.id },
      el("td", { class: "mono", title: ev.id }, ev.id),
      el("td", {}, ev.type),
      el("td", { class: "mono", title: ev.data.order.id }, ev.data.order.id),
      el("td", {}, badge(ev.delivery)),
      el("td", { class: "num attempts" }, String(ev.deliveries.length)),
      el("td", { class: "last-result" }, result),
      el("td", {}, when(ev.nextAttemptAt)),
      el("td", {}, ev.delivery === "none" ? "—"
        : el("button", { type: "button", class: "redeliver small", "data-redeliver": ev.id }, "Redeliver")));
  }));
}

/** Queues one more attempt of an event's callback (same webhook-id and body). */
async function redeliver(eventId) {
  const result = $("events-result");
  try {
    await admin(`/admin/events/${encodeURIComponent(eventId)}/redeliver`, { body: {} });
    result.className = "note";
    result.textContent = `Redelivery of ${eventId} queued.`;
    await refresh();
  } catch (e) {
    result.className = "error";
    result.textContent = `Not redelivered: ${e.message}`;
  }
}

/** Replaces the account's webhook secret; the new one is shown here once. */
async function rotateSecret() {
  const result = $("rotate-result");
  if (!selected || !confirm("Make a new webhook secret? The current one keeps signing beside it for the overlap, then stops.")) return;
  try {
    const data = await admin(`/admin/accounts/${encodeURIComponent(selected)}/webhook-secret`, { body: {} });
    result.className = "note";
    result.replaceChildren("New secret (shown once; give it to the partner): ",
      el("code", { id: "new-secret", class: "mono" }, data.webhookSecret),
      `. The previous one signs beside it until ${when(data.previousSecretValidUntil)}.`);
  } catch (e) {
    result.className = "error";
    result.textContent = `Not rotated: ${e.message}`;
  }
}

let refreshing = false;

async function refresh() {
  // A first read of a long history can outlast the poll interval: one refresh at a time.
  if (!token() || refreshing) return;
  refreshing = true;
  try {
    const accounts = await allPages("/admin/accounts", "accounts");
    if (!selected && accounts.length) selected = (accounts.find((a) => a.wholesale) || accounts[0]).id;
    renderAccounts(accounts);
    if (selected) {
      if (!view || view.account !== selected) view = freshView(selected);
      const v = view;
      const base = `/admin/accounts/${encodeURIComponent(selected)}`;
      const filter = $("events-filter").value;
      const events = filter ? readFiltered(base, v, filter) : readEvents(base, v);
      const [one, orders] = await Promise.all([
        read(base), read(`${base}/orders?limit=${SHOWN}`), readLedger(base, v), events]);
      // Another account chosen meanwhile: its own refresh renders it.
      if (view === v) renderAccount(one.account, orders.orders, v);
    }
    $("live").textContent = `live · ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    if (e.status === 401) { sessionStorage.removeItem(TOKEN_KEY); showSignIn("The admin token is no longer accepted."); return; }
    $("live").textContent = `not updating: ${e.message}`;
  } finally {
    refreshing = false;
  }
}

async function topUp(event) {
  event.preventDefault();
  const amount = Math.round(parseFloat($("topup-amount").value) * 100);
  const result = $("topup-result");
  if (!selected || !(amount > 0)) return;
  try {
    const data = await admin(`/admin/accounts/${encodeURIComponent(selected)}/credits`, {
      body: { amount, reason: "console top-up" }, headers: { "X-Idempotency-Key": `console-${crypto.randomUUID()}` } });
    result.className = "note";
    result.textContent = `Credited ${formatMoney(amount)}; available now ${formatMoney(data.balance.available)}.`;
    await refresh();
  } catch (e) {
    result.className = "error";
    result.textContent = `Not credited: ${e.message}`;
  }
}

async function loadProducts() {
  const { response, data } = await call("GET", "/b2b/products?limit=100", { partner: true });
  if (!response.ok) throw new HttpError(response.status, data);
  const priced = data.products.filter((p) => p.price > 0 && p.active);
  $("demo-product").replaceChildren(...priced.map((p) => el("option", { value: p.id }, `${p.name} · ${formatMoney(p.price)}`)));
}

function answerCard(title, response, data) {
  const replayed = response.headers.get("Idempotency-Replayed");
  const rows = [["Status", `${response.status}`], ["Idempotency-Replayed", replayed || "(absent)"],
    ["Request-Id", response.headers.get("Request-Id") || "(absent)"]];
  if (data && data.order) rows.push(["Order", data.order.id], ["Total", formatMoney(data.order.total)]);
  if (data && data.balance) rows.push(["Available after", formatMoney(data.balance.available)]);
  if (data && data.error) rows.push(["error", data.error]);
  if (data && data.code) rows.push(["code", data.code]);
  const list = el("dl", {});
  for (const [k, v] of rows) list.append(el("dt", {}, k), el("dd", {}, v));
  return el("div", { class: "answer", "data-status": String(response.status), "data-replayed": replayed || "" },
    el("h4", {}, title), list);
}

async function demonstrate(event) {
  event.preventDefault();
  const error = $("demo-error");
  error.hidden = true;
  partnerKey = $("demo-key").value.trim();
  try {
    if (!$("demo-product").value) await loadProducts();
    const productId = $("demo-product").value;
    if (!productId) throw new Error("this key's catalog has no priced product");
    const basket = (quantity) => ({ items: [{ productId, quantity, deliveryData: { username: $("demo-username").value } }] });
    const key = `console-demo-${crypto.randomUUID()}`;
    const balance = async () => {
      const { response, data } = await call("GET", "/b2b/balance", { partner: true });
      if (!response.ok) throw new HttpError(response.status, data);
      return data.balance.available;
    };
    const before = await balance();
    const send = (quantity) => call("POST", "/b2b/orders", { body: basket(quantity), headers: { "X-Idempotency-Key": key }, partner: true });
    const first = await send(1);
    const again = await send(1);
    const changed = await send(2);
    const after = await balance();
    $("answers").replaceChildren(
      answerCard("1 · the order", first.response, first.data),
      answerCard("2 · the same request again", again.response, again.data),
      answerCard("3 · same key, changed basket", changed.response, changed.data));
    const charged = before - after;
    const once = first.data && first.data.order && charged === first.data.order.total;
    $("demo-summary").textContent = once
      ? `Charged once: ${formatMoney(charged)} for two identical requests (the second is a replay); the changed basket got ${changed.response.status}.`
      : `Balance moved by ${formatMoney(charged)}.`;
    $("demo-results").hidden = false;
    await refresh();
  } catch (e) {
    error.hidden = false;
    error.textContent = e.status === 401 || e.status === 403 ? `The partner key was refused: ${e.message}` : e.message;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("sign-in-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const candidate = $("token").value.trim();
    $("token").value = "";
    if (candidate) signIn(candidate);
  });
  $("sign-out").addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); selected = null; showSignIn(""); });
  $("topup-form").addEventListener("submit", topUp);
  $("demo-form").addEventListener("submit", demonstrate);
  $("events").addEventListener("click", (event) => {
    const button = event.target.closest("[data-redeliver]");
    if (button) redeliver(button.getAttribute("data-redeliver"));
  });
  $("events-filter").addEventListener("change", () => {
    // Back to the incremental read of everything, or a fresh filtered one.
    if (view) { view.eventsFrom = null; view.events = []; }
    refresh();
  });
  $("rotate-secret").addEventListener("click", rotateSecret);
  if (token()) signIn(token()); else showSignIn("");
});
