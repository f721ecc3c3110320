-- idem claim. KEYS[1] = record hash.
-- ARGV: now, lease_until, expires_at, owner, fingerprint, version (times in ms).
-- Replies: {1, fence, takeover} when written; {0, HGETALL} on conflict;
-- {-1, reason} when the stored record is damaged.
local k = KEYS[1]
local now = tonumber(ARGV[1])
local fence, takeover = 1, 0
if redis.call('EXISTS', k) == 1 then
  local cur = redis.call('HMGET', k, 'st', 'f', 'l', 'e')
  local st, f, l, e = tonumber(cur[1]), tonumber(cur[2]), tonumber(cur[3]), tonumber(cur[4])
  if not (st and f and l and e) then
    return {-1, 'hash fields st, f, l, e missing or not numbers'}
  end
  if now < e and not (st == 1 and now >= l) then
    return {0, redis.call('HGETALL', k)}
  end
  fence = f + 1
  if now < e then takeover = 1 end
  redis.call('DEL', k)
end
redis.call('HSET', k, 'st', 1, 'f', string.format('%d', fence), 'o', ARGV[4], 'l', ARGV[2],
  'e', ARGV[3], 'fp', ARGV[5], 'c', ARGV[1], 'v', ARGV[6])
redis.call('PEXPIREAT', k, ARGV[3])
return {1, fence, takeover}
