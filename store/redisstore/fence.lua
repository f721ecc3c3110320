-- idem fenced write, the part the single write (fenced.lua) and the
-- batches of Completes (complete.lua) and of Extends (extend.lua) share; a
-- record is laid out as layout.go says.
--
-- held(k, t, now, from, got) reads the record at k (or takes got, the
-- record the caller already read whole) for a write by the claim
-- t ('R' fence ':' len(owner) ':' owner) at now (ms) that expects the
-- record in status from (a digit, as a number). When the record allows
-- it, it returns the record v and, in v, the position q of the ';' after
-- its expiry, the position r of the ':' after len(keep), and len(keep) n.
-- Otherwise it returns false and the write's reply: 1 when the record is
-- absent or expired; the record (a string) when it holds another claim or
-- is in another status (the client decodes it); an error reply 'idem: ...'
-- when it is damaged or the key holds another type.
local function held(k, t, now, from, got)
  local v = got or redis.pcall('GET', k)
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

-- lengthen writes the held record v (with q, r, n from held) with the
-- lease end lease ('0': keep the lease) and the ref ref ('': keep the ref),
-- keeping every other field and the key's expiry. It returns 0, or the
-- error Redis answered, or an error reply 'idem: ...' when the kept fields
-- are damaged.
local function lengthen(k, v, q, r, n, lease, ref)
  -- keep = ['h'] lease_until ';' created ';' version ';' len(fp) ':' fp ref
  local keep = string.sub(v, r + 1, r + n)
  local a = string.find(keep, ';', 1, true)
  if not a then return redis.error_reply('idem: record layout not recognised') end
  if lease == '0' then
    lease = string.sub(keep, 1, a - 1)
  elseif string.byte(keep, 1) == 104 then
    lease = 'h' .. lease -- a held claim stays held
  end
  local rest = string.sub(keep, a)
  if ref ~= '' then
    local b = string.find(keep, ';', a + 1, true)
    local c = b and string.find(keep, ';', b + 1, true)
    local d = c and string.find(keep, ':', c + 1, true)
    local f = d and tonumber(string.sub(keep, c + 1, d - 1))
    if not f then return redis.error_reply('idem: record layout not recognised') end
    rest = string.sub(keep, a, d + f) .. ref
  end
  keep = lease .. rest
  local ok = redis.pcall('SET', k, string.sub(v, 1, q) .. #keep .. ':' .. keep .. string.sub(v, r + n + 1), 'KEEPTTL')
  if ok.err then return ok end
  return 0
end
