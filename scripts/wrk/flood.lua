-- wrk -s scripts/wrk/flood.lua: unauthenticated GET /b2b/balance, one request a second per
-- connection, each request from the next of FLOOD_CLIENTS (2000) distinct forwarded addresses
-- (X-Forwarded-For, honoured through --trusted-proxies 127.0.0.1/32). Every answer is a 401;
-- what it costs is the shared rate limit's work, which is what scripts/limiter-flood.sh measures.
local clients = tonumber(os.getenv("FLOOD_CLIENTS") or "2000")
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
end

function delay()
  return 1000
end

function request()
  counter = counter + 1
  local n = (offset + counter) % clients
  local address = string.format("198.18.%d.%d", math.floor(n / 250), n % 250 + 1)
  return wrk.format("GET", "/b2b/balance", { ["X-Forwarded-For"] = address })
end

function done(summary, latency, requests)
  io.write(string.format("FLOOD requests=%d p99_ms=%.2f sockerr=%d\n", summary.requests,
    latency:percentile(99) / 1000, summary.errors.connect + summary.errors.read + summary.errors.write))
end
