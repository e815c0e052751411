-- Start a new epoch: queue every prompt in a fresh shuffled order, once, even with many replicas.
-- KEYS[1] = epoch_queue list   KEYS[2] = epoch counter
-- ARGV[1] = seen_epoch (the epoch the caller saw)   ARGV[2..] = prompt_id, ... (in their new order)
-- returns the epoch now in force (the caller's + 1 when this call refilled)
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if current ~= tonumber(ARGV[1]) or redis.call('LLEN', KEYS[1]) > 0 then return current end
for i = 2, #ARGV, 5000 do
  redis.call('RPUSH', KEYS[1], unpack(ARGV, i, math.min(i + 4999, #ARGV)))
end
return redis.call('INCR', KEYS[2])
