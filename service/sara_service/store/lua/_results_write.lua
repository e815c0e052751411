-- apply_results.lua's write-back and answer, put in front of it after the policies
-- (redis_format.ScriptSpec.library; used by apply_results.lua only): every key the call changed
-- is written once, one command per key, then the cancels and the answer.

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
