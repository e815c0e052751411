-- The plain allocation policy of apply_results.lua, put in front of it after the common
-- libraries (redis_format.ScriptSpec.library; used by apply_results.lua only): SARA, DS and
-- uniform, under the outcome view and the reward view (SARA_EFFECTIVE=reward). It decides an
-- open group without a round rule or a pilot after each outcome: commit it once mixed, abandon
-- it once a pure prefix reaches the plan's threshold (or run it on to k when it is audited), and
-- otherwise keep it open and issue up to the threshold. The Python reference is
-- math/allocation.py (the plan and its p_eff tables; the reward view's in math/reward_levels.py).

-- mixed_chance_under_posterior (_results_learn.lua) under the reward view: the group stayed at
-- `level`; the prompt's Dirichlet is alpha0 per level in use plus its learned counts
-- (reward_levels.mixed_chance_levels, in this order).
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

-- Decide an open group of the plain policy after one more outcome; returns the decision.
local function decide_sara(g)
  local gid = g.gid
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
