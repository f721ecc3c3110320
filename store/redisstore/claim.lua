#!lua
-- idem claim, the path a SET NX GET could not settle: a record present
-- that may have to be taken over (expired, or lease passed and not held). KEYS[1] = the
-- record.
-- ARGV: now, the new record after its fence digits (see layout.go),
-- expires_at (ms), and '1' when no IN_PROGRESS record may be replaced
-- (ClaimParams.NoTakeover), the claim's fingerprint.
-- A takeover by a claim with the record's own fingerprint carries the
-- record's steps (its IN_PROGRESS payload, layout.go) into the new claim.
-- Replies: {1, fence, takeover, steps ('' for none)} when written; {0,
-- record} on conflict;
-- {-1, reason} when the stored record is damaged.
local k = KEYS[1]
local now = tonumber(ARGV[1])
local fence, takeover, steps = 1, 0, ''
local v = redis.pcall('GET', k)
if type(v) == 'table' then
  return {-1, 'the key holds another type than a record'}
elseif v then
  -- 'R' fence ':' len(owner) ':' owner status expires ';' len(keep) ':' lease ';' ...
  local a = string.find(v, ':', 2, true)
  local b = a and string.find(v, ':', a + 1, true)
  local ol = b and tonumber(string.sub(v, a + 1, b - 1))
  local p = ol and b + ol + 1
  local q = p and string.find(v, ';', p + 1, true)
  local r = q and string.find(v, ':', q + 1, true)
  local s = r and string.find(v, ';', r + 1, true)
  if not (s and string.byte(v, 1) == 82) then return {-1, 'record layout not recognised'} end
  local f, st = tonumber(string.sub(v, 2, a - 1)), string.byte(v, p) - 48
  -- a lease written 'h' lease is held (Record.Hold): never taken over
  local h = string.byte(v, r + 1) == 104
  local e, l = tonumber(string.sub(v, p + 1, q - 1)), tonumber(string.sub(v, h and r + 2 or r + 1, s - 1))
  if not (f and e and l) then return {-1, 'record fence, expiry or lease not a number'} end
  if (st == 1 and ARGV[4] == '1') or (now < e and not (st == 1 and not h and now >= l)) then
    return {0, v}
  end
  fence = f + 1
  if now < e then
    takeover = 1
    -- keep = ['h'] lease ';' created ';' version ';' len(fp) ':' fp ref,
    -- then completed_at ';' and the steps
    local n = tonumber(string.sub(v, q + 1, r - 1))
    local b = string.find(v, ';', s + 1, true)
    local c = b and string.find(v, ';', b + 1, true)
    local d = c and string.find(v, ':', c + 1, true)
    local fl = d and tonumber(string.sub(v, c + 1, d - 1))
    local t = n and string.find(v, ';', r + n + 1, true)
    if not (fl and t) then return {-1, 'record fingerprint or tail not recognised'} end
    if string.sub(v, d + 1, d + fl) == ARGV[5] then steps = string.sub(v, t + 1) end
  end
end
fence = string.format('%d', fence)
redis.call('SET', k, 'R' .. fence .. ARGV[2] .. steps, 'PXAT', ARGV[3])
return {1, fence, takeover, steps}
