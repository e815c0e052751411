-- Lease up to N pending rollouts to one worker, and hand it its cancel list.
-- KEYS[1] = pending list        KEYS[2] = slots hash        KEYS[3] = inflight zset
-- KEYS[4] = stats hash          KEYS[5] = cancels hash      KEYS[6] = lease hash
-- KEYS[7] = lease_rollouts set  KEYS[8] = workers zset      KEYS[9] = group_prompt hash
-- KEYS[10] = prompts hash       KEYS[11] = worker_info hash   KEYS[12] = policy hash
-- KEYS[13] = run_state string  KEYS[14] = prompts_retired hash (content of deleted prompts)
-- ARGV[1] = now   ARGV[2] = worker_id   ARGV[3] = lease_id   ARGV[4] = max_rollouts
-- ARGV[5] = expires_at (of the lease)   ARGV[6] = key_ttl_s   ARGV[7] = backend ('' = unknown)
-- returns {{rollout_id, prompt_id, prompt_json, ...}, cancel ids (space separated)}
local wid, lid, want = ARGV[2], ARGV[3], tonumber(ARGV[4])
local held = 'l|' .. lid .. '|' .. wid
local out = {}
local got = 0
-- paused: nothing is leased (pending rollouts wait), but the worker is still seen and gets its
-- cancels; checked here, in the same script, so no lease slips past a pause
if redis.call('GET', KEYS[13]) == 'paused' then want = 0 end
while got < want do
  local popped = redis.call('LPOP', KEYS[1], want - got)
  if not popped then break end
  for _, rid in ipairs(popped) do
    -- cancelled or already answered slots stay in the queue until popped: skip them here
    if redis.call('HGET', KEYS[2], rid) == 'p' then
      redis.call('HSET', KEYS[2], rid, held)
      redis.call('ZADD', KEYS[3], ARGV[5], rid)
      redis.call('SADD', KEYS[7], rid)
      local gid = string.match(rid, '^(.*):%d+$')
      local pid = redis.call('HGET', KEYS[9], gid)
      out[#out + 1] = rid
      out[#out + 1] = pid
      -- a group in flight still runs after its prompt was deleted: its content is retired
      out[#out + 1] = redis.call('HGET', KEYS[10], pid) or redis.call('HGET', KEYS[14], pid)
      got = got + 1
    end
  end
end
if got > 0 then
  -- a lease topped up by a second call in the same request is still one lease
  if redis.call('EXISTS', KEYS[6]) == 0 then
    redis.call('HINCRBY', KEYS[4], 'leases_granted', 1)
    redis.call('HINCRBY', KEYS[11], wid .. '|leases', 1)
    -- a result that does not say which version made it takes the one its lease was granted under
    redis.call('HSET', KEYS[6], 'policy_version', redis.call('HGET', KEYS[12], 'version') or '0')
  end
  redis.call('HSET', KEYS[6], 'worker', wid, 'expires_at', ARGV[5])
  redis.call('EXPIRE', KEYS[6], ARGV[6])
  redis.call('EXPIRE', KEYS[7], ARGV[6])
  redis.call('HSETNX', KEYS[11], wid .. '|first_seen', ARGV[1])
end
redis.call('ZADD', KEYS[8], ARGV[1], wid)
if ARGV[7] ~= '' then redis.call('HSET', KEYS[11], wid .. '|backend', ARGV[7]) end
local cancel = redis.call('HGET', KEYS[5], wid) or ''
redis.call('HDEL', KEYS[5], wid)
return {out, cancel}
