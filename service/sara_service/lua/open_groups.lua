-- Open new groups while the flow-control target allows, and queue their first rollouts.
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
-- returns the number of specs consumed (a prefix of the list: the rest did not fit): opened, or
--         passed over because their prompt is disabled or deleted. 0 while the run is paused or
--         draining: the check lives here so no replica can open a group after a pause is set.
if redis.call('EXISTS', KEYS[9]) == 1 then return 0 end
local now = ARGV[1]
local target = tonumber(ARGV[2]) * YIELD_UNIT
local specs = cjson.decode(ARGV[3])
local expected = flow_expected(KEYS[3], KEYS[2], KEYS[11])

if tonumber(ARGV[4]) > 0 then redis.call('HINCRBY', KEYS[1], 'groups_skipped', ARGV[4]) end
if #specs == 0 then return 0 end

local audit_fraction, seed = tonumber(ARGV[5]), ARGV[6]

-- A group is audited by a hash of (seed, prompt, visit), not by its outcomes, so the audited
-- groups are a uniform sample of the ones SARA would abandon; a hash keeps any replica and the
-- reference model in agreement where a random draw would not.
local function audited(pid, visit)
  if audit_fraction <= 0 then return 0 end
  local h = tonumber(string.sub(redis.sha1hex(seed .. ':' .. pid .. ':' .. visit), 1, 12), 16)
  return (h / 281474976710656 < audit_fraction) and 1 or 0
end

-- what every spec may need, read at once: disabled prompts and posteriors
local pids = {}
for i, g in ipairs(specs) do pids[i] = g.pid end
local off = redis.call('HMGET', KEYS[10], unpack(pids))
local raw_posts = redis.call('HMGET', KEYS[8], unpack(pids))
local posts, post_writes = {}, {}
for i, pid in ipairs(pids) do
  if posts[pid] == nil then posts[pid] = raw_posts[i] and cjson.decode(raw_posts[i]) or false end
end

local states, prompts, zadds, slots, pushes = {}, {}, {}, {}, {}
local issued, opened_groups = 0, 0
-- Open one group from its spec; returns its expected yield p0.
local function open_one(gkey, g)
  -- a plan that delivers saturated groups (uniform) yields a group for every group opened
  local p0 = (g.deliver_sat == 1) and 1 or g.p0
  local post = posts[g.pid]
  local visit = 0
  if post then
    visit = post.groups or 0
    post.groups = visit + 1
    post.last = g.gid
    post_writes[g.pid] = true
  end
  -- the p_eff tables, each one field (a JSON list, entry n: after n failures / successes only):
  -- two fields where one per prefix length made every read of the hash ~40 fields long
  redis.call('HSET', gkey, 'prompt_id', g.pid, 'k', g.k, 'issued', g.issue, 'done', 0, 's', 0,
    'f', 0, 'cancelled', 0, 'thr_f', g.thr_f, 'thr_s', g.thr_s, 'deliver_sat', g.deliver_sat,
    'commit', g.commit, 'p_eff', g.p0, 'created_at', now, 'audit', audited(g.pid, visit),
    'pf', g.pf, 'ps', g.ps)
  states[#states + 1] = g.gid; states[#states + 1] = 'open'
  prompts[#prompts + 1] = g.gid; prompts[#prompts + 1] = g.pid
  zadds[#zadds + 1] = p0; zadds[#zadds + 1] = g.gid
  for slot = 0, g.issue - 1 do
    local rid = g.gid .. ':' .. slot
    slots[#slots + 1] = rid; slots[#slots + 1] = 'p'
    pushes[#pushes + 1] = rid
  end
  issued = issued + g.issue
  opened_groups = opened_groups + 1
  return yield_units(p0)
end

local consumed, added = 0, 0
for i, g in ipairs(specs) do
  if expected >= target then break end
  -- consumed, not opened: a disabled or deleted prompt is never opened again
  if not off[i] then
    local u = open_one(KEYS[12 + i], g)
    expected = expected + u
    added = added + u
  end
  consumed = consumed + 1
end
if opened_groups == 0 then return consumed end

call_chunked('HSET', KEYS[6], states)
call_chunked('HSET', KEYS[7], prompts)
call_chunked('ZADD', KEYS[2], zadds)
redis.call('INCRBY', KEYS[11], added)
local post_out = {}
for pid in pairs(post_writes) do
  post_out[#post_out + 1] = pid; post_out[#post_out + 1] = cjson.encode(posts[pid])
end
if #post_out > 0 then call_chunked('HSET', KEYS[8], post_out) end
call_chunked('HSET', KEYS[5], slots)
call_chunked('RPUSH', KEYS[4], pushes)
redis.call('HINCRBY', KEYS[1], 'rollouts_issued', issued)
redis.call('HINCRBY', KEYS[1], 'groups_opened', opened_groups)
redis.call('XADD', KEYS[12], 'MAXLEN', '~', 64, '*', 'w', 'lease')
return consumed
