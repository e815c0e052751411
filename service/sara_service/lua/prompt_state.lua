-- Disable, enable or delete one prompt. A disabled or deleted prompt is never opened again
-- (open_groups.lua reads KEYS[3]); its groups in flight finish normally.
-- KEYS[1] = prompts hash   KEYS[2] = posteriors hash   KEYS[3] = prompts_off hash
-- KEYS[4] = prompts_retired hash
-- ARGV[1] = action: 'disable' | 'enable' | 'delete'   ARGV[2] = prompt_id
-- returns 'unknown' (no such prompt) or the prompt's state now: 'disabled' | 'enabled' | 'deleted'
local action, pid = ARGV[1], ARGV[2]
local content = redis.call('HGET', KEYS[1], pid)
if not content then return 'unknown' end
if action == 'disable' then
  redis.call('HSET', KEYS[3], pid, 'disabled')
  return 'disabled'
elseif action == 'enable' then
  redis.call('HDEL', KEYS[3], pid)
  return 'enabled'
end
-- delete: out of the pool and the listing; content kept aside for groups still in flight
redis.call('HDEL', KEYS[1], pid)
redis.call('HDEL', KEYS[2], pid)
redis.call('HSET', KEYS[4], pid, content)
redis.call('HSET', KEYS[3], pid, 'deleted')
return 'deleted'
