-- sandbox.lua — trusted: builds the environment every policy runs in.
--
-- Embedded in the binary and run once per policy state, before any policy
-- code, with the standard libraries the state opened (base, string, table,
-- math, os) and the helpers C passes in.  It returns the table that becomes
-- the policy chunk's environment.  Everything a policy can reach is listed
-- here: an allow-list, never a deny-list over the real globals.
--
-- Arguments: G (the state's real globals), safe (C functions: pcall and
-- xpcall that cannot swallow the hub's timeout and memory errors, and log;
-- max_bytes, the state's memory cap), cjson (the lua-cjson module).
--
-- Two library functions run long stretches in C, where the count hook that
-- enforces the deadline never fires, and are wrapped here:
--   * pattern matching (find, match, gmatch, gsub) backtracks: a pattern
--     whose worst case over its subject exceeds PATTERN_STEPS is refused;
--   * json.encode walks shared references again and again (t = {t, t}
--     twenty times is a million nodes) into a buffer outside the memory
--     cap: the value is walked first in Lua (under the hook), and refused
--     beyond ENCODE_NODES tables or max_bytes of strings.

local G, safe, cjson = ...

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

local PATTERN_STEPS = 1e10
local ENCODE_NODES = 1e6
local sbyte, slen, log = G.string.byte, G.string.len, G.math.log

-- Quantifiers (* + - ?) in a Lua pattern, outside %-escapes and [sets].
local function quantifiers(p)
  local q, i, n = 0, 1, slen(p)
  while i <= n do
    local c = sbyte(p, i)
    if c == 37 then -- %x
      i = i + 2
    elseif c == 91 then -- [set]
      i = i + 1
      if sbyte(p, i) == 94 then i = i + 1 end
      if sbyte(p, i) == 93 then i = i + 1 end
      while i <= n and sbyte(p, i) ~= 93 do
        if sbyte(p, i) == 37 then i = i + 1 end
        i = i + 1
      end
      i = i + 1
    else
      if c == 42 or c == 43 or c == 45 or c == 63 then q = q + 1 end
      i = i + 1
    end
  end
  return q
end

-- Worst case of the backtracking matcher: (#s + 1) ^ q per start position,
-- and #s start positions unless anchored.
local function pattern_guard(name, s, p, plain)
  if plain or G.type(s) ~= "string" or G.type(p) ~= "string" then
    return -- plain search is linear; the real function reports bad types
  end
  local q = quantifiers(p)
  if q == 0 then return end
  local e = sbyte(p, 1) == 94 and q or q + 1
  if e * log(slen(s) + 1) > log(PATTERN_STEPS) then
    G.error(name .. ": pattern with " .. q .. " quantifiers is too costly for a "
            .. slen(s) .. "-byte subject", 3)
  end
end

local function encode(v)
  local nodes, bytes, max_bytes = 0, 0, safe.max_bytes
  local function walk(x, depth)
    local t = G.type(x)
    if t == "string" then
      bytes = bytes + slen(x)
    elseif t == "table" then
      nodes = nodes + 1
      if nodes > ENCODE_NODES or depth > 1000 then
        G.error("json.encode: the value is too large or too deep", 0)
      end
      for k, val in G.next, x do
        walk(k, depth + 1)
        walk(val, depth + 1)
      end
    else
      bytes = bytes + 24
    end
    if bytes > max_bytes then
      G.error("json.encode: the value would exceed the memory cap", 0)
    end
  end
  walk(v, 0)
  return cjson.encode(v)
end

env.string = copy(G.string, { dump = true })
local find, match, gmatch, gsub = G.string.find, G.string.match, G.string.gmatch, G.string.gsub
env.string.find = function(s, p, init, plain)
  pattern_guard("string.find", s, p, plain)
  return find(s, p, init, plain)
end
env.string.match = function(s, p, init)
  pattern_guard("string.match", s, p)
  return match(s, p, init)
end
env.string.gmatch = function(s, p)
  pattern_guard("string.gmatch", s, p)
  return gmatch(s, p)
end
env.string.gsub = function(s, p, repl, n)
  pattern_guard("string.gsub", s, p)
  return gsub(s, p, repl, n)
end
env.table = copy(G.table)
env.math = copy(G.math)
env.os = { time = G.os.time, clock = G.os.clock, date = G.os.date }
env.json = { encode = encode, decode = cjson.decode, null = cjson.null }
env.hub = { log = safe.log }
env._G = env

-- ("x"):rep(3) goes through the string metatable; point it at the copy (no
-- dump) and hide the metatable itself from getmetatable("").
local mt = G.getmetatable("")
mt.__index = env.string
mt.__metatable = "string"

return env
