-- GRESO's exploration rates now (SARA_SELECTION=greso), stepped once per policy version.
-- KEYS[1] = greso hash (v, p_easy, p_hard, and the group-end counters at v: fail, success, total)
-- KEYS[2] = stats hash (groups_ended_all_fail, groups_ended_all_success, groups_ended_mixed)
-- ARGV[1] = version (the policy's now)   ARGV[2] = adapt: 1 once the pool is past its first epoch
-- ARGV[3] = p_start   ARGV[4] = p_min   ARGV[5] = p_max   ARGV[6] = step
-- ARGV[7] = target_easy   ARGV[8] = target_hard (shares of all-success, all-fail group ends)
-- returns {p_easy, p_hard} as text. When the version moved past the stored one, each rate moves
-- by step toward its target (selection.greso_adapt, the same rule): down when the groups that
-- ended since were at least that share of its kind, up otherwise, within [p_min, p_max]. One
-- step however many versions passed: the shares are of the groups that ended in between.
local STATE, STATS = KEYS[1], KEYS[2]
local version, adapt = tonumber(ARGV[1]), ARGV[2] == '1'
local p_start, p_min, p_max, step = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local target_easy, target_hard = tonumber(ARGV[7]), tonumber(ARGV[8])
local ended = redis.call('HMGET', STATS, 'groups_ended_all_fail', 'groups_ended_all_success',
                         'groups_ended_mixed')
local fail, success = tonumber(ended[1] or '0'), tonumber(ended[2] or '0')
local total = fail + success + tonumber(ended[3] or '0')
-- %.17g: a rate read back is the double that was stored, as Python's mirror computes it
local function exact(x) return string.format('%.17g', x) end
local st = redis.call('HMGET', STATE, 'v', 'p_easy', 'p_hard', 'fail', 'success', 'total')
if not st[1] then
  redis.call('HSET', STATE, 'v', version, 'p_easy', exact(p_start), 'p_hard', exact(p_start),
             'fail', fail, 'success', success, 'total', total)
  return {exact(p_start), exact(p_start)}
end
local p_easy, p_hard = tonumber(st[2]), tonumber(st[3])
if version <= tonumber(st[1]) then return {exact(p_easy), exact(p_hard)} end
local function moved(p, share, target)
  if share >= target then return math.max(p - step, p_min) end
  return math.min(p + step, p_max)
end
local n = total - tonumber(st[6])
if adapt and n > 0 then
  p_easy = moved(p_easy, (success - tonumber(st[5])) / n, target_easy)
  p_hard = moved(p_hard, (fail - tonumber(st[4])) / n, target_hard)
end
redis.call('HSET', STATE, 'v', version, 'p_easy', exact(p_easy), 'p_hard', exact(p_hard),
           'fail', fail, 'success', success, 'total', total)
return {exact(p_easy), exact(p_hard)}
