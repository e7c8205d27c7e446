-- wrk script for scripts/stall.sh: new orders exactly as perf/wrk/new_order.lua sends
-- them (PERF_WRK names that directory), and the count of each answer's status, printed after
-- its RESULT line as "STATUSES 200:N 500:N 503:N ...".
local perf = os.getenv("PERF_WRK") or "perf/wrk/"
dofile(perf .. "new_order.lua")

local inner_setup, inner_done = setup, done
local threads = {}
function setup(thread)
  inner_setup(thread)
  threads[#threads + 1] = thread
end

statuses = {}
function response(status)
  statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
  inner_done(summary, latency, requests)
  local total = {}
  for _, thread in ipairs(threads) do
    for status, n in pairs(thread:get("statuses")) do
      total[status] = (total[status] or 0) + n
    end
  end
  local parts = {}
  for status, n in pairs(total) do parts[#parts + 1] = status .. ":" .. n end
  table.sort(parts)
  io.write("STATUSES " .. table.concat(parts, " ") .. "\n")
end
