-- Put rollouts whose lease ran out back at the front of the queue.
-- KEYS[1] = inflight zset   KEYS[2] = slots hash   KEYS[3] = pending list   KEYS[4] = stats hash
-- ARGV[1] = now             ARGV[2] = limit (most rollouts to handle in this call)
-- returns the number of rollouts issued again
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local requeued = 0
-- walk backwards so that, pushed onto the front one by one, they keep their order
for i = #due, 1, -1 do
  local rid = due[i]
  redis.call('ZREM', KEYS[1], rid)
  local state = redis.call('HGET', KEYS[2], rid)
  if state and string.sub(state, 1, 2) == 'l|' then
    redis.call('HSET', KEYS[2], rid, 'p')
    redis.call('LPUSH', KEYS[3], rid)
    requeued = requeued + 1
  end
end
if requeued > 0 then redis.call('HINCRBY', KEYS[4], 'rollouts_reissued', requeued) end
return requeued
