-- Forgetting a worker, put in front of the scripts that do it (redis_format.ScriptSpec.library):
-- prune_workers.lua (workers unseen for long) and forget_worker.lua (a worker that stopped).
-- forget(workers, info, cancels, wid) removes the worker from the workers zset, its fields from
-- the worker_info hash (redis_format.WORKER_INFO_FIELDS) and its cancel list; a worker that
-- comes back later simply starts afresh.
local function forget(workers, info, cancels, wid)
  redis.call('HDEL', info, wid .. '|completed', wid .. '|tokens', wid .. '|policy_version',
    wid .. '|leases', wid .. '|first_seen', wid .. '|backend')
  redis.call('HDEL', cancels, wid)
  return redis.call('ZREM', workers, wid)
end
