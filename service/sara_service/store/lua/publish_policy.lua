-- Publish a new policy version; versions only move forward.
-- KEYS[1] = policy hash
-- ARGV[1] = version (new)   ARGV[2] = checkpoint ('' = none)   ARGV[3] = now
-- returns {'ok', version} | {'stale', current version}
-- A stored version past 2**53 (or inf, NaN: an older release let 10**400 in) is one no publish
-- could ever pass any more; the next publish replaces it.
local MAX_STORED_INT = 9007199254740991
local current = tonumber(redis.call('HGET', KEYS[1], 'version') or '0') or 0
if not (current <= MAX_STORED_INT) then current = -1 end
if tonumber(ARGV[1]) <= current then return {'stale', current} end
redis.call('HSET', KEYS[1], 'version', ARGV[1], 'checkpoint', ARGV[2], 'published_at', ARGV[3])
return {'ok', tonumber(ARGV[1])}
