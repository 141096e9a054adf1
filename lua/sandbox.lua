-- sandbox.lua — trusted: builds the environment every policy runs in.
--
-- Embedded in the binary and run once per policy state, before any policy
-- code, with the standard libraries the state opened (base, string, table,
-- math, os) and the helpers C passes in.  It returns the table that becomes
-- the policy chunk's environment.  Everything a policy can reach is listed
-- here: an allow-list, never a deny-list over the real globals.
--
-- Arguments: G (the state's real globals, whose string and table libraries
-- already hold the hub's bounded pattern, rep, concat and insert functions),
-- safe (C functions: pcall and xpcall that cannot swallow the hub's timeout
-- and memory errors, and log) and json (the hub's bounded codec: encode,
-- decode, null).
--
-- Nothing here guards the library functions: those that can run long in C
-- are replaced in C (src/lpattern.c, src/lbulk.c, src/ljson.c) by versions
-- that the call's deadline stops, and the allocator refuses large blocks
-- that could not be filled in time (src/policy.c).

local G, safe, json = ...

local function copy(t, skip)
  local c = {}
  for k, v in G.pairs(t) do
    if not (skip and skip[k]) then c[k] = v end
  end
  return c
end

local env = {}
for _, name in G.ipairs {
  "assert", "error", "ipairs", "next", "pairs", "select", "tonumber", "tostring", "type",
  "unpack", "rawequal", "rawget", "rawset", "setmetatable", "getmetatable",
} do
  env[name] = G[name]
end
env._VERSION = G._VERSION
env.pcall = safe.pcall
env.xpcall = safe.xpcall

env.string = copy(G.string, { dump = true })
env.table = copy(G.table)
env.math = copy(G.math)
env.os = { time = G.os.time, clock = G.os.clock, date = G.os.date }
env.json = { encode = json.encode, decode = json.decode, null = json.null }
env.hub = { log = safe.log }
env._G = env

-- ("x"):rep(3) goes through the string metatable; point it at the copy (no
-- dump) and hide the metatable itself from getmetatable("").
local mt = G.getmetatable("")
mt.__index = env.string
mt.__metatable = "string"

return env
