-- Shared by every script (the store puts it in front of each): helpers for sending many items
-- in one command, which is how the scripts keep their Redis work per key instead of per item,
-- and flow control's one measure.
local CHUNK = 3000  -- arguments per command: Lua's unpack stops near 8000
-- cmd key items...: one command per CHUNK items (an even number: pairs stay whole)
local function call_chunked(cmd, key, items)
  for i = 1, #items, CHUNK do
    redis.call(cmd, key, unpack(items, i, math.min(i + CHUNK - 1, #items)))
  end
end
-- Expected yield counts in units of 1e-9 groups, each score rounded alone, so the running total
-- of the open groups' scores is exact whatever the order of its updates.
local YIELD_UNIT = 1e9
local function yield_units(p) return math.floor(tonumber(p) * YIELD_UNIT + 0.5) end
-- The open groups' expected yield: the running total (open_yield string; absent: none open yet).
local function open_yield(yield_key)
  return tonumber(redis.call('GET', yield_key) or '0')
end
-- What flow control holds under prefetch_batches x batch_size: ready groups plus the open ones'
-- expected yield, in yield units.
local function flow_expected(ready_key, yield_key)
  return redis.call('LLEN', ready_key) * YIELD_UNIT + open_yield(yield_key)
end
-- The target flow control opens groups under, in yield units: flow_target (prefetch_batches x
-- batch_size), or floor_target while fewer than floor_ready groups are ready. That is the work
-- floor: the scripts that open groups run for a lease that found too little work, so past the
-- target they only fill an engine that would otherwise idle, and only while the trainer is not
-- behind (a SARA group holds just its probes until it commits, so at the same expected yield
-- there is less to lease than under DS). floor_target <= flow_target: no floor.
local function flow_target_units(ready_key, flow_target, floor_target, floor_ready)
  if floor_target > flow_target and redis.call('LLEN', ready_key) < floor_ready then
    return floor_target * YIELD_UNIT
  end
  return flow_target * YIELD_UNIT
end
-- A note on the wake stream, which the long polls of every replica wait on: `kind` says what
-- woke ('lease' or 'batch'), then any field/value pairs. The stream keeps about its last 64.
local function wake(stream, kind, ...)
  redis.call('XADD', stream, 'MAXLEN', '~', 64, '*', 'w', kind, ...)
end
-- Rollouts of the inflight zset whose lease ran out by `now` (at most `limit`) go back to the
-- front of the pending list, in their order, unless answered or cancelled meanwhile (their slot
-- no longer leased); returns how many went back.
local function requeue_expired(inflight, slots_key, pending, stats, now, limit)
  local due = redis.call('ZRANGEBYSCORE', inflight, '-inf', now, 'LIMIT', 0, limit)
  if #due == 0 then return 0 end
  redis.call('ZREM', inflight, unpack(due))
  local states = redis.call('HMGET', slots_key, unpack(due))
  local slots, pushes = {}, {}
  for i = #due, 1, -1 do  -- backwards: pushed onto the front, they keep their order
    if states[i] and string.sub(states[i], 1, 2) == 'l|' then
      slots[#slots + 1] = due[i]
      slots[#slots + 1] = 'p'
      pushes[#pushes + 1] = due[i]
    end
  end
  if #pushes == 0 then return 0 end
  call_chunked('HSET', slots_key, slots)
  call_chunked('LPUSH', pending, pushes)
  redis.call('HINCRBY', stats, 'rollouts_reissued', #pushes)
  return #pushes
end
