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
local k, t = KEYS[1], ARGV[2]
local v = redis.pcall('GET', k)
if not v then return 1 end
if type(v) == 'table' then return redis.error_reply('idem: the key holds another type than a record') end
if string.sub(v, 1, #t) ~= t then return v end
local p = #t + 1
local st = string.byte(v, p) - 48
local q = string.find(v, ';', p + 1, true)
local e = q and tonumber(string.sub(v, p + 1, q - 1))
if not e then return redis.error_reply('idem: record expiry not a number') end
if tonumber(ARGV[3]) >= e then return 1 end
if st ~= tonumber(ARGV[4]) then return v end
local op = ARGV[1]
local r = string.find(v, ':', q + 1, true)
local n = r and tonumber(string.sub(v, q + 1, r - 1))
if not n then return redis.error_reply('idem: record layout not recognised') end
if op == 'settle' then
  -- Keep the claim's fields (lease, created, fingerprint, ref); replace
  -- status, expiry, completion time and payload.
  redis.call('SET', k, t .. ARGV[5] .. ARGV[6] .. ';' .. string.sub(v, q + 1, r + n) .. ARGV[7], 'PXAT', ARGV[6])
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
