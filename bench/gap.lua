-- wrk script: tracks the longest time between two successful (2xx) responses per thread and
-- prints the largest as "MAXGAP <seconds>" when wrk finishes.
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
  last = now()
  maxgap = 0
end

function response(status, headers, body)
  if status >= 200 and status < 300 then
    local t = now()
    if t - last > maxgap then maxgap = t - last end
    last = t
  end
end

function done(summary, latency, requests)
  local m = 0
  for _, t in ipairs(threads) do
    local g = t:get("maxgap")
    if g and g > m then m = g end
  end
  io.write(string.format("MAXGAP %.4f\n", m))
end
