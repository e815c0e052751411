-- Hand the trainer a batch: an expired unacked batch first, else a new one from the ready groups.
-- KEYS[1] = ready list        KEYS[2] = unacked zset       KEYS[3] = stats hash
-- KEYS[4] = policy hash       KEYS[5] = batch hash (new)     KEYS[6] = batch_window hash
-- KEYS[7] = recent_batches list   KEYS[8] = group_states hash   KEYS[9] = gc zset
-- KEYS[10] = run_state string   KEYS[11] = open_groups zset
-- KEYS[12] = wake stream: a new batch takes groups off the ready list, which makes room for
--            new groups (lease long polls wait on it)
-- ARGV[1] = now   ARGV[2] = size (groups wanted)   ARGV[3] = ack_deadline   ARGV[4] = max_staleness
-- ARGV[5] = rollout_cap (per batch; 0 = none)   ARGV[6] = batch_id (new)   ARGV[7] = retention_s
-- returns {'redeliver', batch id} | {'none'} | {'new', batch id}
local now, want = tonumber(ARGV[1]), tonumber(ARGV[2])
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 1)
if #due > 0 then
  redis.call('ZADD', KEYS[2], ARGV[3], due[1])
  redis.call('HINCRBY', KEYS[3], 'batches_redelivered', 1)
  return {'redeliver', due[1]}
end

local window_fields = {'rollouts_completed', 'rollouts_cancelled', 'tokens_generated',
  'groups_committed', 'groups_abandoned', 'groups_dropped_saturated', 'groups_dropped_stale',
  'rollouts_not_spent_on_abandoned_groups'}
local current = redis.call('HMGET', KEYS[3], unpack(window_fields))
local before = redis.call('HMGET', KEYS[6], unpack(window_fields))
local function spent(i) return (tonumber(current[i]) or 0) - (tonumber(before[i]) or 0) end

local cap = tonumber(ARGV[5])
-- a draining run with no group left open delivers what is ready, however few: nothing more comes
local closing = (cap > 0 and spent(1) >= cap)
  or (redis.call('GET', KEYS[10]) == 'draining' and redis.call('ZCARD', KEYS[11]) == 0)
local version = tonumber(redis.call('HGET', KEYS[4], 'version') or '0')
local max_stale = tonumber(ARGV[4])
local picked, gids, rollouts = {}, {}, 0
local dropped, dropped_gc = {}, {}
while #picked < want do
  local entries = redis.call('LPOP', KEYS[1], want - #picked)
  if not entries then break end
  for _, entry in ipairs(entries) do
    local gid, minv, n = string.match(entry, '^(.*)|(.*)|(%d+)$')
    if minv ~= '' and version - tonumber(minv) > max_stale then
      dropped[#dropped + 1] = gid
      dropped[#dropped + 1] = 'dropped'
      dropped_gc[#dropped_gc + 1] = now + tonumber(ARGV[7])
      dropped_gc[#dropped_gc + 1] = gid
    else
      picked[#picked + 1] = entry
      gids[#gids + 1] = gid
      rollouts = rollouts + tonumber(n)
    end
  end
end
if #dropped > 0 then
  call_chunked('HSET', KEYS[8], dropped)
  call_chunked('ZADD', KEYS[9], dropped_gc)
  redis.call('HINCRBY', KEYS[3], 'groups_dropped_stale', #dropped_gc / 2)
end
if #picked == 0 or (#picked < want and not closing) then
  -- back at the front, in their order
  local back = {}
  for i = #picked, 1, -1 do back[#back + 1] = picked[i] end
  call_chunked('LPUSH', KEYS[1], back)
  return {'none'}
end

-- counters re-read: stale drops above belong to this batch's window
current = redis.call('HMGET', KEYS[3], unpack(window_fields))
local stats = {rollouts_spent = spent(1), rollouts_cancelled = spent(2), tokens_spent = spent(3),
  groups_committed = spent(4), groups_abandoned = spent(5), groups_dropped = spent(6) + spent(7),
  rollouts_not_spent_on_abandoned_groups = spent(8), ended_early = #picked < want}
local snapshot = {}
for i, f in ipairs(window_fields) do
  snapshot[#snapshot + 1] = f
  snapshot[#snapshot + 1] = current[i] or 0
end
redis.call('HSET', KEYS[6], unpack(snapshot))

local bid = ARGV[6]
local encoded = cjson.encode(stats)
redis.call('HSET', KEYS[5], 'groups', table.concat(gids, ','), 'policy_version', version,
  'created_at', ARGV[1], 'state', 'delivered', 'stats', encoded, 'rollouts', rollouts)
redis.call('ZADD', KEYS[2], ARGV[3], bid)
local delivered = {}
for _, gid in ipairs(gids) do delivered[#delivered + 1] = gid; delivered[#delivered + 1] = 'delivered' end
call_chunked('HSET', KEYS[8], delivered)
redis.call('HINCRBY', KEYS[3], 'batches_formed', 1)
redis.call('HINCRBY', KEYS[3], 'groups_delivered', #gids)
redis.call('HINCRBY', KEYS[3], 'rollouts_delivered', rollouts)
local summary = cjson.encode({batch_id = bid, created_at = now, policy_version = version,
  groups = #gids, rollouts = rollouts, stats = stats})
redis.call('LPUSH', KEYS[7], summary)
redis.call('LTRIM', KEYS[7], 0, 99)
wake(KEYS[12], 'lease')
return {'new', bid}
