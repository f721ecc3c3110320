#!lua flags=allow-cross-slot-keys
-- idem batch of Extends whose records live on one node, in one
-- invocation: each decided as fenced.lua's extend decides one, by the
-- same code (fence.lua), with its own reply. KEYS[1] = the first record
-- (declared for the routing); the others ride in ARGV, which
-- allow-cross-slot-keys lets the script reach on the node that serves
-- KEYS[1] (Redis refuses any other).
-- ARGV: the number of records, then per record: key, tag, now, from,
-- lease_until ('0': keep the lease), ref ('': keep the ref), read in place.
-- Reply: per record, fenced.lua's reply (0, 1 or the record), or
-- {-2, message} for an error, which is that record's alone.
--fence.lua--
local out, a = {}, 2
for i = 1, tonumber(ARGV[1]) do
  local k, t = ARGV[a], ARGV[a + 1]
  local v, q, r, n = held(k, t, tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]))
  if v then q = lengthen(k, v, q, r, n, ARGV[a + 4], ARGV[a + 5]) end
  if type(q) == 'table' then q = {-2, q.err} end
  out[i] = q
  a = a + 6
end
return out
