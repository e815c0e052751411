"""Prompt pools for `bench/allocation.py`, and what each pool implies exactly (no simulation).

Pools
-----
- ``standard``: `sara_worker.sim.pool.standard_pool` (30% γ = 0, 25% γ = 1, 45% γ ~ Beta(2, 2)).
- a pool file (`--pool-file FILE.jsonl`): one `POST /prompts` item a line, γ in
  ``meta.p_success``, fixed for the run.
- ``drifting``: the same prompts, but every prompt that is not solved improves linearly with
  training: at policy version v, γ_v = min(1, γ_0 + drift · v / V) for γ_0 < 1 (γ_0 = 1 stays 1),
  V = policy versions per epoch. The hopeless prompts (γ_0 = 0) become learnable, the learnable
  ones get easier and some saturate. A benchmark run lasts 4 epochs of V versions (one version
  per trainer batch), so with the default drift 0.05 a hopeless prompt ends the run at γ = 0.2.
  The sim worker reads γ from the prompt's ``meta.p_success``; the benchmark's worker passes
  γ_v of the policy version the rollout is generated under.

Exact expectations
------------------
A group is k i.i.d. Bernoulli(γ) rollouts. Under SARA with abandonment thresholds (t_f, t_s)
(all-fail / all-success prefix lengths at which the group is abandoned; k + 1 = never) and
complete-to-k commits, a group ends in exactly one of: abandoned after t_f failures (probability
(1-γ)^t_f, cost t_f), abandoned after t_s successes (γ^t_s, cost t_s), complete and pure (only
when a threshold is k + 1: (1-γ)^k or γ^k, cost k, dropped) or committed (the rest, cost k,
delivered and mixed). No probe rollout is wasted: the service issues up to the nearer threshold,
so a pure prefix always needs every rollout it was given. Dynamic Sampling is t_f = t_s = k + 1;
uniform also delivers the pure groups. Per pool the figures are ratios of sums over the pool's
prompts (epoch selection visits each prompt equally often), so they are exact for that pool:

- rollouts per effective group  = Σ E[cost] / Σ P(commit)
- useful fraction               = Σ k·P(delivered) / Σ E[cost]
- tokens per effective group    = Σ E[cost]·(γ·μ_s + (1-γ)·μ_f) / Σ P(commit)   (Wald: the
  number of rollouts is a stopping time, each one's length depends only on its own outcome)
- false-abandon rate            = Σ P(abandoned and would have been mixed) / Σ P(abandoned), with
  P(would have been mixed | abandoned after n failures) = 1 - (1-γ)^(k-n) (successes: 1 - γ^(k-n))

μ_s, μ_f are the sim backend's mean lengths: lognormal with median `success_median` /
`failure_median` × max_tokens and shape σ, rounded, capped at max_tokens.

The Beta-prior threshold math here is written from docs/architecture.md ("The decision path"),
independently of `sara_service.math.allocation` (the test checks the two agree).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from typing import Sequence

from sara_worker.sim.pool import standard_pool

POOLS = ("standard", "drifting")
DEFAULT_DRIFT = 0.05  # per epoch, for the drifting pool
EPOCHS_PER_RUN = 4    # the drifting pool's schedule spans this many epochs


# ------------------------------------------------------------------------------------ pools


@dataclass
class Pool:
    """A prompt pool: the prompts the service gets, and γ of each prompt at each policy version."""

    name: str
    prompts: list[dict]
    gamma0: dict[str, float]
    drift: float = 0.0
    versions_per_epoch: float = 1.0
    ids: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.ids = [p["id"] for p in self.prompts]

    @property
    def drifting(self) -> bool:
        return self.drift != 0.0

    def gamma(self, pid: str, version: float) -> float:
        """γ of prompt `pid` under policy `version`."""
        return drifted(self.gamma0[pid], self.drift, version / self.versions_per_epoch)

    def gammas(self, version: float = 0.0) -> list[float]:
        """γ of every prompt under policy `version`, in id order."""
        t = version / self.versions_per_epoch
        return [drifted(self.gamma0[pid], self.drift, t) for pid in self.ids]


def drifted(gamma0: float, drift: float, epochs: float) -> float:
    """γ after `epochs` epochs of drift: γ_0 + drift·t for γ_0 < 1, capped at 1."""
    if gamma0 >= 1.0 or drift == 0.0:
        return gamma0
    return min(1.0, gamma0 + drift * max(epochs, 0.0))


def load_pool_file(path: str) -> list[dict]:
    """A pool's prompts from a JSONL file, one `POST /prompts` item a line with its success
    chance in ``meta.p_success``; a bad line raises ValueError naming the line and the fix."""
    prompts, seen = [], set()
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e.msg})") from None
            if not isinstance(item, dict) or not isinstance(item.get("id"), str):
                raise ValueError(f"{where}: each line needs a string 'id' (POST /prompts shape)")
            gamma = (item.get("meta") or {}).get("p_success")
            if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not (
                    0.0 <= gamma <= 1.0):
                raise ValueError(f"{where}: meta.p_success must be a number in [0, 1], got "
                                 f"{gamma!r}")
            if item["id"] in seen:
                raise ValueError(f"{where}: id {item['id']!r} appears twice")
            seen.add(item["id"])
            # the bench's sim worker draws each reward from p_success, whatever the task was
            prompts.append({**item, "prompt": item.get("prompt", item["id"]), "task": "sim"})
    if not prompts:
        raise ValueError(f"{path}: no prompts in the file")
    return prompts


def make_pool(name: str, n: int, seed: int, drift: float = DEFAULT_DRIFT,
              versions_per_epoch: float = 1.0, pool_file: str = "") -> Pool:
    """The `standard` pool of `n` prompts, or the `drifting` one over the same prompts; with
    `pool_file`, the file's prompts as they are (their own γ, no drift)."""
    if pool_file:
        prompts = load_pool_file(pool_file)
        return Pool(name, prompts, {p["id"]: float(p["meta"]["p_success"]) for p in prompts})
    if name not in POOLS:
        raise ValueError(f"pool must be one of {', '.join(POOLS)}; got {name!r}")
    prompts = standard_pool(n, seed)
    gamma0 = {p["id"]: float(p["meta"]["p_success"]) for p in prompts}
    if name == "standard":
        return Pool(name, prompts, gamma0)
    return Pool(name, prompts, gamma0, drift=drift,
                versions_per_epoch=max(versions_per_epoch, 1e-9))


# ------------------------------------------------------------------- Beta-prior threshold math


def stay_pure(a: float, b: float, k: int, n: int) -> float:
    """P(the rest of a group of k stays all-fail | n failures so far), γ ~ Beta(a, b) a priori:
    B(a, b+k) / B(a, b+n) = Π_{j=n}^{k-1} (b+j)/(a+b+j). Swap a and b for the success side."""
    out = 1.0
    for j in range(n, k):
        out *= (b + j) / (a + b + j)
    return out


def p_eff_pure(a: float, b: float, k: int, n: int, failing: bool = True) -> float:
    """P(a group of k ends mixed | a pure prefix of n outcomes), n >= 1, or n = 0 (no outcome)."""
    if n == 0:
        return max(0.0, 1.0 - stay_pure(a, b, k, 0) - stay_pure(b, a, k, 0))
    return 1.0 - (stay_pure(a, b, k, n) if failing else stay_pure(b, a, k, n))


TIE = 1e-12  # p_eff within this of τ is a tie: exactly τ is not below τ


def thresholds(k: int, a: float, b: float, tau: float) -> tuple[int, int]:
    """(t_f, t_s): the smallest all-fail / all-success prefix with p_eff < τ (k + 1: none);
    (0, 0) when p_eff before any rollout is already below τ (the prompt is skipped).

    Integer posteriors make exact ties common (a = 1, b = 2, k = 16: p_eff after 7 failures is
    exactly 1/2); a product of rounded factors lands a hair either side, so a value within TIE
    of τ counts as equal to it."""
    if p_eff_pure(a, b, k, 0) < tau - TIE:
        return 0, 0
    out = []
    for failing in (True, False):
        t = next((n for n in range(1, k + 1) if p_eff_pure(a, b, k, n, failing) < tau - TIE),
                 k + 1)
        out.append(t)
    return out[0], out[1]


# ----------------------------------------------------------------------------- token lengths


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def mean_length(median_fraction: float, sigma: float, max_tokens: int) -> float:
    """E[length] of the sim backend's rollouts: round(lognormal(ln(median), σ)), at least 1,
    capped at max_tokens (a rounded length reaches the cap once the draw is >= max_tokens - 0.5)."""
    mu = math.log(median_fraction * max_tokens)
    cap = max_tokens - 0.5
    if sigma == 0:
        x = math.exp(mu)
        return float(max_tokens) if x >= cap else max(1.0, float(round(x)))
    z = (math.log(cap) - mu) / sigma
    below = math.exp(mu + sigma * sigma / 2) * _phi(z - sigma)  # E[X; X < cap]
    return below + max_tokens * (1.0 - _phi(z))


@dataclass(frozen=True)
class Lengths:
    """Mean rollout length by outcome (tokens)."""

    success: float
    failure: float

    @classmethod
    def of_sim(cls, success_median: float = 0.2, failure_median: float = 0.45,
               sigma: float = 0.5, max_tokens: int = 256) -> Lengths:
        return cls(mean_length(success_median, sigma, max_tokens),
                   mean_length(failure_median, sigma, max_tokens))


# ------------------------------------------------------------------------ exact expectations


@dataclass
class GroupOutcome:
    """Expectations for one group of one prompt (or sums of them over a pool)."""

    cost: float = 0.0          # rollouts generated
    effective: float = 0.0     # P(committed): delivered and mixed
    delivered: float = 0.0     # P(delivered) (uniform also delivers pure groups)
    abandoned: float = 0.0     # P(abandoned)
    false_abandoned: float = 0.0  # P(abandoned and the full group would have been mixed)
    tokens: float = 0.0

    def add(self, other: GroupOutcome, weight: float = 1.0) -> None:
        for name in ("cost", "effective", "delivered", "abandoned", "false_abandoned", "tokens"):
            setattr(self, name, getattr(self, name) + weight * getattr(other, name))


def group_outcome(gamma: float, k: int, policy: str, t_f: int = 0, t_s: int = 0,
                  lengths: Lengths | None = None) -> GroupOutcome:
    """Exact expectations for one group of a prompt with success rate γ.

    policy: "uniform", "dynamic_sampling" or "sara" (with thresholds t_f, t_s; (0, 0) = skip).
    """
    g, h = gamma, 1.0 - gamma
    all_fail, all_succ = h ** k, g ** k
    mixed = max(0.0, 1.0 - all_fail - all_succ)
    if policy == "uniform":
        out = GroupOutcome(cost=k, effective=mixed, delivered=1.0)
    elif policy == "dynamic_sampling":
        out = GroupOutcome(cost=k, effective=mixed, delivered=mixed)
    elif policy == "sara":
        if t_f == 0 and t_s == 0:
            return GroupOutcome()
        ab_f = h ** t_f if t_f <= k else 0.0
        ab_s = g ** t_s if t_s <= k else 0.0
        sat = (all_fail if t_f > k else 0.0) + (all_succ if t_s > k else 0.0)
        commit = max(0.0, 1.0 - ab_f - ab_s - sat)
        out = GroupOutcome(
            cost=k * (commit + sat) + t_f * ab_f + t_s * ab_s,
            effective=commit, delivered=commit, abandoned=ab_f + ab_s,
            # abandoned after t failures and the other k - t would not all have failed
            false_abandoned=(ab_f - all_fail if t_f <= k else 0.0)
            + (ab_s - all_succ if t_s <= k else 0.0))
    else:
        raise ValueError(f"unknown policy {policy!r}")
    if lengths is not None:
        out.tokens = out.cost * (g * lengths.success + h * lengths.failure)
    return out


@dataclass
class Expectation:
    """Pool-level exact figures (see the module docstring)."""

    rollouts_per_effective: float
    useful_fraction: float
    tokens_per_effective: float
    false_abandon_rate: float | None
    abandon_rate: float
    effective_per_group: float


def expectation(gammas: Sequence[float] | Sequence[Sequence[float]], k: int, policy: str,
                tau: float = 0.5, alpha0: float = 1.0, beta0: float = 1.0,
                lengths: Lengths | None = None) -> Expectation:
    """Exact figures for a policy with a fixed prior on a pool: `gammas` is the pool's γ list,
    or a list of such lists (one per policy version: the figures are then for a run that
    delivers the same number of effective groups at each version, as a trainer does)."""
    snapshots = [gammas] if gammas and isinstance(gammas[0], (int, float)) else list(gammas)
    t_f, t_s = thresholds(k, alpha0, beta0, tau) if policy == "sara" else (k + 1, k + 1)
    per_version = []
    for snapshot in snapshots:
        total = GroupOutcome()
        for gamma in snapshot:
            total.add(group_outcome(gamma, k, policy, t_f, t_s, lengths))
        per_version.append(total)
    # Each version contributes the same number of effective groups: weight by 1 / effective.
    run = GroupOutcome()
    for total in per_version:
        run.add(total, 1.0 / total.effective if total.effective > 0 else 0.0)
    groups = sum(len(s) for s in snapshots)
    return Expectation(
        rollouts_per_effective=run.cost / run.effective if run.effective else math.inf,
        useful_fraction=k * run.delivered / run.cost if run.cost else 0.0,
        tokens_per_effective=run.tokens / run.effective if run.effective else math.inf,
        false_abandon_rate=run.false_abandoned / run.abandoned if run.abandoned else None,
        abandon_rate=sum(t.abandoned for t in per_version) / groups,
        effective_per_group=sum(t.effective for t in per_version) / groups)


# ---------------------------------------------------------------- population (Beta(2,2)) check


def standard_population(k: int, policy: str, tau: float = 0.5) -> float:
    """Rollouts per effective group on the standard pool's *population* (γ drawn from the
    mixture, not a finite pool), in closed form: E[γ^a (1-γ)^b] = B(2+a, 2+b) / B(2, 2)."""
    def beta22(a: int, b: int) -> float:
        return math.exp(math.lgamma(2 + a) + math.lgamma(2 + b) - math.lgamma(4 + a + b)) * 6.0

    def moment(fn_terms: list[tuple[float, int, int]]) -> float:
        # Σ c · E[γ^a (1-γ)^b] over the mixture 0.30·δ0 + 0.25·δ1 + 0.45·Beta(2,2)
        out = 0.0
        for c, a, b in fn_terms:
            at0 = 1.0 if a == 0 else 0.0
            at1 = 1.0 if b == 0 else 0.0
            out += c * (0.30 * at0 + 0.25 * at1 + 0.45 * beta22(a, b))
        return out

    t_f, t_s = thresholds(k, 1.0, 1.0, tau) if policy == "sara" else (k + 1, k + 1)
    if policy in ("uniform", "dynamic_sampling"):
        p_mix = moment([(1.0, 0, 0), (-1.0, 0, k), (-1.0, k, 0)])
        return k / p_mix
    ab_f = moment([(1.0, 0, t_f)]) if t_f <= k else 0.0
    ab_s = moment([(1.0, t_s, 0)]) if t_s <= k else 0.0
    sat = (moment([(1.0, 0, k)]) if t_f > k else 0.0) + (moment([(1.0, k, 0)]) if t_s > k else 0.0)
    commit = 1.0 - ab_f - ab_s - sat
    return (k * (commit + sat) + t_f * ab_f + t_s * ab_s) / commit


def sample_group(gamma: float, k: int, policy: str, t_f: int, t_s: int,
                 rng: random.Random) -> tuple[int, bool, bool, bool]:
    """One group simulated one rollout at a time: (cost, effective, delivered, false abandon).
    The Monte-Carlo twin of `group_outcome` (the tests compare the two)."""
    if policy == "sara" and t_f == 0 and t_s == 0:
        return 0, False, False, False
    if policy != "sara":
        t_f = t_s = k + 1
    s = f = 0
    for n in range(1, k + 1):
        if rng.random() < gamma:
            s += 1
        else:
            f += 1
        if s and f:
            return k, True, True, False  # committed: filled to k
        if (f == n and n >= t_f) or (s == n and n >= t_s):
            rest = [rng.random() < gamma for _ in range(k - n)]
            false = any(rest) if f else not all(rest)
            return n, False, False, false
    return k, False, policy == "uniform", False
