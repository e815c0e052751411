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
-- The open groups' expected yield: the running total (open_yield string); a run started before
-- the total existed sums its open-groups zset once, here.
local function open_yield(open_key, yield_key)
  local total = redis.call('GET', yield_key)
  if total then return tonumber(total) end
  local scores = redis.call('ZRANGE', open_key, 0, -1, 'WITHSCORES')
  total = 0
  for i = 2, #scores, 2 do total = total + yield_units(scores[i]) end
  redis.call('SET', yield_key, total)
  return total
end
-- What flow control holds under prefetch_batches x batch_size: ready groups plus the open ones'
-- expected yield, in yield units.
local function flow_expected(ready_key, open_key, yield_key)
  return redis.call('LLEN', ready_key) * YIELD_UNIT + open_yield(open_key, yield_key)
end
