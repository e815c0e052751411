-- Extend a lease: every rollout it still holds gets the new expiry.
-- KEYS[1] = lease hash   KEYS[2] = lease_rollouts set   KEYS[3] = inflight zset
-- KEYS[4] = slots hash   KEYS[5] = cancels hash         KEYS[6] = workers zset
-- ARGV[1] = now   ARGV[2] = worker_id   ARGV[3] = lease_id   ARGV[4] = expires_at (new)
-- ARGV[5] = key_ttl_s (the lease keys must outlive every extension)
-- returns {'unknown'} (no such lease, or it holds no rollout any more: all answered or expired
--         and issued again) | {'not_yours', owner} | {'ok', cancel ids (space separated)}
local owner = redis.call('HGET', KEYS[1], 'worker')
if not owner then return {'unknown'} end
if owner ~= ARGV[2] then return {'not_yours', owner} end
local held = 'l|' .. ARGV[3] .. '|' .. ARGV[2]
local still_held = 0
for _, rid in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if redis.call('HGET', KEYS[4], rid) == held then
    redis.call('ZADD', KEYS[3], ARGV[4], rid)
    still_held = still_held + 1
  else
    redis.call('SREM', KEYS[2], rid)
  end
end
if still_held == 0 then return {'unknown'} end
redis.call('HSET', KEYS[1], 'expires_at', ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[5])
redis.call('ZADD', KEYS[6], ARGV[1], ARGV[2])
local cancel = redis.call('HGET', KEYS[5], ARGV[2]) or ''
redis.call('HDEL', KEYS[5], ARGV[2])
return {'ok', cancel}
