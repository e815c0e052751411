-- Apply a worker's rollout results and decide each touched group: COMMIT, ABANDON or CONTINUE.
-- KEYS[1] = slots hash      KEYS[2] = inflight zset     KEYS[3] = pending list
-- KEYS[4] = stats hash      KEYS[5] = open_groups zset  KEYS[6] = ready list
-- KEYS[7] = posteriors hash KEYS[8] = cancels hash      KEYS[9] = abandon_hist hash
-- KEYS[10] = workers zset   KEYS[11] = worker_info hash KEYS[12] = policy hash
-- KEYS[13] = gc zset        KEYS[14] = group_states hash      KEYS[15] = prompts hash
-- KEYS[16] = report string (this report's stored answer; used when ARGV[9] > 0)
-- KEYS[17..] = hashes of the groups the results belong to
-- ARGV[1] = now   ARGV[2] = worker_id   ARGV[3] = decay (of posteriors, per policy version)
-- ARGV[4] = alpha0 (prior)   ARGV[5] = beta0 (prior)   ARGV[6] = retention_s
-- ARGV[7] = half_life (of posteriors, in epochs of the pool; 0: none)
-- ARGV[8] = count (of results)   ARGV[9] = report_ttl_s (keep this report's answer; 0: no id)
-- ARGV[10] = holder_only: 1 when the worker id is authenticated (per-worker credentials): a
--            result for a rollout that another worker holds is then ignored (a duplicate)
-- ARGV[11..] = 6 per result: rollout_id, group_key_index, success, tokens, policy_version, json
--           (group_key_index: where its group's hash is in KEYS; success: 1/0/-1/-2)
-- returns {'unknown', rollout ids...} and changes nothing when any rollout is not known, else
--         {'ok', accepted, duplicates, late, {group id, decision, ...}, cancel ids for this worker,
--          released}, or {'replay', JSON of that answer} when this report id was applied before:
--          a retry of a call whose answer was lost gets its decisions and cancels, and changes
--          nothing; success -1 marks an aborted (unfinished) rollout: no outcome; -2 a worker
--          error (engine or server failure): no outcome either, until the same slot has failed
--          MAX_ERRORS_PER_SLOT times, after which it counts as a failure so a prompt that always
--          breaks the engine cannot circulate for ever
-- An audited group (flagged when it opened) that reaches its abandonment point is completed to k
-- instead: the counters audits_mixed / audits_pure measure what abandoning such groups loses.
local now, wid = tonumber(ARGV[1]), ARGV[2]
local decay, a0, b0, retention = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local half_life = tonumber(ARGV[7])
local count, report_ttl, holder_only = tonumber(ARGV[8]), tonumber(ARGV[9]), ARGV[10] == '1'
local REPORT = KEYS[16]
if report_ttl > 0 then
  local stored = redis.call('GET', REPORT)
  if stored then return {'replay', stored} end
end
local S, INFL, PEND, STATS, OPEN, READY, POST, CANCELS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local HIST, WORKERS, WINFO, POLICY, GC, GSTATE = KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14]
local PROMPTS = KEYS[15]

local function arg(i, j) return ARGV[10 + (i - 1) * 6 + j] end
local MAX_ERRORS_PER_SLOT = 3

local unknown = {}
for i = 1, count do
  local gkey = KEYS[tonumber(arg(i, 2))]
  if redis.call('HEXISTS', S, arg(i, 1)) == 0 or redis.call('EXISTS', gkey) == 0 then
    unknown[#unknown + 1] = arg(i, 1)
  end
end
if #unknown > 0 then return {'unknown', unknown} end

local version = tonumber(redis.call('HGET', POLICY, 'version') or '0')
-- The pool's clock, in epochs: prompts consumed (groups opened + prompts skipped) per prompt.
-- A prompt is visited about once per epoch whatever the number of policy versions in between,
-- so a half-life on this clock keeps its history until its next visit (scheduler.pool_clock).
local function pool_clock()
  local n = redis.call('HLEN', PROMPTS)
  if n == 0 then return 0 end
  local c = redis.call('HMGET', STATS, 'groups_opened', 'groups_skipped')
  return (tonumber(c[1] or '0') + tonumber(c[2] or '0')) / n
end
local clock = pool_clock()

-- weight of old evidence: decay^versions * 0.5^(epochs / half-life), as allocation.decay_weight
local function update_posterior(pid, success)
  local raw = redis.call('HGET', POST, pid)
  local p = raw and cjson.decode(raw) or {a = a0, b = b0, v = version, t = clock}
  local elapsed, epochs = version - (p.v or version), clock - (p.t or clock)
  local w = 1.0
  if elapsed > 0 then w = decay ^ elapsed end
  if half_life > 0 and epochs > 0 then w = w * 0.5 ^ (epochs / half_life) end
  if w ~= 1.0 then p.a, p.b = a0 + w * (p.a - a0), b0 + w * (p.b - b0) end
  p.v = math.max(version, p.v or version)
  p.t = math.max(clock, p.t or clock)
  if success == 1 then p.a = p.a + 1 else p.b = p.b + 1 end
  p.rollouts = (p.rollouts or 0) + 1
  p.successes = (p.successes or 0) + success
  redis.call('HSET', POST, pid, cjson.encode(p))
end

-- Each slot teaches its prompt's posterior once, with the first outcome reported for it: a second
-- answer for the same slot (a re-issued copy, a result sent by a non-holder and then the holder's
-- own, a late result repeated) is one sample counted twice otherwise.
local function learn_once(gkey, slot, success)
  if redis.call('HSETNX', gkey, 'learned:' .. slot, 1) == 1 then
    update_posterior(redis.call('HGET', gkey, 'prompt_id'), success)
  end
end

-- Count a group's verdict in its prompt's history, and remember the outcome class the selection
-- layer learns from: 'F' all-fail, 'M' mixed, 'S' all-success (the side a pure group ended on).
-- An abandoned group also records q, its chance of having ended mixed (rounded to 1e-6 so the
-- entry stays short and Python's mirror rounds alike): DPS reads it as a censored observation.
local MAX_OBSERVATIONS = 16
local function record_outcome(pid, field, outcome, q)
  local raw = redis.call('HGET', POST, pid)
  if not raw then return end
  local p = cjson.decode(raw)
  p[field] = (p[field] or 0) + 1
  local obs = p.obs or {}
  if q then
    obs[#obs + 1] = {version, outcome, math.floor(q * 1e6 + 0.5) / 1e6}
  else
    obs[#obs + 1] = {version, outcome}
  end
  if #obs > MAX_OBSERVATIONS then table.remove(obs, 1) end
  p.obs = obs
  redis.call('HSET', POST, pid, cjson.encode(p))
end

local function add_cancel(worker, rid)
  local cur = redis.call('HGET', CANCELS, worker)
  redis.call('HSET', CANCELS, worker, cur and (cur .. ' ' .. rid) or rid)
end

local function issue(gkey, gid, from, to)
  if to <= from then return end
  for slot = to - 1, from, -1 do  -- backwards: pushed onto the front, they keep slot order
    local rid = gid .. ':' .. slot
    redis.call('HSET', S, rid, 'p')
    -- decided groups and probes that decide a group go first: they finish or free work sooner
    redis.call('LPUSH', PEND, rid)
  end
  redis.call('HSET', gkey, 'issued', to)
  redis.call('HINCRBY', STATS, 'rollouts_issued', to - from)
end

local function cancel_outstanding(gkey, gid, issued)
  local n = 0
  for slot = 0, issued - 1 do
    local rid = gid .. ':' .. slot
    local st = redis.call('HGET', S, rid)
    if st == 'p' then
      redis.call('HSET', S, rid, 'c')
      n = n + 1
    elseif st and string.sub(st, 1, 2) == 'l|' then
      redis.call('HSET', S, rid, 'c')
      redis.call('ZREM', INFL, rid)
      add_cancel(string.match(st, '^l|[^|]*|(.*)$'), rid)
      n = n + 1
    end
  end
  if n > 0 then
    redis.call('HINCRBY', gkey, 'cancelled', n)
    redis.call('HINCRBY', STATS, 'rollouts_cancelled', n)
  end
end

local function retire(gid, state)
  redis.call('HSET', GSTATE, gid, state)
  redis.call('ZREM', OPEN, gid)
  redis.call('ZADD', GC, now + retention, gid)
end

local function make_ready(gkey, gid, done)
  redis.call('HSET', GSTATE, gid, 'ready')
  redis.call('ZREM', OPEN, gid)
  local minv = redis.call('HGET', gkey, 'min_v') or ''
  redis.call('RPUSH', READY, gid .. '|' .. minv .. '|' .. done)
end

-- P(the group would still have ended mixed had it run to k) under the prompt's own learned
-- posterior (which already holds this group's outcomes): 1 - E[(1-g)^rest] on the failing side,
-- 1 - E[g^rest] on the succeeding side, each a product of one-step predictive probabilities.
-- The prior's p_eff bounds false abandons; this estimates them, and sharpens as prompts recur.
local function mixed_chance_under_posterior(pid, failing, rest)
  local raw = redis.call('HGET', POST, pid)
  local p = raw and cjson.decode(raw) or {a = a0, b = b0}
  local stay = 1.0
  for j = 0, rest - 1 do
    stay = stay * ((failing and p.b or p.a) + j) / (p.a + p.b + j)
  end
  return 1.0 - stay
end

-- An audited group at its abandonment point runs on to k; what that costs is counted.
local function begin_audit(gkey, gid, g)
  g.audited = true
  redis.call('HSET', gkey, 'audited', 1)
  redis.call('HINCRBY', STATS, 'groups_audited', 1)
  redis.call('HINCRBY', STATS, 'audit_rollouts', g.k - g.issued)
  issue(gkey, gid, g.issued, g.k)
  g.issued = g.k
end

-- Decide an open group after one more outcome; returns the decision.
local function decide_open(gkey, gid, g)
  if g.s > 0 and g.f > 0 then
    redis.call('HSET', GSTATE, gid, 'committed')
    redis.call('HSET', gkey, 'p_eff', 1)
    redis.call('ZADD', OPEN, 1, gid)
    redis.call('HINCRBY', STATS, 'groups_committed', 1)
    if g.audited then redis.call('HINCRBY', STATS, 'audits_mixed', 1) end
    record_outcome(g.pid, 'committed', 'M')
    if g.commit == 'complete' then issue(gkey, gid, g.issued, g.k) end
    return 'commit'
  end
  local failing = g.s == 0
  local n = failing and g.f or g.s
  local thr = failing and g.thr_f or g.thr_s
  -- the plan's table covers every prefix up to the threshold (or k)
  local p = tonumber(redis.call('HGET', gkey, (failing and 'pf:' or 'ps:') .. math.min(n, thr, g.k)))
  if n >= thr and g.audit and not g.audited then begin_audit(gkey, gid, g) end
  if n >= thr and not g.audited then
    cancel_outstanding(gkey, gid, g.issued)
    retire(gid, 'abandoned')
    redis.call('HSET', gkey, 'p_eff', p)
    redis.call('HINCRBY', STATS, 'groups_abandoned', 1)
    redis.call('HINCRBY', STATS, 'rollouts_not_spent_on_abandoned_groups', g.k - g.issued)
    redis.call('HINCRBYFLOAT', STATS, 'expected_false_abandons', p)
    local q = mixed_chance_under_posterior(g.pid, failing, g.k - n)
    redis.call('HINCRBYFLOAT', STATS, 'estimated_false_abandons', q)
    redis.call('HINCRBY', HIST, tostring(g.done), 1)
    record_outcome(g.pid, 'abandoned', failing and 'F' or 'S', q)
    return 'abandon'
  end
  redis.call('HSET', gkey, 'p_eff', p)
  -- flow control counts expected deliveries: every group is one when saturated ones are kept
  redis.call('ZADD', OPEN, g.deliver_sat and 1 or p, gid)
  issue(gkey, gid, g.issued, math.min(thr, g.k))
  return 'continue'
end

local function load_group(gkey)
  local v = redis.call('HMGET', gkey, 'prompt_id', 'k', 'issued', 'done', 's', 'f', 'thr_f',
    'thr_s', 'deliver_sat', 'commit', 'audit', 'audited')
  return {pid = v[1], k = tonumber(v[2]), issued = tonumber(v[3]), done = tonumber(v[4]),
    s = tonumber(v[5]), f = tonumber(v[6]), thr_f = tonumber(v[7]), thr_s = tonumber(v[8]),
    deliver_sat = v[9] == '1', commit = v[10], audit = v[11] == '1', audited = v[12] == '1'}
end

-- After an accepted result: close the group when it has everything it will get.
local function maybe_complete(gkey, gid, g, state)
  if state == 'committed' then
    local target = g.commit == 'complete' and g.k or g.issued
    if g.done >= target then make_ready(gkey, gid, g.done) end
  elseif state == 'open' and g.done >= g.k then
    record_outcome(g.pid, 'saturated', g.s == 0 and 'F' or 'S')
    redis.call('HINCRBY', STATS, 'groups_completed_pure', 1)
    if g.audited then redis.call('HINCRBY', STATS, 'audits_pure', 1) end
    if g.deliver_sat then
      make_ready(gkey, gid, g.done)
    else
      retire(gid, 'dropped')
      redis.call('HINCRBY', STATS, 'groups_dropped_saturated', 1)
    end
  end
end

-- Fill an open slot with its first answer, then decide and maybe close the group.
local function fill(rid, gkey, gid, slot, success, st, policy_version, blob)
  local filled = 'd'
  if string.sub(st, 1, 2) == 'l|' then
    local holder = string.match(st, '^l|[^|]*|(.*)$')
    if holder ~= wid then  -- a re-issued copy is now pointless
      add_cancel(holder, rid)
      filled = 'd|' .. holder
    end
  end
  redis.call('HSET', S, rid, filled)
  redis.call('ZREM', INFL, rid)
  redis.call('HSET', gkey, 'r:' .. slot, blob)
  local minv = redis.call('HGET', gkey, 'min_v')
  if (not minv) or policy_version < tonumber(minv) then
    redis.call('HSET', gkey, 'min_v', policy_version)
  end
  local g = load_group(gkey)
  g.done = redis.call('HINCRBY', gkey, 'done', 1)
  if success == 1 then g.s = redis.call('HINCRBY', gkey, 's', 1)
  else g.f = redis.call('HINCRBY', gkey, 'f', 1) end
  local state = redis.call('HGET', GSTATE, gid)
  local decision = nil
  if state == 'open' then
    decision = decide_open(gkey, gid, g)
    redis.call('HINCRBY', STATS, 'decisions_' .. decision, 1)
    state = redis.call('HGET', GSTATE, gid)
    g.issued = tonumber(redis.call('HGET', gkey, 'issued'))
  end
  maybe_complete(gkey, gid, g, state)
  return decision
end

-- An unfinished rollout its own holder gave up (success = -1): nothing was learned, so the slot
-- goes back to the front of the queue at once instead of waiting for the lease to expire.
local function release(rid)
  redis.call('HSET', S, rid, 'p')
  redis.call('ZREM', INFL, rid)
  redis.call('LPUSH', PEND, rid)
  redis.call('HINCRBY', STATS, 'rollouts_reissued', 1)
end

local accepted, dups, late, released, tokens, newest = 0, 0, 0, 0, 0, -1
local decided, order = {}, {}
for i = 1, count do
  local rid, gkey, success = arg(i, 1), KEYS[tonumber(arg(i, 2))], tonumber(arg(i, 3))
  local gid, slot = string.match(rid, '^(.*):(%d+)$')
  tokens = tokens + tonumber(arg(i, 4))
  newest = math.max(newest, tonumber(arg(i, 5)))
  local st = redis.call('HGET', S, rid)
  local held_here = string.match(st, '^l|[^|]*|(.*)$') == wid
  if success == -2 then
    redis.call('HINCRBY', STATS, 'rollouts_errored', 1)
    -- the holder's error: retry the slot elsewhere, up to the cap; then it is a failure
    if held_here and redis.call('HINCRBY', gkey, 'errors:' .. slot, 1) >= MAX_ERRORS_PER_SLOT then
      success = 0
    end
  end
  local aborted = success < 0
  -- 'd' = answered; 'd|<worker>' = answered while <worker> held a copy, now cancelled: that
  -- worker's own answer is late (its slot already taught the posterior); any other a duplicate
  local copy_holder = string.match(st, '^d|(.*)$')
  local others = holder_only and string.sub(st, 1, 2) == 'l|' and not held_here
  if st == 'd' or (copy_holder and copy_holder ~= wid) or others then
    dups = dups + 1
  elseif aborted and held_here then
    release(rid)
    released = released + 1
  else
    local decision = nil
    if not aborted then learn_once(gkey, slot, success) end
    if st == 'c' or copy_holder or aborted then
      late = late + 1
      if copy_holder then redis.call('HSET', S, rid, 'd') end
    else
      decision = fill(rid, gkey, gid, slot, success, st, tonumber(arg(i, 5)), arg(i, 6))
      accepted = accepted + 1
    end
    if not decided[gid] then order[#order + 1] = gid end
    -- a result that decided nothing answers with the group's standing verdict
    if not decision then
      local state = redis.call('HGET', GSTATE, gid)
      decision = (state == 'open' and 'continue') or (state == 'abandoned' and 'abandon')
        or 'commit'
    end
    decided[gid] = decision
  end
end

redis.call('HINCRBY', STATS, 'rollouts_completed', accepted)
redis.call('HINCRBY', STATS, 'results_duplicate', dups)
redis.call('HINCRBY', STATS, 'results_late', late)
redis.call('HINCRBY', STATS, 'tokens_generated', tokens)
redis.call('HINCRBY', WINFO, wid .. '|completed', accepted)
redis.call('HINCRBY', WINFO, wid .. '|tokens', tokens)
redis.call('HSET', WINFO, wid .. '|policy_version', newest)
redis.call('ZADD', WORKERS, now, wid)

local flat = {}
for _, gid in ipairs(order) do flat[#flat + 1] = gid; flat[#flat + 1] = decided[gid] end
local cancel = redis.call('HGET', CANCELS, wid) or ''
redis.call('HDEL', CANCELS, wid)
if report_ttl > 0 then
  redis.call('SET', REPORT, cjson.encode({accepted, dups, late, flat, cancel, released}),
    'EX', report_ttl)
end
return {'ok', accepted, dups, late, flat, cancel, released}
