-- Start a new epoch: queue every prompt in a fresh shuffled order, once, even with many replicas.
-- KEYS[1] = epoch_queue list   KEYS[2] = epoch counter
-- ARGV[1] = seen_epoch (the epoch the caller saw)
-- ARGV[2] = prompt_ids: the ids in their new order, separated by single spaces (ids hold no
--           space): one argument, not one per prompt, for the client to pack
-- returns the epoch now in force (the caller's + 1 when this call refilled)
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if current ~= tonumber(ARGV[1]) or redis.call('LLEN', KEYS[1]) > 0 then return current end
local ids = {}
for id in string.gmatch(ARGV[2], '%S+') do ids[#ids + 1] = id end
call_chunked('RPUSH', KEYS[1], ids)
return redis.call('INCR', KEYS[2])
