-- Shared by every script (the store puts it in front of each): helpers for sending many items
-- in one command, which is how the scripts keep their Redis work per key instead of per item.
local CHUNK = 3000  -- arguments per command: Lua's unpack stops near 8000
-- cmd key items...: one command per CHUNK items (an even number: pairs stay whole)
local function call_chunked(cmd, key, items)
  for i = 1, #items, CHUNK do
    redis.call(cmd, key, unpack(items, i, math.min(i + CHUNK - 1, #items)))
  end
end
