-- wrk -s scripts/wrk/flood.lua: GET /b2b/balance that never authenticates, one request a second
-- per connection, each request from the next of FLOOD_CLIENTS (2000) distinct forwarded
-- addresses (X-Forwarded-For, honoured through --trusted-proxies 127.0.0.1/32). FLOOD_KEY says
-- which X-Api-Key it carries: "none" (the default), "fixed" (one made-up key, well formed, that
-- no account has) or "random" (a new made-up key each request). Every answer is a 401; what it
-- costs is what scripts/limiter-flood.sh measures.
local clients = tonumber(os.getenv("FLOOD_CLIENTS") or "2000")
local key_mode = os.getenv("FLOOD_KEY") or "none"
local counter = 0
local offset = 0
local threads = 0

function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end

function init(args)
  -- Threads start at different offsets, so that together they cycle over every address.
  offset = (tid or 0) * 997
  math.randomseed(os.time() + offset)
end

local function made_up_key()
  local hex = {}
  for i = 1, 4 do
    hex[i] = string.format("%08x", math.random(0, 0x7fffffff))
  end
  return "gc_live_" .. table.concat(hex)
end

local fixed_key = "gc_live_" .. string.rep("5eed", 8)

function delay()
  return 1000
end

function request()
  counter = counter + 1
  local n = (offset + counter) % clients
  local address = string.format("198.18.%d.%d", math.floor(n / 250), n % 250 + 1)
  local headers = { ["X-Forwarded-For"] = address }
  if key_mode == "fixed" then
    headers["X-Api-Key"] = fixed_key
  elseif key_mode == "random" then
    headers["X-Api-Key"] = made_up_key()
  end
  return wrk.format("GET", "/b2b/balance", headers)
end

function done(summary, latency, requests)
  io.write(string.format("FLOOD requests=%d p99_ms=%.2f sockerr=%d\n", summary.requests,
    latency:percentile(99) / 1000, summary.errors.connect + summary.errors.read + summary.errors.write))
end
