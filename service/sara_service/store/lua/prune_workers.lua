-- Forget workers not seen for a long time (lua/_workers.lua's forget, each).
-- KEYS[1] = workers zset   KEYS[2] = worker_info hash   KEYS[3] = cancels hash
-- ARGV[1] = seen_before (forget workers last seen before it)   ARGV[2] = limit (per call)
-- returns the number of workers forgotten
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[1], 'LIMIT', 0,
  tonumber(ARGV[2]))
for _, wid in ipairs(gone) do
  forget(KEYS[1], KEYS[2], KEYS[3], wid)
end
return #gone
