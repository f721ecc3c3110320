-- idem fenced write, the part the single write (fenced.lua) and the batch
-- of Completes (complete.lua) share; a record is laid out as layout.go
-- says.
--
-- held(k, t, now, from) reads the record at k for a write by the claim
-- t ('R' fence ':' len(owner) ':' owner) at now (ms) that expects the
-- record in status from (a digit, as a number). When the record allows
-- it, it returns the record v and, in v, the position q of the ';' after
-- its expiry, the position r of the ':' after len(keep), and len(keep) n.
-- Otherwise it returns false and the write's reply: 1 when the record is
-- absent or expired; the record (a string) when it holds another claim or
-- is in another status (the client decodes it); an error reply 'idem: ...'
-- when it is damaged or the key holds another type.
local function held(k, t, now, from)
  local v = redis.pcall('GET', k)
  if not v then return false, 1 end
  if type(v) == 'table' then return false, redis.error_reply('idem: the key holds another type than a record') end
  if string.sub(v, 1, #t) ~= t then return false, v end
  local p = #t + 1
  local q = string.find(v, ';', p + 1, true)
  local e = q and tonumber(string.sub(v, p + 1, q - 1))
  if not e then return false, redis.error_reply('idem: record expiry not a number') end
  if now >= e then return false, 1 end
  if string.byte(v, p) - 48 ~= from then return false, v end
  local r = string.find(v, ':', q + 1, true)
  local n = r and tonumber(string.sub(v, q + 1, r - 1))
  if not n then return false, redis.error_reply('idem: record layout not recognised') end
  return v, q, r, n
end

-- settle writes the held record v (with q, r, n from held) in status st
-- (a digit) with expiry exp and tail (completed_at ';' payload), keeping
-- the claim's fields (lease, created, fingerprint, ref). It returns 0, or
-- the error Redis answered.
local function settle(k, t, v, q, r, n, st, exp, tail)
  local ok = redis.pcall('SET', k, t .. st .. exp .. ';' .. string.sub(v, q + 1, r + n) .. tail, 'PXAT', exp)
  if ok.err then return ok end
  return 0
end
