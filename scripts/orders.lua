-- wrk script for POST /b2b/orders, used by bench.sh and soak.sh:
--   wrk ... -s orders.lua http://HOST:PORT/b2b/orders -- MODE ACCOUNTS_TSV POOL_TSV PREFIX [DELAY_MS]
-- ACCOUNTS_TSV: "account_id<TAB>api_key" lines; POOL_TSV: "api_key<TAB>idempotency_key" lines of
-- orders that already exist ("-" for none); PREFIX makes this run's new keys unique.
-- MODE  new     every request a new order (fresh key), accounts round-robin
--       hot     every request a new order on the first account
--       replay  every request replays a pool key (round-robin)
--       mix     9 in 10 requests replay a pool key, 1 in 10 is a new order
--       soak    9 in 10 replay one of this thread's own recent orders, 1 in 10 new; waits
--               DELAY_MS before each request. Run with threads == connections, so each
--               response pairs with the thread's last request.
-- Counts non-200 answers and answers with Idempotency-Replayed: true; done() prints one line
--   RESULT requests=.. rps=.. p50_ms=.. p99_ms=.. non200=.. sock_errors=.. replayed=.. stale=..
-- (stale: soak replays of a key younger than the TTL that answered a fresh 200, i.e. a new order).

-- Bodies: ORDER_BODY=partner (the default) sends the orders partners send, as the perf harness
-- does (perf/wrk/common.lua): 12 baskets of 1 to 3 lines over prd_a, prd_b and prd_c (distinct
-- products, quantity 1 to 3, deliveryData with a username), each with an externalOrderId that
-- pads the body to about 300 bytes. ORDER_BODY=one-line sends the light body older figures were
-- taken with ({"items":[{"productId":"prd_bench","quantity":1}]}): comparisons with them only.
-- The products come from `orderly_client.py setup`.
local shape = os.getenv("ORDER_BODY") or "partner"
assert(shape == "partner" or shape == "one-line", "ORDER_BODY must be partner or one-line")
local light = '{"items":[{"productId":"prd_bench","quantity":1}]}'
local products = { "prd_a", "prd_b", "prd_c" }
local BASKETS = 12
local heads, ext_len = {}, {}
local filler = string.rep("0123456789abcdef", 9)
for n = 0, BASKETS - 1 do
  local items = {}
  for j = 0, n % 3 do
    items[#items + 1] = string.format(
      '{"productId":"%s","quantity":%d,"deliveryData":{"username":"player%d"}}',
      products[(n + j) % #products + 1], (n + j) % 3 + 1, n * 3 + j)
  end
  heads[n] = '{"items":[' .. table.concat(items, ",") .. '],"externalOrderId":"'
  ext_len[n] = math.max(24, math.min(128, 300 - #heads[n] - 2))
end
-- The body of a new order under idempotency key `key` (a replay of one of this script's own
-- orders sends the body its key was first sent with: the same key, the same basket).
local function body_for(key)
  if shape == "one-line" then return light end
  local n = 0
  for i = 1, #key do n = (n * 31 + key:byte(i)) % 1000003 end
  local b = n % BASKETS
  return heads[b] .. string.sub(key .. "-" .. filler, 1, ext_len[b]) .. '"}'
end
local threads, nthreads = {}, 0
local RING = 200

function setup(thread)
  nthreads = nthreads + 1
  thread:set("tid", nthreads)
  table.insert(threads, thread)
end

local function read_tsv(path)
  local rows = {}
  for line in io.lines(path) do
    local a, b = line:match("^([^\t]+)\t([^\t]+)")
    if a then rows[#rows + 1] = { a, b } end
  end
  return rows
end

function init(args)
  mode, prefix = args[1], args[4]
  apikeys = {}
  for _, row in ipairs(read_tsv(args[2])) do apikeys[#apikeys + 1] = row[2] end
  pool = (args[3] ~= "-") and read_tsv(args[3]) or {}
  pos = ((tid - 1) * 997) % math.max(#pool, 1)  -- threads start at different pool places
  sent, fresh, non200, replayed, stale = 0, 0, 0, 0, 0
  recent, ring_pos, last = {}, 0, nil
  math.randomseed(tid * 7919 + os.time())
  if mode == "soak" then
    -- wrk looks for delay() after init() has run, so defining it here only affects soak runs
    local ms = tonumber(args[5] or "10")
    function delay() return ms end
  end
end

local function post(apikey, key, kind, body)
  last = { apikey, key, kind }
  return wrk.format("POST", nil, {
    ["Content-Type"] = "application/json",
    ["X-Api-Key"] = apikey,
    ["X-Idempotency-Key"] = key,
  }, body)
end

local function new_order(apikey)
  fresh = fresh + 1
  local key = prefix .. "-" .. tid .. "-" .. fresh
  return post(apikey, key, "new", body_for(key))
end

function request()
  sent = sent + 1
  if mode == "hot" then return new_order(apikeys[1]) end
  if mode == "replay" or (mode == "mix" and sent % 10 ~= 0) then
    pos = pos % #pool + 1
    -- The pool's orders were placed by orderly_client.py, with the one-line body.
    return post(pool[pos][1], pool[pos][2], "replay", light)
  end
  if mode == "soak" and sent % 10 ~= 0 and #recent > 0 then
    local r = recent[math.random(#recent)]
    return post(r[1], r[2], "replay", body_for(r[2]))
  end
  return new_order(apikeys[(tid * 31 + fresh) % #apikeys + 1])
end

function response(status, headers, _)
  local was_replayed = (headers["idempotency-replayed"] or headers["Idempotency-Replayed"]) == "true"
  if status ~= 200 then non200 = non200 + 1 end
  if was_replayed then replayed = replayed + 1 end
  if mode == "soak" and status == 200 and last then
    if last[3] == "new" then
      ring_pos = ring_pos % RING + 1
      recent[ring_pos] = { last[1], last[2] }
    elseif not was_replayed then
      stale = stale + 1
    end
  end
end

function done(summary, latency, _)
  local n, r, s = 0, 0, 0
  for _, t in ipairs(threads) do
    n, r, s = n + t:get("non200"), r + t:get("replayed"), s + t:get("stale")
  end
  local e = summary.errors
  local secs = summary.duration / 1e6
  io.write(string.format(
    "RESULT requests=%d rps=%.1f p50_ms=%.2f p99_ms=%.2f non200=%d sock_errors=%d replayed=%d stale=%d\n",
    summary.requests, summary.requests / secs, latency:percentile(50) / 1000,
    latency:percentile(99) / 1000, n, e.connect + e.read + e.write + e.timeout, r, s))
end
