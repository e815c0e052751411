-- Apply a worker's rollout results and decide each touched group: COMMIT, ABANDON or CONTINUE.
-- KEYS[1] = slots hash      KEYS[2] = inflight zset     KEYS[3] = pending list
-- KEYS[4] = stats hash      KEYS[5] = open_groups zset  KEYS[6] = ready list
-- KEYS[7] = posteriors hash KEYS[8] = cancels hash      KEYS[9] = abandon_hist hash
-- KEYS[10] = workers zset   KEYS[11] = worker_info hash KEYS[12] = policy hash
-- KEYS[13] = gc zset        KEYS[14] = group_states hash      KEYS[15] = prompts hash
-- KEYS[16] = report string (this report's stored answer; used when ARGV[9] > 0)
-- KEYS[17] = open_yield string (the open_groups zset's scores summed, in 1e-9 groups)
-- KEYS[18] = wake stream (long polls of every replica wait on it)
-- KEYS[19] = reward_levels hash (reward level -> rollouts; used when ARGV[12] > 0)
-- KEYS[20..] = hashes of the groups the results belong to
-- ARGV[1] = now   ARGV[2] = worker_id   ARGV[3] = decay (of posteriors, per policy version)
-- ARGV[4] = alpha0 (prior)   ARGV[5] = beta0 (prior)   ARGV[6] = retention_s
-- ARGV[7] = half_life (of posteriors, in epochs of the pool; 0: none)
-- ARGV[8] = count (of results)   ARGV[9] = report_ttl_s (keep this report's answer; 0: no id)
-- ARGV[10] = holder_only: 1 when the worker id is authenticated (per-worker credentials): a
--            result for a rollout that another worker holds is then ignored (a duplicate)
-- ARGV[11] = results: JSON list, each [rollout id, index of its group key in KEYS, success
--            (1/0/-1/-2), tokens, policy version, and under the reward view the reward's level
--            (text)]: one argument, not six per result, for the client to pack
-- ARGV[12] = levels: 0 under the outcome view; under SARA_EFFECTIVE=reward the number of reward
--            levels in use (the Dirichlet's size, with alpha0 per level). A group is then decided
--            on whether its results' levels differ (lvx > 0), not on successes and failures.
-- ARGV[13..] = result_json, ... (one per result in list order)
--            each the JSON stored as r:<slot>, an argument of its own (inside the list it was a
--            string cjson had to unescape)
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

-- The script is a short driver over library files the store puts in front of it
-- (redis_format.SCRIPTS['apply_results'].library, in this order): _results_state.lua (the
-- arguments by name, the call's state, reading), _results_learn.lua (learning and the
-- bookkeeping every policy shares), one file per allocation policy (_policy_sara.lua: SARA, DS,
-- uniform and the reward view; _policy_rounds.lua: Reinforce-Ada; _policy_pilot.lua:
-- Pilot-Commit) and _results_write.lua (writing back, the answer). Here: the dispatch to the
-- group's policy, the per-result step, and the driver at the end: read what the call touches,
-- apply each result in order, write every key back once, answer. A report is one atomic step,
-- so every policy's decision is taken inside the same call that records the result.

-- --- deciding and applying one result ----------------------------------------------------

-- Decide an open group after one more outcome; returns the decision.
local function decide_open(g)
  if g.ra then return decide_round(g) end
  if g.pc then return decide_pilot(g) end
  return decide_sara(g)
end

-- After an accepted result: close the group when it has everything it will get.
local function maybe_complete(g, state)
  if state == 'committed' then
    local target = g.commit == 'complete' and g.k or g.issued
    if g.done >= target then make_ready(g, g.done) end
  elseif state == 'open' and g.done >= g.k then
    record_outcome(g.pid, 'saturated', g.s == 0 and 'F' or 'S')
    count_up('groups_completed_pure', 1)
    if g.audited then count_up('audits_pure', 1) end
    if g.deliver_sat then
      make_ready(g, g.done)
    else
      retire(g.gid, 'dropped')
      count_up('groups_dropped_saturated', 1)
    end
  end
end

-- Fill an open slot with its first answer, then decide and maybe close the group.
local function fill(rid, g, sl, success, st, policy_version, blob, level)
  local filled = 'd'
  if string.sub(st, 1, 2) == 'l|' then
    local holder = string.match(st, '^l|[^|]*|(.*)$')
    if holder ~= wid then  -- a re-issued copy is now pointless
      add_cancel(holder, rid)
      filled = 'd|' .. holder
    end
  end
  set_slot(rid, filled)
  infl_rem[#infl_rem + 1] = rid
  g.w['r:' .. sl] = blob
  if (not g.min_v) or policy_version < tonumber(g.min_v) then
    g.min_v = policy_version
    g.w.min_v = policy_version
  end
  g.done = g.done + 1
  if success == 1 then g.s = g.s + 1 else g.f = g.f + 1 end
  if level then
    if not g.lv then g.lv = level; g.w.lv = level end
    if level == g.lv then g.lvn = g.lvn + 1 else g.lvx = g.lvx + 1 end
  end
  local state = gstate[g.gid]
  local decision = nil
  if state == 'open' then
    decision = decide_open(g)
    count_up('decisions_' .. decision, 1)
    state = gstate[g.gid]
  end
  maybe_complete(g, state)
  return decision
end

-- An unfinished rollout its own holder gave up (success = -1): nothing was learned, so the slot
-- goes back to the front of the queue at once instead of waiting for the lease to expire.
local function release(rid)
  set_slot(rid, 'p')
  infl_rem[#infl_rem + 1] = rid
  pend_push[#pend_push + 1] = rid
  count_up('rollouts_reissued', 1)
end

-- Result i, in report order: a worker error counts towards its slot's cap; a duplicate is
-- counted; an abort by its holder releases the slot; anything else teaches its prompt (once per
-- slot) and, when it fills an open slot, decides the group.
local function apply_result(i)
  local rid, success = rids[i], tonumber(arg(i, 3))
  local level = reward_view and arg(i, 6) or nil
  local gid, sl = rgid[i], rsl[i]
  local g = groups[gid]
  tally.tokens = tally.tokens + tonumber(arg(i, 4))
  tally.newest = math.max(tally.newest, tonumber(arg(i, 5)))
  local st = slot[rid]
  local held_here = string.match(st, '^l|[^|]*|(.*)$') == wid
  if success == -2 then
    count_up('rollouts_errored', 1)
    -- the holder's error: retry the slot elsewhere, up to the cap; then it is a failure
    if held_here then
      local field = 'errors:' .. sl
      local errors = tonumber(g.slot[field] or '0') + 1
      g.slot[field] = errors
      g.w[field] = errors
      if errors >= MAX_ERRORS_PER_SLOT then success = 0 end
    end
  end
  local aborted = success < 0
  -- 'd' = answered; 'd|<worker>' = answered while <worker> held a copy, now cancelled: that
  -- worker's own answer is late (its slot already taught the posterior); any other a duplicate
  local copy_holder = string.match(st, '^d|(.*)$')
  local others = holder_only and string.sub(st, 1, 2) == 'l|' and not held_here
  if st == 'd' or (copy_holder and copy_holder ~= wid) or others then
    tally.dups = tally.dups + 1
  elseif aborted and held_here then
    release(rid)
    tally.released = tally.released + 1
  else
    local decision = nil
    if not aborted then learn_once(g, sl, success, level, tonumber(arg(i, 4))) end
    if st == 'c' or copy_holder or aborted then
      tally.late = tally.late + 1
      if copy_holder then set_slot(rid, 'd') end
    else
      decision = fill(rid, g, sl, success, st, tonumber(arg(i, 5)), ARGV[12 + i], level)
      tally.accepted = tally.accepted + 1
    end
    if not decided[gid] then order[#order + 1] = gid end
    -- a result that decided nothing answers with the group's standing verdict
    if not decision then
      local state = gstate[gid]
      decision = (state == 'open' and 'continue') or (state == 'abandoned' and 'abandon')
        or 'commit'
    end
    decided[gid] = decision
  end
end

-- --- the driver --------------------------------------------------------------------------------

if report_ttl > 0 then
  local stored = redis.call('GET', REPORT)
  if stored then return {'replay', stored} end
end
read_slots()
read_groups()
local unknown = unknown_rollouts()
if #unknown > 0 then return {'unknown', unknown} end
read_decision_state()
for i = 1, count do apply_result(i) end
local room_freed, ready_len = write_open_groups(write_state())
write_counters()
local cancel = take_cancels()
-- wake long polls (any replica): rollouts to lease or room to open groups; groups ready
if #pend_push > 0 or room_freed then wake(WAKE, 'lease') end
if #ready_push > 0 or ready_len == -1 then wake(WAKE, 'batch', 'n', ready_len) end
return reply(cancel)
