-- Forget a worker that stopped, at once (lua/_workers.lua's forget): it no longer shows in /stats.
-- KEYS[1] = workers zset   KEYS[2] = worker_info hash   KEYS[3] = cancels hash
-- ARGV[1] = worker_id
-- returns 1 when the worker was known, else 0
return forget(KEYS[1], KEYS[2], KEYS[3], ARGV[1])
