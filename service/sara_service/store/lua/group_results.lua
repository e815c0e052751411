-- Read what a batch carries of each group: its prompt id and its stored results, in slot order.
-- A read, in one call: a pipeline of one HMGET per group cost the scheduler more CPU than the
-- rest of building a batch.
-- KEYS[1..] = group: the hashes of the batch's groups, in batch order
-- ARGV[1] = k (slots of a group without its own size: the results r:0 .. r:k-1 are read)
-- returns one list per group: {prompt id, result JSON or false per slot}; a group's own `k`
-- field sets its slots (under SARA_GROUP_SIZING=var_k each group has its own size)
local default_k = tonumber(ARGV[1])
local out = {}
for i, key in ipairs(KEYS) do
  local k = tonumber(redis.call('HGET', key, 'k')) or default_k
  local fields = {'prompt_id'}
  for slot = 0, k - 1 do fields[#fields + 1] = 'r:' .. slot end
  out[i] = redis.call('HMGET', key, unpack(fields))
end
return out
