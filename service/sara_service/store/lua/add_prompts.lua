-- Register prompts; an id seen before is left as it is (idempotent on id).
-- KEYS[1] = prompts hash   KEYS[2] = posteriors hash
-- KEYS[3] = prompts_off hash   KEYS[4] = prompts_retired hash (a deleted id added again is new)
-- KEYS[5] = wake stream: new prompts let waiting leases open groups
-- ARGV[1] = initial_posterior (JSON)   ARGV[2..] = prompt_id, prompt_json, ... (a pair per prompt)
-- returns {number of prompts that were new, {ids already stored with another encoding}}; the
--         caller compares those decoded (the same content may be encoded in another key order)
local created, differs = 0, {}
for i = 2, #ARGV, 2 do
  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then
    redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[1])
    redis.call('HDEL', KEYS[3], ARGV[i])
    redis.call('HDEL', KEYS[4], ARGV[i])
    created = created + 1
  elseif redis.call('HGET', KEYS[1], ARGV[i]) ~= ARGV[i + 1] then
    differs[#differs + 1] = ARGV[i]
  end
end
if created > 0 then wake(KEYS[5], 'lease') end
return {created, differs}
