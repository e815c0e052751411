-- Opening groups, put in front of the scripts that open them (redis_format.ScriptSpec.library):
-- open_groups.lua, and lease.lua, which opens groups itself when its queue runs short so that a
-- lease of a uniform-prior run is one call, not four.
-- open_specs(K, specs, group_key, target, expected, now, audit_fraction, seed, direct) opens the
-- specs in order while the expected yield stays under the target (both in yield units) and
-- returns how many it consumed (opened, or passed over because the prompt is disabled, deleted
-- or busy: a prefix of the list) and the first `direct` new rollout ids (0 from open_groups.lua):
-- the caller leases those itself, so they are neither queued nor marked pending here (lease.lua
-- calls it on an empty queue, where they are exactly what its next pop would take).
-- K names the keys: stats, open (open_groups zset), pending, slots, states (group_states),
-- prompt (group_prompt), posteriors, off (prompts_off), yield (open_yield), wake;
-- group_key(i) is the i-th spec's group hash. A spec is {gid, pid, k, thr_f, thr_s, issue, pf,
-- ps, p0, deliver_sat, commit, lp?, ra?, pc?}: pf and ps the p_eff tables as JSON text, stored
-- verbatim, and lp (per-level plans under the reward view's per-prompt plans), ra (a round
-- rule, Reinforce-Ada's) and pc (a pilot and its band, Pilot-Commit's) likewise, when present.

-- A group is audited by a hash of (seed, prompt, visit), not by its outcomes, so the audited
-- groups are a uniform sample of the ones SARA would abandon; a hash keeps any replica and the
-- reference model in agreement where a random draw would not. The draw: the first 48 bits of
-- sha1("<seed>:<prompt id>:<visit>") as a fraction of 2^48, audited when below audit_fraction.
local function audit_draw(audit_fraction, seed, pid, visit)
  if audit_fraction <= 0 then return 0 end
  local h = tonumber(string.sub(redis.sha1hex(seed .. ':' .. pid .. ':' .. visit), 1, 12), 16)
  return (h / 281474976710656 < audit_fraction) and 1 or 0
end

-- One group per prompt at a time: a prompt whose latest group (its posterior's `last`) is still
-- open, committed and filling, or ready and not yet delivered is busy, and is passed over
-- (consumed, not opened; counted as prompts_skipped_busy). A latest group that is gone (collected,
-- or lost) leaves the prompt free: the state is read, never a lock that could be left behind.
local BUSY = {open = true, committed = true, ready = true}
local function busy_prompts(K, pids, posts)
  local lasts, owners = {}, {}
  for _, pid in ipairs(pids) do
    local post = posts[pid]
    if post and post.last and not owners[post.last] then
      lasts[#lasts + 1] = post.last
      owners[post.last] = pid
    end
  end
  local busy = {}
  if #lasts == 0 then return busy end
  local states = redis.call('HMGET', K.states, unpack(lasts))
  for i, gid in ipairs(lasts) do
    if states[i] and BUSY[states[i]] then busy[owners[gid]] = true end
  end
  return busy
end

-- Up to `n` prompts from the front of the epoch queue whose last group is not busy, and whether
-- the queue ran short. Busy ones popped on the way are used up for this pass of the pool (their
-- group in flight is their turn) and counted; at most `n + spare` are popped in all, so a
-- queue full of busy prompts costs a bounded call.
local function pop_free(K, queue, n, spare)
  local free, popped, skipped = {}, 0, 0
  while #free < n and popped < n + spare do
    local want = math.min(n - #free, n + spare - popped)
    local pids = redis.call('LPOP', queue, want) or {}
    popped = popped + #pids
    if #pids > 0 then
      local raw = redis.call('HMGET', K.posteriors, unpack(pids))
      local posts = {}
      for i, pid in ipairs(pids) do posts[pid] = raw[i] and cjson.decode(raw[i]) or false end
      local busy = busy_prompts(K, pids, posts)
      for _, pid in ipairs(pids) do
        if busy[pid] then skipped = skipped + 1 else free[#free + 1] = pid; busy[pid] = true end
      end
    end
    if #pids < want then
      if skipped > 0 then redis.call('HINCRBY', K.stats, 'prompts_skipped_busy', skipped) end
      return free, true
    end
  end
  if skipped > 0 then redis.call('HINCRBY', K.stats, 'prompts_skipped_busy', skipped) end
  return free, false
end

local function open_specs(K, specs, group_key, target, expected, now, audit_fraction, seed,
                          direct)
  local handed = {}
  if #specs == 0 then return 0, handed end
  -- what every spec may need, read at once: disabled prompts, posteriors, busy prompts
  local pids = {}
  for i, g in ipairs(specs) do pids[i] = g.pid end
  local off = redis.call('HMGET', K.off, unpack(pids))
  local raw_posts = redis.call('HMGET', K.posteriors, unpack(pids))
  local posts, post_writes = {}, {}
  for i, pid in ipairs(pids) do
    if posts[pid] == nil then posts[pid] = raw_posts[i] and cjson.decode(raw_posts[i]) or false end
  end
  local busy = busy_prompts(K, pids, posts)
  local states, prompts, zadds, slots, pushes = {}, {}, {}, {}, {}
  local issued, opened, consumed, added, skipped_busy = 0, 0, 0, 0, 0
  for i, g in ipairs(specs) do
    if expected >= target then break end
    -- consumed, not opened: a disabled or deleted prompt is never opened again; a busy one
    -- (its group still open, or opened earlier in this call) waits for its next turn
    if busy[g.pid] and not off[i] then skipped_busy = skipped_busy + 1 end
    if not off[i] and not busy[g.pid] then
      busy[g.pid] = true
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
      -- the p_eff tables, each one field (a JSON list, entry n: after n failures / successes
      -- only): two fields where one per prefix length made every read of the hash ~40 fields long
      redis.call('HSET', group_key(i), 'prompt_id', g.pid, 'k', g.k, 'issued', g.issue, 'done', 0,
        's', 0, 'f', 0, 'cancelled', 0, 'thr_f', g.thr_f, 'thr_s', g.thr_s,
        'deliver_sat', g.deliver_sat, 'commit', g.commit, 'p_eff', g.p0, 'created_at', now,
        'audit', audit_draw(audit_fraction, seed, g.pid, visit), 'pf', g.pf, 'ps', g.ps)
      if g.lp then redis.call('HSET', group_key(i), 'lp', g.lp) end
      if g.ra then redis.call('HSET', group_key(i), 'ra', g.ra) end
      if g.pc then redis.call('HSET', group_key(i), 'pc', g.pc) end
      states[#states + 1] = g.gid; states[#states + 1] = 'open'
      prompts[#prompts + 1] = g.gid; prompts[#prompts + 1] = g.pid
      zadds[#zadds + 1] = p0; zadds[#zadds + 1] = g.gid
      for slot = 0, g.issue - 1 do
        local rid = g.gid .. ':' .. slot
        if #handed < direct then
          handed[#handed + 1] = rid
        else
          slots[#slots + 1] = rid; slots[#slots + 1] = 'p'
          pushes[#pushes + 1] = rid
        end
      end
      issued = issued + g.issue
      opened = opened + 1
      local u = yield_units(p0)
      expected = expected + u
      added = added + u
    end
    consumed = consumed + 1
  end
  if skipped_busy > 0 then redis.call('HINCRBY', K.stats, 'prompts_skipped_busy', skipped_busy) end
  if opened == 0 then return consumed, handed end
  call_chunked('HSET', K.states, states)
  call_chunked('HSET', K.prompt, prompts)
  call_chunked('ZADD', K.open, zadds)
  redis.call('INCRBY', K.yield, added)
  local post_out = {}
  for pid in pairs(post_writes) do
    post_out[#post_out + 1] = pid; post_out[#post_out + 1] = cjson.encode(posts[pid])
  end
  if #post_out > 0 then call_chunked('HSET', K.posteriors, post_out) end
  call_chunked('HSET', K.slots, slots)
  call_chunked('RPUSH', K.pending, pushes)
  redis.call('HINCRBY', K.stats, 'rollouts_issued', issued)
  redis.call('HINCRBY', K.stats, 'groups_opened', opened)
  wake(K.wake, 'lease')
  return consumed, handed
end
