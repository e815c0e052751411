-- Put rollouts whose lease ran out back at the front of the queue.
-- KEYS[1] = inflight zset   KEYS[2] = slots hash   KEYS[3] = pending list   KEYS[4] = stats hash
-- KEYS[5] = wake stream (long polls of every replica wait on it)
-- ARGV[1] = now             ARGV[2] = limit (most rollouts to handle in this call)
-- returns the number of rollouts issued again
local requeued = requeue_expired(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], tonumber(ARGV[2]))
if requeued > 0 then wake(KEYS[5], 'lease') end
return requeued
