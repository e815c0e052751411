-- Open new groups while the flow-control target allows, and queue their first rollouts.
-- KEYS[1] = stats hash           KEYS[2] = open_groups zset (group -> p_eff)
-- KEYS[3] = ready list           KEYS[4] = pending list
-- KEYS[5] = slots hash           KEYS[6] = group_states hash
-- KEYS[7] = group_prompt hash    KEYS[8] = posteriors hash
-- KEYS[9] = run_state string      KEYS[10] = prompts_off hash (disabled / deleted prompts)
-- KEYS[10 + i] = hash of the i-th candidate group
-- ARGV[1] = now                  ARGV[2] = flow_target (prefetch_batches x batch_size)
-- ARGV[3] = specs: JSON list of group specs, in the order to open them:
--           {gid, pid, k, thr_f, thr_s, issue, pf, ps, deliver_sat, commit}
-- ARGV[4] = skipped: prompts skipped before any rollout (counted only)
-- ARGV[5] = audit_fraction: the share of groups that, should SARA decide to abandon them, are
--           completed to k instead so the run can measure what abandoning loses
-- ARGV[6] = seed (of the audit draw)
-- returns the number of specs consumed (a prefix of the list: the rest did not fit): opened, or
--         passed over because their prompt is disabled or deleted. 0 while the run is paused or
--         draining: the check lives here so no replica can open a group after a pause is set.
if redis.call('EXISTS', KEYS[9]) == 1 then return 0 end
local now = ARGV[1]
local target = tonumber(ARGV[2])
local specs = cjson.decode(ARGV[3])

local expected = redis.call('LLEN', KEYS[3])
local scores = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for i = 2, #scores, 2 do expected = expected + tonumber(scores[i]) end

if tonumber(ARGV[4]) > 0 then redis.call('HINCRBY', KEYS[1], 'groups_skipped', ARGV[4]) end

local audit_fraction, seed = tonumber(ARGV[5]), ARGV[6]

-- A group is audited by a hash of (seed, prompt, visit), not by its outcomes, so the audited
-- groups are a uniform sample of the ones SARA would abandon; a hash keeps any replica and the
-- reference model in agreement where a random draw would not.
local function audited(pid, visit)
  if audit_fraction <= 0 then return 0 end
  local h = tonumber(string.sub(redis.sha1hex(seed .. ':' .. pid .. ':' .. visit), 1, 12), 16)
  return (h / 281474976710656 < audit_fraction) and 1 or 0
end

-- Open one group from its spec; returns its expected yield p0.
local function open_one(gkey, g)
  -- a plan that delivers saturated groups (uniform) yields a group for every group opened
  local p0 = (g.deliver_sat == 1) and 1 or g.pf[1]
  redis.call('HSET', gkey, 'prompt_id', g.pid, 'k', g.k, 'issued', g.issue, 'done', 0,
    's', 0, 'f', 0, 'cancelled', 0, 'thr_f', g.thr_f, 'thr_s', g.thr_s,
    'deliver_sat', g.deliver_sat, 'commit', g.commit, 'p_eff', g.pf[1], 'created_at', now)
  local visit = 0
  -- p_eff tables, one field per prefix length: pf:n (n failures), ps:n (n successes)
  for n, p in ipairs(g.pf) do redis.call('HSET', gkey, 'pf:' .. (n - 1), p) end
  for n, p in ipairs(g.ps) do redis.call('HSET', gkey, 'ps:' .. (n - 1), p) end
  redis.call('HSET', KEYS[6], g.gid, 'open')
  redis.call('HSET', KEYS[7], g.gid, g.pid)
  redis.call('ZADD', KEYS[2], p0, g.gid)
  local raw = redis.call('HGET', KEYS[8], g.pid)
  if raw then
    local post = cjson.decode(raw)
    visit = post.groups or 0
    post.groups = visit + 1
    post.last = g.gid
    redis.call('HSET', KEYS[8], g.pid, cjson.encode(post))
  end
  redis.call('HSET', gkey, 'audit', audited(g.pid, visit))
  for slot = 0, g.issue - 1 do
    local rid = g.gid .. ':' .. slot
    redis.call('HSET', KEYS[5], rid, 'p')
    redis.call('RPUSH', KEYS[4], rid)
  end
  redis.call('HINCRBY', KEYS[1], 'rollouts_issued', g.issue)
  redis.call('HINCRBY', KEYS[1], 'groups_opened', 1)
  return p0
end

local opened = 0
for i, g in ipairs(specs) do
  if expected >= target then break end
  -- consumed, not opened: a disabled or deleted prompt is never opened again
  if redis.call('HEXISTS', KEYS[10], g.pid) == 0 then
    expected = expected + open_one(KEYS[10 + i], g)
  end
  opened = opened + 1
end
return opened
