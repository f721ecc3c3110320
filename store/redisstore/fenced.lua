-- idem fenced write. KEYS[1] = record hash.
-- ARGV: op, fence, now, then per op:
--   complete: expires_at, result
--   fail:     expires_at, code, message, body
--   release:  (nothing)
--   extend:   lease_until
-- Replies: {0} done; {1} absent or expired; {2, fence, status} fenced out;
-- {-1, reason} when the stored record is damaged.
local k = KEYS[1]
local op, now = ARGV[1], tonumber(ARGV[3])
if redis.call('EXISTS', k) == 0 then return {1} end
local cur = redis.call('HMGET', k, 'st', 'f', 'e')
local st, f, e = tonumber(cur[1]), tonumber(cur[2]), tonumber(cur[3])
if not (st and f and e) then
  return {-1, 'hash fields st, f, e missing or not numbers'}
end
if now >= e then return {1} end
if f ~= tonumber(ARGV[2]) or st ~= 1 then return {2, f, st} end
if op == 'complete' then
  redis.call('HSET', k, 'st', 2, 'r', ARGV[5], 'e', ARGV[4], 'd', ARGV[3])
  redis.call('PEXPIREAT', k, ARGV[4])
elseif op == 'fail' then
  redis.call('HSET', k, 'st', 3, 'ec', ARGV[5], 'em', ARGV[6], 'eb', ARGV[7], 'e', ARGV[4], 'd', ARGV[3])
  redis.call('PEXPIREAT', k, ARGV[4])
elseif op == 'release' then
  redis.call('DEL', k)
elseif op == 'extend' then
  redis.call('HSET', k, 'l', ARGV[4])
else
  return redis.error_reply('idem: unknown op ' .. op)
end
return {0}
