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
-- returns {{rollout_id, prompt_id, ...}, {prompt_id, prompt_json, ...} (each leased prompt's
--          content once; '' for a prompt with none), cancel ids (space separated),
--          policy version, policy checkpoint ('' = none), room, dry}: room is 1 when
--          open_groups.lua could open a group now (the run is neither paused nor draining, and
--          flow control is under its target), else 0, so a worker that flow control holds back
--          costs one call; dry is 1 when opening groups here found the epoch queue short (the
--          scheduler starts the next epoch and opens the rest)
-- Each key is read and written once per batch of popped ids, not once per rollout.
local wid, lid, want = ARGV[2], ARGV[3], tonumber(ARGV[4])
-- rollouts whose lease ran out go back at the front first (one round trip, not two)
local expire_limit = tonumber(ARGV[8])
if expire_limit > 0 then
  local due = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[1], 'LIMIT', 0, expire_limit)
  if #due > 0 then
    redis.call('ZREM', KEYS[3], unpack(due))
    local states = redis.call('HMGET', KEYS[2], unpack(due))
    local slots, pushes = {}, {}
    for i = #due, 1, -1 do  -- backwards: pushed onto the front, they keep their order
      if states[i] and string.sub(states[i], 1, 2) == 'l|' then
        slots[#slots + 1] = due[i]
        slots[#slots + 1] = 'p'
        pushes[#pushes + 1] = due[i]
      end
    end
    if #pushes > 0 then
      call_chunked('HSET', KEYS[2], slots)
      call_chunked('LPUSH', KEYS[1], pushes)
      redis.call('HINCRBY', KEYS[4], 'rollouts_reissued', #pushes)
      if #pushes > want then redis.call('XADD', KEYS[15], 'MAXLEN', '~', 64, '*', 'w', 'lease') end
    end
  end
end
local held = 'l|' .. lid .. '|' .. wid
local taken, seen = {}, {}
local got = 0
-- paused: nothing is leased (pending rollouts wait), but the worker is still seen and gets its
-- cancels; checked here, in the same script, so no lease slips past a pause
if redis.call('GET', KEYS[13]) == 'paused' then want = 0 end
local function take()
  while got < want do
    local popped = redis.call('LPOP', KEYS[1], want - got)
    if not popped then break end
    local states = redis.call('HMGET', KEYS[2], unpack(popped))
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
  local target = tonumber(ARGV[9]) * YIELD_UNIT
  local expected = flow_expected(KEYS[16], KEYS[18], KEYS[17])
  if redis.call('EXISTS', KEYS[13]) == 1 or expected >= target then return end
  local plan, gids = cjson.decode(ARGV[10]), {}
  for gid in string.gmatch(ARGV[13], '%S+') do gids[#gids + 1] = gid end
  local n = math.min(#gids, math.ceil((want - got) / math.max(1, plan.issue)))
  local pids = redis.call('LPOP', KEYS[22], n) or {}
  if #pids < n then dry = 1 end
  local specs = {}
  for i, pid in ipairs(pids) do
    local spec = {gid = gids[i], pid = pid}
    for field, value in pairs(plan) do spec[field] = value end
    specs[i] = spec
  end
  local K = {stats = KEYS[4], open = KEYS[18], pending = KEYS[1], slots = KEYS[2],
    states = KEYS[19], prompt = KEYS[9], posteriors = KEYS[20], off = KEYS[21],
    yield = KEYS[17], wake = KEYS[15]}
  -- the queue is empty here (take() popped it dry): the new rollouts it would pop next are
  -- handed over directly instead of queued, marked pending, popped and read back; only those
  -- past what the lease wants are queued, so nothing is left for another take()
  local consumed, handed = open_specs(K, specs, function(i) return KEYS[22 + i] end, target,
    expected, ARGV[1], tonumber(ARGV[11]), ARGV[12], want - got)
  for _, rid in ipairs(handed) do taken[#taken + 1] = rid end
  got = got + #handed
  if consumed < #pids then
    local back = {}
    for i = #pids, consumed + 1, -1 do back[#back + 1] = pids[i] end
    redis.call('LPUSH', KEYS[22], unpack(back))
  end
end
if got < want and ARGV[10] ~= '' then open_for_rest() end
local out, prompts = {}, {}
if got > 0 then
  local slots, scored, gids = {}, {}, {}
  for i, rid in ipairs(taken) do
    slots[2 * i - 1], slots[2 * i] = rid, held
    scored[2 * i - 1], scored[2 * i] = ARGV[5], rid
    gids[i] = string.match(rid, '^(.*):%d+$')
  end
  call_chunked('HSET', KEYS[2], slots)
  call_chunked('ZADD', KEYS[3], scored)
  call_chunked('SADD', KEYS[7], taken)
  -- each group's prompt looked up once, and each prompt's content sent once, however many of
  -- its rollouts are leased
  local group_list, group_seen = {}, {}
  for _, gid in ipairs(gids) do
    if not group_seen[gid] then group_seen[gid] = true; group_list[#group_list + 1] = gid end
  end
  local pid_of = {}
  for i, pid in ipairs(redis.call('HMGET', KEYS[9], unpack(group_list))) do
    pid_of[group_list[i]] = pid
  end
  local unique, seen_pid = {}, {}
  for i, rid in ipairs(taken) do
    local pid = pid_of[gids[i]]
    out[#out + 1] = rid
    out[#out + 1] = pid
    if not seen_pid[pid] then seen_pid[pid] = true; unique[#unique + 1] = pid end
  end
  local content = redis.call('HMGET', KEYS[10], unpack(unique))
  local retired = nil
  for i, pid in ipairs(unique) do
    -- a group in flight still runs after its prompt was deleted: its content is retired
    if not content[i] then
      retired = retired or redis.call('HMGET', KEYS[14], unpack(unique))
      content[i] = retired[i]
    end
    prompts[#prompts + 1] = pid
    prompts[#prompts + 1] = content[i] or ''
  end
  -- a lease topped up by a second call in the same request is still one lease
  if redis.call('EXISTS', KEYS[6]) == 0 then
    redis.call('HINCRBY', KEYS[4], 'leases_granted', 1)
    redis.call('HINCRBY', KEYS[11], wid .. '|leases', 1)
    -- a result that does not say which version made it takes the one its lease was granted under
    redis.call('HSET', KEYS[6], 'policy_version', redis.call('HGET', KEYS[12], 'version') or '0')
  end
  redis.call('HSET', KEYS[6], 'worker', wid, 'expires_at', ARGV[5])
  redis.call('EXPIRE', KEYS[6], ARGV[6])
  redis.call('EXPIRE', KEYS[7], ARGV[6])
  redis.call('HSETNX', KEYS[11], wid .. '|first_seen', ARGV[1])
end
redis.call('ZADD', KEYS[8], ARGV[1], wid)
if ARGV[7] ~= '' then redis.call('HSET', KEYS[11], wid .. '|backend', ARGV[7]) end
local cancel = redis.call('HGET', KEYS[5], wid) or ''
if cancel ~= '' then redis.call('HDEL', KEYS[5], wid) end
local policy = redis.call('HMGET', KEYS[12], 'version', 'checkpoint')
local room = 0
local target = tonumber(ARGV[9])
if target > 0 and redis.call('EXISTS', KEYS[13]) == 0
    and flow_expected(KEYS[16], KEYS[18], KEYS[17]) < target * YIELD_UNIT then
  room = 1
end
return {out, prompts, cancel, policy[1] or '0', policy[2] or '', room, dry}
