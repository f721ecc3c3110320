#!lua
-- idem fenced write. KEYS[1] = the record (see layout.go).
-- ARGV: op, tag ('R' fence ':' len(owner) ':' owner, the claim the write
-- holds), now, from (the status digit the record must be in), then per op:
--   settle:  status digit, expires_at, tail (completed_at ';' payload)
--   release: (nothing)
--   extend:  lease_until (0: keep the lease), ref ("": keep the ref)
--   step:    index, name, size (the step's store.Step.Size), the step
--            (layout.go), the size limit (0: none)
-- Replies: 0 done; 1 absent or expired; the record (a string) when it
-- holds another claim or is in another status (the client decodes it, and
-- also answers expired from it); an error 'idem: ...' when the stored
-- record is damaged or the key holds another type. A step has two more:
-- the status 'order N' when the record holds N steps and the step is not
-- the next one nor a retry of step index; 'size S' when the steps with it
-- would take S bytes, over the limit.
--fence.lua--

-- skip returns the position after the len ':' bytes field at i in v, or nil.
local function skip(v, i)
  local a = string.find(v, ':', i, true)
  local l = a and tonumber(string.sub(v, i, a - 1))
  return l and a + 1 + l
end

-- step appends the step enc (its name name, its size size) to the held
-- record v (with q, r, n from held) at index, as layout.go lays steps out
-- in an IN_PROGRESS record's payload.
local function step(k, v, r, n, index, name, size, enc, limit)
  local bad = redis.error_reply('idem: record steps not recognised')
  local c = string.find(v, ';', r + n + 1, true) -- completed_at ';'
  if not c then return bad end
  local count, total, i = 0, 0, c + 1
  if i <= #v then
    local a = string.find(v, ';', i, true)
    local b = a and string.find(v, ';', a + 1, true)
    count = b and tonumber(string.sub(v, i, a - 1))
    total = b and tonumber(string.sub(v, a + 1, b - 1))
    if not (count and total) then return bad end
    i = b + 1
  end
  local first = i
  if index < count then -- a retry of a recorded step changes nothing
    for j = 0, index do
      local a = string.find(v, ':', i, true)
      local l = a and tonumber(string.sub(v, i, a - 1))
      if not l then return bad end
      if j == index then
        if string.sub(v, a + 1, a + l) == name then return 0 end
        break
      end
      local d = string.find(v, ';', a + 1 + l, true) -- after at
      if not d then return bad end
      local kind = string.byte(v, d + 1)
      i = d + 2
      if kind == 114 then -- 'r'
        i = skip(v, i)
      elseif kind == 101 then -- 'e'
        i = skip(v, i)
        i = i and skip(v, i)
        i = i and skip(v, i)
      elseif kind ~= 110 then -- 'n'
        return bad
      end
      if not i then return bad end
    end
  end
  if index ~= count then return {ok = 'order ' .. count} end
  if limit > 0 and total + size > limit then return {ok = 'size ' .. (total + size)} end
  local ok = redis.pcall('SET', k, string.sub(v, 1, c) .. (count + 1) .. ';' .. (total + size) .. ';' .. string.sub(v, first) .. enc, 'KEEPTTL')
  if ok.err then return ok end
  return 0
end

-- HEAD is how much of a record a step reads first (GETRANGE): a record
-- that long or longer is likely to hold steps that need not pass through
-- the script (see appended).
local HEAD = 512

-- appended records a step in place, without reading the record whole:
-- from h, the record's first HEAD bytes, it checks the claim (t, at now,
-- in status from) as held does, and that the record holds index steps of
-- size total (layout.go) with the header count ';' size ';' wholly in h;
-- and when the new header is as long as the old one, it overwrites the
-- header (SETRANGE) and appends the step enc (APPEND). Moving a long
-- record through the script costs the server far more than the two
-- commands (docs/benchmarks.md). It returns 0 when it wrote, nil when the
-- full path must decide (step): another claim, a retry, a refusal, a
-- header that changes length, a damaged record, or a command the ACL
-- refuses.
local function appended(k, t, now, from, h, index, size, enc, limit)
  if string.sub(h, 1, #t) ~= t then return nil end
  local p = #t + 1
  local q = string.find(h, ';', p + 1, true)
  local e = q and tonumber(string.sub(h, p + 1, q - 1))
  if not e or now >= e or string.byte(h, p) - 48 ~= from then return nil end
  local r = string.find(h, ':', q + 1, true)
  local n = r and tonumber(string.sub(h, q + 1, r - 1))
  local c = n and string.find(h, ';', r + n + 1, true) -- completed_at ';'
  local a = c and string.find(h, ';', c + 1, true)
  local b = a and string.find(h, ';', a + 1, true)
  local count = b and tonumber(string.sub(h, c + 1, a - 1))
  local total = b and tonumber(string.sub(h, a + 1, b - 1))
  if not (count and total) or index ~= count or (limit > 0 and total + size > limit) then return nil end
  local head = (count + 1) .. ';' .. (total + size) .. ';'
  if #head ~= b - c then return nil end
  -- h[c + 1] is the header's first byte: offset c
  if type(redis.pcall('SETRANGE', k, c, head)) == 'table' then return nil end
  if type(redis.pcall('APPEND', k, enc)) == 'table' then
    redis.call('SETRANGE', k, c, string.sub(h, c + 1, b)) -- as it was
    return nil
  end
  return 0
end

local k, t, op = KEYS[1], ARGV[2], ARGV[1]
local got -- the record, when a step read it whole
if op == 'step' then
  local h = redis.pcall('GETRANGE', k, 0, HEAD - 1)
  if type(h) == 'string' and #h >= HEAD then
    if appended(k, t, tonumber(ARGV[3]), tonumber(ARGV[4]), h, tonumber(ARGV[5]), tonumber(ARGV[7]), ARGV[8], tonumber(ARGV[9])) then
      return 0
    end
  elseif type(h) == 'string' and h ~= '' then
    got = h
  end
end
local v, q, r, n = held(k, t, tonumber(ARGV[3]), tonumber(ARGV[4]), got)
if not v then return q end
if op == 'settle' then
  return settle(k, t, v, q, r, n, ARGV[5], ARGV[6], ARGV[7])
elseif op == 'release' then
  redis.call('DEL', k)
elseif op == 'extend' then
  return lengthen(k, v, q, r, n, ARGV[5], ARGV[6])
elseif op == 'step' then
  return step(k, v, r, n, tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7]), ARGV[8], tonumber(ARGV[9]))
else
  return redis.error_reply('idem: unknown op ' .. op)
end
return 0
