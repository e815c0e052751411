-- What every allocation policy of apply_results.lua shares, put in front of it after
-- _results_state.lua (redis_format.ScriptSpec.library; used by apply_results.lua only): the
-- posteriors' learning (once per slot), the prompts' outcome history, issuing and cancelling
-- rollouts, retiring and readying groups, the false-abandon estimate under the posterior, the
-- plan's p_eff tables, and the three ends a policy's decision takes: commit_group,
-- abandon_group and keep_open. The policies themselves are in _policy_<name>.lua.

-- --- learning and bookkeeping -------------------------------------------------------------

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
