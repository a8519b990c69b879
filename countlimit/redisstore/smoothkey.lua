-- countlimit: a smooth key kept as a string. Go puts this before
-- apply.lua and lease.lua, and into fast.lua below its commonest smooth
-- call, each of which reads and writes the counter hash of a (use type,
-- id).
--
-- A smooth call that is allowed on a key that holds nothing, or only a
-- smooth instant, keeps it as a string, "<t>:<r>": the instant (µs) and
-- the record (the token of the script that wrote it; "<t>" alone with the
-- records off), with the TTL the hash would have (until it is drained).
-- That is one GET and one SET ... PX a call, where a hash takes an HMGET,
-- an HSET and a PEXPIRE: a quarter of Redis's instructions for the call
-- (docs/benchmarks.md, "A smooth key kept as a string"). Only fast.lua
-- writes it (instant). It stands for the hash {t = <t>, r = <r>}, and
-- reads as that hash everywhere; every other write (a denial, a penalty,
-- another kind counted, a refund, a lease's denial) first makes it that
-- hash with the same TTL (unstring). A string that is not of this form is
-- not ours (a hand edit): it fails as a string key always has
-- (WRONGTYPE), and nothing is written.

-- parsed returns the instant and the record a string v holds: nil for one
-- that is not a smooth key's.
local function parsed(v)
  local t, r = string.match(v, '^(-?%d+):?(%d*)$')
  if t == nil then return nil end
  return tonumber(t), r
end

-- stringed returns the instant and the record of h, a smooth key's string,
-- for err, a read of h as a hash that failed: nil when err is not
-- WRONGTYPE or h is not such a string.
local function stringed(h, err)
  if string.sub(err.err, 1, 9) ~= 'WRONGTYPE' then return nil end
  local v = redis.pcall('GET', h)
  if type(v) ~= 'string' then return nil end
  return parsed(v)
end

-- unstring makes h, a smooth key's string of instant t and record r, the
-- hash it stands for, with the same TTL. Its first write, DEL, cannot be
-- refused for memory, and a script that has written is not refused later
-- ones: no half of it is left.
local function unstring(h, t, r)
  local ttl = redis.call('PTTL', h)
  redis.call('DEL', h)
  if r ~= '' then
    redis.call('HSET', h, 't', string.format('%d', t), 'r', r)
  else
    redis.call('HSET', h, 't', string.format('%d', t))
  end
  if ttl > 0 then redis.call('PEXPIRE', h, ttl) end
end

