-- countlimit: forget an id's counters, logs and penalties (KEYS).
return redis.call('DEL', unpack(KEYS))
