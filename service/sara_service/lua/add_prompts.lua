-- Register prompts; an id seen before is left as it is (idempotent on id).
-- KEYS[1] = prompts hash   KEYS[2] = posteriors hash
-- ARGV[1] = initial posterior JSON   ARGV[2..] = prompt id, prompt JSON, prompt id, prompt JSON, ...
-- returns the number of prompts that were new
local created = 0
for i = 2, #ARGV, 2 do
  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then
    redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[1])
    created = created + 1
  end
end
return created
