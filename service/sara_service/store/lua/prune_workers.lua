-- Forget workers not seen for a long time: their place in the workers set, their info fields and
-- any cancel list left for them. A worker that comes back later simply starts afresh.
-- KEYS[1] = workers zset   KEYS[2] = worker_info hash   KEYS[3] = cancels hash
-- ARGV[1] = seen_before (forget workers last seen before it)   ARGV[2] = limit (per call)
-- returns the number of workers forgotten
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[1], 'LIMIT', 0,
  tonumber(ARGV[2]))
for _, wid in ipairs(gone) do
  redis.call('HDEL', KEYS[2], wid .. '|completed', wid .. '|tokens', wid .. '|policy_version',
    wid .. '|leases', wid .. '|first_seen', wid .. '|backend', wid .. '|stopped_at',
    wid .. '|occupancy', wid .. '|slots')
  redis.call('HDEL', KEYS[3], wid)
  redis.call('ZREM', KEYS[1], wid)
end
return #gone
