-- idem fenced write. KEYS[1] = record hash.
-- ARGV: op, fence, owner, now, then per op:
--   complete: expires_at, result
--   fail:     expires_at, code, message, body
--   release:  (nothing)
--   extend:   lease_until
-- Replies: {0} done; {1} absent or expired; {2, fence, status, owner} when
-- the record holds another claim or is no longer IN_PROGRESS;
-- {-1, reason} when the stored record is damaged.
local k = KEYS[1]
local op, now = ARGV[1], tonumber(ARGV[4])
if redis.call('EXISTS', k) == 0 then return {1} end
local cur = redis.call('HMGET', k, 'st', 'f', 'e', 'o')
local st, f, e, o = tonumber(cur[1]), tonumber(cur[2]), tonumber(cur[3]), cur[4]
if not (st and f and e and o) then
  return {-1, 'hash fields st, f, e, o missing or not numbers'}
end
if now >= e then return {1} end
if f ~= tonumber(ARGV[2]) or o ~= ARGV[3] or st ~= 1 then return {2, f, st, o} end
if op == 'complete' then
  redis.call('HSET', k, 'st', 2, 'r', ARGV[6], 'e', ARGV[5], 'd', ARGV[4])
  redis.call('PEXPIREAT', k, ARGV[5])
elseif op == 'fail' then
  redis.call('HSET', k, 'st', 3, 'ec', ARGV[6], 'em', ARGV[7], 'eb', ARGV[8], 'e', ARGV[5], 'd', ARGV[4])
  redis.call('PEXPIREAT', k, ARGV[5])
elseif op == 'release' then
  redis.call('DEL', k)
elseif op == 'extend' then
  redis.call('HSET', k, 'l', ARGV[5])
else
  return redis.error_reply('idem: unknown op ' .. op)
end
return {0}
