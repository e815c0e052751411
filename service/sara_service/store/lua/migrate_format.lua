-- Move an unversioned namespace's run-wide keys to format 1 (store/migrate.py runs it once, under
-- its lock, before the per-prompt and per-group repairs and before writing the format version).
-- KEYS[1] = stats hash   KEYS[2] = policy hash   KEYS[3] = open_groups zset
-- KEYS[4] = open_yield string
-- ARGV[1] = renamed: JSON object, old counter name -> new name
-- ARGV[2] = max_int: the largest integer a stored version may hold (2**53 - 1)
-- returns {counters renamed, 1 if the policy version was reset to 0 else 0,
--          1 if the open groups' yield total was written else 0}
-- Each step is idempotent: run again, it finds nothing left to do.
local STATS, POLICY, OPEN, YIELD = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local renamed, max_int = cjson.decode(ARGV[1]), tonumber(ARGV[2])

-- counters an unversioned namespace kept under an earlier name: added to the new one
local moved = 0
for old, new in pairs(renamed) do
  local value = redis.call('HGET', STATS, old)
  if value then
    redis.call('HINCRBY', STATS, new, tonumber(value))
    redis.call('HDEL', STATS, old)
    moved = moved + 1
  end
end

-- a policy version past 2**53, inf or NaN is one no publish could pass: start again from 0
local reset = 0
local version = redis.call('HGET', POLICY, 'version')
if version then
  local v = tonumber(version)
  if not v or not (v <= max_int) then
    redis.call('HSET', POLICY, 'version', 0)
    reset = 1
  end
end

-- the open groups' expected yield as one running total (the scripts now only keep it up)
local written = 0
if not redis.call('GET', YIELD) then
  local scores = redis.call('ZRANGE', OPEN, 0, -1, 'WITHSCORES')
  local total = 0
  for i = 2, #scores, 2 do total = total + yield_units(scores[i]) end
  redis.call('SET', YIELD, total)
  written = 1
end
return {moved, reset, written}
