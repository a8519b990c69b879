-- countlimit: the fast path, apply.lua for the common call: an Allow of
-- one rule whose window is not sliding (rolling, fixed, calendar, lifetime,
-- CheckLimit). It decides as apply.lua does for such a call, in straight
-- code without apply.lua's tables, loops and branches for other ops and
-- for logs, and counts an event in the current window under an unchanged
-- limit with one HINCRBY instead of rewriting four fields: about a third
-- less Redis CPU a call. Twins: apply.lua (and with it countlimit_apply,
-- queries/fast.sql and memstore's Store.apply): change one, change them
-- all. storetest.Run, in TestConformance, sends every single-rule Allow
-- here and every other call to apply.lua, on the same keys.
--
-- KEYS: the counter hash, the sliding log (deleted when a log is there:
-- counting with another kind of window drops it), the reply key.
-- ARGV: now (µs), n, reply TTL (ms), limit, begin (µs), length (µs; 0 =
-- lifetime), block (µs; 0 = none).
-- Returns apply.lua's reply for one check: {used, begin, end,
-- blocked_until, NONE, verdict}, and keeps it under the reply key as
-- apply.lua does.
local h, reply = KEYS[1], KEYS[3]
local done = redis.call('GET', reply)
if done then return cmsgpack.unpack(done) end

local NONE = -9007199254740992 -- -2^53: no time
local now, n, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[4])
local f = redis.call('HMGET', h, 'c', 'b', 'e', 'x', 's', 'l')
local exists = f[2] ~= false
local b, e, x = tonumber(f[2]), tonumber(f[3]), tonumber(f[4])
-- The hash's TTL now: the later of e and x (apply.lua's oldat).
local oldat = e
if e ~= nil and x ~= nil and x > e then oldat = x end
local blocked
if x ~= nil and x > now then blocked = x end

-- Current: not empty, not over (begin is not compared with now).
local cur = exists and (e == nil or (b < e and e > now))
local used, wb, we = 0, tonumber(ARGV[5]), nil
if cur then
  used, wb, we = tonumber(f[1]), b, e
else
  local len = tonumber(ARGV[6])
  if len > 0 then we = wb + len end
end

local ok = blocked == nil and n <= limit - used
if ok then
  used = used + n
  if cur and f[6] == ARGV[4] and not f[5] then
    -- One more in the current window, the limit as last applied: the
    -- window, the limit and the TTL stay as they are.
    redis.call('HINCRBY', h, 'c', n)
  else
    if f[5] then
      redis.call('DEL', KEYS[2])
      redis.call('HDEL', h, 's')
    end
    if we == nil then
      redis.call('HSET', h, 'c', string.format('%.0f', used), 'b', string.format('%.0f', wb), 'l', ARGV[4])
      if e ~= nil then redis.call('HDEL', h, 'e') end
    else
      redis.call('HSET', h, 'c', string.format('%.0f', used), 'b', string.format('%.0f', wb),
        'e', string.format('%.0f', we), 'l', ARGV[4])
    end
  end
  e = we
else
  if exists then
    redis.call('HSET', h, 'l', ARGV[4])
  else
    -- An empty window (begin = end) that only a counted event opens.
    redis.call('HSET', h, 'l', ARGV[4], 'b', ARGV[1], 'e', ARGV[1], 'c', '0')
    e = now
  end
  local block = tonumber(ARGV[7])
  if blocked == nil and block > 0 then
    blocked = now + block
    x = blocked
    redis.call('HSET', h, 'x', string.format('%.0f', blocked))
  end
  redis.call('HINCRBY', h, 'd', 1)
end

-- The hash lives as long as its window and its penalty (nil: a lifetime
-- count, kept for good); a TTL that would not change is left alone.
local at = e
if at ~= nil and x ~= nil and x > at then at = x end
if not exists or at ~= oldat then
  if at == nil then
    redis.call('PERSIST', h)
  else
    local ms = math.ceil((at - now) / 1000)
    if ms < 1 then ms = 1 end
    redis.call('PEXPIRE', h, ms)
  end
end

local out = {used, wb or NONE, we or NONE, blocked or NONE, NONE, ok and 1 or 0}
-- As in apply.lua, a denial is not remembered.
if ok then redis.call('SET', reply, cmsgpack.pack(out), 'PX', ARGV[3]) end
return out
