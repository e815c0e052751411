-- A worker that stops on request says so: /stats then shows it stopped at once (neither live
-- nor, later, stale), with what it did, until it is pruned like any worker unseen for long. A
-- worker seen again after it (a lease, a heartbeat, a report) is live again: stopped_at is
-- compared with its last seen time, so no other script needs to clear it.
-- KEYS[1] = workers zset   KEYS[2] = worker_info hash   KEYS[3] = cancels hash
-- ARGV[1] = now   ARGV[2] = worker_id
-- returns 1 when the worker was known, else 0
if not redis.call('ZSCORE', KEYS[1], ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[2] .. '|stopped_at', ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[2])
return 1
