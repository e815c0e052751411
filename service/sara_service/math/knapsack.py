"""Variable group sizes: a batch's rollout budget split across its prompts (pure: no I/O).

Knapsack RL (arXiv 2509.25849, ByteDance Seed) gives each prompt of a batch its own number of
rollouts. A batch of B prompts has B * k rollouts to spend; prompt i, whose success rate is
estimated as p_i, gets N_i of them, chosen to maximise the sum of

    value(N, p) = P(a group of N is mixed) * InfoGain(p)
                = (1 - p^N - (1 - p)^N) * p * (1 - p)^2

over the batch, with `min_n <= N_i <= max_n` for a prompt whose rate lies strictly inside
(0, 1). Its public code's rules, followed here:

- a prompt never seen gets k; one whose last group was all fails (p = 0) or all successes
  (p = 1) gets `min_n` (its value is 0 at any N);
- when the inside prompts need less than the budget, the surplus goes to the p = 0 prompts,
  evenly (hard prompts are where more rollouts can still find a success), and only then to the
  others. "Need" is a prompt's cost: the rollouts for a group to come out mixed with chance
  `confidence` (0.9), log(1 - confidence) / log(max(p, 1 - p)), capped at max_n;
- otherwise the budget left after the minimums is split by the value above.

Where this differs from the paper's code, and why:

- the split is greedy on marginal value, one rollout at a time to the prompt that gains most,
  instead of a dynamic programme over (prompt, budget): value(N, p) rises in N with falling
  increments (p^N (1 - p) + (1 - p)^N p), so the objective is separable and concave and the
  greedy split reaches the same optimum (up to ties), in O(budget * log B) instead of
  O(B * budget * max_n);
- a prompt's rate is estimated from its stored history (`estimated_rate`): its last group's
  side when that group was pure, its decayed pass rate over past groups when mixed. The paper's
  code takes the last epoch's pass rate;
- a budget the inside prompts cannot absorb (all at max_n) goes to the p = 0 prompts, as the
  surplus does, rather than past max_n.
"""

from __future__ import annotations

import functools
import heapq
import math
from dataclasses import dataclass
from typing import Sequence

from .allocation import GroupPlan, plan_group


@dataclass(frozen=True)
class KnapsackParams:
    """The split's bounds: `min_n` and `max_n` rollouts for a prompt with an inside rate;
    `confidence`, the chance of a mixed group its cost is sized for."""

    min_n: int = 2
    max_n: int = 64
    confidence: float = 0.9

    def __post_init__(self) -> None:
        if not 2 <= self.min_n <= self.max_n:
            raise ValueError(f"need 2 <= min_n <= max_n; got min_n={self.min_n}, "
                             f"max_n={self.max_n}")
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence must lie in (0, 1); got {self.confidence}")


def group_value(n: int, p: float) -> float:
    """value(n, p): P(a group of n is mixed) times InfoGain(p) = p (1 - p)^2."""
    if not 0.0 < p < 1.0:
        return 0.0
    return (1.0 - p ** n - (1.0 - p) ** n) * p * (1.0 - p) ** 2


def mixed_cost(p: float, params: KnapsackParams) -> int:
    """Rollouts for a group to come out mixed with chance `confidence` (whole rollouts, at most
    max_n): log(1 - confidence) / log(max(p, 1 - p)), truncated as the paper's code does."""
    cost = math.log(1.0 - params.confidence) / math.log(max(p, 1.0 - p))
    return int(min(params.max_n, cost))


def estimated_rate(last_side: str | None, successes: float, failures: float) -> float | None:
    """A prompt's success rate for the split: None when it has no decided group yet, 0 or 1
    when its last group was pure ('F' or 'S'), else successes / (successes + failures) over its
    past rollouts (the caller's decayed counts, prior excluded)."""
    if last_side is None:
        return None
    if last_side == "F":
        return 0.0
    if last_side == "S":
        return 1.0
    total = successes + failures
    if total <= 0:
        return None
    return min(max(successes / total, 0.0), 1.0)


@functools.lru_cache(maxsize=1024)
def sized_plan(policy: str, n: int, alpha0: float, beta0: float, tau_low: float) -> GroupPlan:
    """The plan of a group of n under `policy` and Beta(alpha0, beta0); where SARA's would skip
    the prompt (a group this small starts below tau_low), DS's: the split chose the prompt, so
    its group runs whole."""
    plan = plan_group(policy, n, alpha0, beta0, tau_low)
    return plan_group("dynamic_sampling", n, alpha0, beta0, tau_low) if plan.skip else plan


def split_budget(rates: Sequence[float | None], k: int, params: KnapsackParams) -> list[int]:
    """Rollouts per prompt of a batch whose budget is len(rates) * k (see the module
    docstring); the sizes sum to the budget exactly when min_n <= k (Settings' rule)."""
    sizes = [k if p is None else params.min_n for p in rates]
    inside = [i for i, p in enumerate(rates) if p is not None and 0.0 < p < 1.0]
    hard = [i for i, p in enumerate(rates) if p == 0.0]
    left = len(rates) * k - sum(sizes)
    if left <= 0:
        return sizes
    if not inside and not hard:   # nothing to learn from or to search: every prompt gets k
        return [k] * len(rates)
    need = sum(mixed_cost(rates[i], params) for i in inside)
    surplus = left - need if need < left else 0
    surplus += _greedy(sizes, inside, rates, left - surplus, params)
    inside_set = set(inside)
    outside = [i for i in range(len(rates)) if i not in inside_set]
    _spread(sizes, hard or outside or inside, surplus)
    return sizes


def _greedy(sizes: list[int], inside: list[int], rates: Sequence[float | None], budget: int,
            params: KnapsackParams) -> int:
    """Give `budget` rollouts, one at a time, to the inside prompt whose value gains most;
    returns what no prompt below max_n could take."""
    def gain(i: int) -> float:
        p, n = rates[i], sizes[i]
        return group_value(n + 1, p) - group_value(n, p)

    heap = [(-gain(i), i) for i in inside if sizes[i] < params.max_n]
    heapq.heapify(heap)
    while budget > 0 and heap:
        _, i = heapq.heappop(heap)
        sizes[i] += 1
        budget -= 1
        if sizes[i] < params.max_n:
            heapq.heappush(heap, (-gain(i), i))
    return budget


def _spread(sizes: list[int], sinks: list[int], budget: int) -> None:
    """Add `budget` rollouts evenly over `sinks`, the first ones taking the remainder."""
    if budget <= 0 or not sinks:
        return
    share, extra = divmod(budget, len(sinks))
    for rank, i in enumerate(sinks):
        sizes[i] += share + (1 if rank < extra else 0)
