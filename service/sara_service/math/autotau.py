"""Cost-aware abandonment thresholds (``tau_low = "auto"``): pure math, no I/O, no randomness.

A fixed τ_low asks "is the chance that this group ends mixed below τ?". What a run wants is
fewer rollouts per effective group. Buying one effective group elsewhere costs ρ rollouts (the
pool's running rollouts per effective group: what a rollout would buy spent on a fresh prompt).
So a pure prefix is worth continuing exactly when its expected value is positive, with a mixed
group worth +ρ and each rollout worth -1. That is an optimal-stopping problem on each side of a
pure prefix, solved here by backward induction (`side_values`):

    V(k) = 0                     (a complete pure group: nothing more to spend or gain)
    V(n) = max(0, -1 + h(n)·(ρ - r(n)) + (1 - h(n))·V(n+1)),   n = 1..k-1

h(n) is the predictive chance that the next rollout breaks a run of n equal results, r(n) what
a group that turns mixed still costs (k - n - 1 under commit "complete", 0 under "partial"),
and 0 is the value of abandoning. The group is abandoned at the first n where stopping is
optimal; the prompt is skipped (thresholds 0, 0) when even the first rollout is not worth it.
Minimising cost - ρ·mixed at the ρ where its minimum is 0 minimises the ratio cost / mixed
(Dinkelbach), so feeding back the ρ the thresholds achieve converges to the best thresholds
(`fixed_point_rho`).

The predictive is where the pool comes in. A Beta(1, 1) prompt says "after 3 failures, 1 in 5
succeeds next"; on a pool where 30% of prompts never succeed it is far less, and the Beta-prior
thresholds never abandon (23-52% worse than the best fixed τ on the standard pool). So the
prior of a fresh prompt is the *learned pool*: a discrete mixture over a grid of success rates
(`PoolModel`), fitted by EM to the prompts' learned posteriors (`fit_pool`). A prompt's own
evidence reweights the mixture (history priors). Before anything is learned the model is the
configured Beta prior, discretised.

The reliability floor: with ``floor`` set, stopping is allowed only where p_eff (the predictive
chance that the full group would end mixed) is below the floor, so every abandoned group (and a
skip, at n = 0) has false-abandon probability < floor under the model, the fixed-τ bound. The
DP then optimises among the allowed stopping points.

Priced in tokens (`TokenLengths`, ``SARA_AUTO_PRICE=tokens``): in real traces a failure runs
longer than a success, so a rollout on a run of failures costs more than one on a run of
successes, and the rollout price undercharges exactly the runs the rule should cut. With mean
lengths L_s (a success) and L_f (a failure), the -1 above becomes the next rollout's expected
tokens, c(n) = h(n)·L_other + (1 - h(n))·L_side, r(n) the expected tokens of the k - n - 1
rollouts a group that turns mixed still costs (each a success with the pool model's posterior
mean after the prefix), and ρ is tokens per effective group. With L_s = L_f = L every term is
L times the rollout DP's at ρ / L, so the thresholds are the same.

The reward view (``SARA_EFFECTIVE=reward``, `level_thresholds`): a group is mixed once two of
its rewards differ in level, so a pure prefix is a run at one level, and what breaks it is any
other level. The pool model is then the distribution of q, the chance of one level, over every
(prompt, level) pair in use, fitted by the same EM to rows (rollouts at the level, rollouts
elsewhere) (`level_evidence`); before anything is learned it is the symmetric Dirichlet's
marginal, Beta(α0, (L-1)α0) (`level_pool_prior`). A run of n at a level is the binary rule's
run of successes at rate q, so the same DP on that one side gives the one threshold every level
shares. Token prices are not kept per level, so the reward view prices in rollouts only.

Past 400 lines because it is one concept: the stopping DP, the pool model it needs and the
fixed point that prices it, with the token and reward-level variants of each beside the
rollout one they reduce to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GRID = tuple(i / 32 for i in range(33))   # success rates the pool model puts mass on
_TINY = 1e-300


@dataclass(frozen=True)
class PoolModel:
    """A distribution of success rates: weights[i] on GRID[i] (sums to 1)."""

    weights: tuple[float, ...]

    @classmethod
    def beta(cls, a: float, b: float) -> PoolModel:
        """Beta(a, b), discretised on GRID (trapezoid weights: the density at each point)."""
        # the end points carry half a cell each; the density is read just inside them, where
        # it is finite for a or b < 1
        dens = []
        for i, g in enumerate(GRID):
            x = min(max(g, 1 / 128), 1 - 1 / 128)
            width = 0.5 if i in (0, len(GRID) - 1) else 1.0
            dens.append(width * math.exp((a - 1) * math.log(x) + (b - 1) * math.log1p(-x)))
        total = sum(dens)
        return cls(tuple(d / total for d in dens))

    def given(self, successes: float, failures: float) -> PoolModel:
        """The mixture after a prompt's own evidence (pseudo-counts above its prior)."""
        if successes <= 0 and failures <= 0:
            return self
        logs = [math.log(w) + _loglik(g, successes, failures) if w > 0 else -math.inf
                for w, g in zip(self.weights, GRID)]
        top = max(logs)
        raw = [math.exp(x - top) for x in logs]
        total = sum(raw)
        return PoolModel(tuple(r / total for r in raw))

    def mean(self) -> float:
        """E[γ]."""
        return sum(w * g for w, g in zip(self.weights, GRID))


@dataclass(frozen=True)
class TokenLengths:
    """Mean completion tokens of a successful and of a failed rollout: the rollout prices of
    the token-priced DP (both > 0)."""

    success: float
    failure: float

    def __post_init__(self) -> None:
        for name in ("success", "failure"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"token length {name} must be finite and > 0, got {value!r}")

    def expected(self, p_success: float) -> float:
        """Expected tokens of a rollout that succeeds with probability `p_success`."""
        return p_success * self.success + (1.0 - p_success) * self.failure


@dataclass(frozen=True)
class SidePrices:
    """One side's prices for `side_values`: step[n], the next rollout's cost after a run of n,
    and rest[n], what a group that turns mixed at rollout n + 1 still costs."""

    step: tuple[float, ...]
    rest: tuple[float, ...]


def rollout_prices(k: int, fill: bool) -> SidePrices:
    """The rollout-priced rule: every rollout costs 1, a mixed group the k - n - 1 to fill."""
    return SidePrices((1.0,) * k, tuple((k - n - 1) if fill else 0 for n in range(k)))


def token_prices(model: PoolModel, logs: list[float], k: int, fill: bool, failing: bool,
                 lengths: TokenLengths) -> SidePrices:
    """The token-priced rule on one side (see the module docstring): the next rollout's
    expected tokens after a run of n, and the rest of a group that turns mixed there."""
    side, other = ((lengths.failure, lengths.success) if failing
                   else (lengths.success, lengths.failure))
    step, rest = [0.0] * k, [0.0] * k
    for n in range(1, k):
        breaks = -math.expm1(logs[n + 1] - logs[n])
        step[n] = breaks * other + (1.0 - breaks) * side
        if fill and k - n - 1 > 0:
            wins, losses = (1.0, float(n)) if failing else (float(n), 1.0)
            rest[n] = (k - n - 1) * lengths.expected(model.given(wins, losses).mean())
    return SidePrices(tuple(step), tuple(rest))


def _loglik(g: float, s: float, f: float) -> float:
    if (g == 0.0 and s > 0) or (g == 1.0 and f > 0):
        return -math.inf
    return (s * math.log(g) if s > 0 else 0.0) + (f * math.log1p(-g) if f > 0 else 0.0)


def stay_logs(model: PoolModel, k: int, failing: bool) -> list[float]:
    """logs[n] = log P(the first n outcomes all fail) (all succeed when not failing), n = 0..k."""
    out = []
    for n in range(k + 1):
        terms = [w * ((1.0 - g) if failing else g) ** n for w, g in zip(model.weights, GRID)]
        out.append(math.log(max(sum(terms), _TINY)))
    return out


def p_eff_table(logs: list[float], k: int) -> list[float]:
    """p_eff after n equal results, n = 1..k (entry 0 is a placeholder): 1 - P(stay pure)."""
    return [0.0] + [min(1.0, max(0.0, -math.expm1(logs[k] - logs[n]))) for n in range(1, k + 1)]


@dataclass(frozen=True)
class SideDecision:
    """One side's optimal stopping: the threshold (k + 1 = never) and V(1), the value of a
    run of one equal result under the optimal policy."""

    threshold: int
    value_at_one: float


def side_values(logs: list[float], k: int, rho: float, fill: bool,
                allowed: list[bool], prices: SidePrices | None = None) -> SideDecision:
    """Backward induction on one side (see the module docstring); allowed[n]: may stop at n.
    `prices` None: the rollout price (each rollout 1, ρ in rollouts)."""
    if prices is None:
        prices = rollout_prices(k, fill)
    value = 0.0                       # V(n + 1), starting from V(k) = 0
    stop_at = [False] * (k + 1)
    for n in range(k - 1, 0, -1):
        breaks = -math.expm1(logs[n + 1] - logs[n])   # h(n), accurate when tiny
        # the rollout price gives -1.0 + h·(ρ - (k - n - 1)) + ..., the same floats as before
        cont = -prices.step[n] + breaks * (rho - prices.rest[n]) + (1.0 - breaks) * value
        # ties go to stopping: an indifferent rollout is not worth its latency
        if allowed[n] and cont <= 0.0:
            stop_at[n], value = True, 0.0
        else:
            value = cont
    threshold = next((n for n in range(1, k) if stop_at[n]), k + 1)
    return SideDecision(threshold, value)


def _allowed(table: list[float], floor: float | None) -> list[bool]:
    return [floor is None or p < floor for p in table]


@dataclass(frozen=True)
class AutoThresholds:
    """The cost-aware plan's numbers: thresholds (0, 0 = skip), the p_eff tables (n = 0..k) and
    the value of starting a group (in rollouts; <= 0 means skipping is optimal)."""

    after_failures: int
    after_successes: int
    p_eff_fail: tuple[float, ...]
    p_eff_success: tuple[float, ...]
    start_value: float


def auto_thresholds(model: PoolModel, k: int, rho: float, fill: bool = True,
                    floor: float | None = None, allow_skip: bool = True,
                    lengths: TokenLengths | None = None) -> AutoThresholds:
    """Thresholds minimising expected rollouts per effective group at opportunity cost `rho`.

    `allow_skip` False starts the group even when its value is negative (a fresh prompt under a
    shared plan: skipping every prompt would stall the run, and ρ is noisy). `lengths` given:
    priced in tokens (ρ in tokens per effective group; see the module docstring).
    """
    if not (rho > 0 and math.isfinite(rho)):
        raise ValueError(f"rho must be finite and > 0, got {rho!r}")
    fail_logs, succ_logs = stay_logs(model, k, True), stay_logs(model, k, False)
    fail_tab, succ_tab = p_eff_table(fail_logs, k), p_eff_table(succ_logs, k)
    start = min(1.0, max(0.0, 1.0 - math.exp(fail_logs[k]) - math.exp(succ_logs[k])))
    fail_tab[0] = succ_tab[0] = start
    fail_prices = succ_prices = None
    if lengths is not None:
        fail_prices = token_prices(model, fail_logs, k, fill, True, lengths)
        succ_prices = token_prices(model, succ_logs, k, fill, False, lengths)
    fail = side_values(fail_logs, k, rho, fill, _allowed(fail_tab, floor), fail_prices)
    succ = side_values(succ_logs, k, rho, fill, _allowed(succ_tab, floor), succ_prices)
    p_first_success = math.exp(succ_logs[1])
    # V(0): the first rollout costs 1 (its expected tokens) and lands on one side or the
    # other; k = 1 has no sides
    first = 1.0 if lengths is None else lengths.expected(p_first_success)
    value = (-first + p_first_success * succ.value_at_one
             + (1.0 - p_first_success) * fail.value_at_one)
    # strictly negative: at the price a pool achieves, its average prompt is worth exactly 0
    skip = allow_skip and value < -1e-9 and (floor is None or start < floor)
    t_f, t_s = (0, 0) if skip else (fail.threshold, succ.threshold)
    return AutoThresholds(t_f, t_s, tuple(fail_tab), tuple(succ_tab), value)


def expected_cost_and_yield(model: PoolModel, k: int, t_f: int, t_s: int,
                            fill: bool = True, lengths: TokenLengths | None = None
                            ) -> tuple[float, float]:
    """(E[rollouts], P(mixed)) of one group with thresholds (t_f, t_s) for a prompt drawn from
    `model`; (0, 0) for a skip. Under "partial" a mixed group costs its rollouts up to the
    switch only (approximately: rollouts already issued beyond it are not counted).
    `lengths` given: E[tokens] instead of E[rollouts]."""
    if t_f == 0 and t_s == 0:
        return 0.0, 0.0
    cost = mixed = 0.0
    for w, g in zip(model.weights, GRID):
        cost_g, mixed_g = _one_side(g, k, t_f, fill, True, lengths)
        cost_g, mixed_g = _one_side(g, k, t_s, fill, False, lengths, cost_g, mixed_g)
        cost += w * cost_g
        mixed += w * mixed_g
    return cost, mixed


def _one_side(g: float, k: int, limit: int, fill: bool, failing: bool,
              lengths: TokenLengths | None, cost: float = 0.0, mixed: float = 0.0
              ) -> tuple[float, float]:
    """(cost, P(mixed)) of the groups whose first outcome lands on one side, at rate g, added
    to `cost` and `mixed` (the two sides accumulate in one sum, in this order)."""
    stay, other = (1.0 - g, g) if failing else (g, 1.0 - g)
    last = min(limit, k)
    for n in range(1, last):          # a run of n, then the switch at rollout n + 1
        p = stay ** n * other
        mixed += p
        cost += p * _mixed_cost(g, k, n, fill, failing, lengths)
    # abandoned at the threshold, or complete and pure
    run = 1 if lengths is None else (lengths.failure if failing else lengths.success)
    cost += stay ** last * last * run
    return cost, mixed


def _mixed_cost(g: float, k: int, n: int, fill: bool, failing: bool,
                lengths: TokenLengths | None) -> float:
    # integers under the rollout price: the same floats the rule always gave
    if lengths is None:
        return k if fill else n + 1
    side, other = ((lengths.failure, lengths.success) if failing
                   else (lengths.success, lengths.failure))
    tail = (k - n - 1) * lengths.expected(g) if fill else 0.0
    return n * side + other + tail


def fixed_point_rho(model: PoolModel, k: int, fill: bool = True, floor: float | None = None,
                    iterations: int = 64, lengths: TokenLengths | None = None,
                    levels: int | None = None) -> float:
    """The ρ the model's own thresholds achieve when derived at that ρ (Dinkelbach's iteration
    from what Dynamic Sampling pays): the starting price before the pool has yielded anything.
    `lengths` given: in tokens per effective group, for the token-priced rule. `levels` given:
    the reward view's rule (`level_thresholds`), `model` then being the pool of level chances."""
    def cost_and_yield(t_f: int, t_s: int) -> tuple[float, float]:
        if levels is None:
            return expected_cost_and_yield(model, k, t_f, t_s, fill, lengths)
        return level_cost_and_yield(model, k, t_f, fill)

    def plan_at(rho: float) -> AutoThresholds:
        if levels is None:
            return auto_thresholds(model, k, rho, fill, floor, allow_skip=False, lengths=lengths)
        return level_thresholds(model, k, rho, levels, fill, floor)

    cost, mixed = cost_and_yield(k + 1, k + 1)
    if mixed <= 0.0:
        raise ValueError("the model gives no chance of a mixed group: no price exists")
    rho = cost / mixed
    for _ in range(iterations):
        plan = plan_at(rho)
        cost, mixed = cost_and_yield(plan.after_failures, plan.after_successes)
        if mixed <= 0.0 or cost / mixed >= rho * (1.0 - 1e-12):
            break                          # no further improvement: this is the fixed point
        rho = cost / mixed
    return rho


# ----------------------------------------------------------------------------- the reward view


def level_pool_prior(alpha0: float, levels: int) -> PoolModel:
    """The reward view's pool model before anything is learned: the chance of one level under
    the symmetric Dirichlet(alpha0, ..., alpha0) over `levels` levels, Beta(alpha0, (L-1)alpha0),
    discretised."""
    if levels < 2:
        raise ValueError(f"the reward view plans for at least 2 levels, got {levels!r}")
    return PoolModel.beta(alpha0, (levels - 1) * alpha0)


def level_evidence(level_counts: list[float], levels: int) -> list[tuple[float, float]]:
    """One prompt's rows for `fit_pool` under the reward view: (rollouts at level j, rollouts
    elsewhere) for each of the `levels` levels in use (those it never produced count 0)."""
    counts = list(level_counts) + [0.0] * max(0, levels - len(level_counts))
    total = math.fsum(counts)
    return [(c, total - c) for c in counts]


def level_thresholds(model: PoolModel, k: int, rho: float, levels: int, fill: bool = True,
                     floor: float | None = None) -> AutoThresholds:
    """The cost-aware plan of the reward view (see the module docstring's price; here a group
    is mixed once two of its rewards differ in level).

    `model` is the pool's distribution of q, the chance of one level of one prompt, over every
    (prompt, level) pair in use (`level_evidence` rows). A pure prefix of n at some level is the
    success side of the binary rule with q as the success rate: P(run of n) = L·E[q^n] summed
    over the L levels of a prompt, so h(n) = 1 - E[q^(n+1)] / E[q^n] whatever the level, and one
    threshold serves every level (as the fixed-τ plan of the symmetric Dirichlet). Both of the
    returned thresholds and tables are that one side's (the Lua reads the failure side's under
    the reward view); entry 0 of the table is P(a group's rewards differ) = 1 - L·E[q^k]. A
    fresh prompt is never skipped: the first rollout always starts a run.
    """
    if not (rho > 0 and math.isfinite(rho)):
        raise ValueError(f"rho must be finite and > 0, got {rho!r}")
    logs = stay_logs(model, k, False)
    table = p_eff_table(logs, k)
    table[0] = min(1.0, max(0.0, 1.0 - levels * math.exp(logs[k])))
    side = side_values(logs, k, rho, fill, _allowed(table, floor))
    return AutoThresholds(side.threshold, side.threshold, tuple(table), tuple(table),
                          -1.0 + side.value_at_one)


def level_cost_and_yield(model: PoolModel, k: int, threshold: int, fill: bool = True
                         ) -> tuple[float, float]:
    """(E[rollouts], P(mixed)) of one group under the reward view's `threshold`, per level in
    use: a prompt's figures are L times these (each of its L levels starts a run with chance
    q_j), so their ratio is the rollouts per effective group."""
    cost = mixed = 0.0
    for w, g in zip(model.weights, GRID):
        cost_g, mixed_g = _one_side(g, k, threshold, fill, False, None)
        cost += w * cost_g
        mixed += w * mixed_g
    return cost, mixed


def fit_pool(evidence: list[tuple[float, float]], prior: PoolModel, prior_weight: float = 32.0,
             iterations: int = 60) -> PoolModel:
    """The pool's distribution of success rates from its prompts' evidence, by EM on GRID.

    evidence: (successes, failures) per prompt, the pseudo-counts its learned posterior holds
    above the prior (decayed ones included: they weigh less). Prompts without evidence are left
    out. The likelihood ignores when a group stopped (abandonment depends only on outcomes
    seen), so censored groups are used as they are. The result is shrunk toward `prior` with
    the weight of `prior_weight` prompts, so a handful of prompts cannot decide the plan.
    """
    rows: dict[tuple[float, float], int] = {}
    for s, f in evidence:
        if s + f >= 0.5:                   # rounded: identical rows share the work
            key = (round(s * 4) / 4, round(f * 4) / 4)
            rows[key] = rows.get(key, 0) + 1
    total = sum(rows.values())
    if not total:
        return prior
    lik = [(count, [math.exp(_loglik(g, s, f)) for g in GRID]) for (s, f), count in rows.items()]
    weights = list(prior.weights)
    for _ in range(iterations):
        acc = [0.0] * len(GRID)
        for count, row in lik:
            mix = [w * x for w, x in zip(weights, row)]
            norm = sum(mix)
            if norm > 0:
                scale = count / norm
                acc = [a + m * scale for a, m in zip(acc, mix)]
        weights = [(a + prior_weight * p) / (total + prior_weight)
                   for a, p in zip(acc, prior.weights)]
    return PoolModel(tuple(weights))
