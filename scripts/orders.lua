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

local body = '{"items":[{"productId":"prd_bench","quantity":1}]}'
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

local function post(apikey, key, kind)
  last = { apikey, key, kind }
  return wrk.format("POST", nil, {
    ["Content-Type"] = "application/json",
    ["X-Api-Key"] = apikey,
    ["X-Idempotency-Key"] = key,
  }, body)
end

local function new_order(apikey)
  fresh = fresh + 1
  return post(apikey, prefix .. "-" .. tid .. "-" .. fresh, "new")
end

function request()
  sent = sent + 1
  if mode == "hot" then return new_order(apikeys[1]) end
  if mode == "replay" or (mode == "mix" and sent % 10 ~= 0) then
    pos = pos % #pool + 1
    return post(pool[pos][1], pool[pos][2], "replay")
  end
  if mode == "soak" and sent % 10 ~= 0 and #recent > 0 then
    local r = recent[math.random(#recent)]
    return post(r[1], r[2], "replay")
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
