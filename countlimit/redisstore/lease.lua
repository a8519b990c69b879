-- countlimit: one atomic step on the leases of a Concurrent check.
-- The twin of memstore's leaseOp and pgstore's lease statements; the
-- contract is driver.Store's, written as code in model.Apply (internal/testkit/model), to which
-- redisstore's TestModel holds this script.
--
-- KEYS[1] the counter hash (see apply.lua: only its fields d, the denied
-- tally, and x, blocked until, are read or written here), KEYS[2] the lease
-- set: a sorted set of lease tokens scored by expiry (µs).
-- ARGV: op ('acquire' | 'peek' | 'release' | 'extend'), now (µs), token
-- ('' for peek), limit, ttl (µs), block (µs; 0 = none).
-- Returns apply.lua's reply for one check: {used, begin, end,
-- blocked_until, NONE}, then the verdict (1 or 0). Begin and end are the
-- earliest and the latest expiry of a live lease.
--
-- No reply is kept for a repeat after a lost reply (see redisstore's
-- package doc): the token makes each op idempotent, without apply.lua's GET,
-- SET and short-lived key per call. A repeated acquire finds its token and
-- answers allowed without taking a second slot (ZADD of the same token
-- could not take one either); a repeated extend sets the same expiry; a
-- repeated release frees nothing more (it answers "was not live", which
-- Lease.Release ignores). Only a lease that is gone before the repeat runs
-- (a caller whose clock is ttl past this call's now dropped it: possible for
-- ttl under the 10 s a repeat may come after) makes the repeat a new acquire
-- at the same now, allowed or denied as the slots then stand.
local op = ARGV[1]
local now = tonumber(ARGV[2])
local token = ARGV[3]
local limit = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local block = tonumber(ARGV[6])
local h, z = KEYS[1], KEYS[2]

local NONE = -9007199254740992 -- -2^53: no time (every valid one is larger)

-- s writes x, a whole number of µs (or a count) within ±2^53, exactly:
-- '%d' (a C long) writes it for about 3 000 fewer instructions than '%.0f'
-- (a double's digits), per callgrind on fast.lua's smooth path.
local function s(x) return string.format('%d', x) end

-- ms returns the milliseconds from now to at, at least 1, and the grace
-- every TTL carries (GRACE, which Go puts before this script): a PEXPIRE.
local function ms(at)
  local d = math.ceil((at - now) / 1000)
  if d < 1 then d = 1 end
  return d + GRACE
end

local function latest()
  local top = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
  if top[2] then return tonumber(top[2]) end
  return nil
end

-- A smooth key's string (smoothkey.lua, which Go puts before this script)
-- holds no penalty; a denial makes it its hash first (st, sc, sr).
local x, st, sc, sr = redis.pcall('HGET', h, 'x'), nil, nil, nil
if type(x) == 'table' then
  st, sc, sr = stringed(h, x)
  if st == nil then return redis.error_reply(x.err) end
  x = nil
end
x = tonumber(x)
local blocked = nil
if x ~= nil and x > now then blocked = x end

local at = redis.call('ZSCORE', z, token)
local live = at ~= false and tonumber(at) > now
if op ~= 'peek' then
  -- Every write drops the expired leases.
  redis.call('ZREMRANGEBYSCORE', z, '-inf', s(now))
end

local allowed = false
local moved = false -- a lease was added, moved or removed
local used = 0 -- the live leases, once the op is done
if op == 'peek' then
  used = redis.call('ZCOUNT', z, '(' .. s(now), '+inf')
  allowed = blocked == nil and 1 <= limit - used
elseif op == 'acquire' then
  if live then
    -- A repeat of an acquire that took its slot, whose reply was lost.
    allowed = true
  elseif blocked == nil and 1 <= limit - redis.call('ZCARD', z) then
    allowed = true
    redis.call('ZADD', z, s(now + ttl), token)
    moved = true
  else
    -- A denial, counted as apply.lua counts one: tally it, set the
    -- penalty, and keep the hash at least until the penalty and the leases
    -- it waited on are over. Its TTL is never shortened: a hash with a
    -- window (field b) already lives as long as its window and old penalty,
    -- and a lifetime count (b without e) keeps none.
    if st ~= nil then unstring(h, st, sc, sr) end
    local f = redis.call('HMGET', h, 'b', 'e')
    redis.call('HINCRBY', h, 'd', 1)
    if blocked == nil and block > 0 then
      blocked = now + block
      redis.call('HSET', h, 'x', s(blocked))
    end
    local keep = ms(math.max(blocked or now, latest() or now))
    local cur = redis.call('PTTL', h)
    local lifetime = f[1] and not f[2]
    if (cur == -1 and not lifetime) or (cur >= 0 and cur < keep) then
      redis.call('PEXPIRE', h, keep)
    end
  end
elseif op == 'release' then
  allowed = live
  if at then
    redis.call('ZREM', z, token)
    moved = true
  end
elseif op == 'extend' then
  allowed = live
  if live then
    redis.call('ZADD', z, 'XX', s(now + ttl), token)
    moved = true
  end
end

local first, last = NONE, NONE
if op == 'peek' then
  if used > 0 then
    first = tonumber(redis.call('ZRANGEBYSCORE', z, '(' .. s(now), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)[2])
  end
else
  -- A write has dropped the expired leases: every one left is live.
  used = redis.call('ZCARD', z)
  if used > 0 then first = tonumber(redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')[2]) end
end
if used > 0 then last = latest() end
-- The set expires with its latest lease (an empty one is gone already).
if moved and used > 0 then redis.call('PEXPIRE', z, ms(last)) end
return {used, first, last, blocked or NONE, NONE, allowed and 1 or 0}
