-- Confirm a batch was consumed: it will not be redelivered, and its groups may be collected.
-- KEYS[1] = batch hash   KEYS[2] = unacked zset   KEYS[3] = stats hash
-- KEYS[4] = group_states hash   KEYS[5] = gc zset
-- ARGV[1] = now   ARGV[2] = batch_id   ARGV[3] = retention_s
-- returns 'unknown' | 'already' | 'ok'
local BATCH, UNACKED, STATS, GROUP_STATES, GC = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now, batch_id, retention = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local state = redis.call('HGET', BATCH, 'state')
if not state then return 'unknown' end
if state == 'acked' then return 'already' end
redis.call('ZREM', UNACKED, batch_id)
redis.call('HSET', BATCH, 'state', 'acked', 'acked_at', ARGV[1])
redis.call('EXPIRE', BATCH, math.ceil(retention))
local n, states, gc = 0, {}, {}
for gid in string.gmatch(redis.call('HGET', BATCH, 'groups'), '[^,]+') do
  states[#states + 1] = gid; states[#states + 1] = 'acked'
  gc[#gc + 1] = now + retention; gc[#gc + 1] = gid
  n = n + 1
end
call_chunked('HSET', GROUP_STATES, states)
call_chunked('ZADD', GC, gc)
redis.call('HINCRBY', STATS, 'batches_acked', 1)
redis.call('HINCRBY', STATS, 'groups_acked', n)
return 'ok'
