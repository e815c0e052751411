-- Open new groups while the flow-control target allows, and queue their first rollouts (the
-- opening itself is _open.lua's open_specs, which lease.lua shares).
-- KEYS[1] = stats hash           KEYS[2] = open_groups zset (group -> p_eff)
-- KEYS[3] = ready list           KEYS[4] = pending list
-- KEYS[5] = slots hash           KEYS[6] = group_states hash
-- KEYS[7] = group_prompt hash    KEYS[8] = posteriors hash
-- KEYS[9] = run_state string      KEYS[10] = prompts_off hash (disabled / deleted prompts)
-- KEYS[11] = open_yield string (the open_groups zset's scores summed, in 1e-9 groups)
-- KEYS[12] = wake stream (long polls of every replica wait on it)
-- KEYS[12 + i] = hash of the i-th candidate group
-- ARGV[1] = now                  ARGV[2] = flow_target (prefetch_batches x batch_size)
-- ARGV[3] = specs: JSON list of group specs, in the order to open them:
--           {gid, pid, k, thr_f, thr_s, issue, pf, ps, p0, deliver_sat, commit}: pf and ps are
--           the p_eff tables as JSON text (stored verbatim), p0 their first entry as text
-- ARGV[4] = skipped: prompts skipped before any rollout (counted only)
-- ARGV[5] = audit_fraction: the share of groups that, should SARA decide to abandon them, are
--           completed to k instead so the run can measure what abandoning loses
-- ARGV[6] = seed (of the audit draw)
-- ARGV[7] = floor_target, ARGV[8] = floor_ready: the work floor (flow_target_units in
--           _prelude.lua; floor_target 0: none)
-- ARGV[9] = skipped_busy: prompts the scheduler's draw passed over because a group of theirs was
--           still in flight (counted only, even while paused: the draw happened)
-- returns the number of specs consumed (a prefix of the list: the rest did not fit): opened, or
--         passed over because their prompt is disabled or deleted. 0 while the run is paused or
--         draining: the check lives here so no replica can open a group after a pause is set.
local STATS, OPEN_GROUPS, READY, PENDING, SLOTS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local GROUP_STATES, GROUP_PROMPT, POSTERIORS, RUN_STATE = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local PROMPTS_OFF, OPEN_YIELD, WAKE = KEYS[10], KEYS[11], KEYS[12]
local function group_key(i) return KEYS[12 + i] end
local now, flow_target, specs_json, skipped = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local audit_fraction, seed = tonumber(ARGV[5]), ARGV[6]
local floor_target, floor_ready = tonumber(ARGV[7]), tonumber(ARGV[8])
if tonumber(ARGV[9]) > 0 then redis.call('HINCRBY', STATS, 'prompts_skipped_busy', ARGV[9]) end
if redis.call('EXISTS', RUN_STATE) == 1 then return 0 end
local target = flow_target_units(READY, flow_target, floor_target, floor_ready)
local specs = cjson.decode(specs_json)
local expected = flow_expected(READY, OPEN_YIELD)
if skipped > 0 then redis.call('HINCRBY', STATS, 'groups_skipped', ARGV[4]) end
local K = {stats = STATS, open = OPEN_GROUPS, pending = PENDING, slots = SLOTS,
  states = GROUP_STATES, prompt = GROUP_PROMPT, posteriors = POSTERIORS, off = PROMPTS_OFF,
  yield = OPEN_YIELD, wake = WAKE}
return (open_specs(K, specs, group_key, target, expected, now, audit_fraction, seed, 0))
