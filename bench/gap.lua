-- wrk script: the outage, i.e. the longest time without a successful (2xx) response on any
-- connection, and the longest time one connection waited for an answer. Each thread marks the
-- milliseconds (CLOCK_MONOTONIC, shared by the threads) in which it got a 2xx; `done` merges the
-- threads' marks and prints the longest run of milliseconds that no thread marked as
-- "OUTAGE <seconds>" (1 ms resolution). A stall of one connection hides behind the others'
-- answers there, so it also prints wrk's longest request latency (from writing a request to
-- its complete answer, on one connection: a keep-alive connection writes its next request as
-- soon as an answer is complete) as "MAXWAIT <seconds>".
local ffi = require("ffi")
ffi.cdef [[
  typedef struct { long tv_sec; long tv_nsec; } berth_timespec;
  int clock_gettime(int clk_id, berth_timespec *tp);
]]
local ts = ffi.new("berth_timespec")
local function now()
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) / 1e9
end

local threads = {}
function setup(thread) table.insert(threads, thread) end

function init(args)
  ok_ms = {}
end

function response(status, headers, body)
  if status >= 200 and status < 300 then
    ok_ms[math.floor(now() * 1000)] = true
  end
end

function done(summary, latency, requests)
  local all = {}
  for _, t in ipairs(threads) do
    for ms, _ in pairs(t:get("ok_ms") or {}) do all[ms] = true end
  end
  local sorted = {}
  for ms, _ in pairs(all) do table.insert(sorted, ms) end
  table.sort(sorted)
  local outage = 0
  for i = 2, #sorted do
    local gap = sorted[i] - sorted[i - 1]
    if gap > outage then outage = gap end
  end
  io.write(string.format("MAXWAIT %.4f\n", latency.max / 1e6))
  io.write(string.format("OUTAGE %.3f\n", outage / 1000))
end
