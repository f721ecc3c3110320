#!lua
-- idem fenced write. KEYS[1] = the record (see layout.go).
-- ARGV: op, tag ('R' fence ':' len(owner) ':' owner, the claim the write
-- holds), now, from (the status digit the record must be in), then per op:
--   settle:  status digit, expires_at, tail (completed_at ';' payload)
--   release: (nothing)
--   extend:  lease_until (0: keep the lease), ref ("": keep the ref)
-- Replies: 0 done; 1 absent or expired; the record (a string) when it
-- holds another claim or is in another status (the client decodes it, and
-- also answers expired from it); an error 'idem: ...' when the stored
-- record is damaged or the key holds another type.
--fence.lua--
local k, t, op = KEYS[1], ARGV[2], ARGV[1]
local v, q, r, n = held(k, t, tonumber(ARGV[3]), tonumber(ARGV[4]))
if not v then return q end
if op == 'settle' then
  return settle(k, t, v, q, r, n, ARGV[5], ARGV[6], ARGV[7])
elseif op == 'release' then
  redis.call('DEL', k)
elseif op == 'extend' then
  return lengthen(k, v, q, r, n, ARGV[5], ARGV[6])
else
  return redis.error_reply('idem: unknown op ' .. op)
end
return 0
