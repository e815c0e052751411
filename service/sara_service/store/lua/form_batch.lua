-- Hand the trainer a batch: an expired unacked batch first, else a new one from the ready groups.
-- KEYS[1] = ready list        KEYS[2] = unacked zset       KEYS[3] = stats hash
-- KEYS[4] = policy hash       KEYS[5] = batch hash (new)     KEYS[6] = batch_window hash
-- KEYS[7] = recent_batches list   KEYS[8] = group_states hash   KEYS[9] = gc zset
-- KEYS[10] = run_state string   KEYS[11] = open_groups zset
-- KEYS[12] = wake stream: a new batch takes groups off the ready list, which makes room for
--            new groups (lease long polls wait on it)
-- KEYS[13] = group_prompt hash: a batch holds groups of distinct prompts; a ready group whose
--            prompt the batch already holds stays at the front of the ready list for the next
-- ARGV[1] = now   ARGV[2] = size (groups wanted)   ARGV[3] = ack_deadline   ARGV[4] = max_staleness
-- ARGV[5] = rollout_cap (per batch; 0 = none)   ARGV[6] = batch_id (new)   ARGV[7] = retention_s
-- returns {'redeliver', batch id} | {'none'} | {'new', batch id}
local READY, UNACKED, STATS, POLICY, BATCH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local BATCH_WINDOW, RECENT_BATCHES, GROUP_STATES, GC = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local RUN_STATE, OPEN_GROUPS, WAKE, GROUP_PROMPT = KEYS[10], KEYS[11], KEYS[12], KEYS[13]
local now_text, ack_deadline, batch_id = ARGV[1], ARGV[3], ARGV[6]
local max_stale, cap, retention = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[7])
local now, want = tonumber(now_text), tonumber(ARGV[2])
local due = redis.call('ZRANGEBYSCORE', UNACKED, '-inf', now, 'LIMIT', 0, 1)
if #due > 0 then
  redis.call('ZADD', UNACKED, ack_deadline, due[1])
  redis.call('HINCRBY', STATS, 'batches_redelivered', 1)
  return {'redeliver', due[1]}
end

local window_fields = {'rollouts_completed', 'rollouts_cancelled', 'tokens_generated',
  'groups_committed', 'groups_abandoned', 'groups_dropped_saturated', 'groups_dropped_stale',
  'rollouts_not_spent_on_abandoned_groups'}
local current = redis.call('HMGET', STATS, unpack(window_fields))
local before = redis.call('HMGET', BATCH_WINDOW, unpack(window_fields))
local function spent(i) return (tonumber(current[i]) or 0) - (tonumber(before[i]) or 0) end

-- a draining run with no group left open delivers what is ready, however few: nothing more comes
local closing = (cap > 0 and spent(1) >= cap)
  or (redis.call('GET', RUN_STATE) == 'draining' and redis.call('ZCARD', OPEN_GROUPS) == 0)
local version = tonumber(redis.call('HGET', POLICY, 'version') or '0')
local picked, gids, rollouts = {}, {}, 0
local age = 0   -- policy versions each picked group's oldest result lags the current, summed
local dropped, dropped_gc = {}, {}
local in_batch, deferred = {}, {}   -- prompts the batch holds; entries left for the next batch
while #picked < want do
  local entries = redis.call('LPOP', READY, want - #picked)
  if not entries then break end
  local entry_gids = {}
  for i, entry in ipairs(entries) do entry_gids[i] = string.match(entry, '^(.*)|.*|%d+$') end
  local pids = redis.call('HMGET', GROUP_PROMPT, unpack(entry_gids))
  for i, entry in ipairs(entries) do
    local gid, minv, n = string.match(entry, '^(.*)|(.*)|(%d+)$')
    local pid = pids[i] or gid   -- a group whose prompt is unknown counts as its own
    if minv ~= '' and version - tonumber(minv) > max_stale then
      dropped[#dropped + 1] = gid
      dropped[#dropped + 1] = 'dropped'
      dropped_gc[#dropped_gc + 1] = now + retention
      dropped_gc[#dropped_gc + 1] = gid
    elseif in_batch[pid] then
      deferred[#deferred + 1] = entry
    else
      in_batch[pid] = true
      picked[#picked + 1] = entry
      gids[#gids + 1] = gid
      rollouts = rollouts + tonumber(n)
      if minv ~= '' then age = age + math.max(0, version - tonumber(minv)) end
    end
  end
end
if #dropped > 0 then
  call_chunked('HSET', GROUP_STATES, dropped)
  call_chunked('ZADD', GC, dropped_gc)
  redis.call('HINCRBY', STATS, 'groups_dropped_stale', #dropped_gc / 2)
end
-- entries go back at the front in their order: `entries` first, then the ones before them
local function push_back(entries)
  local back = {}
  for i = #entries, 1, -1 do back[#back + 1] = entries[i] end
  if #back > 0 then call_chunked('LPUSH', READY, back) end
end
push_back(deferred)
if #picked == 0 or (#picked < want and not closing) then
  push_back(picked)
  return {'none'}
end

-- counters re-read: stale drops above belong to this batch's window
current = redis.call('HMGET', STATS, unpack(window_fields))
local stats = {rollouts_spent = spent(1), rollouts_cancelled = spent(2), tokens_spent = spent(3),
  groups_committed = spent(4), groups_abandoned = spent(5), groups_dropped = spent(6) + spent(7),
  rollouts_not_spent_on_abandoned_groups = spent(8), ended_early = #picked < want,
  age_versions_mean = age / #gids}
local snapshot = {}
for i, f in ipairs(window_fields) do
  snapshot[#snapshot + 1] = f
  snapshot[#snapshot + 1] = current[i] or 0
end
redis.call('HSET', BATCH_WINDOW, unpack(snapshot))

local encoded = cjson.encode(stats)
redis.call('HSET', BATCH, 'groups', table.concat(gids, ','), 'policy_version', version,
  'created_at', now_text, 'state', 'delivered', 'stats', encoded, 'rollouts', rollouts)
redis.call('ZADD', UNACKED, ack_deadline, batch_id)
local delivered = {}
for _, gid in ipairs(gids) do delivered[#delivered + 1] = gid; delivered[#delivered + 1] = 'delivered' end
call_chunked('HSET', GROUP_STATES, delivered)
redis.call('HINCRBY', STATS, 'batches_formed', 1)
redis.call('HINCRBY', STATS, 'groups_delivered', #gids)
redis.call('HINCRBY', STATS, 'delivered_lag_versions', age)
redis.call('HINCRBY', STATS, 'rollouts_delivered', rollouts)
local summary = cjson.encode({batch_id = batch_id, created_at = now, policy_version = version,
  groups = #gids, rollouts = rollouts, stats = stats})
redis.call('LPUSH', RECENT_BATCHES, summary)
redis.call('LTRIM', RECENT_BATCHES, 0, 99)
wake(WAKE, 'lease')
return {'new', batch_id}
