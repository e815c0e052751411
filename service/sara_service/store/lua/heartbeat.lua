-- Extend a lease: every rollout it still holds gets the new expiry.
-- KEYS[1] = lease hash   KEYS[2] = lease_rollouts set   KEYS[3] = inflight zset
-- KEYS[4] = slots hash   KEYS[5] = cancels hash         KEYS[6] = workers zset
-- ARGV[1] = now   ARGV[2] = worker_id   ARGV[3] = lease_id   ARGV[4] = expires_at (new)
-- ARGV[5] = key_ttl_s (the lease keys must outlive every extension)
-- returns {'unknown'} (no such lease, or it holds no rollout any more: all answered or expired
--         and issued again) | {'not_yours', owner} | {'ok', cancel ids (space separated)}
local LEASE, LEASE_ROLLOUTS, INFLIGHT, SLOTS, CANCELS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local WORKERS = KEYS[6]
local now, wid, lid, expires_at, key_ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local owner = redis.call('HGET', LEASE, 'worker')
if not owner then return {'unknown'} end
if owner ~= wid then return {'not_yours', owner} end
local held = 'l|' .. lid .. '|' .. wid
local still_held = 0
for _, rid in ipairs(redis.call('SMEMBERS', LEASE_ROLLOUTS)) do
  if redis.call('HGET', SLOTS, rid) == held then
    redis.call('ZADD', INFLIGHT, expires_at, rid)
    still_held = still_held + 1
  else
    redis.call('SREM', LEASE_ROLLOUTS, rid)
  end
end
if still_held == 0 then return {'unknown'} end
redis.call('HSET', LEASE, 'expires_at', expires_at)
redis.call('EXPIRE', LEASE, key_ttl)
redis.call('EXPIRE', LEASE_ROLLOUTS, key_ttl)
redis.call('ZADD', WORKERS, now, wid)
local cancel = redis.call('HGET', CANCELS, wid) or ''
redis.call('HDEL', CANCELS, wid)
return {'ok', cancel}
