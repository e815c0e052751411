-- Lease up to N pending rollouts to one worker, and hand it its cancel list.
-- KEYS[1] = pending list        KEYS[2] = slots hash        KEYS[3] = inflight zset
-- KEYS[4] = stats hash          KEYS[5] = cancels hash      KEYS[6] = lease hash
-- KEYS[7] = lease_rollouts set  KEYS[8] = workers zset      KEYS[9] = group_prompt hash
-- KEYS[10] = prompts hash       KEYS[11] = worker_info hash   KEYS[12] = policy hash
-- KEYS[13] = run_state string  KEYS[14] = prompts_retired hash (content of deleted prompts)
-- KEYS[15] = wake stream (long polls of every replica wait on it)
-- KEYS[16] = ready list         KEYS[17] = open_yield string   KEYS[18] = open_groups zset
--             (flow control's measure, read as open_groups.lua reads it)
-- KEYS[19] = group_states hash  KEYS[20] = posteriors hash     KEYS[21] = prompts_off hash
-- KEYS[22] = epoch_queue list   KEYS[22 + i] = hash of the group named by ARGV[13]'s i-th id
-- ARGV[1] = now   ARGV[2] = worker_id   ARGV[3] = lease_id   ARGV[4] = max_rollouts
-- ARGV[5] = expires_at (of the lease)   ARGV[6] = key_ttl_s   ARGV[7] = backend ('' = unknown)
-- ARGV[8] = requeue_limit (most expired leases to put back first, as expire_leases.lua does;
--           0: none)
-- ARGV[9] = flow_target (prefetch_batches x batch_size; 0: room is not asked for)
-- ARGV[10] = plan: '' or, when every group of the run has one plan (a uniform prior), that plan
--            as a group spec without gid and pid (see _open.lua): a lease the queue cannot fill
--            then opens groups for the rest on the epoch queue's next prompts and leases them,
--            one call where the scheduler made four (this lease, an LPOP of the epoch queue,
--            open_groups.lua, a second lease)
-- ARGV[11] = audit_fraction   ARGV[12] = seed (as open_groups.lua takes them)
-- ARGV[13] = group_ids: the ids (space separated) the groups opened here take, in order
-- ARGV[14] = floor_target, ARGV[15] = floor_ready: the work floor (flow_target_units in
--            _prelude.lua; floor_target 0: none)
-- ARGV[16] = engine_occupancy, ARGV[17] = engine_slots: how full the worker's engine has been
--            since its previous lease, and its slots ('' each: not reported), kept in its
--            worker_info for /stats
-- returns {{rollout_id, prompt_id, ...}, {prompt_id, prompt_json, ...} (each leased prompt's
--          content once; '' for a prompt with none), cancel ids (space separated),
--          policy version, policy checkpoint ('' = none), room, dry}: room is 1 when
--          open_groups.lua could open a group now (the run is neither paused nor draining, and
--          flow control is under its target, the work floor's where it applies), else 0, so
--          a worker that flow control holds back costs one call; dry is 1 when opening groups
--          here found the epoch queue short (the scheduler starts the next epoch and opens the
--          rest); and the leased groups already committed (space separated): their rollouts
--          are the rest of a group under way, which an engine should run first
-- Each key is read and written once per batch of popped ids, not once per rollout.
local PENDING, SLOTS, INFLIGHT, STATS, CANCELS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local LEASE, LEASE_ROLLOUTS, WORKERS, GROUP_PROMPT = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local PROMPTS, WORKER_INFO, POLICY, RUN_STATE = KEYS[10], KEYS[11], KEYS[12], KEYS[13]
local PROMPTS_RETIRED, WAKE, READY, OPEN_YIELD = KEYS[14], KEYS[15], KEYS[16], KEYS[17]
local OPEN_GROUPS, GROUP_STATES, POSTERIORS = KEYS[18], KEYS[19], KEYS[20]
local PROMPTS_OFF, EPOCH_QUEUE = KEYS[21], KEYS[22]
local function group_key(i) return KEYS[22 + i] end
local now, wid, lid, want = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local expires_at, key_ttl, backend = ARGV[5], ARGV[6], ARGV[7]
local requeue_limit, flow_target = tonumber(ARGV[8]), tonumber(ARGV[9])
local plan_json, audit_fraction, seed, group_ids = ARGV[10], tonumber(ARGV[11]), ARGV[12], ARGV[13]
local floor_target, floor_ready = tonumber(ARGV[14]), tonumber(ARGV[15])
-- busy prompts one opening may pass over beyond the ones it opens (pop_free in _open.lua)
local BUSY_SPARE = 64

-- rollouts whose lease ran out go back at the front first (one round trip, not two)
if requeue_limit > 0 then
  local requeued = requeue_expired(INFLIGHT, SLOTS, PENDING, STATS, now, requeue_limit)
  if requeued > want then wake(WAKE, 'lease') end
end
local held = 'l|' .. lid .. '|' .. wid
local taken, seen = {}, {}
local got = 0
-- paused: nothing is leased (pending rollouts wait), but the worker is still seen and gets its
-- cancels; checked here, in the same script, so no lease slips past a pause
if redis.call('GET', RUN_STATE) == 'paused' then want = 0 end
local function take()
  while got < want do
    local popped = redis.call('LPOP', PENDING, want - got)
    if not popped then break end
    local states = redis.call('HMGET', SLOTS, unpack(popped))
    for i, rid in ipairs(popped) do
      -- cancelled or already answered slots stay in the queue until popped: skip them here
      if states[i] == 'p' and not seen[rid] then
        seen[rid] = true
        taken[#taken + 1] = rid
        got = got + 1
      end
    end
  end
end
take()

-- Open groups for the rest on the epoch's next prompts, as the scheduler would (its count, its
-- plan), while flow control has room; prompts popped but not opened go back to the front.
local dry = 0
local function open_for_rest()
  local target = flow_target_units(READY, flow_target, floor_target, floor_ready)
  local expected = flow_expected(READY, OPEN_YIELD)
  if redis.call('EXISTS', RUN_STATE) == 1 or expected >= target then return end
  local plan, gids = cjson.decode(plan_json), {}
  for gid in string.gmatch(group_ids, '%S+') do gids[#gids + 1] = gid end
  local n = math.min(#gids, math.ceil((want - got) / math.max(1, plan.issue)))
  local K = {stats = STATS, open = OPEN_GROUPS, pending = PENDING, slots = SLOTS,
    states = GROUP_STATES, prompt = GROUP_PROMPT, posteriors = POSTERIORS, off = PROMPTS_OFF,
    yield = OPEN_YIELD, wake = WAKE}
  -- prompts whose group is still in flight are passed over (one group per prompt at a time)
  local pids, short = pop_free(K, EPOCH_QUEUE, n, BUSY_SPARE)
  if short then dry = 1 end
  local specs = {}
  for i, pid in ipairs(pids) do
    local spec = {gid = gids[i], pid = pid}
    for field, value in pairs(plan) do spec[field] = value end
    specs[i] = spec
  end
  -- the queue is empty here (take() popped it dry): the new rollouts it would pop next are
  -- handed over directly instead of queued, marked pending, popped and read back; only those
  -- past what the lease wants are queued, so nothing is left for another take()
  local consumed, handed = open_specs(K, specs, group_key, target,
    expected, now, audit_fraction, seed, want - got)
  for _, rid in ipairs(handed) do taken[#taken + 1] = rid end
  got = got + #handed
  if consumed < #pids then
    local back = {}
    for i = #pids, consumed + 1, -1 do back[#back + 1] = pids[i] end
    redis.call('LPUSH', EPOCH_QUEUE, unpack(back))
  end
end
if got < want and plan_json ~= '' then open_for_rest() end
local out, prompts, committed = {}, {}, {}
if got > 0 then
  local slots, scored, gids = {}, {}, {}
  for i, rid in ipairs(taken) do
    slots[2 * i - 1], slots[2 * i] = rid, held
    scored[2 * i - 1], scored[2 * i] = expires_at, rid
    gids[i] = string.match(rid, '^(.*):%d+$')
  end
  call_chunked('HSET', SLOTS, slots)
  call_chunked('ZADD', INFLIGHT, scored)
  call_chunked('SADD', LEASE_ROLLOUTS, taken)
  -- each group's prompt looked up once, and each prompt's content sent once, however many of
  -- its rollouts are leased
  local group_list, group_seen = {}, {}
  for _, gid in ipairs(gids) do
    if not group_seen[gid] then group_seen[gid] = true; group_list[#group_list + 1] = gid end
  end
  local pid_of = {}
  for i, pid in ipairs(redis.call('HMGET', GROUP_PROMPT, unpack(group_list))) do
    pid_of[group_list[i]] = pid
  end
  for i, state in ipairs(redis.call('HMGET', GROUP_STATES, unpack(group_list))) do
    if state == 'committed' then committed[#committed + 1] = group_list[i] end
  end
  local unique, seen_pid = {}, {}
  for i, rid in ipairs(taken) do
    local pid = pid_of[gids[i]]
    out[#out + 1] = rid
    out[#out + 1] = pid
    if not seen_pid[pid] then seen_pid[pid] = true; unique[#unique + 1] = pid end
  end
  local content = redis.call('HMGET', PROMPTS, unpack(unique))
  local retired = nil
  for i, pid in ipairs(unique) do
    -- a group in flight still runs after its prompt was deleted: its content is retired
    if not content[i] then
      retired = retired or redis.call('HMGET', PROMPTS_RETIRED, unpack(unique))
      content[i] = retired[i]
    end
    prompts[#prompts + 1] = pid
    prompts[#prompts + 1] = content[i] or ''
  end
  -- a lease topped up by a second call in the same request is still one lease
  if redis.call('EXISTS', LEASE) == 0 then
    redis.call('HINCRBY', STATS, 'leases_granted', 1)
    redis.call('HINCRBY', WORKER_INFO, wid .. '|leases', 1)
    -- a result that does not say which version made it takes the one its lease was granted under
    redis.call('HSET', LEASE, 'policy_version', redis.call('HGET', POLICY, 'version') or '0')
  end
  redis.call('HSET', LEASE, 'worker', wid, 'expires_at', expires_at)
  redis.call('EXPIRE', LEASE, key_ttl)
  redis.call('EXPIRE', LEASE_ROLLOUTS, key_ttl)
  redis.call('HSETNX', WORKER_INFO, wid .. '|first_seen', now)
end
redis.call('ZADD', WORKERS, now, wid)
if backend ~= '' then redis.call('HSET', WORKER_INFO, wid .. '|backend', backend) end
if ARGV[16] ~= '' then
  redis.call('HSET', WORKER_INFO, wid .. '|occupancy', ARGV[16], wid .. '|slots', ARGV[17])
end
local cancel = redis.call('HGET', CANCELS, wid) or ''
if cancel ~= '' then redis.call('HDEL', CANCELS, wid) end
local policy = redis.call('HMGET', POLICY, 'version', 'checkpoint')
local room = 0
if flow_target > 0 and redis.call('EXISTS', RUN_STATE) == 0 and flow_expected(READY, OPEN_YIELD)
    < flow_target_units(READY, flow_target, floor_target, floor_ready) then
  room = 1
end
return {out, prompts, cancel, policy[1] or '0', policy[2] or '', room, dry,
  table.concat(committed, ' ')}
