-- Disable, enable or delete one prompt. A disabled or deleted prompt is never opened again
-- (open_groups.lua reads KEYS[3]); its groups in flight finish normally.
-- KEYS[1] = prompts hash   KEYS[2] = posteriors hash   KEYS[3] = prompts_off hash
-- KEYS[4] = prompts_retired hash
-- ARGV[1] = action: 'disable' | 'enable' | 'delete'   ARGV[2] = prompt_id
-- returns 'unknown' (no such prompt) or the prompt's state now: 'disabled' | 'enabled' | 'deleted'
local PROMPTS, POSTERIORS, PROMPTS_OFF, PROMPTS_RETIRED = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local action, pid = ARGV[1], ARGV[2]
local content = redis.call('HGET', PROMPTS, pid)
if not content then return 'unknown' end
if action == 'disable' then
  redis.call('HSET', PROMPTS_OFF, pid, 'disabled')
  return 'disabled'
elseif action == 'enable' then
  redis.call('HDEL', PROMPTS_OFF, pid)
  return 'enabled'
end
-- delete: out of the pool and the listing; content kept aside for groups still in flight
redis.call('HDEL', PROMPTS, pid)
redis.call('HDEL', POSTERIORS, pid)
redis.call('HSET', PROMPTS_RETIRED, pid, content)
redis.call('HSET', PROMPTS_OFF, pid, 'deleted')
return 'deleted'
