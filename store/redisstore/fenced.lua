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

local k, t, op = KEYS[1], ARGV[2], ARGV[1]
local v, q, r, n = held(k, t, tonumber(ARGV[3]), tonumber(ARGV[4]))
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
