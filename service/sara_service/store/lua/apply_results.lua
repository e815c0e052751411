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

-- The script is its library functions first, then a short driver at the end: read what the
-- call touches, apply each result in order, write every key back once, answer.
-- Past 400 lines because a report is one atomic step: every policy's decision (SARA, DS,
-- the reward view, per-prompt plans, Reinforce-Ada's rounds, Pilot-Commit's pilot) is taken
-- inside the same call that records the result, so they cannot live in separate scripts.

-- arguments, by name
local now, wid = tonumber(ARGV[1]), ARGV[2]
local decay, a0, b0, retention = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local half_life = tonumber(ARGV[7])
local count, report_ttl, holder_only = tonumber(ARGV[8]), tonumber(ARGV[9]), ARGV[10] == '1'
local REPORT = KEYS[16]

local S, INFL, PEND, STATS, OPEN, READY, POST, CANCELS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local HIST, WORKERS, WINFO, POLICY, GC, GSTATE = KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14]
local PROMPTS, YIELD, WAKE, LEVELS = KEYS[15], KEYS[17], KEYS[18], KEYS[19]
local levels_n = tonumber(ARGV[12])
local reward_view = levels_n > 0

local results = cjson.decode(ARGV[11])
local function arg(i, j) return results[i][j] end
local MAX_ERRORS_PER_SLOT = 3

-- Every read goes through the caches below and every write is held until the end, then sent as
-- one command per key (a hash's fields in one HSET, a list's pushes in one LPUSH, in order): the
-- script's Redis work grows with the keys a call touches, not with its results.
local function hset_map(key, map)
  local flat = {}
  for f, v in pairs(map) do flat[#flat + 1] = f; flat[#flat + 1] = v end
  if #flat > 0 then call_chunked('HSET', key, flat) end
end
local function hmget_map(key, ids)
  local out = {}
  for i = 1, #ids, CHUNK do
    local part = {unpack(ids, i, math.min(i + CHUNK - 1, #ids))}
    local got = redis.call('HMGET', key, unpack(part))
    for j, id in ipairs(part) do out[id] = got[j] end
  end
  return out
end

-- The call's state: read once, changed in memory, written back once by the write functions.
-- rids[i], rgid[i], rsl[i]: result i's rollout id, group id and slot (rgid[i] nil for an id that
-- names no slot); gids: the groups reported on, each once, gids_seen[gid] its index in KEYS
local rids, rgid, rsl, gids_seen, gids = {}, {}, {}, {}, {}
local slot, slot_writes = {}, {}      -- slot states (the slots hash)
local groups = {}                     -- gid -> the group's fields (g.w: its fields to write)
local gstate, gstate_writes = {}, {}  -- gid -> open | committed | abandoned | ready | dropped
local incr, fincr, hist, level_incr = {}, {}, {}, {}   -- counters, added once at the end
local version, clock = 0, 0           -- the policy version and the pool's clock (epochs)
local posts, post_writes = {}, {}     -- pid -> its posterior, decoded once
local cancel_adds, cancel_workers = {}, {}   -- other workers' cancel lists, appended at the end
local open_final, open_order = {}, {}        -- the open-groups zset's changes, in order
local infl_rem, pend_push, ready_push, gc_add = {}, {}, {}, {}
local tally = {accepted = 0, dups = 0, late = 0, released = 0, tokens = 0, newest = -1}
local decided, order = {}, {}         -- gid -> its decision for the answer, in report order

-- --- reading -------------------------------------------------------------------------------

-- Slot states: every reported rollout's at once (a group's other slots are read when it is
-- cancelled). Each rollout id is split into group id and slot once, here.
local function read_slots()
  for i = 1, count do
    rids[i] = arg(i, 1)
    local gid, sl = string.match(rids[i], '^(.*):(%d+)$')
    rgid[i], rsl[i] = gid, sl
    if gid and not gids_seen[gid] then gids_seen[gid] = tonumber(arg(i, 2)); gids[#gids + 1] = gid end
  end
  slot = hmget_map(S, rids)
end
local function set_slot(rid, st) slot[rid] = st; slot_writes[rid] = st end

-- groups: the fields decisions read, and the per-slot fields of the slots reported here (a
-- slot's error count only with a worker error for it: each field read costs as much as the rest)
local GROUP_FIELDS = {'prompt_id', 'k', 'issued', 'done', 's', 'f', 'thr_f', 'thr_s',
  'deliver_sat', 'commit', 'audit', 'audited', 'min_v', 'cancelled', 'pf', 'ps', 'lv', 'lvn', 'lvx',
  'ra', 'pc'}
-- per-level plans are read only where they can exist
if reward_view then GROUP_FIELDS[#GROUP_FIELDS + 1] = 'lp' end

local function read_groups()
  local per_group_fields = {}
  for i = 1, count do
    local gid = rgid[i]
    if gid then
      local list = per_group_fields[gid] or {}
      list[#list + 1] = 'learned:' .. rsl[i]
      if tonumber(arg(i, 3)) == -2 then list[#list + 1] = 'errors:' .. rsl[i] end
      per_group_fields[gid] = list
    end
  end
  for _, gid in ipairs(gids) do
    local fields = {unpack(GROUP_FIELDS)}
    for _, field in ipairs(per_group_fields[gid]) do fields[#fields + 1] = field end
    local gkey = KEYS[gids_seen[gid]]
    local v = redis.call('HMGET', gkey, unpack(fields))
    if v[1] then
      local g = {key = gkey, gid = gid, pid = v[1], k = tonumber(v[2]), issued = tonumber(v[3]),
        done = tonumber(v[4]), s = tonumber(v[5]), f = tonumber(v[6]), thr_f = tonumber(v[7]),
        thr_s = tonumber(v[8]), deliver_sat = v[9] == '1', commit = v[10], audit = v[11] == '1',
        audited = v[12] == '1', min_v = v[13], cancelled = tonumber(v[14] or '0'), slot = {},
        w = {}, ptab = {pf = v[15], ps = v[16]}, lv = v[17], lvn = tonumber(v[18] or '0'),
        lvx = tonumber(v[19] or '0'), ra = v[20], pc = v[21], lp = reward_view and v[22] or nil}
      for j = #GROUP_FIELDS + 1, #fields do g.slot[fields[j]] = v[j] end
      groups[gid] = g
    end
  end
end

-- The rollout ids that name no slot of a group reported on (a rollout id names its group's key
-- in KEYS: the key must be the one for this id).
local function unknown_rollouts()
  local unknown = {}
  for i = 1, count do
    local gid = rgid[i]
    if not slot[rids[i]] or not gid or not groups[gid] or KEYS[tonumber(arg(i, 2))] ~= groups[gid].key then
      unknown[#unknown + 1] = rids[i]
    end
  end
  return unknown
end

local function set_gstate(gid, st) gstate[gid] = st; gstate_writes[gid] = st end
local function count_up(field, n) incr[field] = (incr[field] or 0) + n end

-- The pool's clock, in epochs: prompts consumed (groups opened + prompts skipped) per prompt.
-- A prompt is visited about once per epoch whatever the number of policy versions in between,
-- so a half-life on this clock keeps its history until its next visit (the store reads the
-- same clock as store.prompts.pool_clock).
local function pool_clock()
  local n = redis.call('HLEN', PROMPTS)
  if n == 0 then return 0 end
  local c = redis.call('HMGET', STATS, 'groups_opened', 'groups_skipped')
  return (tonumber(c[1] or '0') + tonumber(c[2] or '0')) / n
end

-- What the decisions read besides the groups: their states, the policy version, the pool's
-- clock, and the posteriors of their prompts (decoded once, written once).
local function read_decision_state()
  gstate = hmget_map(GSTATE, gids)
  version = tonumber(redis.call('HGET', POLICY, 'version') or '0')
  clock = pool_clock()
  local pids, pid_seen = {}, {}
  for _, gid in ipairs(gids) do
    local pid = groups[gid].pid
    if not pid_seen[pid] then pid_seen[pid] = true; pids[#pids + 1] = pid end
  end
  for pid, raw in pairs(hmget_map(POST, pids)) do posts[pid] = raw and cjson.decode(raw) or false end
end

-- --- learning and deciding -----------------------------------------------------------------

-- cjson writes 14 significant digits: what a later step of this call reads is that value, as
-- it was when every step wrote the posterior and the next one read it back
local function r14(x) return tonumber(string.format('%.14g', x)) end
local function as_stored(p)
  for _, f in ipairs({'a', 'b', 't'}) do
    if type(p[f]) == 'number' then p[f] = r14(p[f]) end
  end
  if p.lc then
    for level, c in pairs(p.lc) do p.lc[level] = r14(c) end
  end
end

-- The reward view's Dirichlet counts: old ones weigh w as a and b do, then this level gains one.
local function learn_level(p, w, level)
  local lc = p.lc or {}
  if w ~= 1.0 then
    for other, c in pairs(lc) do lc[other] = w * c end
  end
  lc[level] = (lc[level] or 0) + 1
  p.lc = lc
  level_incr[level] = (level_incr[level] or 0) + 1
end

-- weight of old evidence: decay^versions * 0.5^(epochs / half-life), as allocation.decay_weight
local function update_posterior(pid, success, level)
  local p = posts[pid] or {a = a0, b = b0, v = version, t = clock}
  local elapsed, epochs = version - (p.v or version), clock - (p.t or clock)
  local w = 1.0
  if elapsed > 0 then w = decay ^ elapsed end
  if half_life > 0 and epochs > 0 then w = w * 0.5 ^ (epochs / half_life) end
  if w ~= 1.0 then p.a, p.b = a0 + w * (p.a - a0), b0 + w * (p.b - b0) end
  p.v = math.max(version, p.v or version)
  p.t = math.max(clock, p.t or clock)
  if success == 1 then p.a = p.a + 1 else p.b = p.b + 1 end
  if level then learn_level(p, w, level) end
  p.rollouts = (p.rollouts or 0) + 1
  p.successes = (p.successes or 0) + success
  as_stored(p)
  posts[pid] = p
  post_writes[pid] = true
end

-- Each slot teaches its prompt's posterior once, with the first outcome reported for it: a second
-- answer for the same slot (a re-issued copy, a result sent by a non-holder and then the holder's
-- own, a late result repeated) is one sample counted twice otherwise.
-- The same once-per-slot sample feeds the mean completion tokens of a success and of a failure
-- (learned_* counters), which tau_low=auto prices rollouts with under SARA_AUTO_PRICE=tokens.
local function learn_once(g, sl, success, level, tokens)
  local field = 'learned:' .. sl
  if not g.slot[field] then
    g.slot[field] = '1'
    g.w[field] = 1
    update_posterior(g.pid, success, level)
    local side = success == 1 and 'success' or 'failure'
    count_up('learned_' .. side .. '_rollouts', 1)
    count_up('learned_' .. side .. '_tokens', tokens)
  end
end

-- Count a group's verdict in its prompt's history, and remember the outcome class the selection
-- layer learns from: 'F' all-fail, 'M' mixed, 'S' all-success (the side a pure group ended on).
-- An abandoned group also records q, its chance of having ended mixed (rounded to 1e-6 so the
-- entry stays short and Python's mirror rounds alike): DPS reads it as a censored observation.
-- Every group end is also counted by class (groups_ended_*): GRESO's rates adapt to their shares.
local MAX_OBSERVATIONS = 16
local ENDED = {F = 'groups_ended_all_fail', M = 'groups_ended_mixed', S = 'groups_ended_all_success'}
local function record_outcome(pid, field, outcome, q)
  count_up(ENDED[outcome], 1)
  local p = posts[pid]
  if not p then return end
  p[field] = (p[field] or 0) + 1
  local obs = p.obs or {}
  if q then
    obs[#obs + 1] = {version, outcome, math.floor(q * 1e6 + 0.5) / 1e6}
  else
    obs[#obs + 1] = {version, outcome}
  end
  if #obs > MAX_OBSERVATIONS then table.remove(obs, 1) end
  p.obs = obs
  as_stored(p)
  post_writes[pid] = true
end

-- cancel lists of other workers, appended to once at the end (this worker's comes back now)
local function add_cancel(worker, rid)
  if not cancel_adds[worker] then cancel_adds[worker] = {}; cancel_workers[#cancel_workers + 1] = worker end
  local list = cancel_adds[worker]
  list[#list + 1] = rid
end

-- the open-groups zset and its running total (expected yield in units of 1e-9 groups)
local function set_open(gid, score)
  if open_final[gid] == nil then open_order[#open_order + 1] = gid end
  open_final[gid] = score
end

local function issue(g, from, to)
  if to <= from then return end
  for sl = to - 1, from, -1 do  -- backwards: pushed onto the front, they keep slot order
    local rid = g.gid .. ':' .. sl
    set_slot(rid, 'p')
    -- decided groups and probes that decide a group go first: they finish or free work sooner
    pend_push[#pend_push + 1] = rid
  end
  g.w.issued = to
  g.issued = to
  count_up('rollouts_issued', to - from)
end

local function cancel_outstanding(g, issued)
  local missing = {}
  for sl = 0, issued - 1 do
    local rid = g.gid .. ':' .. sl
    if slot[rid] == nil then missing[#missing + 1] = rid end
  end
  if #missing > 0 then
    for rid, st in pairs(hmget_map(S, missing)) do slot[rid] = st end
  end
  local n = 0
  for sl = 0, issued - 1 do
    local rid = g.gid .. ':' .. sl
    local st = slot[rid]
    if st == 'p' then
      set_slot(rid, 'c')
      n = n + 1
    elseif st and string.sub(st, 1, 2) == 'l|' then
      set_slot(rid, 'c')
      infl_rem[#infl_rem + 1] = rid
      add_cancel(string.match(st, '^l|[^|]*|(.*)$'), rid)
      n = n + 1
    end
  end
  if n > 0 then
    g.cancelled = g.cancelled + n
    g.w.cancelled = g.cancelled
    count_up('rollouts_cancelled', n)
  end
end

local function retire(gid, state)
  set_gstate(gid, state)
  set_open(gid, false)
  gc_add[#gc_add + 1] = now + retention
  gc_add[#gc_add + 1] = gid
end

local function make_ready(g, done)
  set_gstate(g.gid, 'ready')
  set_open(g.gid, false)
  ready_push[#ready_push + 1] = g.gid .. '|' .. (g.min_v or '') .. '|' .. done
end

-- P(the group would still have ended mixed had it run to k) under the prompt's own learned
-- posterior (which already holds this group's outcomes): 1 - E[(1-g)^rest] on the failing side,
-- 1 - E[g^rest] on the succeeding side, each a product of one-step predictive probabilities.
-- The prior's p_eff bounds false abandons; this estimates them, and sharpens as prompts recur.
local function mixed_chance_under_posterior(pid, failing, rest)
  local p = posts[pid] or {a = a0, b = b0}
  local stay = 1.0
  for j = 0, rest - 1 do
    stay = stay * ((failing and p.b or p.a) + j) / (p.a + p.b + j)
  end
  return 1.0 - stay
end

-- The same under the reward view: the group stayed at `level`; the prompt's Dirichlet is alpha0
-- per level in use plus its learned counts (reward_levels.mixed_chance_levels, in this order).
local function mixed_chance_at_level(pid, level, rest)
  local lc = (posts[pid] or {}).lc or {}
  local seen, counted = 0, 0
  for _, c in pairs(lc) do seen = seen + 1; counted = counted + c end
  local here = a0 + (lc[level] or 0)
  local total = math.max(levels_n, seen) * a0 + counted
  local stay = 1.0
  for j = 0, rest - 1 do stay = stay * (here + j) / (total + j) end
  return 1.0 - stay
end

-- An audited group at its abandonment point runs on to k; what that costs is counted.
local function begin_audit(g)
  g.audited = true
  g.w.audited = 1
  count_up('groups_audited', 1)
  count_up('audit_rollouts', g.k - g.issued)
  issue(g, g.issued, g.k)
end

-- p_eff after n results on one pure side ('pf': failures only, 'ps': successes only, 'lp': the
-- run's level's own table), from the plan's tables: each a JSON list in one field, decoded when
-- a decision first needs it.
local function p_eff_at(g, side, n)
  local tab = g.ptab[side]
  if type(tab) == 'string' then
    tab = cjson.decode(tab)
    g.ptab[side] = tab
  end
  return tab[n + 1]
end

-- Under the reward view: the threshold and table side of the group's run, its level's own
-- when the plan has one for it (per-prompt plans, `lp`), else the plan's default (thr_f, pf).
local function level_plan(g)
  if g.lp and g.lv then
    if type(g.lp) == 'string' then g.lp = cjson.decode(g.lp) end
    local own = g.lp[g.lv]
    if own then
      g.ptab.lp = own[2]
      return own[1], 'lp'
    end
  end
  return g.thr_f, 'pf'
end

-- A mixed group is committed: it will be delivered (filled to k first under commit 'complete').
local function commit_group(g)
  set_gstate(g.gid, 'committed')
  g.w.p_eff = 1
  set_open(g.gid, 1)
  count_up('groups_committed', 1)
  if g.audited then count_up('audits_mixed', 1) end
  record_outcome(g.pid, 'committed', 'M')
  if g.commit == 'complete' then issue(g, g.issued, g.k) end
  return 'commit'
end

-- A group of a peer's policy (rounds, pilots) ends abandoned, with the side it recorded.
local function abandon_group(g, side, q)
  retire(g.gid, 'abandoned')
  count_up('groups_abandoned', 1)
  count_up('rollouts_not_spent_on_abandoned_groups', g.k - g.issued)
  hist[tostring(g.done)] = (hist[tostring(g.done)] or 0) + 1
  record_outcome(g.pid, 'abandoned', side, q)
  return 'abandon'
end

-- A group of a peer's policy stays open: its p_eff (1 once mixed) scores it for flow control.
local function keep_open(g)
  local p = 1
  if g.s == 0 or g.f == 0 then p = p_eff_at(g, g.s == 0 and 'pf' or 'ps', math.min(g.done, g.k)) end
  g.w.p_eff = p
  set_open(g.gid, p)
  return 'continue'
end

-- A group sampled in rounds (Reinforce-Ada; math/reinforce_ada.py is the reference): nothing is
-- decided while its round is out; then it stops once its rule's successes and failures are in
-- (or at its budget k), committed when mixed, and otherwise takes one more round. Its commit is
-- 'partial': it is delivered with what it has. One that stops pure before k (the "positive"
-- rule met by successes only) is abandoned; one pure at k is dropped as saturated, as under DS.
local function decide_round(g)
  if type(g.ra) == 'string' then
    local size, need_s, need_f = string.match(g.ra, '^(%d+),(%d+),(%d+)$')
    g.ra = {size = tonumber(size), s = tonumber(need_s), f = tonumber(need_f)}
  end
  local mixed = g.s > 0 and g.f > 0
  if g.done >= g.issued and ((g.s >= g.ra.s and g.f >= g.ra.f) or g.issued >= g.k) then
    if mixed then return commit_group(g) end
    if g.issued < g.k then
      local failing = g.s == 0
      return abandon_group(g, failing and 'F' or 'S',
                           mixed_chance_under_posterior(g.pid, failing, g.k - g.done))
    end
  elseif g.done >= g.issued then
    issue(g, g.issued, math.min(g.issued + g.ra.size, g.k))
  end
  return keep_open(g)
end

-- A pilot ends abandoned: out of its band, or stopped by SARA's rule. Its side (F, S, or M for a
-- mixed pilot outside the band) goes to the prompt's history, where the scheduler reads a
-- solved pilot (S) to exclude the prompt.
local function abandon_pilot(g)
  cancel_outstanding(g, g.issued)
  local side = 'M'
  if g.s == 0 then side = 'F' elseif g.f == 0 then side = 'S' end
  return abandon_group(g, side)
end

-- A group decided on its pilot (Pilot-Commit; math/pilot_commit.py is the reference): once its
-- pilot is complete it is committed (filled to k: its commit is 'complete') when the pilot's
-- successes lie in the band [low, high], and abandoned otherwise. The band holds mixed pilots
-- only, so a solved or hopeless pilot is always abandoned. Composed with SARA's stopping, thr_f
-- is SARA's threshold for the pilot: only that many are issued at first, a prefix failing
-- throughout is abandoned there, and its first success issues the rest of the pilot (without
-- it, thr_f is k + 1 and the pilot is issued whole).
local function decide_pilot(g)
  if type(g.pc) == 'string' then
    local pilot, low, high = string.match(g.pc, '^(%d+),(%d+),(%d+)$')
    g.pc = {pilot = tonumber(pilot), low = tonumber(low), high = tonumber(high)}
  end
  if g.done >= g.pc.pilot then
    if g.s >= g.pc.low and g.s <= g.pc.high then return commit_group(g) end
    return abandon_pilot(g)
  end
  if g.s == 0 and g.f >= g.thr_f then return abandon_pilot(g) end
  if g.s > 0 and g.issued < g.pc.pilot then issue(g, g.issued, g.pc.pilot) end
  return keep_open(g)
end

-- Decide an open group after one more outcome; returns the decision.
local function decide_open(g)
  local gid = g.gid
  if g.ra then return decide_round(g) end
  if g.pc then return decide_pilot(g) end
  -- under the reward view the two sides are "at the first result's level" and "elsewhere": a
  -- group is mixed once its levels differ, and a pure prefix is always on the first side
  local s, f = g.s, g.f
  if reward_view then s, f = g.lvx, g.lvn end
  if s > 0 and f > 0 then return commit_group(g) end
  local failing = s == 0
  local n = failing and f or s
  -- the side DPS learns from: all below or all at/above success_threshold
  local side = g.s == 0 and 'F' or 'S'
  if not reward_view then side = failing and 'F' or 'S' end
  local thr, tab = g.thr_s, 'ps'
  if reward_view then
    thr, tab = level_plan(g)
  elseif failing then
    thr, tab = g.thr_f, 'pf'
  end
  -- the plan's table covers every prefix up to the threshold (or k)
  local p = p_eff_at(g, tab, math.min(n, thr, g.k))
  if n >= thr and g.audit and not g.audited then begin_audit(g) end
  if n >= thr and not g.audited then
    cancel_outstanding(g, g.issued)
    retire(gid, 'abandoned')
    g.w.p_eff = p
    count_up('groups_abandoned', 1)
    count_up('rollouts_not_spent_on_abandoned_groups', g.k - g.issued)
    fincr.expected_false_abandons = (fincr.expected_false_abandons or 0) + p
    local q
    if reward_view then
      q = mixed_chance_at_level(g.pid, g.lv, g.k - n)
    else
      q = mixed_chance_under_posterior(g.pid, failing, g.k - n)
    end
    fincr.estimated_false_abandons = (fincr.estimated_false_abandons or 0) + q
    hist[tostring(g.done)] = (hist[tostring(g.done)] or 0) + 1
    record_outcome(g.pid, 'abandoned', side, q)
    return 'abandon'
  end
  g.w.p_eff = p
  -- flow control counts expected deliveries: every group is one when saturated ones are kept
  set_open(gid, g.deliver_sat and 1 or p)
  issue(g, g.issued, math.min(thr, g.k))
  return 'continue'
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

-- --- applying one result ------------------------------------------------------------------

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

-- --- writing back: one command per key ------------------------------------------------------

-- Slots, the inflight and pending queues, the ready list, group states, the collection
-- schedule, the groups and the posteriors. Returns the ready list's length (0 when nothing was
-- made ready): it goes with the wake-up, so a trainer waiting for a batch of n groups sleeps on
-- through fewer.
local function write_state()
  hset_map(S, slot_writes)
  if #infl_rem > 0 then call_chunked('ZREM', INFL, infl_rem) end
  if #pend_push > 0 then call_chunked('LPUSH', PEND, pend_push) end
  local ready_len = 0
  if #ready_push > 0 then ready_len = redis.call('RPUSH', READY, unpack(ready_push)) end
  hset_map(GSTATE, gstate_writes)
  if #gc_add > 0 then call_chunked('ZADD', GC, gc_add) end
  for _, gid in ipairs(gids) do
    local g = groups[gid]
    g.w.done, g.w.s, g.w.f = g.done, g.s, g.f
    if reward_view then g.w.lvn, g.w.lvx = g.lvn, g.lvx end
    hset_map(g.key, g.w)
  end
  local post_out = {}
  for pid in pairs(post_writes) do post_out[pid] = cjson.encode(posts[pid]) end
  hset_map(POST, post_out)
  return ready_len
end

-- The open-groups zset, and the running total of its scores that open_groups.lua reads.
-- Returns whether room was freed under flow control, and the ready length to announce (-1 when
-- no group is left open: a draining run then delivers what is ready, however few).
local function write_open_groups(ready_len)
  if #open_order == 0 then return false, ready_len end
  local old = redis.call('ZMSCORE', OPEN, unpack(open_order))
  local delta, adds, rems = 0, {}, {}
  for i, gid in ipairs(open_order) do
    if old[i] then delta = delta - yield_units(old[i]) end
    local score = open_final[gid]
    if score then
      adds[#adds + 1] = score; adds[#adds + 1] = gid
      delta = delta + yield_units(score)
    else
      rems[#rems + 1] = gid
    end
  end
  if #adds > 0 then call_chunked('ZADD', OPEN, adds) end
  if #rems > 0 then
    call_chunked('ZREM', OPEN, rems)
    if redis.call('ZCARD', OPEN) == 0 then ready_len = -1 end
  end
  if delta ~= 0 then redis.call('INCRBY', YIELD, delta) end
  return delta < 0, ready_len
end

-- The run's counters, the abandonment histogram, the reward levels and this worker's figures.
local function write_counters()
  count_up('rollouts_completed', tally.accepted)
  count_up('results_duplicate', tally.dups)
  count_up('results_late', tally.late)
  count_up('tokens_generated', tally.tokens)
  for field, n in pairs(incr) do redis.call('HINCRBY', STATS, field, n) end
  for field, x in pairs(fincr) do redis.call('HINCRBYFLOAT', STATS, field, x) end
  for field, n in pairs(hist) do redis.call('HINCRBY', HIST, field, n) end
  for level, n in pairs(level_incr) do redis.call('HINCRBY', LEVELS, level, n) end
  redis.call('HINCRBY', WINFO, wid .. '|completed', tally.accepted)
  redis.call('HINCRBY', WINFO, wid .. '|tokens', tally.tokens)
  redis.call('HSET', WINFO, wid .. '|policy_version', tally.newest)
  redis.call('ZADD', WORKERS, now, wid)
end

-- Cancels: the other workers' lists grow; this worker's comes back now (returned, as text).
local function take_cancels()
  local others_list = {}
  for _, worker in ipairs(cancel_workers) do
    if worker ~= wid then others_list[#others_list + 1] = worker end
  end
  if #others_list > 0 then
    local cur = hmget_map(CANCELS, others_list)
    local out = {}
    for _, worker in ipairs(others_list) do
      local add = table.concat(cancel_adds[worker], ' ')
      out[worker] = cur[worker] and (cur[worker] .. ' ' .. add) or add
    end
    hset_map(CANCELS, out)
  end
  local cancel = redis.call('HGET', CANCELS, wid) or ''
  local mine = cancel_adds[wid]
  if mine then
    local add = table.concat(mine, ' ')
    cancel = cancel ~= '' and (cancel .. ' ' .. add) or add
  end
  if cancel ~= '' then redis.call('HDEL', CANCELS, wid) end
  return cancel
end

-- The answer, kept for a retry of the same report id when it has one.
local function reply(cancel)
  local flat = {}
  for _, gid in ipairs(order) do flat[#flat + 1] = gid; flat[#flat + 1] = decided[gid] end
  local t = tally
  if report_ttl > 0 then
    redis.call('SET', REPORT, cjson.encode({t.accepted, t.dups, t.late, flat, cancel, t.released}),
      'EX', report_ttl)
  end
  return {'ok', t.accepted, t.dups, t.late, flat, cancel, t.released}
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
