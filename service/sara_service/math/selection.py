"""Prompt selection policies that predict which prompts will give mixed groups (pure: no I/O).

The store records, per prompt, the outcome class of each finished group with the policy version
it finished under: 'F' (all fail), 'M' (mixed), 'S' (all succeed). The predictors below replay
that short history; the scheduler draws a candidate pool and keeps the best-scored prompts.

- DPS (Dynamics-Predictive Sampling, arXiv 2603.10887): a 3-state hidden Markov model per prompt
  over F/M/S, as its reference sampler runs it, one step per policy version. Transition counts
  start at a Dirichlet prior (`prior` each) and a uniform belief. Every step the counts decay
  toward the prior (c -> prior + decay * (c - prior)); a step with an observation also gains one
  soft count, spread over (from, to) in proportion to from-belief x to-belief x the expected
  transition probability, where the "from" belief is the prompt's belief one step before the
  observation (its last observed state, pushed forward through the steps it was not sampled).
  The prediction for a step is the belief pushed one step on through the counts as they stood
  after the previous step, so a prompt not sampled for a while drifts toward the prior's
  prediction. At most one observation per prompt a step: of several groups finished at one
  version, the last recorded counts.
  A group SARA abandoned is censored: it saw only a pure prefix, and would have ended mixed with
  probability q (the store records q with the outcome, from the prompt's posterior). It counts
  as a soft observation: the to-belief is (1-q, q, 0) for 'F' ((0, q, 1-q) for 'S'). q = 0 is
  the hard label. (The reference has no censoring: every group it samples runs whole.)
- MoPPS: Thompson-sample a success rate from the prompt's (decayed) Beta posterior and prefer
  prompts whose sample is nearest a target rate (0.5: most likely to give a mixed group). Under
  the reward view (levels, not successes) the sample is the prompt's chances over its reward
  levels, from its (decayed) Dirichlet, scored by the chance that a group of k drawn with them
  does not land all on one level; with two levels that orders prompts exactly as the distance
  from 0.5 does.
- GRESO (arXiv 2506.02177): prompts in epoch order, each skipped before any rollout with
  probability 1 - max(p^c, 0.01), c its zero-variance groups in a row at the end of its history
  (p_easy after all-success groups, p_hard after all-fail ones); the two rates step by 0.01 per
  policy version toward a target share of zero-variance groups (`GresoParams`). GRESO reads a
  group's mean reward (a threshold of 0.98 for easy); here a group's outcome class does, and
  a group SARA abandoned counts on the side of its pure prefix.
"""

from __future__ import annotations

import array
import functools
import random
import threading
from dataclasses import dataclass
from typing import Sequence

STATES = ("F", "M", "S")
_INDEX = {s: i for i, s in enumerate(STATES)}
# Forward prediction converges within a few dozen steps; longer gaps cost time for nothing.
MAX_STEPS_FORWARD = 64

Matrix = list[list[float]]


@dataclass(frozen=True)
class DpsParams:
    """decay: weight kept per policy version (0.7 math, 0.5 Countdown in the DPS paper)."""

    decay: float = 0.5
    prior: float = 1.0


def _advance(belief: list[float], counts: Matrix, steps: int, params: DpsParams,
             mixed: array.array | None = None) -> tuple[list[float], Matrix]:
    """`steps` versions on (at most MAX_STEPS_FORWARD): each pushes the belief through the
    counts' rows (each normalised to sum to one), appends P(mixed) to `mixed` when given, then
    decays the counts toward the prior (c -> prior + decay * (c - prior)): the prediction for a
    step uses the counts as they stood after the step before it. Written out over the nine
    counts because it runs for every new observation history (a prompt keeps its last 16):
    built from lists, a step took about 5 times as long (bench/dps_scoring.py)."""
    d, p = params.decay, params.prior
    b0, b1, b2 = belief
    (c00, c01, c02), (c10, c11, c12), (c20, c21, c22) = counts
    for _ in range(min(steps, MAX_STEPS_FORWARD)):
        # belief[i] / row i's total: the row's weight once normalised
        w0, w1, w2 = b0 / (c00 + c01 + c02), b1 / (c10 + c11 + c12), b2 / (c20 + c21 + c22)
        b0, b1, b2 = (w0 * c00 + w1 * c10 + w2 * c20, w0 * c01 + w1 * c11 + w2 * c21,
                      w0 * c02 + w1 * c12 + w2 * c22)
        if mixed is not None:
            mixed.append(b1)
        c00, c01, c02 = p + d * (c00 - p), p + d * (c01 - p), p + d * (c02 - p)
        c10, c11, c12 = p + d * (c10 - p), p + d * (c11 - p), p + d * (c12 - p)
        c20, c21, c22 = p + d * (c20 - p), p + d * (c21 - p), p + d * (c22 - p)
    return [b0, b1, b2], [[c00, c01, c02], [c10, c11, c12], [c20, c21, c22]]


def _observed(before: list[float], counts: Matrix, after: list[float],
              params: DpsParams) -> Matrix:
    """The counts after a step with an observation: decayed once, plus one soft count over
    (from, to) in proportion to before[i] * after[j] * P(i -> j) under the counts as they stood
    (the reference sampler's Bayesian update of its transition parameters)."""
    d, p = params.decay, params.prior
    joint = [[before[i] * after[j] * counts[i][j] / sum(counts[i]) for j in range(3)]
             for i in range(3)]
    total = sum(map(sum, joint))
    return [[p + d * (counts[i][j] - p) + (joint[i][j] / total if total > 0 else 0.0)
             for j in range(3)] for i in range(3)]


def dps_observations(stored: Sequence[Sequence], censored: bool = True) -> list[tuple]:
    """The store's obs entries, [version, outcome] or [version, outcome, q] for an abandoned
    group, as `dps_mixed_probability` takes them; censored=False drops q (the old hard labels)."""
    return [tuple(o) if censored else tuple(o[:2]) for o in stored]


def dps_mixed_probability(observations: Sequence[Sequence], version: int,
                          params: DpsParams = DpsParams()) -> float:
    """P(the prompt's next group is mixed) at policy `version`, from (version, 'F'|'M'|'S')
    pairs, or triples (version, 'F'|'S', q) for a censored group that would have been mixed with
    probability q. Of several observations at one version the last recorded counts."""
    # stable by version: observations of one version keep the order they were recorded in, and
    # the last of them stands for the step
    last_at: dict[int, tuple[int, str, float]] = {}
    for o in sorted(observations, key=lambda o: int(o[0])):
        last_at[int(o[0])] = (int(o[0]), str(o[1]), float(o[2]) if len(o) > 2 else 0.0)
    return _predicted_mixed(tuple(last_at.values()), int(version), params)


def _belief_after(outcome: str, q: float) -> list[float]:
    """The state's distribution given the observation; a pure label with q > 0 is censored."""
    if outcome == "M":
        return [0.0, 1.0, 0.0]
    q = min(1.0, max(0.0, q))
    return [1.0 - q, q, 0.0] if outcome == "F" else [0.0, q, 1.0 - q]


# A scheduler scores selection_pool candidates for every group it opens, at a policy version
# that moves every step, while a prompt's observations change only when one of its groups ends.
# So each observation history's forward walk is kept and extended on demand (`_Forward`): a
# score at a later version costs a dictionary lookup and at most the steps not yet walked.
# Walking from the last observation at every version held the scheduler's event loop for 45% of
# py-spy's samples in a SARA + DPS run on the learning testbed (docs/benchmarks.md).
def _predicted_mixed(observations: tuple[tuple[int, str, float], ...], version: int,
                     params: DpsParams) -> float:
    walk = _forward(observations, params)
    if walk.at is None:  # never observed: the prior's one-step prediction (its counts do not decay)
        return walk.mixed_after(1)
    return walk.mixed_after(max(1, version - walk.at))


class _Forward:
    """One observation history's forward walk: P(mixed) 1, 2, ... versions after its last
    observation, walked as far as asked (at most MAX_STEPS_FORWARD) and kept."""

    __slots__ = ("at", "belief", "counts", "params", "mixed")

    def __init__(self, observations: tuple[tuple[int, str, float], ...],
                 params: DpsParams) -> None:
        belief, counts, self.at = _filtered(observations, params)  # at: the last one's version
        self.belief, self.counts = list(belief), [list(row) for row in counts]
        self.params = params
        self.mixed = array.array("d")   # [n - 1]: P(mixed) n versions on

    def mixed_after(self, steps: int) -> float:
        """P(mixed) `steps` versions after the last observation (the walk of `_advance`)."""
        steps = min(steps, MAX_STEPS_FORWARD)
        if len(self.mixed) < steps:
            with _EXTENDING:   # callers on several threads must not interleave one walk's steps
                self.belief, self.counts = _advance(self.belief, self.counts,
                                                    steps - len(self.mixed), self.params,
                                                    self.mixed)
        return self.mixed[steps - 1]


_EXTENDING = threading.Lock()


# a walk holds at most MAX_STEPS_FORWARD floats and its 3x3 state, about 2.4 KB with the cache's
# own bookkeeping (measured): at most about 80 MB when full, where a walk at every version was
# the alternative
@functools.lru_cache(maxsize=1 << 15)
def _forward(observations: tuple[tuple[int, str, float], ...], params: DpsParams) -> _Forward:
    return _Forward(observations, params)


@functools.lru_cache(maxsize=1 << 14)
def _filtered(observations: tuple[tuple[int, str, float], ...], params: DpsParams
              ) -> tuple[tuple[float, ...], tuple[tuple[float, ...], ...], int | None]:
    """The HMM's belief and transition counts just after the last observation, and its version
    (one observation a version: `dps_mixed_probability` keeps the last of each)."""
    counts: Matrix = [[params.prior] * 3 for _ in range(3)]
    belief = [1 / 3] * 3   # the reference's uniform starting belief
    at: int | None = None
    for seen_at, outcome, q in observations:
        if outcome not in _INDEX:
            raise ValueError(f"outcome must be one of {STATES}, got {outcome!r}")
        if at is not None:   # the belief one step before this observation, and the counts then
            belief, counts = _advance(belief, counts, seen_at - 1 - at, params)
        current = _belief_after(outcome, q)
        counts = _observed(belief, counts, current, params)
        belief, at = current, seen_at
    return tuple(belief), tuple(tuple(row) for row in counts), at


def mopps_score(alpha: float, beta: float, rng: random.Random, target: float = 0.5) -> float:
    """Negative squared distance of a Thompson sample from `target`: higher is better."""
    sample = rng.betavariate(alpha, beta)
    return -((sample - target) ** 2)


def mopps_levels_score(alphas: Sequence[float], k: int, rng: random.Random) -> float:
    """MoPPS under the reward view: a Thompson sample of the prompt's chances over its levels,
    pi ~ Dirichlet(`alphas`) (as normalised Gamma draws), scored by :func:`differ_chance`:
    higher is better."""
    draws = [rng.gammavariate(a, 1.0) for a in alphas]
    total = sum(draws)
    if total <= 0.0:   # every draw underflowed: all mass on no level, nothing to prefer
        return 0.0
    return differ_chance([d / total for d in draws], k)


def differ_chance(chances: Sequence[float], k: int) -> float:
    """P(a group of `k` whose rollouts land on the levels with these `chances` does not land
    all on one level) = 1 - sum_j pi_j^k. For two levels, 1 - p^k - (1-p)^k: largest at p =
    1/2 and falling as |p - 1/2| grows, so it ranks as MoPPS's -(p - 1/2)^2 does."""
    return 1.0 - sum(c ** k for c in chances)


def top_by_score(candidates: Sequence[str], scores: Sequence[float], count: int,
                 rng: random.Random) -> list[str]:
    """The `count` best-scored candidates; ties broken at random so no prompt is favoured."""
    order = sorted(range(len(candidates)), key=lambda i: (-scores[i], rng.random()))
    return [candidates[i] for i in order[:count]]


# --- GRESO -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GresoParams:
    """GRESO's (arXiv 2506.02177) pre-rollout filter. A prompt whose last `c` groups were all
    successes ('easy') is skipped with probability 1 - max(p_easy^c, floor), one whose last c
    were all failures ('hard') with 1 - max(p_hard^c, floor). Once per policy version the two
    exploration rates move by `step` toward a target share of zero-variance groups, `target`
    split one third easy, two thirds hard (hard prompts are the likelier to change as the policy
    improves), within [p_min, p_max]."""

    target: float = 0.25
    p_start: float = 0.5
    p_min: float = 0.05
    p_max: float = 0.95
    step: float = 0.01
    floor: float = 0.01

    @property
    def target_easy(self) -> float:
        return self.target / 3

    @property
    def target_hard(self) -> float:
        return self.target * 2 / 3


def greso_streak(observations: Sequence[Sequence]) -> tuple[str, int]:
    """The prompt's trailing run of zero-variance groups: ('S', c) for c all-success groups in a
    row at the end of its history, ('F', c) for all-fail, ('M', 0) after a mixed group or with
    no history. An abandoned group counts as the pure side its prefix was on."""
    ordered = sorted(observations, key=lambda o: int(o[0]))   # stable within a version
    if not ordered or str(ordered[-1][1]) == "M":
        return "M", 0
    side = str(ordered[-1][1])
    count = 0
    for obs in reversed(ordered):
        if str(obs[1]) != side:
            break
        count += 1
    return side, count


def greso_keep_chance(side: str, count: int, p_easy: float, p_hard: float,
                      params: GresoParams = GresoParams()) -> float:
    """P(GRESO keeps a prompt whose history ends in `count` groups on `side`)."""
    if side == "M" or count <= 0:
        return 1.0
    p = p_easy if side == "S" else p_hard
    return max(p ** count, params.floor)


def greso_adapt(p: float, share: float, target: float, params: GresoParams = GresoParams()
                ) -> float:
    """One step of an exploration rate: down (skip more) when the step's share of that kind of
    zero-variance group reached its target, up otherwise. greso_step.lua applies the same rule."""
    if share >= target:
        return max(p - params.step, params.p_min)
    return min(p + params.step, params.p_max)
