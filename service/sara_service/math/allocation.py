"""SARA allocation math and the three allocation policies (pure: no I/O, no randomness).

A prompt's success rate is gamma ~ Beta(alpha0, beta0); a group is k Bernoulli(gamma) rollouts and
is *mixed* (useful to GRPO) when it holds at least one success and one failure. After a prefix of
n outcomes with s successes, ``p_eff`` is the posterior-predictive probability that the full group
ends up mixed:

- mixed prefix (1 <= s <= n-1): 1;
- all-fail prefix (s = 0 < n):    1 - B(a, b+k) / B(a, b+n);
- all-success prefix (s = n > 0): 1 - B(a+k, b) / B(a+n, b);
- empty prefix (n = 0):           1 - B(a, b+k)/B(a, b) - B(a+k, b)/B(a, b).

Each Beta ratio is a product of one-step predictive probabilities,
B(a, b+k)/B(a, b+n) = prod_{j=n}^{k-1} (b+j)/(a+b+j), so its log is a short sum of bounded terms.
That is how it is computed here: differences of lgamma values near 1e6 would lose ~10 digits.

The scheduler calls ``plan_group`` once per new group; the Redis Lua scripts only count results
and compare them with the plan's thresholds (and read p_eff from its tables for accounting).
``decide`` is the Python reference those scripts are checked against.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

POLICIES = ("uniform", "dynamic_sampling", "sara")


# ---------------------------------------------------------------------------- input checks


def _int_at_least(name: str, value: object, minimum: int) -> int:
    # bool is an int subclass; True as a group size is always a caller bug.
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        number = operator.index(value)  # accepts int and numpy integers, rejects 2.0
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}")
    return number


def _float(name: str, value: object) -> float:
    # bool is a number to Python and always a caller bug here
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None


def _real(name: str, value: object) -> float:
    number = _float(name, value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return number


def _real_or_inf(name: str, value: object) -> float:
    # a half-life may be infinite (never forget); NaN and negatives are caller bugs
    number = _float(name, value)
    if math.isnan(number) or number < 0.0:
        raise ValueError(f"{name} must be >= 0 or inf, got {value!r}")
    return number


def _positive(name: str, value: object) -> float:
    number = _real(name, value)
    if number <= 0.0:
        raise ValueError(f"{name} must be > 0 (a Beta prior parameter), got {value!r}")
    return number


def _unit(name: str, value: object) -> float:
    number = _real(name, value)
    if not 0.0 <= number <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return number


def _prefix(n: object, s: object, k: object) -> tuple[int, int, int]:
    k = _int_at_least("k", k, 1)
    n = _int_at_least("n", n, 0)
    s = _int_at_least("s", s, 0)
    if n > k:
        raise ValueError(f"n (outcomes seen) must be <= k={k}, got n={n}")
    if s > n:
        raise ValueError(f"s (successes) must be <= n={n}, got s={s}")
    return n, s, k


# ------------------------------------------------------------------------------- the math


def _clamp01(x: float) -> float:
    # Also turns -0.0 (from -expm1(0.0)) into 0.0.
    return min(1.0, max(0.0, x))


def log_stay_pure(a: float, b: float, k: int) -> list[float]:
    """logs[n] = log B(a, b+k) / B(a, b+n): the log-probability that, after n failures, the
    remaining k-n draws fail too. logs[k] = 0. (Swap a and b for the all-success side.)

    Accumulated from j = k-1 down, so logs[n] for every n is one pass, and every caller (p_eff,
    the thresholds, the plan's tables) gets bit-identical values: decide() and the Lua tables can
    never disagree by a rounding. All terms are negative, so logs is non-increasing in floating
    point as well as in exact arithmetic.
    """
    logs = [0.0] * (k + 1)
    acc = 0.0
    for j in range(k - 1, -1, -1):
        r = a / (a + b + j)  # predictive chance of a success after j failures
        # log1p(-r) is accurate while r is small; as r -> 1 the 1 - r inside it cancels, and the
        # direct quotient (b+j)/(a+b+j) is the accurate form (e.g. a = 1e6, b = 0.01, j = 0).
        acc += math.log1p(-r) if r < 0.5 else math.log((b + j) / (a + b + j))
        logs[j] = acc
    return logs


def _p_eff_start(fail_logs: list[float], success_logs: list[float]) -> float:
    # 1 - P(all fail) - P(all succeed); expm1 keeps 1 - P(all fail) exact when P is near 1.
    return _clamp01(-math.expm1(fail_logs[0]) - math.exp(success_logs[0]))


def _p_eff_tables(k: int, a: float, b: float) -> tuple[list[float], list[float]]:
    """p_eff along the all-fail and all-success prefixes, n = 0..k (entry 0 is shared)."""
    fail_logs = log_stay_pure(a, b, k)
    success_logs = log_stay_pure(b, a, k)
    start = _p_eff_start(fail_logs, success_logs)
    fail = [start] + [_clamp01(-math.expm1(x)) for x in fail_logs[1:]]
    success = [start] + [_clamp01(-math.expm1(x)) for x in success_logs[1:]]
    return fail, success


def p_eff(n: int, s: int, k: int, alpha0: float, beta0: float) -> float:
    """Probability that a group of k rollouts ends mixed, given s successes in its first n.

    gamma ~ Beta(alpha0, beta0). A mixed prefix gives 1.0, a complete pure group (n = k) 0.0.
    Stable for k up to 1024 and alpha0, beta0 up to 1e6 and beyond. Raises ValueError unless
    0 <= s <= n <= k, k >= 1 and alpha0, beta0 are finite and > 0.
    """
    n, s, k = _prefix(n, s, k)
    a, b = _positive("alpha0", alpha0), _positive("beta0", beta0)
    if 0 < s < n:
        return 1.0
    if n == 0:
        return _p_eff_start(log_stay_pure(a, b, k), log_stay_pure(b, a, k))
    logs = log_stay_pure(a, b, k) if s == 0 else log_stay_pure(b, a, k)
    return _clamp01(-math.expm1(logs[n]))


# ------------------------------------------------------------------------ thresholds, decide


@dataclass(frozen=True)
class Thresholds:
    """Pure-prefix lengths at which a group is abandoned; k + 1 means never, 0 means skip."""

    after_failures: int
    after_successes: int


def _first_below(table: list[float], tau_low: float, k: int) -> int:
    # p_eff is non-increasing along a pure prefix for n >= 1, so the first hit is the threshold.
    for n in range(1, k + 1):
        if table[n] < tau_low:
            return n
    return k + 1


def _thresholds(fail: list[float], success: list[float], k: int, tau_low: float,
                tau_fail: float | None = None) -> Thresholds:
    """Where each pure side's p_eff first drops below its threshold: `tau_fail` on the failing
    side when given (a hard prompt's rare success is worth more probes), `tau_low` otherwise."""
    tau_f = tau_low if tau_fail is None else tau_fail
    if fail[0] < min(tau_low, tau_f):
        # Not even worth one rollout. (n = 0 is a different formula from n >= 1, so it is
        # checked separately: an informed prior can make n = 0 low and n = 1 high.)
        return Thresholds(0, 0)
    return Thresholds(_first_below(fail, tau_f, k), _first_below(success, tau_low, k))


def abandon_thresholds(k: int, alpha0: float, beta0: float, tau_low: float) -> Thresholds:
    """The smallest all-fail and all-success prefix lengths n (1..k) with p_eff < tau_low.

    k + 1 when there is none (tau_low = 0: never abandon); both 0 when p_eff at n = 0 is
    already below tau_low (skip the prompt before issuing anything).
    """
    _, _, k = _prefix(0, 0, k)
    a, b = _positive("alpha0", alpha0), _positive("beta0", beta0)
    tau = _unit("tau_low", tau_low)
    fail, success = _p_eff_tables(k, a, b)
    return _thresholds(fail, success, k, tau)


def decide(n: int, s: int, k: int, alpha0: float, beta0: float, tau_low: float) -> str:
    """SARA's decision after s successes in n outcomes: "commit", "abandon" or "continue".

    "commit" for a mixed prefix; "abandon" for a pure prefix with p_eff < tau_low (n = 0 is
    the skip decision); otherwise "continue". A pure group at n = k that is not abandoned
    (tau_low = 0) is complete and saturated: the caller drops it.
    """
    tau = _unit("tau_low", tau_low)
    probability = p_eff(n, s, k, alpha0, beta0)  # validates the rest
    if 0 < s < n:
        return "commit"
    return "abandon" if probability < tau else "continue"


# ----------------------------------------------------------------------------- group plans


@dataclass(frozen=True)
class GroupPlan:
    """Everything the Lua scripts need to run one group without computing a Beta function.

    p_eff_fail[n] = p_eff(n, 0) for n = 0..min(after_failures, k); p_eff_success[n] likewise
    for all-success prefixes. deliver_saturated: a complete all-fail/all-success group is
    delivered (uniform) rather than dropped. by_level: under the reward view with per-prompt
    plans, (level, threshold, p_eff table up to it) for each reward level the prompt has
    produced; a run at any other level uses after_failures and p_eff_fail (empty otherwise).
    rounds: (round size, successes and failures that stop it) for a group sampled in rounds
    (Reinforce-Ada, `math.reinforce_ada`); empty otherwise. pilot: (pilot size, fewest and most
    successes committed) for a group decided on its pilot (Pilot-Commit, `math.pilot_commit`);
    empty otherwise.
    """

    policy: str
    k: int
    after_failures: int
    after_successes: int
    initial_issue: int
    p_eff_fail: tuple[float, ...]
    p_eff_success: tuple[float, ...]
    deliver_saturated: bool
    by_level: tuple[tuple[str, int, tuple[float, ...]], ...] = ()
    rounds: tuple[int, ...] = ()
    pilot: tuple[int, ...] = ()

    @property
    def skip(self) -> bool:
        """True when the prompt is abandoned before any rollout is issued."""
        return self.after_failures == 0 and self.after_successes == 0


def plan_group(policy: str, k: int, alpha0: float, beta0: float, tau_low: float | str,
               rho: float | None = None, tau_floor: float | None = None,
               pool: object = None, fill: bool = True, allow_skip: bool = False,
               lengths: object = None, tau_fail: float | None = None) -> GroupPlan:
    """The plan for a new group under "uniform", "dynamic_sampling" or "sara".

    Baselines never abandon (thresholds k + 1) and issue k at once; only uniform delivers
    saturated groups. SARA issues enough rollouts to reach its nearer threshold at once.
    tau_low "auto" (SARA only) derives the thresholds from the price `rho` (rollouts per
    effective group bought elsewhere) with `sara_service.math.autotau`: `pool` is the PoolModel of
    this prompt's success rate (default: Beta(alpha0, beta0) discretised; rho default: that
    model's fixed point); tau_floor bounds p_eff at abandonment; allow_skip lets the plan skip
    (off for a plan shared by every fresh prompt: skipping all of them would stall the run).
    `lengths` (an autotau.TokenLengths) prices the "auto" plan in tokens: rho is then tokens
    per effective group (SARA_AUTO_PRICE=tokens). `tau_fail` (fixed tau only) abandons an
    all-fail prefix below it instead of below tau_low (SARA_TAU_LOW_FAIL).
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {policy!r}")
    _, _, k = _prefix(0, 0, k)
    a, b = _positive("alpha0", alpha0), _positive("beta0", beta0)
    if tau_low == "auto":
        if policy == "sara":
            return _auto_plan(k, a, b, rho, tau_floor, pool, fill, allow_skip, lengths)
        tau_low = 0.0  # the baselines never abandon: any τ gives the same plan
    fail, success = _p_eff_tables(k, a, b)
    return plan_from_tables(policy, k, fail, success, tau_low, tau_fail)


def plan_from_tables(policy: str, k: int, fail: list[float], success: list[float],
                     tau_low: float, tau_fail: float | None = None) -> GroupPlan:
    """The plan of `policy` from p_eff along the two pure sides (entries n = 0..k): SARA's
    thresholds are where each side first drops below tau_low (the failing side's below
    `tau_fail` when given); the baselines never abandon. `sara_service.math.reward_levels`
    plans the reward view with it, from the Dirichlet's tables."""
    tau = _unit("tau_low", tau_low)
    if policy == "sara":
        limits = _thresholds(fail, success, k, tau,
                             None if tau_fail is None else _unit("tau_fail", tau_fail))
    else:
        limits = Thresholds(k + 1, k + 1)
    return _plan(policy, k, limits, fail, success)


def _plan(policy: str, k: int, limits: Thresholds, fail: list[float] | tuple[float, ...],
          success: list[float] | tuple[float, ...]) -> GroupPlan:
    return GroupPlan(
        policy=policy,
        k=k,
        after_failures=limits.after_failures,
        after_successes=limits.after_successes,
        initial_issue=min(limits.after_failures, limits.after_successes, k),
        p_eff_fail=tuple(fail[: min(limits.after_failures, k) + 1]),
        p_eff_success=tuple(success[: min(limits.after_successes, k) + 1]),
        deliver_saturated=policy == "uniform",
    )


def _auto_plan(k: int, a: float, b: float, rho: float | None, floor: float | None,
               pool: object, fill: bool, allow_skip: bool, lengths: object) -> GroupPlan:
    # imported here: autotau is the heavier module and only "auto" runs need it
    from .autotau import PoolModel, TokenLengths, auto_thresholds, fixed_point_rho

    if floor is not None:
        floor = _unit("tau_floor", floor)
    model = PoolModel.beta(a, b) if pool is None else pool
    if not isinstance(model, PoolModel):
        raise ValueError(f"pool must be an autotau.PoolModel, got {type(pool).__name__}")
    if lengths is not None and not isinstance(lengths, TokenLengths):
        raise ValueError(f"lengths must be an autotau.TokenLengths, got {type(lengths).__name__}")
    if rho is None:
        rho = fixed_point_rho(model, k, fill, floor, lengths=lengths)
    auto = auto_thresholds(model, k, _positive("rho", rho), fill, floor, allow_skip, lengths)
    limits = Thresholds(auto.after_failures, auto.after_successes)
    return _plan("sara", k, limits, auto.p_eff_fail, auto.p_eff_success)


def issue_target(plan: GroupPlan, successes: int, failures: int) -> int:
    """Total rollouts an open group should have issued, given its results so far.

    A pure prefix can only end at the threshold on its own side, so it needs exactly that many
    outcomes; with no results either side may come first, so the nearer one. Capped at k. A
    mixed prefix means the group is committed: the answer is k (fill the group).
    """
    successes = _int_at_least("successes", successes, 0)
    failures = _int_at_least("failures", failures, 0)
    if successes + failures > plan.k:
        raise ValueError(f"successes + failures must be <= k={plan.k}, got {successes + failures}")
    if successes and failures:
        return plan.k
    if failures:
        return min(plan.after_failures, plan.k)
    if successes:
        return min(plan.after_successes, plan.k)
    return min(plan.after_failures, plan.after_successes, plan.k)


# ------------------------------------------------------------------------------ posteriors


def _toward(prior: float, current: float, weight: float) -> float:
    value = prior + weight * (current - prior)
    # Rounding may step a hair outside [prior, current]; the exact value never does.
    return min(max(value, min(prior, current)), max(prior, current))


def decay_weight(decay: float, versions_elapsed: int, half_life: float = math.inf,
                 epochs_elapsed: float = 0.0) -> float:
    """The weight old evidence keeps: decay**dv * 0.5**(de / half_life).

    dv = policy versions elapsed, de = epochs of the pool elapsed (groups opened or prompts
    skipped, divided by the pool's size). half_life = inf (or 0, "off") leaves de out. The
    operations and their order are those of apply_results.lua (update_posterior, in
    lua/_results_learn.lua), so the two agree to the bit.
    """
    decay = _unit("decay", decay)
    elapsed = _int_at_least("versions_elapsed", versions_elapsed, 0)
    half_life = _real_or_inf("half_life", half_life)
    epochs = _real("epochs_elapsed", epochs_elapsed)
    weight = 1.0
    if elapsed > 0:
        weight = decay**elapsed  # underflows to 0.0 (the prior) for long gaps; never raises
    if 0.0 < half_life < math.inf and epochs > 0.0:
        weight = weight * 0.5 ** (epochs / half_life)
    return weight


def decay_posterior(
    alpha: float, beta: float, alpha0: float, beta0: float, decay: float, versions_elapsed: int,
    half_life: float = math.inf, epochs_elapsed: float = 0.0,
) -> tuple[float, float]:
    """Shrink a posterior toward its prior as the policy and the pool move on.

    alpha <- alpha0 + w * (alpha - alpha0), same for beta, with w = `decay_weight(...)`: decay
    per policy version, and a half-life in epochs of the pool (a prompt's history should last
    to its next visit, an epoch later, whatever the number of versions in between). Nothing
    elapsed returns (alpha, beta) unchanged; decay = 0 with dv > 0 returns the prior.
    """
    alpha, beta = _positive("alpha", alpha), _positive("beta", beta)
    alpha0, beta0 = _positive("alpha0", alpha0), _positive("beta0", beta0)
    weight = decay_weight(decay, versions_elapsed, half_life, epochs_elapsed)
    if weight == 1.0:
        return alpha, beta
    return _toward(alpha0, alpha, weight), _toward(beta0, beta, weight)
