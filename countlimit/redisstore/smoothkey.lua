-- countlimit: a smooth key kept as a string. Go puts this before
-- apply.lua and lease.lua, and into fast.lua below its commonest smooth
-- call, each of which reads and writes the counter hash of a (use type,
-- id).
--
-- A smooth call that is allowed on a key that holds nothing, or only a
-- smooth instant, keeps it as a string, "<t>:<c>:<r>": the instant (µs,
-- in hexadecimal: 14 digits where decimal takes 16, which keeps the
-- string within the allocation "<t>:<r>" took before it held a count),
-- the units not yet drained when it was written (the count a rule of
-- another kind carries over, see apply.lua) and the record (the token of
-- the script that wrote it; "<t>:<c>" alone with the records off), with
-- the TTL the hash would have (until it is drained). That is one GET and
-- one SET ... PX a call, where a hash takes an HMGET, an HSET and a
-- PEXPIRE: a quarter of Redis's instructions for the call
-- (docs/benchmarks.md, "A smooth key kept as a string"). Only fast.lua
-- writes it (instant). It stands for the hash {t = <t>, c = <c>, b = 0, e
-- = <t>, r = <r>}, a smooth key's window [0, t) and its count, and reads
-- as that hash everywhere; every other write (a denial, a penalty,
-- another kind counted, a refund, a lease's denial) first makes it that
-- hash with the same TTL (unstring). A string that is not of this form is
-- not ours (a hand edit): it fails as a string key always has
-- (WRONGTYPE), and nothing is written.

-- parsed returns the instant, the count and the record a string v holds:
-- nil for one that is not a smooth key's.
local function parsed(v)
  local t, c, r = string.match(v, '^(%x+):(%d+):?(%d*)$')
  if t == nil then return nil end
  return tonumber(t, 16), tonumber(c), r
end

-- stringed returns the instant, the count and the record of h, a smooth
-- key's string, for err, a read of h as a hash that failed: nil when err
-- is not WRONGTYPE or h is not such a string.
local function stringed(h, err)
  if string.sub(err.err, 1, 9) ~= 'WRONGTYPE' then return nil end
  local v = redis.pcall('GET', h)
  if type(v) ~= 'string' then return nil end
  return parsed(v)
end

-- unstring makes h, a smooth key's string of instant t, count c and
-- record r, the hash it stands for, with the same TTL. Its first write,
-- DEL, cannot be refused for memory, and a script that has written is not
-- refused later ones: no half of it is left.
local function unstring(h, t, c, r)
  local ttl = redis.call('PTTL', h)
  redis.call('DEL', h)
  local ts = string.format('%d', t)
  if r ~= '' then
    redis.call('HSET', h, 't', ts, 'c', string.format('%d', c), 'b', '0', 'e', ts, 'r', r)
  else
    redis.call('HSET', h, 't', ts, 'c', string.format('%d', c), 'b', '0', 'e', ts)
  end
  if ttl > 0 then redis.call('PEXPIRE', h, ttl) end
end
