"""What Dynamic Sampling would have spent on the prompts SARA saw: a live estimate with its
95% interval (pure: no I/O).

DS fills every group to k and keeps the mixed ones, so on a stream of prompts where a group comes
out mixed with probability q it spends k / q rollouts per effective group. SARA's run tells us q
for every group it decided, except the ones it abandoned: those might have ended mixed. Audit
sampling fills that gap. A fixed share of groups, chosen when they open and so independent of
their outcomes, run on to k where SARA would abandon them. That is two-phase sampling:

- phase one, every decided group: mixed before its abandonment point (C of them), pure to the end
  without reaching one, or would-abandon (A of them);
- phase two, the audited would-abandon groups (n of them, M mixed): r = M / n estimates the share
  of would-abandon groups that would have ended mixed (the false-abandon rate).

Then q = (C + A r) / N over the N decided groups, and

    Var(q) ~ q (1 - q) / N  +  (A / N)^2 r (1 - r) / n (1 - n / A).

The first term is the binomial spread of the groups themselves (conservative when the prompts
are a census of the pool, as in an epoch), the second the audit's sampling error. Both use
Agresti-Coull adjusted proportions so the interval does not collapse on a rate of 0 or 1. The
interval on q is mapped through k / q. Before the first audit has finished there is no point
estimate, only the interval that every r in [0, 1] allows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Z95 = 1.959963984540054


@dataclass(frozen=True)
class GroupTally:
    """Decided groups of a run, in the two-phase classes above."""

    decided: int                # N: committed + abandoned + completed pure (audits included)
    mixed_before_abandon: int   # C: committed without having reached an abandonment point
    would_abandon: int          # A: abandoned + audited ones that finished
    audited: int                # n: audited would-abandon groups that finished
    audited_mixed: int          # M: of those, the ones that ended mixed


@dataclass(frozen=True)
class Interval:
    """A point estimate and its 95% interval; point None when the data cannot give one yet."""

    point: float | None
    low: float | None
    high: float | None


def tally_from_counters(committed: int, abandoned: int, completed_pure: int, audits_mixed: int,
                        audits_pure: int) -> GroupTally:
    """The tally from the service's counters (audited groups are counted among committed or
    completed-pure groups, by how they ended)."""
    audited = audits_mixed + audits_pure
    return GroupTally(decided=committed + abandoned + completed_pure,
                      mixed_before_abandon=committed - audits_mixed,
                      would_abandon=abandoned + audited, audited=audited,
                      audited_mixed=audits_mixed)


def _adjusted(successes: float, trials: float, z: float) -> tuple[float, float]:
    """Agresti-Coull: the proportion and trial count after adding z^2/2 of each outcome."""
    n = trials + z * z
    return (successes + z * z / 2) / n, n


def wilson(successes: int, trials: int, z: float = Z95) -> Interval:
    """The Wilson score interval of a binomial proportion (None throughout when trials = 0)."""
    if trials <= 0:
        return Interval(None, None, None)
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return Interval(p, max(0.0, centre - half), min(1.0, centre + half))


def _binomial_half(q: float, trials: int, z: float) -> float:
    q_adj, n_adj = _adjusted(q * trials, trials, z)
    return z * math.sqrt(q_adj * (1 - q_adj) / n_adj)


def mixed_fraction(t: GroupTally, z: float = Z95) -> Interval:
    """q, the chance that a group of k on these prompts ends mixed, with its interval."""
    if t.decided <= 0:
        return Interval(None, None, None)
    share_abandon = t.would_abandon / t.decided
    floor = t.mixed_before_abandon / t.decided          # r = 0: no abandoned group was mixed
    if t.would_abandon and not t.audited:               # nothing measured: any r in [0, 1] fits
        ceiling = floor + share_abandon
        return Interval(None, max(0.0, floor - _binomial_half(floor, t.decided, z)),
                        min(1.0, ceiling + _binomial_half(ceiling, t.decided, z)))
    rate = t.audited_mixed / t.audited if t.would_abandon else 0.0
    point = floor + share_abandon * rate
    half = _binomial_half(point, t.decided, z)
    if t.would_abandon:
        r_adj, audits_adj = _adjusted(t.audited_mixed, t.audited, z)
        unsampled = max(0.0, 1.0 - t.audited / t.would_abandon)
        audit_variance = share_abandon**2 * r_adj * (1 - r_adj) / audits_adj * unsampled
        half = math.sqrt(half**2 + z * z * audit_variance)
    return Interval(point, max(0.0, point - half), min(1.0, point + half))


def ds_rollouts_per_effective_group(t: GroupTally, k: int, z: float = Z95) -> Interval:
    """k / q with its interval; the upper end is None while q's lower end is 0."""
    q = mixed_fraction(t, z)

    def over(x: float | None) -> float | None:
        return k / x if x else None

    return Interval(over(q.point), over(q.high), over(q.low))


def false_abandon_rate(t: GroupTally, z: float = Z95) -> Interval:
    """The measured share of would-abandon groups that would have ended mixed (Wilson)."""
    return wilson(t.audited_mixed, t.audited, z)


def net_saving(spent: int, effective: float, ds: Interval) -> Interval:
    """1 - SARA's rollouts per effective group / DS's, with DS's interval carried through."""
    if not effective:
        return Interval(None, None, None)
    own = spent / effective

    def saving(x: float | None) -> float | None:
        return 1 - own / x if x else None

    return Interval(saving(ds.point), saving(ds.low), saving(ds.high))


def net_rollouts_saved(spent: int, effective: float, ds: Interval) -> Interval:
    """Rollouts DS would have spent for the same effective groups, less what was spent."""

    def saved(x: float | None) -> float | None:
        return effective * x - spent if x is not None else None

    return Interval(saved(ds.point), saved(ds.low), saved(ds.high))
