-- Extends the lease KEYS[1] by ARGV[2] ms while it is still ARGV[1]'s.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
