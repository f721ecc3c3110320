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
  local keep = string.sub(v, r + 1, r + n)
  local a = string.find(keep, ';', 1, true)
  local lease = string.sub(keep, 1, a - 1)
  if ARGV[5] ~= '0' then lease = ARGV[5] end
  local rest = string.sub(keep, a)
  if ARGV[6] ~= '' then
    -- keep = lease ';' created ';' version ';' len(fp) ':' fp ref
    local b = string.find(keep, ';', a + 1, true)
    local c = string.find(keep, ';', b + 1, true)
    local d = string.find(keep, ':', c + 1, true)
    rest = string.sub(keep, a, d + tonumber(string.sub(keep, c + 1, d - 1))) .. ARGV[6]
  end
  keep = lease .. rest
  redis.call('SET', k, string.sub(v, 1, q) .. #keep .. ':' .. keep .. string.sub(v, r + n + 1), 'KEEPTTL')
else
  return redis.error_reply('idem: unknown op ' .. op)
end
return 0
