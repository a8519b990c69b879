-- countlimit: the fast path, apply.lua for the common call: an Allow of
-- one rule (rolling, fixed, calendar, lifetime, sliding, smooth,
-- CheckLimit). It
-- decides as apply.lua does for such a call, in straight code without
-- apply.lua's tables, loops and branches for other ops and for several
-- rules, and counts an event in the current window under an unchanged
-- limit by writing the count and the record alone. It is one of the copies
-- of model.Apply that docs/ARCHITECTURE.md lists ("The copies"): change
-- the model first, then every copy there. redisstore's TestModel holds
-- it to model.Apply, alone and combined; storetest.Run, in
-- TestConformance, sends every single-rule Allow here and every other call
-- to apply.lua, on the same keys.
--
-- One script may carry many such calls (a pipeline's, on one server): they
-- are applied one after another, in order, each to the hash as the one
-- before left it, exactly as if each were a script of its own, and share
-- the script's fixed cost.
--
-- KEYS: for each call its counter hash and its sliding log (for a window
-- that is not sliding, deleted when a log is there: counting with another
-- kind of window drops it). On a Cluster Go names the log only where the
-- call needs it (a sliding window), and the hash again in its place
-- otherwise, so that a slot in migration does not refuse the call for a
-- log that is not there; a call whose hash has a log (field s) that it was not given
-- answers verdict -3 and writes nothing, and Go sends it again with its log.
-- ARGV: the script's token, its attempt ('1' when an earlier send of the
-- command may have run, else '0'; see redisstore's attempt), then for each
-- call: now (µs), n, limit, begin (µs), length (µs; 0 = lifetime), block
-- (µs; 0 = none), span (µs; 0 = not sliding; begin and length are 0 when
-- it is not; -1 = smooth, whose begin is then its burst and length its
-- emission interval, µs; see apply.lua).
-- Returns apply.lua's reply for each call, one after another: {used,
-- begin, end, blocked_until, free_at, verdict}.
--
-- Lost replies. Only the first attempt of a command applies its calls; a
-- repeat (attempt '1') writes nothing, so however the attempts of one
-- command meet in Redis, in whatever order, each call counts at most once.
-- A repeat only answers: every hash a call writes keeps the script's token
-- in its field r, the token when the call counted, '-' and the token when
-- it was denied (apply.lua keeps its own there, so r always names the last
-- script that wrote the hash). A repeat's call whose hash still names the
-- script was applied by the first attempt, and nothing has written that
-- hash since, so the hash is as that call left it and the reply is read
-- back from it. A call whose hash names another script (written since, or
-- never written by this one: the first attempt may never have reached
-- Redis) answers verdict -2 (lost) and the caller reports it as failed: it
-- may have counted, once. Token '0' turns the records off, and every
-- attempt then applies its calls (a test shows what that costs).
--
-- A call of many whose keys hold something the script cannot read or write
-- (a hash key made a string, a field that is not a number; a hand edit)
-- fails before it writes anything: each branch's first write is the only
-- one that can fail. Its verdict is then -1 and it changed nothing, so the
-- caller sends it again alone, to get the error. A script of one call fails
-- with that error.
local NONE = -9007199254740992 -- -2^53: no time
local tok = ARGV[1]
local guard = tok ~= '0'
local repeated = guard and ARGV[2] == '1'

-- A smooth key may be kept as a string (smoothkey.lua: parsed, stringed,
-- unstring). Go puts smoothkey.lua below the commonest smooth call, not
-- before this script as before apply.lua and lease.lua: Lua makes every
-- function of a script anew on each run, and each closure costs Redis
-- 500-1 800 instructions, more with upvalues (callgrind: docs/benchmarks.md,
-- "The commonest smooth call before any closure").

-- instant applies the smooth call of the hash h and arguments ARGV[a..a+6],
-- under the script's token and the TTLs' grace (ms), when h holds
-- nothing or a smooth key's string and the call fits: it writes the
-- string and returns the reply's values, or the error of a write refused.
-- Anything else writes nothing and returns nil and whether h holds a
-- smooth key's string, its instant and its record. It has no upvalues
-- (they are what makes a closure dear), so it reads a string as
-- smoothkey.lua's parsed does, in its place.
local function instant(h, a, token, grace)
  local v = redis.pcall('GET', h)
  if type(v) == 'table' then return nil, false end -- a hash: no string
  local now, ahead, t, c, r = ARGV[a] + 0, 0, nil, nil, nil
  if v then
    t, c, r = string.match(v, '^(%x+):(%d+):?(%d*)$') -- parsed
    if t == nil then return nil, false end
    t, c = tonumber(t, 16), tonumber(c)
    if t > now then ahead = t - now end
  end
  local n, burst, iv = ARGV[a+1] + 0, ARGV[a+3] + 0, ARGV[a+4] + 0
  if ARGV[a+2] == '0' or n > burst or ahead + n * iv > burst * iv then return nil, v ~= false, t, c, r end
  ahead = ahead + n * iv
  -- ceil(ahead/iv), exactly (see ceildiv): the units not yet drained,
  -- kept beside the instant (smoothkey.lua).
  local used = math.floor(ahead / iv)
  if used * iv < ahead then used = used + 1 elseif used > 0 and (used - 1) * iv >= ahead then used = used - 1 end
  if used > burst then used = burst end
  -- Until it is drained, as rate's hash. A limit of 0 (the Limiter's
  -- arguments are whole numbers, never negative) allows nothing. The
  -- TTL goes as a string: Lua writes a number with '%.14g', 1 500
  -- instructions more.
  local ms = math.ceil(ahead / 1000)
  if ms < 1 then ms = 1 end
  ms = ms + grace
  if token ~= '0' then
    v = string.format('%x:%d:%s', now + ahead, used, token)
  else
    v = string.format('%x:%d', now + ahead, used)
  end
  -- An error (a write refused: OOM, READONLY) is returned as such, to
  -- fail the call alone, as count's.
  local w = redis.pcall('SET', h, v, 'PX', string.format('%d', ms))
  if w.err then return w end
  return used, now + ahead
end

-- The commonest smooth call first, before anything else is made: one
-- call, no repeat, that instant applies.
local str, st, sc, sr -- the single call's key: a smooth string, its instant, count and record
if #KEYS == 2 and not repeated and ARGV[9] == '-1' then
  local used, e
  used, e, st, sc, sr = instant(KEYS[1], 3, tok, GRACE)
  if type(used) == 'table' then return redis.error_reply(used.err) end
  if used then return {used, NONE, e, NONE, NONE, 1} end
  str = e
end

-- smoothkey.lua

-- fields returns HMGET's reply for h's fields c, b, e, x, s, l, r, t, a
-- smooth key's string made its hash first; for any other key that is no
-- hash, HMGET's error (a table with err).
local function fields(h)
  local f = redis.pcall('HMGET', h, 'c', 'b', 'e', 'x', 's', 'l', 'r', 't')
  if f.err then
    local t, c, r = stringed(h, f)
    if t ~= nil then
      unstring(h, t, c, r)
      f = redis.pcall('HMGET', h, 'c', 'b', 'e', 'x', 's', 'l', 'r', 't')
    end
  end
  return f
end

-- rate applies the commonest smooth call, if it is one: n more that fit
-- the rate of a hash h (fields f) that holds nothing of another kind (a
-- count, window or limit that are not a smooth key's, a log) and no
-- running penalty, as smoothAllow does. It writes the instant, the count,
-- the window and the record with one HSET, sets the TTL, and returns the
-- reply's values, or nil, having written nothing, for any other call; an
-- error as count does.
local function rate(h, f, a)
  if f[5] or f[6] or not f[8] and (f[1] or f[2] or f[3]) then return nil end
  local now, x, t = tonumber(ARGV[a]), f[4], f[8]
  if x then
    x = tonumber(x)
    if x == nil or x > now then return nil end
  end
  local ahead = 0
  if t then
    t = tonumber(t)
    if t == nil then return nil end
    if t > now then ahead = t - now end
  end
  local n, limit, burst, iv = tonumber(ARGV[a+1]), tonumber(ARGV[a+2]), tonumber(ARGV[a+3]), tonumber(ARGV[a+4])
  if limit <= 0 or n > burst or ahead + n * iv > burst * iv then return nil end
  ahead = ahead + n * iv
  -- ceil(ahead/iv), exactly (see ceildiv).
  local used = math.floor(ahead / iv)
  if used * iv < ahead then used = used + 1 elseif used > 0 and (used - 1) * iv >= ahead then used = used - 1 end
  if used > burst then used = burst end
  local ts, w = string.format('%d', now + ahead)
  if guard then
    w = redis.pcall('HSET', h, 't', ts, 'c', string.format('%d', used), 'b', '0', 'e', ts, 'r', tok)
  else
    w = redis.pcall('HSET', h, 't', ts, 'c', string.format('%d', used), 'b', '0', 'e', ts)
  end
  if type(w) == 'table' and w.err then return w end
  -- Until it is drained: an expired penalty ends before.
  local ms = math.ceil(ahead / 1000)
  if ms < 1 then ms = 1 end
  redis.call('PEXPIRE', h, ms + GRACE)
  return used, NONE, now + ahead, NONE, NONE, 1
end

-- count applies the commonest call, if it is one: counting n more in the
-- current window of the hash h (fields f) under the limit last applied,
-- with no log and no penalty, as allow's first branch does. It writes the
-- count and the record with one HSET and returns the reply's values, or
-- nil, having written nothing, for any other call. An error (a write
-- refused: OOM, READONLY) is returned as such, to fail the call alone.
-- A smooth call is rate's.
local function count(h, f, a)
  if ARGV[a+6] == '-1' then return rate(h, f, a) end
  if not f[2] or f[5] or f[8] or f[6] ~= ARGV[a+2] or ARGV[a+6] ~= '0' then return nil end
  -- A field that is no number (a hand edit) leaves the call to allow,
  -- which fails it as it always has.
  local now, x, e = tonumber(ARGV[a]), f[4], f[3]
  if x then x = tonumber(x) end
  if x and x > now then return nil end
  local b, used = tonumber(f[2]), tonumber(f[1])
  if b == nil or used == nil then return nil end
  if e then e = tonumber(e) else e = nil end
  if e ~= nil and not (b < e and e > now) then return nil end
  local n = tonumber(ARGV[a+1])
  if n > tonumber(ARGV[a+2]) - used then return nil end
  used = used + n
  local w
  if guard then
    w = redis.pcall('HSET', h, 'c', string.format('%d', used), 'r', tok)
  else
    w = redis.pcall('HSET', h, 'c', string.format('%d', used))
  end
  if type(w) == 'table' and w.err then return w end
  return used, b, e or NONE, NONE, NONE, 1
end

-- The commonest call first, before the other functions below are made (Lua
-- makes each anew on every run): one call, no repeat, that count applies.
-- Anything else goes on below with the fields read here.
local f1
if #KEYS == 2 and not repeated then
  if str then unstring(KEYS[1], st, sc, sr) end
  f1 = fields(KEYS[1])
  if f1.err then return redis.error_reply(f1.err) end
  local used, b, e = count(KEYS[1], f1, 3)
  if type(used) == 'table' then return redis.error_reply(used.err) end
  if used then return {used, b, e, NONE, NONE, 1} end
end

local denied = '-' .. tok

-- record adds field r, the record of this script, to set, an HSET's
-- arguments, unless records are off.
local function record(set, r)
  if guard then set[#set + 1], set[#set + 2] = 'r', r end
end

-- s writes x, a whole number of µs (or a count) within ±2^53, exactly:
-- '%d' (a C long) writes it for about 3 000 fewer instructions than '%.0f'
-- (a double's digits), per callgrind on fast.lua's smooth path.
local function s(x) return string.format('%d', x) end

-- FOREVER is the end of a lifetime window (no field e).
local FOREVER = math.huge

-- carried is the count a call of another form than its key's reads from
-- the hash's fields f at now, and the end of the window that holds it
-- (FOREVER for a lifetime window): c over [b, e), while that window is
-- current; 0 and nil otherwise (apply.lua's carried).
local function carried(f, now)
  local c, b = tonumber(f[1]), f[2]
  if b and c ~= nil and c > 0 then
    if not f[3] then return c, FOREVER end
    local e = tonumber(f[3])
    if tonumber(b) < e and now < e then return c, e end
  end
  return 0, nil
end

-- decide works out the call whose fields are f and arguments ARGV[a..a+6]
-- as the hash stands, writing nothing; not for a sliding call (slide).
local function decide(f, a)
  local now, n = tonumber(ARGV[a]), tonumber(ARGV[a+1])
  local b, e, x = f[2], f[3], f[4]
  local exists = b ~= false
  if e then e = tonumber(e) else e = nil end
  if x then x = tonumber(x) else x = nil end
  local blocked
  if x ~= nil and x > now then blocked = x end
  -- Current: not empty, not over (begin is not compared with now).
  local used, wb, we, cur = 0, nil, nil, false
  if exists then
    b = tonumber(b)
    cur = e == nil or (b < e and e > now)
  end
  if cur then
    used, wb, we = tonumber(f[1]), b, e
  else
    wb = tonumber(ARGV[a+3])
    local len = tonumber(ARGV[a+4])
    if len > 0 then we = wb + len end
  end
  local ok = blocked == nil and n <= tonumber(ARGV[a+2]) - used
  return ok, now, n, exists, cur, e, x, blocked, used, wb, we
end

-- slide works out a sliding call whose log is lg, fields f and arguments
-- ARGV[a..a+6] as the log stands, writing nothing: apply.lua's slide and
-- decision for one check.
local function slide(lg, f, a)
  local now, n, limit, span = tonumber(ARGV[a]), tonumber(ARGV[a+1]), tonumber(ARGV[a+2]), tonumber(ARGV[a+6])
  local x = f[4]
  if x then x = tonumber(x) else x = nil end
  local blocked
  if x ~= nil and x > now then blocked = x end
  local used, wb, we, free, held
  if not f[5] then
    -- No log: another kind's count, as apply.lua's slide sees it.
    used, held = carried(f, now)
    if used > 0 then
      wb = math.min(now, held - span)
      we = wb + span
      if n > limit - used and n <= limit and held ~= FOREVER then free = held - span end
    end
  else
    local cut = '(' .. s(now - span)
    used = redis.call('ZCOUNT', lg, cut, '+inf')
    if used > 0 then
      wb = tonumber(redis.call('ZRANGEBYSCORE', lg, cut, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)[2])
      we = tonumber(redis.call('ZRANGE', lg, -1, -1, 'WITHSCORES')[2]) + span
    end
    if n > limit - used and n <= limit then
      free = tonumber(redis.call('ZRANGEBYSCORE', lg, cut, '+inf', 'WITHSCORES', 'LIMIT', used + n - limit - 1, 1)[2])
    end
  end
  local ok = blocked == nil and n <= limit - used
  return ok, now, n, span, x, blocked, used, wb, we, free, held
end

-- expire sets h's TTL to end at at (µs), seen at now; nil: never.
local function expire(h, at, now)
  if at == nil then
    redis.call('PERSIST', h)
  else
    local ms = math.ceil((at - now) / 1000)
    if ms < 1 then ms = 1 end
    redis.call('PEXPIRE', h, ms + GRACE)
  end
end

-- later returns the later of at and the smooth instant t (a field, or
-- false), for a hash's TTL; at nil (never) stays nil.
local function later(at, t)
  if at ~= nil and t then
    t = tonumber(t)
    if t ~= nil and t > at then return t end
  end
  return at
end

-- deny writes the denial of the call whose hash is h and arguments
-- ARGV[a..a+6], at now, blocked the penalty's end or nil: the tally, the
-- limit, an empty window on a new hash, a penalty when the rule has one
-- and none runs, and the record. It returns the hash's window end when it
-- wrote one (else nil), the penalty's end when it set one (else nil), and
-- blocked as it now is.
local function deny(h, a, exists, now, blocked)
  -- The tally first: the one write of a denial that can fail (a field
  -- that is not an integer), before any other.
  redis.call('HINCRBY', h, 'd', 1)
  local set = {'HSET', h, 'l', ARGV[a+2]}
  local e, x
  if not exists then
    -- An empty window (begin = end) that only a counted event opens.
    set[5], set[6], set[7], set[8], set[9], set[10] = 'b', ARGV[a], 'e', ARGV[a], 'c', '0'
    e = now
  end
  local block = tonumber(ARGV[a+5])
  if blocked == nil and block > 0 then
    blocked = now + block
    x = blocked
    set[#set + 1], set[#set + 2] = 'x', s(blocked)
  end
  record(set, denied)
  redis.call(unpack(set))
  return e, x, blocked
end

-- slideAllow applies a sliding call, as allow does others.
local function slideAllow(h, lg, f, a)
  local ok, now, n, span, x, blocked, used, wb, we, free, held = slide(lg, f, a)
  local exists = f[2] ~= false
  local e = f[3]
  if e then e = tonumber(e) else e = nil end
  if ok then
    local snow = s(now)
    redis.call('ZREMRANGEBYSCORE', lg, '-inf', s(now - span))
    -- A count carried over from another kind (held) is logged as the
    -- events slide saw, at wb.
    local m = 0
    if held then m = used end
    local seq = redis.call('HINCRBY', h, 's', m + n)
    if m > 0 then
      local sat = s(wb)
      for j = seq - n - m + 1, seq - n do
        redis.call('ZADD', lg, sat, sat .. ':' .. s(j))
      end
    end
    for j = seq - n + 1, seq do
      redis.call('ZADD', lg, snow, snow .. ':' .. s(j))
    end
    -- The log is now the used live events slide found (the trim above
    -- dropped exactly those it did not count) and n more at now, which a
    -- late clock read may put before the newest, or even the oldest, of
    -- them.
    if used > 0 then
      wb, we = math.min(wb, now), math.max(we, now + span)
    else
      wb, we = now, now + span
    end
    used = used + n
    local set = {'HSET', h, 'c', s(used), 'b', s(wb), 'e', s(we), 'l', ARGV[a+2]}
    record(set, tok)
    redis.call(unpack(set))
    -- Counting with another kind of window drops a smooth instant.
    if f[8] then redis.call('HDEL', h, 't') end
    expire(lg, we, now)
    e, free = we, nil
  else
    local de, dx
    de, dx, blocked = deny(h, a, exists, now, blocked)
    e, x = de or e, dx or x
    e = later(e, f[8])
  end
  -- A sliding hash's TTL is set on every write: a refund may have
  -- shortened its window.
  local at = e
  if at ~= nil and x ~= nil and x > at then at = x end
  expire(h, at, now)
  return used, wb or NONE, we or NONE, blocked or NONE, free or NONE, ok and 1 or 0
end

-- ceildiv is ceil(p/q) for whole p >= 0 and q > 0 below 2^53, exactly:
-- the quotient of doubles is corrected by products, which are exact.
local function ceildiv(p, q)
  local k = math.floor(p / q)
  if k * q < p then k = k + 1 elseif k > 0 and (k - 1) * q >= p then k = k - 1 end
  return k
end

-- gcra works out a smooth call (span -1) whose fields are f and arguments
-- ARGV[a..a+6] as the hash stands, writing nothing: apply.lua's decision
-- for one smooth check. ahead is max(t, now) - now; room, whether n more
-- fit the rate (the penalty aside).
local function gcra(f, a)
  local now, n, limit = tonumber(ARGV[a]), tonumber(ARGV[a+1]), tonumber(ARGV[a+2])
  local burst, iv = tonumber(ARGV[a+3]), tonumber(ARGV[a+4])
  local x, t = f[4], f[8]
  if x then x = tonumber(x) else x = nil end
  if t then t = tonumber(t) else t = nil end
  local blocked
  if x ~= nil and x > now then blocked = x end
  local ahead, held = 0, nil
  if t ~= nil then
    if t > now then ahead = t - now end
  else
    -- No instant: another kind's count, as apply.lua's gcra sees it.
    local m
    m, held = carried(f, now)
    if m > 0 then ahead = math.min(m, burst) * iv end
  end
  local room = limit > 0 and n <= burst and ahead + n * iv <= burst * iv
  return room and blocked == nil, room, now, n, limit, burst, iv, x, blocked, ahead, held
end

-- rated is a smooth call's reply: used the units not yet drained, no
-- begin, the end when the key is drained (none when it is), and when
-- the call did not fit the rate but could, the instant it does: for a
-- count carried over (held), when its window ends (a lifetime's: never).
local function rated(ok, room, now, n, limit, burst, iv, blocked, ahead, held)
  local used = math.min(burst, ceildiv(ahead, iv))
  local e, free = NONE, NONE
  if ahead > 0 then e = now + ahead end
  if not ok and not room and limit > 0 and n <= burst then
    free = now + ahead + n * iv - burst * iv
    if held == FOREVER then free = NONE elseif held ~= nil then free = held end
  end
  return used, NONE, e, blocked or NONE, free, ok and 1 or 0
end

-- smoothAllow applies a smooth call, as allow does others: counted, the
-- hash keeps the new instant in t, its units not yet drained in c over
-- [0, t), and drops the log and limit of other kinds; denied, the tally
-- and the penalty, as for every kind. The hash lives until it is drained
-- and its penalty is over.
local function smoothAllow(h, lg, f, a)
  local ok, room, now, n, limit, burst, iv, x, blocked, ahead, held = gcra(f, a)
  if ok then
    ahead = ahead + n * iv
    local ts = s(now + ahead)
    local set = {'HSET', h, 't', ts, 'c', s(math.min(burst, ceildiv(ahead, iv))), 'b', '0', 'e', ts}
    record(set, tok)
    redis.call(unpack(set))
    if f[5] or f[6] then redis.call('HDEL', h, 'l', 's') end
    if f[5] then redis.call('DEL', lg) end
    local at = now + ahead
    if x ~= nil and x > at then at = x end
    expire(h, at, now)
  else
    -- The tally first, the one write that can fail (see deny).
    redis.call('HINCRBY', h, 'd', 1)
    local set = {'HSET', h}
    local block = tonumber(ARGV[a+5])
    local penalized = false
    if blocked == nil and block > 0 then
      blocked = now + block
      set[3], set[4] = 'x', s(blocked)
      penalized = true
    end
    record(set, denied)
    if #set > 2 then redis.call(unpack(set)) end
    -- Kept as long as anything in it lives: a window another kind
    -- counted in (a lifetime count for good), the penalty, the instant.
    -- A hash that was there already expires no sooner than those (see
    -- apply.lua), and a denial moves none of them but a new penalty: its
    -- TTL stands.
    local fresh = not (f[1] or f[2] or f[4] or f[5] or f[8])
    local at = now
    if f[2] then at = f[3] and math.max(now, tonumber(f[3])) or nil end
    if at ~= nil and (fresh or penalized) then
      if blocked ~= nil and blocked > at then at = blocked end
      expire(h, later(at, f[8]), now)
    end
  end
  return rated(ok, room, now, n, limit, burst, iv, blocked, ahead, held)
end

-- allow applies the call whose hash is h, log lg, fields f and arguments
-- ARGV[a..a+6] and returns its reply's values.
local function allow(h, lg, f, a)
  -- A log it was not given (see KEYS): asked for, nothing written.
  if f[5] and lg == h then return 0, NONE, NONE, NONE, NONE, -3 end
  if ARGV[a+6] == '-1' then return smoothAllow(h, lg, f, a) end
  if ARGV[a+6] ~= '0' then return slideAllow(h, lg, f, a) end
  local ok, now, n, exists, cur, e, x, blocked, used, wb, we = decide(f, a)
  -- The hash's TTL now: the latest of e, x and t (apply.lua's oldat).
  local oldat = e
  if e ~= nil and x ~= nil and x > e then oldat = x end
  oldat = later(oldat, f[8])
  if ok then
    used = used + n
    if cur and f[6] == ARGV[a+2] and not f[5] and not f[8] then
      -- One more in the current window, the limit as last applied: the
      -- window, the limit and the TTL stay as they are. One HSET writes
      -- the count and the record (a call into Redis costs more than
      -- formatting the count).
      if guard then
        redis.call('HSET', h, 'c', string.format('%d', used), 'r', tok)
      else
        redis.call('HSET', h, 'c', string.format('%d', used))
      end
      return used, wb, we or NONE, NONE, NONE, 1
    end
    if f[5] then
      redis.call('DEL', lg)
      redis.call('HDEL', h, 's')
    end
    -- Counting with another kind of window drops a smooth instant.
    if f[8] then redis.call('HDEL', h, 't') end
    local set = {'HSET', h, 'c', string.format('%d', used), 'b', string.format('%d', wb), 'l', ARGV[a+2]}
    if we ~= nil then set[9], set[10] = 'e', string.format('%d', we) end
    record(set, tok)
    redis.call(unpack(set))
    if we == nil and e ~= nil then redis.call('HDEL', h, 'e') end
    e = we
  else
    local de, dx
    de, dx, blocked = deny(h, a, exists, now, blocked)
    e, x = de or e, dx or x
    e = later(e, f[8])
  end

  -- The hash lives as long as its window, its penalty and a smooth
  -- instant a denial left (nil: a lifetime count, kept for good); a TTL
  -- that would not change is left alone.
  local at = e
  if at ~= nil and x ~= nil and x > at then at = x end
  if not exists or at ~= oldat then expire(h, at, now) end
  return used, wb or NONE, we or NONE, blocked or NONE, NONE, ok and 1 or 0
end

-- again answers, without writing, the call whose hash (and log) is as
-- this script left it (fields f, record r) from an earlier attempt.
local function again(lg, f, a, r)
  if ARGV[a+6] == '-1' then
    local ok, room, now, n, limit, burst, iv, _, blocked, ahead, held = gcra(f, a)
    if r == tok then
      -- Counted: t is the instant the call left, and it was not blocked.
      return rated(true, true, now, n, limit, burst, iv, nil, ahead)
    end
    return rated(ok, room, now, n, limit, burst, iv, blocked, ahead, held)
  end
  if r == tok then
    -- Counted: the hash holds the count and the window it left (for a
    -- sliding call too); a counted call was not blocked.
    local e = NONE
    if f[3] then e = tonumber(f[3]) end
    return tonumber(f[1]), tonumber(f[2]), e, NONE, NONE, 1
  end
  -- Denied: the same hash, log and arguments decide the same way again
  -- (the penalty it set blocks it, the empty window it opened is not
  -- current, the log is as it was).
  if ARGV[a+6] ~= '0' then
    local ok, _, _, _, _, blocked, used, wb, we, free = slide(lg, f, a)
    return used, wb or NONE, we or NONE, blocked or NONE, free or NONE, ok and 1 or 0
  end
  local ok, _, _, _, _, _, _, blocked, used, wb, we = decide(f, a)
  return used, wb, we or NONE, blocked or NONE, NONE, ok and 1 or 0
end

local calls = #KEYS / 2
if repeated then
  -- Every call answers from its hash, or is lost. A hash that a later
  -- call of this script wrote holds that call's outcome, not this one's.
  local last, out = {}, {}
  for i = 1, calls do last[KEYS[2 * i - 1]] = i end
  for i = 1, calls do
    local h, o = KEYS[2 * i - 1], 6 * (i - 1)
    local f = redis.pcall('HMGET', h, 'c', 'b', 'e', 'x', 's', 'l', 'r', 't')
    if f.err and ARGV[7 * i + 2] == '-1' then
      -- A smooth key's string reads as its hash {t, c, b, e, r}.
      local t, c, r = stringed(h, f)
      if t ~= nil then
        local ts = string.format('%d', t)
        f = {string.format('%d', c), '0', ts, false, false, false, r, ts}
      end
    end
    if last[h] == i and not f.err and (f[7] == tok or f[7] == denied) then
      out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = again(KEYS[2 * i], f, 7 * i - 4, f[7])
    else
      out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = 0, NONE, NONE, NONE, NONE, -2
    end
  end
  return out
end

if calls == 1 then
  return {allow(KEYS[1], KEYS[2], f1 or redis.call('HMGET', KEYS[1], 'c', 'b', 'e', 'x', 's', 'l', 'r', 't'), 3)}
end

-- Many calls, one after another, each reading its hash as the one before
-- left it. A key that is no hash fails its call alone (verdict -1).
local out = {}
for i = 1, calls do
  local h, o = KEYS[2 * i - 1], 6 * (i - 1)
  local a = 7 * i - 4
  local fine, used, wb, we, blocked, free, ok = false
  local f
  if ARGV[a + 6] == '-1' then
    local t, tc, r
    used, we, t, tc, r = instant(h, a, tok, GRACE)
    if type(used) == 'table' then
      f = used -- failed alone
    elseif used then
      fine, wb, blocked, free, ok = true, NONE, NONE, NONE, 1
      f = {}
    elseif we then
      unstring(h, t, tc, r)
    end
  end
  if not fine and not f then f = fields(h) end
  if not fine and not f.err then
    fine, used, wb, we, blocked, free, ok = true, count(h, f, 7 * i - 4)
    if used == nil then
      fine, used, wb, we, blocked, free, ok = pcall(allow, h, KEYS[2 * i], f, 7 * i - 4)
    elseif type(used) == 'table' then
      fine = false
    end
  end
  if fine then
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = used, wb, we, blocked, free, ok
  else
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = 0, NONE, NONE, NONE, NONE, -1
  end
end
return out
