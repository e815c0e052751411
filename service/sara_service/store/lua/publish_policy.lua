-- Publish a new policy version; versions only move forward.
-- KEYS[1] = policy hash
-- ARGV[1] = version (new)   ARGV[2] = checkpoint ('' = none)   ARGV[3] = now
-- returns {'ok', version} | {'stale', current version}
local current = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if tonumber(ARGV[1]) <= current then return {'stale', current} end
redis.call('HSET', KEYS[1], 'version', ARGV[1], 'checkpoint', ARGV[2], 'published_at', ARGV[3])
return {'ok', tonumber(ARGV[1])}
