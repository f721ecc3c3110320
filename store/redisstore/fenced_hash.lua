-- idem fenced write on a record in the previous layout (a hash), sent when
-- fenced.lua answers {3}. KEYS[1] = record hash.
-- ARGV: op, fence, owner, now, from (the status the record must be in),
-- then per op:
--   complete: expires_at, result
--   fail:     expires_at, code, message, body
--   release:  (nothing)
--   extend:   lease_until (0: keep the lease), ref ("": keep the ref)
-- Complete removes a stored error and Fail a stored result, for a settled
-- record that its claim corrects.
-- Replies: {0} done; {1} absent or expired; {2, fence, status, owner} when
-- the record holds another claim or is in another status;
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
if f ~= tonumber(ARGV[2]) or o ~= ARGV[3] or st ~= tonumber(ARGV[5]) then return {2, f, st, o} end
if op == 'complete' then
  redis.call('HDEL', k, 'ec', 'em', 'eb')
  redis.call('HSET', k, 'st', 2, 'r', ARGV[7], 'e', ARGV[6], 'd', ARGV[4])
  redis.call('PEXPIREAT', k, ARGV[6])
elseif op == 'fail' then
  redis.call('HDEL', k, 'r')
  redis.call('HSET', k, 'st', 3, 'ec', ARGV[7], 'em', ARGV[8], 'eb', ARGV[9], 'e', ARGV[6], 'd', ARGV[4])
  redis.call('PEXPIREAT', k, ARGV[6])
elseif op == 'release' then
  redis.call('DEL', k)
elseif op == 'extend' then
  if tonumber(ARGV[6]) ~= 0 then redis.call('HSET', k, 'l', ARGV[6]) end
  if ARGV[7] ~= '' then redis.call('HSET', k, 'ref', ARGV[7]) end
else
  return redis.error_reply('idem: unknown op ' .. op)
end
return {0}
