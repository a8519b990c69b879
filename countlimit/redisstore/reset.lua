-- countlimit: forget an id's counters, logs and penalties. KEYS: the
-- counters and logs, then the reply key (see apply.lua); ARGV[1]: the reply
-- TTL (ms); ARGV[2]: the attempt (see apply.lua), unread here: by it Go
-- tells a reset that a Cluster slot in migration refused from one that may
-- have run. A repeat of a reset already done changes nothing, so that a
-- count made since is not forgotten.
local reply = KEYS[#KEYS]
if redis.call('EXISTS', reply) == 1 then return 0 end
redis.call('DEL', unpack(KEYS, 1, #KEYS - 1))
redis.call('SET', reply, '1', 'PX', ARGV[1])
return 1
