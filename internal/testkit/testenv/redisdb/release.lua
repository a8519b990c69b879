-- Deletes the lease KEYS[1] while it is still ARGV[1]'s.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
