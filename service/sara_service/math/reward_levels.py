"""The reward view's allocation math: a Dirichlet over the reward levels a prompt produces
(pure: no I/O, no randomness).

Under ``SARA_EFFECTIVE=reward`` a group is effective when its rewards are not all equal, as a
GRPO advantage sees them. Rewards are binned first: a reward's *level* is its nearest point on
the grid of step ``SARA_REWARD_TOLERANCE`` (``floor(reward / tolerance + 1/2)``), and two rewards
are equal when they share a level.

A prompt's chances over the L levels in use are pi ~ Dirichlet(alpha_1..alpha_L), A = sum alpha.
Here alpha are the parameters *before the group's own results*: the prior (and, for the estimate
of false abandons, plus the prompt's earlier rollouts counted by level). After n results, all at
level j, the group's own results enter through i = n..k-1:

    P(the other k-n are at j too | prefix) = prod_{i=n}^{k-1} (alpha_j + i) / (A + i),

which is the posterior predictive chance with parameters alpha_j + n and A + n. So

- two or more levels in the prefix: p_eff = 1;
- n >= 1, all at level j:            p_eff = 1 - prod_{i=n}^{k-1} (alpha_j + i) / (A + i);
- n = 0:                             p_eff = 1 - sum_j prod_{i=0}^{k-1} (alpha_j + i) / (A + i).

With L = 2 and alpha = (beta0, alpha0) this is the outcome view's Beta-binomial, computed by the
same function (`allocation.log_stay_pure`, with the other levels' total as its `a`), so the two
agree to the bit.

The engine plans under a symmetric prior, Dirichlet(alpha0, ..., alpha0) over L levels: every
level then has the same table, and one threshold serves whichever level a group starts on. L is
``max(SARA_REWARD_LEVELS, levels seen in the run so far)`` (`levels_in_use`): it grows as new
levels appear, and a larger L makes SARA slower to abandon (a new level is likelier), which is
the safe direction.

Under tau_low = "auto" the threshold is the cost-aware one of `autotau.level_thresholds`
(`plan_levels_auto`), from a pool model of level chances the scheduler learns as it goes.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping, Sequence

from .allocation import GroupPlan, log_stay_pure, plan_from_tables

# one level is never effective, so a plan assumes at least two
MIN_LEVELS = 2


def level_of(reward: float, tolerance: float) -> int:
    """The reward's level: its nearest point on the grid of step `tolerance` (halves up)."""
    if not tolerance > 0.0 or not math.isfinite(tolerance):
        raise ValueError(f"tolerance must be finite and > 0, got {tolerance!r}")
    if not math.isfinite(reward):
        raise ValueError(f"reward must be finite, got {reward!r}")
    return math.floor(reward / tolerance + 0.5)


def levels_in_use(assumed: int, seen: int) -> int:
    """The L a plan uses: the levels assumed up front or the ones seen so far, at least two."""
    return max(MIN_LEVELS, int(assumed), int(seen))


def first_non_binary(rewards: Sequence[float]) -> float | None:
    """The first reward that is neither 0 nor 1 (the outcome view's warning), else None."""
    for reward in rewards:
        if reward != 0.0 and reward != 1.0:
            return reward
    return None


def non_binary_warning(reward: float) -> str:
    """What the outcome view says, once per run, when a reward other than 0 and 1 arrives."""
    return (f"rewards are not 0/1 (first seen: {reward:g}): under SARA_EFFECTIVE=outcome only "
            "reward >= SARA_SUCCESS_THRESHOLD counts, so groups whose rewards differ below or "
            "above it are dropped or abandoned as pure; SARA_EFFECTIVE=reward treats a group as "
            "effective when its rewards are not all equal (see docs/architecture.md, "
            "\"The reward view\")")


def _check(counts: Sequence[int], k: int, alphas: Sequence[float]) -> int:
    if len(counts) != len(alphas) or len(alphas) < MIN_LEVELS:
        raise ValueError(f"counts and alphas need one entry per level (>= {MIN_LEVELS}); got "
                         f"{len(counts)} counts, {len(alphas)} alphas")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts):
        raise ValueError(f"counts must be integers >= 0, got {list(counts)!r}")
    if any(not (math.isfinite(a) and a > 0.0) for a in alphas):
        raise ValueError(f"alphas must be finite and > 0 (Dirichlet parameters), got "
                         f"{list(alphas)!r}")
    n = sum(counts)
    if n > k:
        raise ValueError(f"the prefix holds {n} results, more than k={k}")
    return n


def _clamp01(x: float) -> float:
    return min(1.0, max(0.0, x))


def _stay_logs(alphas: Sequence[float], j: int, k: int) -> list[float]:
    """logs[n] = log P(the rest of the group stays at level j | n results, all at j)."""
    # the other levels' total, exactly rounded: the same value whatever the order of the levels
    others = math.fsum(a for i, a in enumerate(alphas) if i != j)
    return log_stay_pure(others, alphas[j], k)


def _p_eff_start(alphas: Sequence[float], k: int) -> float:
    firsts = [_stay_logs(alphas, j, k)[0] for j in range(len(alphas))]
    # expm1 keeps 1 - P(all at the first level) exact when that chance is near 1
    return _clamp01(-math.expm1(firsts[0]) - math.fsum(math.exp(x) for x in firsts[1:]))


def p_eff_levels(counts: Sequence[int], k: int, alphas: Sequence[float]) -> float:
    """P(a group of k ends with two levels or more | the prefix's `counts` per level), with
    the levels' chances ~ Dirichlet(`alphas`) before the group (see the module docstring)."""
    n = _check(counts, k, alphas)
    present = [j for j, c in enumerate(counts) if c > 0]
    if len(present) >= 2:
        return 1.0
    if n == 0:
        return _p_eff_start(alphas, k)
    return _clamp01(-math.expm1(_stay_logs(alphas, present[0], k)[n]))


def level_table(k: int, levels: int, alpha0: float) -> list[float]:
    """p_eff after n results all at one level, n = 0..k (entry 0: the empty prefix), under the
    symmetric Dirichlet(alpha0, ..., alpha0) over `levels` levels."""
    alphas = [float(alpha0)] * levels
    _check([0] * levels, k, alphas)
    logs = _stay_logs(alphas, 0, k)
    return [_p_eff_start(alphas, k)] + [_clamp01(-math.expm1(x)) for x in logs[1:]]


def plan_levels(policy: str, k: int, levels: int, alpha0: float, tau_low: float) -> GroupPlan:
    """The group plan of the reward view: both pure sides get the one-level table, so SARA
    abandons a group whose first `thr_f` results share a level, whichever level it is."""
    table = level_table(k, levels, alpha0)
    return plan_from_tables(policy, k, table, table, tau_low)


def history_alphas(counts: Mapping[str, float], levels: int, alpha0: float
                   ) -> tuple[list[str], list[float]]:
    """A prompt's own Dirichlet: (its levels, in `counts` order, and the alphas), alpha0 plus
    its count for each level it has produced, then alpha0 for each other level in use, or for
    one more when it has produced all of them (a level new to the run, the plan's default)."""
    labels = list(counts)
    alphas = [float(alpha0) + float(counts[x]) for x in labels]
    others = max(1, levels_in_use(levels, len(labels)) - len(labels))
    return labels, alphas + [float(alpha0)] * others


def plan_levels_history(policy: str, k: int, counts: Mapping[str, float], levels: int,
                        alpha0: float, tau_low: float) -> GroupPlan:
    """The plan of one prompt under its own Dirichlet (`history_alphas`; `counts`: its
    decayed rollouts per level, keyed as the scripts key levels). SARA abandons a run at a
    level it has produced where that level's table drops below tau_low (`GroupPlan.by_level`),
    a run at any other level on the default table; it issues the nearest threshold at once,
    and skips the prompt when P(its rewards differ) < tau_low. No counts: `plan_levels`."""
    if not counts:
        return plan_levels(policy, k, levels, alpha0, tau_low)
    labels, alphas = history_alphas(counts, levels, alpha0)
    _check([0] * len(alphas), k, alphas)
    start = _p_eff_start(alphas, k)

    def level_plan(j: int) -> GroupPlan:
        table = [start] + [_clamp01(-math.expm1(x)) for x in _stay_logs(alphas, j, k)[1:]]
        return plan_from_tables(policy, k, table, table, tau_low)

    default = level_plan(len(labels))
    if policy != "sara" or default.skip:
        return default
    own = [(label, level_plan(j)) for j, label in enumerate(labels)]
    issue = min([default.initial_issue] + [p.initial_issue for _, p in own])
    return replace(default, initial_issue=issue,
                   by_level=tuple((x, p.after_failures, p.p_eff_fail) for x, p in own))


def decide_levels_history(prefix: Sequence[str], k: int, counts: Mapping[str, float],
                          levels: int, alpha0: float, tau_low: float) -> str:
    """SARA's decision after the results' levels `prefix` (labels as in `counts`) under the
    prompt's own Dirichlet: "commit" once two differ, "abandon" when p_eff < tau_low (n = 0:
    the skip decision), else "continue"."""
    if not 0.0 <= tau_low <= 1.0:
        raise ValueError(f"tau_low must be in [0, 1], got {tau_low!r}")
    labels, alphas = history_alphas(counts, levels, alpha0)
    if len(set(prefix)) >= 2:
        return "commit"
    at = [0] * len(alphas)
    if prefix:
        at[labels.index(prefix[0]) if prefix[0] in labels else len(labels)] = len(prefix)
    return "abandon" if p_eff_levels(at, k, alphas) < tau_low else "continue"


def plan_levels_auto(k: int, levels: int, pool: object, rho: float, fill: bool = True,
                     floor: float | None = None) -> GroupPlan:
    """SARA's plan under tau_low = "auto" in the reward view: the cost-aware threshold of
    `autotau.level_thresholds` at price `rho` on `pool` (an autotau.PoolModel of level chances),
    the same on both pure sides as `plan_levels`'s; a fresh prompt is never skipped."""
    # imported here, as allocation does: only "auto" runs need the heavier module
    from .autotau import PoolModel, level_thresholds

    if not isinstance(pool, PoolModel):
        raise ValueError(f"pool must be an autotau.PoolModel, got {type(pool).__name__}")
    auto = level_thresholds(pool, k, rho, levels_in_use(levels, 0), fill, floor)
    limit = min(auto.after_failures, k)
    table = auto.p_eff_fail[: limit + 1]
    return GroupPlan(policy="sara", k=k, after_failures=auto.after_failures,
                     after_successes=auto.after_successes, initial_issue=limit,
                     p_eff_fail=table, p_eff_success=table, deliver_saturated=False)


def decide_levels(prefix: Sequence[int], k: int, levels: int, alpha0: float,
                  tau_low: float) -> str:
    """SARA's decision after the results' levels `prefix` (any labels, in order): "commit" once
    two differ, "abandon" when p_eff < tau_low (n = 0: the skip decision), else "continue"."""
    if not 0.0 <= tau_low <= 1.0:
        raise ValueError(f"tau_low must be in [0, 1], got {tau_low!r}")
    distinct = sorted(set(prefix))
    levels = max(levels, len(distinct))
    counts = [list(prefix).count(x) for x in distinct] + [0] * (levels - len(distinct))
    if len(distinct) >= 2:
        return "commit"
    probability = p_eff_levels(counts, k, [float(alpha0)] * levels)
    return "abandon" if probability < tau_low else "continue"


def mixed_chance_levels(prompt_counts: dict[str, float], level: str, rest: int, levels: int,
                        alpha0: float) -> float:
    """The chance an abandoned group, pure at `level`, would have ended with another level in
    its `rest` missing results, under the prompt's own Dirichlet: alpha0 per level plus its
    (decayed) rollouts counted by level, `prompt_counts` (which hold the group's own results).
    The mirror of apply_results.lua's estimate of false abandons (the same products in order;
    mixed_chance_at_level, in lua/_policy_sara.lua).
    """
    levels = max(levels, len(prompt_counts))
    here = alpha0 + prompt_counts.get(level, 0.0)
    total = levels * alpha0 + sum(prompt_counts.values())
    stay = 1.0
    for i in range(rest):
        stay = stay * (here + i) / (total + i)
    return 1.0 - stay
