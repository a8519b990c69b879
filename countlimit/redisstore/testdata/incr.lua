-- The simplest counter: the baseline countlimit's Allow is benchmarked against.
local n = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return n
