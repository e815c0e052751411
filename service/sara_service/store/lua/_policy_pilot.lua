-- Pilot-Commit's allocation policy (SARA_POLICY=pilot_commit), put in front of
-- apply_results.lua after the common libraries (redis_format.ScriptSpec.library; used by
-- apply_results.lua only): a group is decided on its pilot, committed (filled to k) when the
-- complete pilot's successes lie in the band, abandoned otherwise. The Python reference is
-- math/pilot_commit.py (decide_pilot).

-- A pilot ends abandoned: out of its band, or stopped by SARA's rule. Its side (F, S, or M for a
-- mixed pilot outside the band) goes to the prompt's history, where the scheduler reads a
-- solved pilot (S) to exclude the prompt.
local function abandon_pilot(g)
  cancel_outstanding(g, g.issued)
  local side = 'M'
  if g.s == 0 then side = 'F' elseif g.f == 0 then side = 'S' end
  return abandon_group(g, side)
end

-- A group decided on its pilot (Pilot-Commit; math/pilot_commit.py is the reference): once its
-- pilot is complete it is committed (filled to k: its commit is 'complete') when the pilot's
-- successes lie in the band [low, high], and abandoned otherwise. The band holds mixed pilots
-- only, so a solved or hopeless pilot is always abandoned. Composed with SARA's stopping, thr_f
-- is SARA's threshold for the pilot: only that many are issued at first, a prefix failing
-- throughout is abandoned there, and its first success issues the rest of the pilot (without
-- it, thr_f is k + 1 and the pilot is issued whole).
local function decide_pilot(g)
  if type(g.pc) == 'string' then
    local pilot, low, high = string.match(g.pc, '^(%d+),(%d+),(%d+)$')
    g.pc = {pilot = tonumber(pilot), low = tonumber(low), high = tonumber(high)}
  end
  if g.done >= g.pc.pilot then
    if g.s >= g.pc.low and g.s <= g.pc.high then return commit_group(g) end
    return abandon_pilot(g)
  end
  if g.s == 0 and g.f >= g.thr_f then return abandon_pilot(g) end
  if g.s > 0 and g.issued < g.pc.pilot then issue(g, g.issued, g.pc.pilot) end
  return keep_open(g)
end
