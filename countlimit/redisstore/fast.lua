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
-- One script may carry many such calls (a pipeline's, on one server): they
-- are applied one after another, in order, each to the hash as the one
-- before left it, exactly as if each were a script of its own, and share
-- one reply key and the script's fixed cost.
--
-- KEYS: for each call its counter hash and its sliding log (deleted when a
-- log is there: counting with another kind of window drops it); last, the
-- reply key.
-- ARGV: reply TTL (ms), then for each call: now (µs), n, limit, begin (µs),
-- length (µs; 0 = lifetime), block (µs; 0 = none).
-- Returns apply.lua's reply for each call, one after another: {used,
-- begin, end, blocked_until, NONE, verdict}; and keeps it under the reply
-- key, as apply.lua does, when a call counted (with the replies of the
-- script's other calls, denials too). A call of many whose keys hold
-- something the script cannot read or write (a hash key made a string, a
-- field that is not a number; a hand edit) fails before it writes
-- anything: each branch's first write is the only one that can fail. Its
-- verdict is then -1 and it changed nothing, so the caller sends it again
-- alone, to get the error. A script of one call fails with that error.
local NONE = -9007199254740992 -- -2^53: no time

-- allow applies the call whose hash is h, log lg and arguments ARGV[a..a+5]
-- and returns its reply's values.
local function allow(h, lg, a)
  local now, n, limit = tonumber(ARGV[a]), tonumber(ARGV[a+1]), tonumber(ARGV[a+2])
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
  local used, wb, we = 0, tonumber(ARGV[a+3]), nil
  if cur then
    used, wb, we = tonumber(f[1]), b, e
  else
    local len = tonumber(ARGV[a+4])
    if len > 0 then we = wb + len end
  end

  local ok = blocked == nil and n <= limit - used
  if ok then
    used = used + n
    if cur and f[6] == ARGV[a+2] and not f[5] then
      -- One more in the current window, the limit as last applied: the
      -- window, the limit and the TTL stay as they are.
      redis.call('HINCRBY', h, 'c', n)
    else
      if f[5] then
        redis.call('DEL', lg)
        redis.call('HDEL', h, 's')
      end
      if we == nil then
        redis.call('HSET', h, 'c', string.format('%.0f', used), 'b', string.format('%.0f', wb), 'l', ARGV[a+2])
        if e ~= nil then redis.call('HDEL', h, 'e') end
      else
        redis.call('HSET', h, 'c', string.format('%.0f', used), 'b', string.format('%.0f', wb),
          'e', string.format('%.0f', we), 'l', ARGV[a+2])
      end
    end
    e = we
  else
    -- The tally first: the one write of a denial that can fail (a field
    -- that is not an integer), before any other.
    redis.call('HINCRBY', h, 'd', 1)
    if exists then
      redis.call('HSET', h, 'l', ARGV[a+2])
    else
      -- An empty window (begin = end) that only a counted event opens.
      redis.call('HSET', h, 'l', ARGV[a+2], 'b', ARGV[a], 'e', ARGV[a], 'c', '0')
      e = now
    end
    local block = tonumber(ARGV[a+5])
    if blocked == nil and block > 0 then
      blocked = now + block
      x = blocked
      redis.call('HSET', h, 'x', string.format('%.0f', blocked))
    end
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
  return used, wb or NONE, we or NONE, blocked or NONE, ok
end

local reply = KEYS[#KEYS]
local done = redis.call('GET', reply)
if done then return cmsgpack.unpack(done) end

local calls = (#KEYS - 1) / 2
local out, counted = {}, false
for i = 1, calls do
  local o, a = 6 * (i - 1), 2 + 6 * (i - 1)
  local fine, used, wb, we, blocked, ok = true
  if calls == 1 then
    used, wb, we, blocked, ok = allow(KEYS[1], KEYS[2], a)
  else
    fine, used, wb, we, blocked, ok = pcall(allow, KEYS[2 * i - 1], KEYS[2 * i], a)
  end
  if fine then
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] =
      used, wb, we, blocked, NONE, ok and 1 or 0
    counted = counted or ok
  else
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = 0, NONE, NONE, NONE, NONE, -1
  end
end
-- As in apply.lua, a denial alone is not remembered: its repeat counts
-- nothing either.
if counted then redis.call('SET', reply, cmsgpack.pack(out), 'PX', ARGV[1]) end
return out
