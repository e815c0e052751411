-- apply_results.lua's state, put in front of it (redis_format.ScriptSpec.library; used by
-- apply_results.lua only): its KEYS and ARGV by name, the call's in-memory state (read once,
-- changed in memory, written back once by _results_write.lua), the hash helpers every read and
-- write goes through, and the reading functions (slots, groups, decision state, pool clock).

-- arguments, by name
local now, wid = tonumber(ARGV[1]), ARGV[2]
local decay, a0, b0, retention = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local half_life = tonumber(ARGV[7])
local count, report_ttl, holder_only = tonumber(ARGV[8]), tonumber(ARGV[9]), ARGV[10] == '1'
local REPORT = KEYS[16]

local S, INFL, PEND, STATS, OPEN, READY, POST, CANCELS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local HIST, WORKERS, WINFO, POLICY, GC, GSTATE = KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14]
local PROMPTS, YIELD, WAKE, LEVELS = KEYS[15], KEYS[17], KEYS[18], KEYS[19]
local levels_n = tonumber(ARGV[12])
local reward_view = levels_n > 0

local results = cjson.decode(ARGV[11])
local function arg(i, j) return results[i][j] end
local MAX_ERRORS_PER_SLOT = 3

-- Every read goes through the caches below and every write is held until the end, then sent as
-- one command per key (a hash's fields in one HSET, a list's pushes in one LPUSH, in order): the
-- script's Redis work grows with the keys a call touches, not with its results.
local function hset_map(key, map)
  local flat = {}
  for f, v in pairs(map) do flat[#flat + 1] = f; flat[#flat + 1] = v end
  if #flat > 0 then call_chunked('HSET', key, flat) end
end
local function hmget_map(key, ids)
  local out = {}
  for i = 1, #ids, CHUNK do
    local part = {unpack(ids, i, math.min(i + CHUNK - 1, #ids))}
    local got = redis.call('HMGET', key, unpack(part))
    for j, id in ipairs(part) do out[id] = got[j] end
  end
  return out
end

-- The call's state: read once, changed in memory, written back once by the write functions.
-- rids[i], rgid[i], rsl[i]: result i's rollout id, group id and slot (rgid[i] nil for an id that
-- names no slot); gids: the groups reported on, each once, gids_seen[gid] its index in KEYS
local rids, rgid, rsl, gids_seen, gids = {}, {}, {}, {}, {}
local slot, slot_writes = {}, {}      -- slot states (the slots hash)
local groups = {}                     -- gid -> the group's fields (g.w: its fields to write)
local gstate, gstate_writes = {}, {}  -- gid -> open | committed | abandoned | ready | dropped
local incr, fincr, hist, level_incr = {}, {}, {}, {}   -- counters, added once at the end
local version, clock = 0, 0           -- the policy version and the pool's clock (epochs)
local posts, post_writes = {}, {}     -- pid -> its posterior, decoded once
local cancel_adds, cancel_workers = {}, {}   -- other workers' cancel lists, appended at the end
local open_final, open_order = {}, {}        -- the open-groups zset's changes, in order
local infl_rem, pend_push, ready_push, gc_add = {}, {}, {}, {}
local tally = {accepted = 0, dups = 0, late = 0, released = 0, tokens = 0, newest = -1}
local decided, order = {}, {}         -- gid -> its decision for the answer, in report order

-- --- reading -------------------------------------------------------------------------------

-- Slot states: every reported rollout's at once (a group's other slots are read when it is
-- cancelled). Each rollout id is split into group id and slot once, here.
local function read_slots()
  for i = 1, count do
    rids[i] = arg(i, 1)
    local gid, sl = string.match(rids[i], '^(.*):(%d+)$')
    rgid[i], rsl[i] = gid, sl
    if gid and not gids_seen[gid] then gids_seen[gid] = tonumber(arg(i, 2)); gids[#gids + 1] = gid end
  end
  slot = hmget_map(S, rids)
end
local function set_slot(rid, st) slot[rid] = st; slot_writes[rid] = st end

-- groups: the fields decisions read, and the per-slot fields of the slots reported here (a
-- slot's error count only with a worker error for it: each field read costs as much as the rest)
local GROUP_FIELDS = {'prompt_id', 'k', 'issued', 'done', 's', 'f', 'thr_f', 'thr_s',
  'deliver_sat', 'commit', 'audit', 'audited', 'min_v', 'cancelled', 'pf', 'ps', 'lv', 'lvn', 'lvx',
  'ra', 'pc'}
-- per-level plans are read only where they can exist
if reward_view then GROUP_FIELDS[#GROUP_FIELDS + 1] = 'lp' end

-- The group table `g` (one per group reported on) holds the group hash's fields by their stored
-- names, decoded; the "Group hash fields" table in redis_format.py's docstring (and its copy in
-- docs/architecture.md) documents them:
--   pid (prompt_id), k, issued, done, cancelled   the prompt, budget and slot counts
--   s, f           successes and failures among the done slots
--   thr_f, thr_s   abandon after this many failures (successes) with no success (failure)
--   ptab.pf, ptab.ps   the plan's p_eff tables (JSON, decoded on first use by p_eff_at):
--                  p_eff after n failures (successes) only; ptab.lp the run's level's own
--   min_v          oldest policy version among the stored results
--   deliver_sat    a saturated (all-equal) group is delivered, not dropped (uniform)
--   commit         'complete' (a committed group gets all k) or 'partial' (what is issued)
--   audit, audited chosen to run on to k at the abandonment point / started doing so
--   lv, lvn, lvx   reward view: the first result's level, results at it, results at any other
--   lp             reward view, per-prompt plans: level -> [threshold, p_eff table]
--   ra             Reinforce-Ada's round rule "<round size>,<successes>,<failures>"
--   pc             Pilot-Commit's pilot and band "<pilot>,<low>,<high>" (in successes)
-- and, besides: key (its hash's name), gid, slot (the per-slot fields read: learned:<slot>,
-- errors:<slot>), w (the fields to write back at the end; w.p_eff, the current p_eff, is written
-- only).
local function read_groups()
  local per_group_fields = {}
  for i = 1, count do
    local gid = rgid[i]
    if gid then
      local list = per_group_fields[gid] or {}
      list[#list + 1] = 'learned:' .. rsl[i]
      if tonumber(arg(i, 3)) == -2 then list[#list + 1] = 'errors:' .. rsl[i] end
      per_group_fields[gid] = list
    end
  end
  for _, gid in ipairs(gids) do
    local fields = {unpack(GROUP_FIELDS)}
    for _, field in ipairs(per_group_fields[gid]) do fields[#fields + 1] = field end
    local gkey = KEYS[gids_seen[gid]]
    local v = redis.call('HMGET', gkey, unpack(fields))
    if v[1] then
      local g = {key = gkey, gid = gid, pid = v[1], k = tonumber(v[2]), issued = tonumber(v[3]),
        done = tonumber(v[4]), s = tonumber(v[5]), f = tonumber(v[6]), thr_f = tonumber(v[7]),
        thr_s = tonumber(v[8]), deliver_sat = v[9] == '1', commit = v[10], audit = v[11] == '1',
        audited = v[12] == '1', min_v = v[13], cancelled = tonumber(v[14] or '0'), slot = {},
        w = {}, ptab = {pf = v[15], ps = v[16]}, lv = v[17], lvn = tonumber(v[18] or '0'),
        lvx = tonumber(v[19] or '0'), ra = v[20], pc = v[21], lp = reward_view and v[22] or nil}
      for j = #GROUP_FIELDS + 1, #fields do g.slot[fields[j]] = v[j] end
      groups[gid] = g
    end
  end
end

-- The rollout ids that name no slot of a group reported on (a rollout id names its group's key
-- in KEYS: the key must be the one for this id).
local function unknown_rollouts()
  local unknown = {}
  for i = 1, count do
    local gid = rgid[i]
    if not slot[rids[i]] or not gid or not groups[gid] or KEYS[tonumber(arg(i, 2))] ~= groups[gid].key then
      unknown[#unknown + 1] = rids[i]
    end
  end
  return unknown
end

local function set_gstate(gid, st) gstate[gid] = st; gstate_writes[gid] = st end
local function count_up(field, n) incr[field] = (incr[field] or 0) + n end

-- The pool's clock, in epochs: prompts consumed (groups opened + prompts skipped) per prompt.
-- A prompt is visited about once per epoch whatever the number of policy versions in between,
-- so a half-life on this clock keeps its history until its next visit (the store reads the
-- same clock as store.prompts.pool_clock).
local function pool_clock()
  local n = redis.call('HLEN', PROMPTS)
  if n == 0 then return 0 end
  local c = redis.call('HMGET', STATS, 'groups_opened', 'groups_skipped')
  return (tonumber(c[1] or '0') + tonumber(c[2] or '0')) / n
end

-- What the decisions read besides the groups: their states, the policy version, the pool's
-- clock, and the posteriors of their prompts (decoded once, written once).
local function read_decision_state()
  gstate = hmget_map(GSTATE, gids)
  version = tonumber(redis.call('HGET', POLICY, 'version') or '0')
  clock = pool_clock()
  local pids, pid_seen = {}, {}
  for _, gid in ipairs(gids) do
    local pid = groups[gid].pid
    if not pid_seen[pid] then pid_seen[pid] = true; pids[#pids + 1] = pid end
  end
  for pid, raw in pairs(hmget_map(POST, pids)) do posts[pid] = raw and cjson.decode(raw) or false end
end
