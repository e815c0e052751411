-- Put rollouts whose lease ran out back at the front of the queue.
-- KEYS[1] = inflight zset   KEYS[2] = slots hash   KEYS[3] = pending list   KEYS[4] = stats hash
-- KEYS[5] = wake stream (long polls of every replica wait on it)
-- ARGV[1] = now             ARGV[2] = limit (most rollouts to handle in this call)
-- returns the number of rollouts issued again
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #due == 0 then return 0 end
redis.call('ZREM', KEYS[1], unpack(due))
local states = redis.call('HMGET', KEYS[2], unpack(due))
local slots, pushes = {}, {}
-- walk backwards so that, pushed onto the front in this order, they keep their order
for i = #due, 1, -1 do
  local state = states[i]
  if state and string.sub(state, 1, 2) == 'l|' then
    slots[#slots + 1] = due[i]
    slots[#slots + 1] = 'p'
    pushes[#pushes + 1] = due[i]
  end
end
if #pushes == 0 then return 0 end
redis.call('HSET', KEYS[2], unpack(slots))
redis.call('LPUSH', KEYS[3], unpack(pushes))
redis.call('HINCRBY', KEYS[4], 'rollouts_reissued', #pushes)
redis.call('XADD', KEYS[5], 'MAXLEN', '~', 64, '*', 'w', 'lease')
return #pushes
