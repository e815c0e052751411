-- Read what a batch carries of each group: its prompt id and its stored results, in slot order.
-- A read, in one call: a pipeline of one HMGET per group cost the scheduler more CPU than the
-- rest of building a batch.
-- KEYS[1..] = group: the hashes of the batch's groups, in batch order
-- ARGV[1] = k (slots per group: the results r:0 .. r:k-1 are read)
-- returns one list per group: {prompt id, result JSON or false per slot}
local fields = {'prompt_id'}
for i = 0, tonumber(ARGV[1]) - 1 do fields[#fields + 1] = 'r:' .. i end
local out = {}
for i, key in ipairs(KEYS) do out[i] = redis.call('HMGET', key, unpack(fields)) end
return out
