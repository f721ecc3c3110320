#!lua flags=allow-cross-slot-keys
-- idem batch: the script below (a single-key script, the body of
-- claim.lua or fenced.lua) for each record of a batch whose records live
-- on one node, in one invocation. KEYS[1] = the first record (declared for
-- the routing); ARGV: the number of records, the number of arguments of
-- each (w), then per record its key and its w arguments. The other keys
-- ride in ARGV: allow-cross-slot-keys lets the script reach keys of other
-- slots of the node that serves KEYS[1], and Redis refuses any other.
-- Reply: per record, the single-key script's reply, or {-2, message} when
-- it raised an error (its error_reply, or an error of Redis or of Lua), so
-- that one record's failure is its own.
local function one(KEYS, ARGV)
--BODY--
end
local n, w, out, a = tonumber(ARGV[1]), tonumber(ARGV[2]), {}, 3
for i = 1, n do
  local args = {}
  for j = 1, w do args[j] = ARGV[a + j] end
  local ok, r = pcall(one, {ARGV[a]}, args)
  if ok and type(r) == 'table' and r.err then ok, r = false, r end
  if not ok then
    local m = type(r) == 'table' and r.err or tostring(r)
    if string.find(m, '^user_script') then m = 'ERR ' .. m end
    r = {-2, m}
  end
  out[i] = r
  a = a + 1 + w
end
return out
