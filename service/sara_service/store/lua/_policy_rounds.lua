-- Reinforce-Ada's allocation policy (SARA_POLICY=reinforce_ada), put in front of
-- apply_results.lua after the common libraries (redis_format.ScriptSpec.library; used by
-- apply_results.lua only): a group sampled in rounds is decided only when its round is in, then
-- stops (committed when mixed) or takes one more round. The Python reference is
-- math/reinforce_ada.py (decide_round, next_issue).

-- A group sampled in rounds (Reinforce-Ada; math/reinforce_ada.py is the reference): nothing is
-- decided while its round is out; then it stops once its rule's successes and failures are in
-- (or at its budget k), committed when mixed, and otherwise takes one more round. Its commit is
-- 'partial': it is delivered with what it has. One that stops pure before k (the "positive"
-- rule met by successes only) is abandoned; one pure at k is dropped as saturated, as under DS.
local function decide_round(g)
  if type(g.ra) == 'string' then
    local size, need_s, need_f = string.match(g.ra, '^(%d+),(%d+),(%d+)$')
    g.ra = {size = tonumber(size), s = tonumber(need_s), f = tonumber(need_f)}
  end
  local mixed = g.s > 0 and g.f > 0
  if g.done >= g.issued and ((g.s >= g.ra.s and g.f >= g.ra.f) or g.issued >= g.k) then
    if mixed then return commit_group(g) end
    if g.issued < g.k then
      local failing = g.s == 0
      return abandon_group(g, failing and 'F' or 'S',
                           mixed_chance_under_posterior(g.pid, failing, g.k - g.done))
    end
  elseif g.done >= g.issued then
    issue(g, g.issued, math.min(g.issued + g.ra.size, g.k))
  end
  return keep_open(g)
end
