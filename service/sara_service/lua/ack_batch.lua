-- Confirm a batch was consumed: it will not be redelivered, and its groups may be collected.
-- KEYS[1] = batch hash   KEYS[2] = unacked zset   KEYS[3] = stats hash
-- KEYS[4] = group_states hash   KEYS[5] = gc zset
-- ARGV[1] = now   ARGV[2] = batch_id   ARGV[3] = retention_s
-- returns 'unknown' | 'already' | 'ok'
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return 'unknown' end
if state == 'acked' then return 'already' end
local retention = tonumber(ARGV[3])
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('HSET', KEYS[1], 'state', 'acked', 'acked_at', ARGV[1])
redis.call('EXPIRE', KEYS[1], math.ceil(retention))
local n, states, gc = 0, {}, {}
local function flush()  -- a few thousand arguments per command: Lua's unpack stops near 8000
  if #states > 0 then
    redis.call('HSET', KEYS[4], unpack(states))
    redis.call('ZADD', KEYS[5], unpack(gc))
    states, gc = {}, {}
  end
end
for gid in string.gmatch(redis.call('HGET', KEYS[1], 'groups'), '[^,]+') do
  states[#states + 1] = gid; states[#states + 1] = 'acked'
  gc[#gc + 1] = tonumber(ARGV[1]) + retention; gc[#gc + 1] = gid
  n = n + 1
  if #states >= 3000 then flush() end
end
flush()
redis.call('HINCRBY', KEYS[3], 'batches_acked', 1)
redis.call('HINCRBY', KEYS[3], 'groups_acked', n)
return 'ok'
