-- countlimit: one atomic check of one id against one or more rules.
-- It is one copy of the decision the driver.Store contract spells out as
-- code in model.Apply (internal/testkit/model) (docs/ARCHITECTURE.md, "The copies", lists every
-- copy): change the model first, then every copy there. redisstore's
-- TestModel holds this script to the model on seeded random steps, every
-- call it can take; storetest.Run and TestFastScriptIsApplyForOneRule hold
-- the scripts to each other besides.
--
-- KEYS, per check i: KEYS[2i-1] the counter hash, KEYS[2i] the sliding log
-- (a sorted set: member "<µs>:<seq>", score µs), or the hash again where Go
-- names no log (see fast.lua's KEYS): a script given no log for a check
-- whose hash has one (field s) answers verdict -3 and writes nothing.
-- ARGV: op ('allow' | 'peek' | 'refund'), now (µs), n, the script's token
-- ('0' for peek), its attempt ('1' when an earlier send of the command may
-- have run, else '0'; see redisstore's attempt), then per check: limit,
-- begin (µs), length (µs; 0 = lifetime), span (µs; 0 = not sliding; -1 =
-- smooth), block (µs; 0 = none). A sliding check's begin and length are 0:
-- its log is its window. A smooth check (GCRA) has no window: its begin is
-- its burst and its length its emission interval (µs).
-- Hash fields: c count, b window begin, e window end (absent = lifetime),
-- l limit last applied, d denied tally, x blocked until, s log sequence,
-- t a smooth check's instant (the TAT: when the key is drained), r the
-- last script that wrote the hash (see fast.lua). The hash lives as long
-- as the latest of its window, its penalty and its instant.
--
-- One count per (use type, id), whatever kind of window asks (model.Apply
-- is the reference). A key is kept in the form of the kind that last
-- counted in it: a window's count, a sliding log (field s and the sorted
-- set), a smooth instant (t); every form keeps c over [b, e) besides: a
-- log its length over [oldest, newest + span), a smooth key its units not
-- yet drained over [0, t) (b 0, e t). A check of another form carries
-- that count over while the window is current (carried): a window joins
-- it; a sliding check with no log sees that many events logged at
-- min(now, e - span), and logs them when it counts; a smooth check with
-- no instant sees min(c, burst) units taken now. Counting writes the key
-- in the check's own form: a count drops the log and t, a log drops t, a
-- smooth instant drops the log, l and s. A refund gives back only in the
-- key's own form, or lowers the count of a window that joins it.
-- Returns per check: {used, begin, end, blocked_until, free_at}, NONE for
-- none, then the verdict (1 or 0) as the last element; -2 for a repeat
-- that cannot tell whether it ran (see below).
--
-- Lost replies. Only the first attempt of a command applies it; a repeat
-- (go-redis's retry on a new connection after a lost reply) writes
-- nothing, so nothing is counted or refunded twice. Every hash the script
-- writes keeps its token in field r: the first it writes the token, a
-- space and the packed reply, the others the token alone. A repeat that
-- finds its reply there returns it; one that does not (the hash written
-- since, or the first attempt never ran) answers -2 (lost) and the caller
-- reports the call as failed: it may have counted, once. Token '0' turns
-- the records off, and every attempt then applies the call.
--
-- A smooth key may be kept as a string (smoothkey.lua, which Go puts
-- before this script): it reads as its hash, and is made that hash before
-- anything else is written.
local op = ARGV[1]
local now = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local tok = ARGV[4]
local guard = tok ~= '0'
local cnt = (#ARGV - 5) / 5
local NONE = -9007199254740992 -- -2^53: no time (every valid one is larger)

if guard and ARGV[5] == '1' then
  for i = 1, cnt do
    -- A smooth key's string (smoothkey.lua) was written by fast.lua, not
    -- by this script.
    local r = redis.pcall('HGET', KEYS[2 * i - 1], 'r')
    if type(r) == 'string' and string.sub(r, 1, #tok + 1) == tok .. ' ' then
      return cmsgpack.unpack(string.sub(r, #tok + 2))
    end
  end
  local out = {}
  for i = 1, cnt do
    out[5 * i - 4], out[5 * i - 3], out[5 * i - 2], out[5 * i - 1], out[5 * i] = 0, NONE, NONE, NONE, NONE
  end
  out[5 * cnt + 1] = -2
  return out
end
local need = n
if op ~= 'allow' then need = 1 end

-- s writes x, a whole number of µs (or a count) within ±2^53, exactly:
-- '%d' (a C long) writes it for about 3 000 fewer instructions than '%.0f'
-- (a double's digits), per callgrind on fast.lua's smooth path.
local function s(x) return string.format('%d', x) end

-- ceildiv is ceil(p/q) for whole p >= 0 and q > 0 below 2^53, exactly:
-- the quotient of doubles is corrected by products, which are exact.
local function ceildiv(p, q)
  local k = math.floor(p / q)
  if k * q < p then k = k + 1 elseif k > 0 and (k - 1) * q >= p then k = k - 1 end
  return k
end

-- FOREVER is the end of a lifetime window (no field e).
local FOREVER = math.huge

-- carried is the count a check of another form than its key's reads from
-- it at now, and the end of the window that holds it (FOREVER for a
-- lifetime window): c over [b, e), while that window is current (not
-- empty, not over); 0 and nil otherwise. A window's count, a sliding
-- log's length and a smooth key's undrained units are all kept there.
local function carried(c)
  if c.exists and c.cnt ~= nil and c.cnt > 0 then
    if c.e == nil then return c.cnt, FOREVER end
    if c.b < c.e and now < c.e then return c.cnt, c.e end
  end
  return 0, nil
end

-- gcra sets a smooth check's view of its instant c.t at now: c.ahead
-- (max(t, now) - now), c.used (the units not yet drained), c.wend (the
-- instant, when it is after now), c.room (whether need more fit the rate)
-- and c.free (when they do, if they do not yet but can).
local function gcra(c)
  c.ahead, c.held = 0, nil
  if c.t ~= nil then
    if c.t > now then c.ahead = c.t - now end
  else
    -- No instant: another kind's count, as that many units taken now (a
    -- full burst at the most), held until its window ends.
    local m, held = carried(c)
    if m > 0 then c.ahead, c.held = math.min(m, c.burst) * c.iv, held end
  end
  c.used = math.min(c.burst, ceildiv(c.ahead, c.iv))
  c.wbegin, c.wend, c.free = nil, nil, nil
  if c.ahead > 0 then c.wend = now + c.ahead end
  c.room = c.limit > 0 and need <= c.burst and c.ahead + need * c.iv <= c.burst * c.iv
  if not c.room and c.limit > 0 and need <= c.burst then
    c.free = now + c.ahead + need * c.iv - c.burst * c.iv
    -- A carried count drains when its window ends (a lifetime's: never).
    if c.held == FOREVER then c.free = nil elseif c.held ~= nil then c.free = c.held end
  end
end

-- later returns the later of at and t, for a hash's TTL; at nil (never)
-- stays nil.
local function later(at, t)
  if at ~= nil and t ~= nil and t > at then return t end
  return at
end

-- expire sets a key's TTL so it vanishes when its window and penalty are
-- over; nil means never (a lifetime count).
local function expire(key, at)
  if at == nil then
    redis.call('PERSIST', key)
    return
  end
  local ms = math.ceil((at - now) / 1000)
  if ms < 1 then ms = 1 end
  redis.call('PEXPIRE', key, ms + GRACE)
end

-- the live sliding log: count, oldest, newest + span, and the event whose
-- expiry makes room for need.
local function slide(c)
  c.held = nil
  if not c.hadlog then
    -- No log: another kind's count, as that many events logged at the
    -- latest instant that lets them leave when its window ends, never
    -- after now; a denial waits for that (a lifetime count: no wait helps).
    local m, held = carried(c)
    c.used, c.wbegin, c.wend, c.free = m, nil, nil, nil
    if m > 0 then
      c.held, c.wbegin = held, math.min(now, held - c.span)
      c.wend = c.wbegin + c.span
      if need > c.limit - m and need <= c.limit and held ~= FOREVER then c.free = held - c.span end
    end
    return
  end
  local cut = '(' .. s(now - c.span)
  c.used = redis.call('ZCOUNT', c.z, cut, '+inf')
  c.wbegin, c.wend, c.free = nil, nil, nil
  if c.used > 0 then
    c.wbegin = tonumber(redis.call('ZRANGEBYSCORE', c.z, cut, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)[2])
    c.wend = tonumber(redis.call('ZRANGE', c.z, -1, -1, 'WITHSCORES')[2]) + c.span
  end
  if need > c.limit - c.used and need <= c.limit then
    local k = c.used + need - c.limit
    c.free = tonumber(redis.call('ZRANGEBYSCORE', c.z, cut, '+inf', 'WITHSCORES', 'LIMIT', k - 1, 1)[2])
  end
end

-- first is the first hash the script writes: it keeps the reply.
local first
local function wrote(h)
  if first == nil and guard then first = h end
end

local checks = {}
local allok = true
for i = 1, cnt do
  local a = 5 + (i - 1) * 5
  local c = {
    h = KEYS[2 * i - 1], z = KEYS[2 * i],
    limit = tonumber(ARGV[a + 1]), begin = tonumber(ARGV[a + 2]), len = tonumber(ARGV[a + 3]),
    span = tonumber(ARGV[a + 4]), block = tonumber(ARGV[a + 5]),
  }
  local f = redis.pcall('HMGET', c.h, 'c', 'b', 'e', 'x', 's', 't')
  if f.err then
    -- A smooth key's string (smoothkey.lua) reads as its hash {t, c, b,
    -- e, r}, and is made that hash for any op that may write.
    local t, tc, r = stringed(c.h, f)
    if t == nil then return redis.error_reply(f.err) end
    if op == 'peek' then
      local ts = string.format('%d', t)
      f = {string.format('%d', tc), '0', ts, false, false, ts}
    else
      unstring(c.h, t, tc, r)
      f = redis.call('HMGET', c.h, 'c', 'b', 'e', 'x', 's', 't')
    end
  end
  c.exists = f[2] ~= false
  c.hadlog = f[5] ~= false
  if c.hadlog and c.z == c.h then
    -- A log it was not given (see KEYS): asked for, with nothing written
    -- yet but a smooth key's string made the hash it stands for (Go names
    -- every log of a refund, the one op that writes above). Go reads the
    -- verdict alone.
    local out = {}
    for j = 1, 5 * cnt do out[j] = 0 end
    out[5 * cnt + 1] = -3
    return out
  end
  c.counted = f[1] ~= false or c.exists or c.hadlog
  local x = tonumber(f[4])
  c.x, c.e, c.t = x, tonumber(f[3]), tonumber(f[6])
  c.cnt, c.b = tonumber(f[1]), tonumber(f[2])
  -- A hash that exists expires no sooner than the latest of its e, x and t
  -- (the write that last moved either set its TTL so; a sliding refund
  -- only shortens e), and never when it has no e (a lifetime count).
  c.oldat = c.e
  if c.e ~= nil and x ~= nil and x > c.e then c.oldat = x end
  c.oldat = later(c.oldat, c.t)
  if x ~= nil and x > now then c.blocked = x end
  if c.span < 0 then
    c.burst, c.iv = c.begin, c.len
    if op == 'refund' and c.t ~= nil and c.t > now then
      -- Back n intervals, never before now, and the count and the window
      -- follow (the units undrained, [0, t)): a drained instant is
      -- dropped, and its window ends now with nothing in it.
      if n >= ceildiv(c.t - now, c.iv) then
        c.t, c.e, c.cnt = nil, now, 0
        redis.call('HDEL', c.h, 't')
        redis.call('HSET', c.h, 'c', '0', 'e', s(now), 'r', tok)
      else
        c.t = c.t - n * c.iv
        c.e, c.cnt = c.t, math.min(c.burst, ceildiv(c.t - now, c.iv))
        redis.call('HSET', c.h, 't', s(c.t), 'c', s(c.cnt), 'e', s(c.t), 'r', tok)
      end
      wrote(c.h)
      -- Its TTL follows: the latest of the window's end (the instant)
      -- and the penalty's.
      expire(c.h, later(c.e, x))
    end
    gcra(c)
  elseif c.span > 0 then
    -- A refund gives back only what a log holds: a key that has none
    -- (another kind's count) keeps it.
    if op == 'refund' and c.hadlog then
      local drop = math.min(n, redis.call('ZCOUNT', c.z, '(' .. s(now - c.span), '+inf'))
      if drop > 0 then redis.call('ZPOPMAX', c.z, drop) end
    end
    slide(c)
    if op == 'refund' and c.hadlog then
      redis.call('HSET', c.h, 'c', s(c.used), 'r', tok)
      wrote(c.h)
      if c.used > 0 then redis.call('HSET', c.h, 'b', s(c.wbegin), 'e', s(c.wend)) end
    end
  else
    local b, e = tonumber(f[2]), tonumber(f[3])
    -- Current: not empty, not over. Begin is not compared with now, so a
    -- caller whose clock read is older than a window another caller just
    -- opened joins it instead of resetting it.
    if c.exists and (e == nil or (b < e and e > now)) then
      c.used, c.wbegin, c.wend = tonumber(f[1]), b, e
      if op == 'refund' and c.used > 0 then
        c.used = math.max(c.used - n, 0)
        redis.call('HSET', c.h, 'c', s(c.used), 'r', tok)
        wrote(c.h)
      end
    else
      c.used, c.wbegin = 0, c.begin
      if c.len > 0 then c.wend = c.begin + c.len end
    end
  end
  if c.span < 0 then
    c.fits = c.blocked == nil and c.room
  else
    c.fits = c.blocked == nil and need <= c.limit - c.used
  end
  allok = allok and c.fits
  checks[i] = c
end

if op == 'allow' then
  for i = 1, cnt do
    local c = checks[i]
    if c.span < 0 then
      if allok then
        c.ahead = c.ahead + n * c.iv
        c.t = now + c.ahead
        c.used, c.wend = math.min(c.burst, ceildiv(c.ahead, c.iv)), c.t
        -- A smooth key: its units not yet drained over [0, t), what a
        -- rule of another kind carries over.
        local ts = s(c.t)
        redis.call('HSET', c.h, 't', ts, 'c', s(c.used), 'b', '0', 'e', ts, 'r', tok)
        wrote(c.h)
        -- Counting at a rate drops the log and the limit of other kinds.
        if c.exists or c.hadlog then redis.call('HDEL', c.h, 'l', 's') end
        if c.hadlog then redis.call('DEL', c.z) end
        expire(c.h, later(c.t, c.x))
      elseif not c.fits then
        local set = {'HSET', c.h, 'r', tok}
        local penalized = false
        if c.blocked == nil and c.block > 0 then
          c.blocked = now + c.block
          set[5], set[6] = 'x', s(c.blocked)
          penalized = true
        end
        redis.call(unpack(set))
        wrote(c.h)
        redis.call('HINCRBY', c.h, 'd', 1)
        -- Kept as long as anything in it lives: a window another kind
        -- counted in (a lifetime count for good), the penalty, the
        -- instant. A hash that was there already expires no sooner than
        -- those (c.oldat), and a denial moves none of them but a new
        -- penalty: its TTL stands.
        local fresh = not c.counted and c.t == nil and c.x == nil
        if (not c.exists or c.e ~= nil) and (fresh or penalized) then
          expire(c.h, later(later(math.max(c.e or now, now), c.blocked), c.t))
        end
      end
    elseif allok then
      if c.span > 0 then
        redis.call('ZREMRANGEBYSCORE', c.z, '-inf', s(now - c.span))
        -- A count carried over from another kind (c.held) is logged as
        -- the events slide saw, at c.wbegin.
        local m = 0
        if c.held ~= nil then m = c.used end
        local seq = redis.call('HINCRBY', c.h, 's', m + n)
        for j = seq - n - m + 1, seq - n do
          redis.call('ZADD', c.z, s(c.wbegin), s(c.wbegin) .. ':' .. s(j))
        end
        for j = seq - n + 1, seq do
          redis.call('ZADD', c.z, s(now), s(now) .. ':' .. s(j))
        end
        -- The log is now the c.used live events slide found (the trim
        -- above dropped exactly those it did not count) and n more at now,
        -- which a late clock read may put before the newest, or even the
        -- oldest, of them. (No two checks share a key: the Limiter refuses
        -- a use type twice.)
        if c.used > 0 then
          c.wbegin = math.min(c.wbegin, now)
          c.wend = math.max(c.wend, now + c.span)
        else
          c.wbegin, c.wend = now, now + c.span
        end
        c.used = c.used + n
        redis.call('HSET', c.h, 'c', s(c.used), 'b', s(c.wbegin), 'e', s(c.wend), 'l', s(c.limit), 'r', tok)
        wrote(c.h)
        -- Counting with another kind of window drops a smooth instant.
        if c.t ~= nil then redis.call('HDEL', c.h, 't') end
        c.t = nil
        expire(c.z, c.wend)
        c.e = c.wend
      else
        c.used = c.used + n
        if c.hadlog then
          -- Counting with another kind of window drops the sliding log.
          redis.call('DEL', c.z)
          redis.call('HDEL', c.h, 's')
        end
        if c.wend == nil then
          redis.call('HSET', c.h, 'c', s(c.used), 'b', s(c.wbegin), 'l', s(c.limit), 'r', tok)
          if c.e ~= nil then redis.call('HDEL', c.h, 'e') end
        else
          redis.call('HSET', c.h, 'c', s(c.used), 'b', s(c.wbegin), 'e', s(c.wend), 'l', s(c.limit), 'r', tok)
        end
        wrote(c.h)
        if c.t ~= nil then redis.call('HDEL', c.h, 't') end
        c.t = nil
        c.e = c.wend
      end
    elseif not c.fits then
      local set = {'HSET', c.h, 'l', s(c.limit), 'r', tok}
      if not c.exists then
        -- An empty window (begin = end) that only a counted event opens.
        set[7], set[8], set[9], set[10], set[11], set[12] = 'b', s(now), 'e', s(now), 'c', '0'
        c.e = now
      end
      if c.blocked == nil and c.block > 0 then
        c.blocked = now + c.block
        c.x = c.blocked
        local k = #set
        set[k + 1], set[k + 2] = 'x', s(c.blocked)
      end
      redis.call(unpack(set))
      wrote(c.h)
      redis.call('HINCRBY', c.h, 'd', 1)
    end
    if c.span >= 0 and (allok or not c.fits) then
      -- The hash lives as long as its window, its penalty and a smooth
      -- instant a denial left (c.e nil: a lifetime count, kept for good).
      -- A count in a window whose end is unchanged leaves its TTL as it
      -- is.
      local at = c.e
      if at ~= nil and c.x ~= nil and c.x > at then at = c.x end
      at = later(at, c.t)
      if c.span > 0 or not c.exists or at ~= c.oldat then expire(c.h, at) end
    end
  end
end

local out = {}
for i = 1, cnt do
  local c = checks[i]
  local free = NONE
  if not allok and c.free ~= nil then free = c.free end
  out[#out + 1] = c.used
  out[#out + 1] = c.wbegin or NONE
  out[#out + 1] = c.wend or NONE
  out[#out + 1] = c.blocked or NONE
  out[#out + 1] = free
end
out[#out + 1] = allok and 1 or 0
-- The reply goes with the token into the first hash written (the others
-- hold the token alone, written above).
if first then redis.call('HSET', first, 'r', tok .. ' ' .. cmsgpack.pack(out)) end
return out
