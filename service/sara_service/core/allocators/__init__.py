"""Allocation policies: how a group of one prompt is planned, committed and delivered.

An allocator is the part of a policy that runs in Python; what a result does to a group's state
runs atomically in Redis, in the policy's Lua library (`store/lua/_policy_<name>.lua`, dispatched
by `apply_results.lua` on the plan's fields). The scheduler knows only this interface:

- `fixed_plan(levels)`: every group's plan under a uniform prior (None levels: the outcome view;
  a count: the reward view's Dirichlet over that many levels);
- `plan_for(a, b)`: the plan of a prompt whose posterior is Beta(a, b) (SARA_PRIOR=history);
- `commit`: how a committed group is filled ('complete': to k, 'partial': what is issued);
- `excludes(post)`: a prompt this policy does not sample again (reads its history when
  `reads_history`);
- `delivered(results)`: a group's results as the trainer gets them;
- `prices_by_tau`: whether tau_low=auto prices its plans (SARA only: the baselines ignore τ);
- `stats()`: what it adds to /stats' `strategy`;
- `settings_class`: its own settings (strategy_settings), if it has any.

The pure math each one calls lives in `math/` (allocation, reinforce_ada, pilot_commit).
"""

from __future__ import annotations

from ...settings import Settings
from .base import Allocator, Sara
from .pilot_commit import PilotCommit
from .reinforce_ada import ReinforceAda

ALLOCATORS: dict[str, type[Allocator]] = {
    "uniform": Allocator, "dynamic_sampling": Allocator, "sara": Sara,
    "reinforce_ada": ReinforceAda, "pilot_commit": PilotCommit,
}


def allocator_for(settings: Settings) -> Allocator:
    """The run's allocation policy (SARA_POLICY)."""
    return ALLOCATORS[settings.policy](settings)
