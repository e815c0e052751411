#!/usr/bin/env python
"""Allocation efficiency of SARA and its baselines, measured through the real scheduler.

Every figure comes from the service itself: `sara_client.alocal()` runs the same FastAPI app and
Lua scripts as `sara serve`, on an embedded redis-server, in this process. The benchmark plays
the two other roles:

- a **worker fleet** with unlimited capacity and zero latency. A *sync round* is one pass of
  lease everything there is (`POST /leases` until one comes back empty; each call lets flow
  control open groups) -> generate every leased rollout with the sim backend's own outcome model
  (`SimBackend.outcome`: reward ~ Bernoulli(γ), failures longer) -> report them all
  (`POST /results`). A rollout's outcome is keyed by (seed, prompt, how many rollouts that prompt
  has had), so the same scheduling decisions give the same outcomes on any engine.
- a **trainer** that, after each round, takes every batch that is ready (`POST /batches/next`),
  acks it and publishes a new policy version, so posterior decay and DPS steps happen as they
  would in training.

Methods (all through the one engine, set by scheduler settings): uniform, Dynamic Sampling (DS),
SARA at τ_low 0.3 / 0.45 / 0.5 with the paper's uniform prior, SARA with history priors, DPS and
MoPPS (selection over DS), SARA + DPS, and SARA auto (tau_low=auto: cost-aware thresholds
priced by the pool's yield, `sara_service.math.autotau`; `sara-auto-tokens`, opt-in, prices it in
tokens, SARA_AUTO_PRICE=tokens). Pools: `standard` and `drifting` (see
`bench/_pools.py`), each at k = 8 and 16. Opt-in rows show the earlier posterior-memory rules
beside today's: `sara-history-v0.5` and `mopps-v0.5` (posterior decay 0.5 per policy
version, no half-life in epochs) and `sara-dps-hard` (DPS learns an abandoned group as a full
all-fail/all-success label instead of the censored prefix it saw).

`--grid` also runs the grid of fixed τ = 0.05..0.95 (step 0.05) through the service, one run
per distinct threshold, with the same seeds and groups, and prints SARA auto against the best
of it, measured and in closed form (the issue's target: within 2% on every pool). One seed
cannot settle that (a run's figure wanders by ~2%, and the minimum over the grid's noisy runs
is biased low), so `--seeds 0,1,2,3,4` runs everything on each seed (a seed draws the pool and
the outcome stream) and compares over seeds: means ± s.e., the best fixed τ by seed-mean and in
closed form, and auto's gap paired by seed (`compare_grid`). `--grid-near 0.05` runs only the
thresholds whose closed form is within 5% of the closed-form best: the rest cannot be the best
fixed τ, and leaving them out keeps five seeds within the CPU budget.

Each measured figure is printed beside what it should be:

- **exact**: methods with a fixed prior and epoch selection (uniform, DS, SARA uniform prior)
  have closed-form expectations over the pool (`_pools.expectation`): rollouts per effective
  group, useful fraction, tokens, false-abandon rate. The benchmark checks the service against
  them.
- **model**: a pure-Python reference scheduler (`ModelService`, written from
  docs/architecture.md, no Redis) run through the very same driver, `--model-reps` times on independent seeds. It gives the
  expectation for methods without a closed form (history priors, DPS, MoPPS) and the sync rounds
  per batch of every method. One more run uses the service run's seeds: for epoch-selection
  methods it then makes the same decisions in the same order as the Lua scripts, so its figures
  match the service's to the last digit unless the two disagree somewhere (marked `=`).

Figures are measured over a steady-state window, from the end of the first round that delivered
a batch to the last batch (the batches of that round are outside it: their groups were paid for
before it), so the work in flight at start and end cancels out. A *false abandon* is an abandoned group whose
full k would have been mixed; its probability is exact given the prompt's true γ
(1 - (1-γ)^(k-n) after n failures, 1 - γ^(k-n) after n successes), and the rate is its mean over
abandoned groups, shown beside the τ_low bound.

Usage:
    python bench/allocation.py                    # all pools, k and methods (~7 min, 2 cores)
    python bench/allocation.py --quick            # CI: standard pool, k=16, small (< 60 s)
    python bench/allocation.py --pool standard --k 16 --methods ds,sara-0.5 --groups 512
    python bench/allocation.py --grid             # + the fixed-τ grid against sara-auto
    python bench/allocation.py --methods sara-auto --grid --grid-near 0.05 --seeds 0,1,2,3,4
                                                  # auto vs the grid over 5 seeds (~60 min busy)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import hashlib
import json
import logging
import math
import multiprocessing
import os
import platform
import random
import shlex
import sys
import tempfile
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _provenance import git_state  # noqa: E402  (bench/ is not a package)
from _shutdown import unstick_shutdown  # noqa: E402
from _pools import (  # noqa: E402  (bench/ is not a package)
    DEFAULT_DRIFT, EPOCHS_PER_RUN, POOLS, Lengths, Pool, expectation, load_pool_file, make_pool,
    p_eff_pure, thresholds,
)
from sara_client.limits import MAX_RESULTS_PER_CALL, MAX_ROLLOUTS_PER_LEASE  # noqa: E402
from sara_client.models import Rollout, SamplingParams  # noqa: E402
from sara_service.math.allocation import plan_group  # noqa: E402  (flow-control weights only)
# the epoch order and the bound on busy prompts a draw passes over, to mirror them
from sara_service.core.draws import BUSY_SPARE, shuffled  # noqa: E402
from sara_service.math.selection import (  # noqa: E402
    DpsParams, dps_mixed_probability, dps_observations, mopps_score, top_by_score,
)
from sara_service.settings import DEFAULT_HALF_LIFE  # noqa: E402
from sara_worker.sim.backend import SimBackend  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
WORKER = "bench-worker"
MAX_TOKENS = 256


# ------------------------------------------------------------------------------------ methods


@dataclass(frozen=True)
class Method:
    """One allocation method: scheduler settings; `exact` when a closed form exists."""

    key: str
    label: str
    policy: str
    selection: str = "epoch"
    prior: str = "uniform"
    tau: float | str = 0.5
    # memory overrides, to show the old rules beside the new: per-version λ and half-life (in
    # epochs of the pool); None takes the run's (--posterior-decay, --posterior-half-life)
    posterior_decay: float | None = None
    half_life: float | None = None
    dps_censored: bool = True      # False: an abandoned group teaches DPS a full pure label
    auto_price: str = "rollouts"   # under tau "auto": "tokens" prices rollouts by their length
    ada_rule: str = "balanced"     # Reinforce-Ada's stop rule (policy reinforce_ada)
    pc_tau: float | None = None    # Pilot-Commit composed with SARA's stopping on the pilot
    sizing: str = "fixed"          # var_k: each draw's budget split by value (Knapsack RL)

    @property
    def peer(self) -> bool:
        """A peer allocator (Reinforce-Ada, Pilot-Commit, Knapsack RL's variable group sizes):
        no closed form, no model."""
        return self.policy in ("reinforce_ada", "pilot_commit") or self.sizing != "fixed"

    @property
    def exact(self) -> bool:
        return (self.selection == "epoch" and self.prior == "uniform" and self.tau != "auto"
                and not self.peer)

    def budget(self, k: int) -> int:
        """Rollouts one group may draw: k, or under Reinforce-Ada its rounds' total (`ADA`),
        under Pilot-Commit its committed group (`PILOT`)."""
        if self.policy == "reinforce_ada":
            return ADA["rounds"] * ADA["round"] * k
        return self.delivers(k)

    def delivers(self, k: int) -> int:
        """Rollouts in a delivered group: k, except Pilot-Commit's whole committed groups; the
        bench counts such a group as that many groups of k (`drive`). Under var_k a group's
        size is its own, counted the same way (a group of n as n / k groups of k)."""
        return PILOT["groups"] * k if self.policy == "pilot_commit" else k

    @property
    def modelled(self) -> bool:
        """The reference model covers it (not tau_low=auto: see `AUTO_NOTE`; not GRESO, whose
        rates step on the service's own counters: its expectation is its own seeds' spread; not
        Reinforce-Ada, which the reference model does not implement)."""
        return self.tau != "auto" and self.selection != "greso" and not self.peer

    @property
    def abandons(self) -> bool:
        return self.policy == "sara"


METHODS = {m.key: m for m in (
    Method("uniform", "uniform", "uniform"),
    Method("ds", "DS", "dynamic_sampling"),
    Method("sara-0.3", "SARA τ=0.3", "sara", tau=0.3),
    Method("sara-0.45", "SARA τ=0.45", "sara", tau=0.45),
    Method("sara-0.5", "SARA τ=0.5", "sara", tau=0.5),
    Method("sara-history", "SARA+history", "sara", prior="history", tau=0.5),
    Method("dps", "DPS (DS)", "dynamic_sampling", selection="dps"),
    Method("mopps", "MoPPS (DS)", "dynamic_sampling", selection="mopps"),
    Method("sara-dps", "SARA+DPS", "sara", selection="dps", tau=0.5),
    # the earlier rules: λ = 0.5 per policy version, no half-life; hard labels
    Method("sara-history-v0.5", "SARA+hist old", "sara", prior="history", tau=0.5,
           posterior_decay=0.5, half_life=math.inf),
    Method("mopps-v0.5", "MoPPS old", "dynamic_sampling", selection="mopps",
           posterior_decay=0.5, half_life=math.inf),
    Method("sara-dps-hard", "SARA+DPS old", "sara", selection="dps", tau=0.5,
           dps_censored=False),
    Method("sara-auto", "SARA auto", "sara", tau="auto"),
    # the same rule priced in tokens (the sim's failures run longer)
    Method("sara-auto-tokens", "SARA auto tok", "sara", tau="auto", auto_price="tokens"),
    # GRESO's pre-rollout filter (opt-in), alone on DS and under SARA
    Method("greso", "GRESO (DS)", "dynamic_sampling", selection="greso"),
    Method("sara-greso", "SARA+GRESO", "sara", selection="greso", tau=0.5),
    # Reinforce-Ada (balanced), at its reference settings' proportions (`ADA`)
    Method("reinforce_ada", "Reinforce-Ada", "reinforce_ada"),
    Method("reinforce_ada_pos", "Reinforce-Ada pos", "reinforce_ada", ada_rule="positive"),
    # Pilot-Commit at its scripts' proportions (`PILOT`), solved prompts excluded
    Method("pilot_commit", "Pilot-Commit", "pilot_commit"),
    Method("sara_pilot_commit", "SARA+Pilot-Commit", "pilot_commit", pc_tau=0.5),
    # Knapsack RL's variable group sizes (`VAR_K`), on DS's filter and under SARA's stopping
    Method("var_k", "var_k (DS)", "dynamic_sampling", sizing="var_k"),
    Method("sara_var_k", "SARA+var_k", "sara", tau=0.5, sizing="var_k"),
    # the service's defaults, SARA at tau_low 0.5. The testbed's `recommended` (bench/_testbed.py)
    # adds tau_low_fail 0.3, which this bench's exact model does not cover
    Method("recommended", "recommended (= SARA τ=0.5)", "sara", tau=0.5),
)}
# Reinforce-Ada's reference settings keep 4 rollouts a prompt, drawn in rounds of 8, at most 4
# rounds: here it delivers groups of k like every other method, in rounds of 2k, up to 8k
ADA = {"round": 2, "rounds": 4}
# Pilot-Commit's scripts pilot 16 (or 32) rollouts and commit groups of 64 (or 128), the band of
# pass rates [0.125, 0.75]: here a pilot of k and groups of 4k (at k = 16, the 16/64 script),
# each delivered group counted as 4 groups of k
PILOT = {"groups": 4, "band_low": 0.125, "band_high": 0.75}
# Knapsack RL's split: at least 2 rollouts for a prompt with a mixed history, at most 8k (its
# paper gives hard prompts up to 93 at an average of 8 to 16), one budget per trainer batch
VAR_K = {"min": 2, "max_groups": 8}
# Why sara-auto has no reference-model runs: its plans depend on the price and pool model the
# service re-derives from its own counters and posteriors mid-run; a mirror would have to call
# the same code (sara_service.core.autoprice) on the same store reads, so it would check nothing
# independent. Its reference is the grid of fixed τ instead (`grid_summary`), exact per pool.
# The grid of fixed τ that sara-auto is judged against (`--grid`): registered here so that
# worker processes can look them up by key; not in the default method list.
# What `python bench/allocation.py` runs without --methods: the old-rule rows are opt-in.
DEFAULT_METHODS = ("uniform", "ds", "sara-0.3", "sara-0.45", "sara-0.5", "sara-history", "dps",
                   "mopps", "sara-dps", "sara-auto")
GRID_TAUS = tuple(round(0.05 * i, 2) for i in range(1, 20))   # 0.05 .. 0.95
for _tau in GRID_TAUS:
    METHODS.setdefault(f"sara-{_tau:g}", Method(f"sara-{_tau:g}", f"SARA τ={_tau:g}", "sara",
                                                tau=_tau))

AUTO_NOTE = ("sara-auto: no reference-model runs (its price is re-derived from the service's "
             "own state); compared with the exact grid of fixed τ below")


@dataclass(frozen=True)
class Config:
    """One benchmark configuration (one pool, one k); see the CLI flags."""

    pool: str = "standard"
    pool_file: str = ""        # --pool-file: the pool's prompts from this JSONL, `pool` its name
    k: int = 16
    groups: int = 2048            # effective groups to collect per method
    prompts: int = 1024
    seed: int = 0
    batch_size: int = 32
    prefetch_batches: int = 2
    max_staleness: int = 1
    posterior_decay: float = 1.0
    posterior_half_life: float = DEFAULT_HALF_LIFE
    # 0: the allocation rule alone, as the exact expectations assume; > 0 measures audit sampling
    audit_fraction: float = 0.0
    dps_decay: float = 0.5
    selection_lambda: int = 8
    tau_skip: float = 0.1
    drift: float = DEFAULT_DRIFT
    model_reps: int = 3

    @property
    def versions_per_epoch(self) -> float:
        """The drifting pool's epoch: a quarter of the trainer steps a run takes."""
        return max(1.0, self.groups / self.batch_size / EPOCHS_PER_RUN)

    def make_pool(self) -> Pool:
        return make_pool(self.pool, self.prompts, self.seed, self.drift, self.versions_per_epoch,
                         self.pool_file)

    def memory(self, method: Method) -> tuple[float, float]:
        """(λ per policy version, half-life in epochs of the pool) in force for `method`."""
        decay = self.posterior_decay if method.posterior_decay is None else method.posterior_decay
        half_life = self.posterior_half_life if method.half_life is None else method.half_life
        return decay, half_life

    def _rounds(self, method: Method) -> dict[str, Any]:
        if method.sizing == "var_k":
            return dict(group_sizing="var_k", vk_min=VAR_K["min"],
                        vk_max=VAR_K["max_groups"] * self.k, vk_batch=self.batch_size)
        if method.policy == "pilot_commit":
            return dict(pc_pilot=self.k, pc_band_low=PILOT["band_low"],
                        pc_band_high=PILOT["band_high"], pc_tau_low=method.pc_tau)
        if method.policy != "reinforce_ada":
            return {}
        return dict(ada_round=ADA["round"] * self.k, ada_keep=self.k, ada_rule=method.ada_rule)

    def settings(self, method: Method, seed: int | None = None) -> dict[str, Any]:
        """Scheduler settings (`sara_service.settings.Settings` fields) for `method`."""
        decay, half_life = self.memory(method)
        return dict(policy=method.policy, selection=method.selection, prior=method.prior,
                    tau_low=method.tau, auto_price=method.auto_price, tau_skip=self.tau_skip,
                    group_size=method.budget(self.k), **self._rounds(method),
                    batch_size=self.batch_size, prefetch_batches=self.prefetch_batches,
                    # the fleet's capacity is unlimited, so every lease is short and a work
                    # floor would always apply: flow control here is the target alone, whatever
                    # the service's default (the floor fills a real engine: engine_time.py)
                    work_floor=1.0, max_staleness=self.max_staleness, posterior_decay=decay,
                    posterior_half_life=half_life, dps_censored=method.dps_censored,
                    audit_fraction=self.audit_fraction,
                    dps_decay=self.dps_decay, selection_lambda=self.selection_lambda,
                    seed=self.seed if seed is None else seed, max_tokens=MAX_TOKENS,
                    # nothing may expire while a slow machine works through a round
                    lease_ttl_s=3600.0, batch_ack_timeout_s=3600.0, retention_s=7200.0)


# --------------------------------------------------------------------------------- accounting


class NothingToMeasure(RuntimeError):
    """A run has no steady-state window to measure: fewer than two batches, all delivered at
    once, or no effective group after the first."""


@dataclass
class Tally:
    """What one run did, as the worker and the trainer saw it."""

    k: int
    rounds: int = 0
    rollouts: int = 0
    tokens: int = 0
    batches: list[dict] = field(default_factory=list)
    # (round, gamma, rollouts seen, failing side or None for a mixed prefix, group budget)
    abandons: list[tuple[int, float, int, bool | None, int]] = field(default_factory=list)
    abandon_hist: dict[int, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    effective: float = 0   # groups of k (a var_k group of n counts n / k)
    # group id -> [epoch, rollouts generated, delivered and mixed, finished]
    groups: dict[str, list] = field(default_factory=dict)
    counters: dict[str, Any] = field(default_factory=dict)   # the service's own, at the end
    seconds: float = 0.0
    shutdown_recancels: int = 0  # see _shutdown.unstick_shutdown

    def note_recancel(self) -> None:
        """The shutdown workaround had to cancel the maintenance task once more."""
        self.shutdown_recancels += 1

    def false_probability(self, gamma: float, n: int, failing: bool | None,
                          budget: int) -> float:
        """The chance the abandoned group's full budget would have been mixed; `failing` None
        for a mixed prefix (Pilot-Commit abandons a mixed pilot outside its band): certain."""
        if failing is None:
            return 1.0
        rest = budget - n
        return 1.0 - ((1.0 - gamma) ** rest if failing else gamma ** rest)

    def summary(self) -> dict[str, Any]:
        """The figures over the steady-state window (the end of the first round that delivered a
        batch to the last batch)."""
        if len(self.batches) < 2:
            raise NothingToMeasure(f"{len(self.batches)} batch(es) delivered, fewer than two: "
                                "nothing to measure (raise --groups)")
        # The window opens at the end of the first round that delivered a batch, not after its
        # first batch: that round's other batches hold groups whose rollouts were spent before
        # the window, and counting them would put a fraction of useful rollouts above 1.
        opening = self.batches[0]["round"]
        window = [b for b in self.batches if b["round"] > opening]
        if not window:
            raise NothingToMeasure(f"all {len(self.batches)} batches came in the first round "
                                   "that delivered any: nothing to measure (raise --groups)")
        first = [b for b in self.batches if b["round"] == opening][-1]
        last = self.batches[-1]
        rollouts = last["cum_rollouts"] - first["cum_rollouts"]
        tokens = last["cum_tokens"] - first["cum_tokens"]
        effective = sum(b["effective"] for b in window)
        delivered_rollouts = sum(b["delivered_rollouts"] for b in window)
        if effective <= 0 or rollouts <= 0:
            raise NothingToMeasure(f"{len(self.batches)} batches delivered, all at once or with "
                                   "no effective group after the first: nothing to measure "
                                   "(raise --groups)")
        in_window = [a for a in self.abandons if first["round"] < a[0] <= last["round"]]
        false = [self.false_probability(g, n, f, budget) for _, g, n, f, budget in in_window]
        lag = sum(b["lag"] for b in window) / max(1, sum(b["groups"] for b in window))
        out = {
            "rollouts_per_effective": rollouts / effective,
            "tokens_per_effective": tokens / effective,
            "useful_fraction": delivered_rollouts / rollouts,
            "false_abandon_rate": sum(false) / len(false) if false else None,
            "abandoned": len(in_window),
            "rounds_per_batch": (last["round"] - first["round"]) / len(window),
            "effective": effective,
            "batches": len(window),
            "rollouts": rollouts,
            "versions": [b["version"] for b in window],
            "lag": lag,
            "seconds": self.seconds,
            "shutdown_recancels": self.shutdown_recancels,
            "violations": self.violations[:5],
            "n_violations": len(self.violations),
            "abandon_hist": {str(n): c for n, c in sorted(self.abandon_hist.items())},
        }
        out["by_epoch"] = self.by_epoch()
        return out

    def by_epoch(self) -> list[dict[str, Any]]:
        """Rollouts per effective group of the groups opened in each epoch of the pool (each
        prompt popped once per epoch; epoch-selection methods). A group is placed by the middle
        of the prompt count consumed during the round that opened it; groups still unfinished at
        the end are left out, and the run's last epoch is marked partial."""
        rollouts: dict[int, int] = {}
        effective: dict[int, float] = {}   # mixed groups of k
        for epoch, n, eff, finished in self.groups.values():
            if not finished and not eff:
                continue
            rollouts[epoch] = rollouts.get(epoch, 0) + n
            effective[epoch] = effective.get(epoch, 0) + eff
        last = max(rollouts, default=0)
        return [{"epoch": e + 1, "rollouts": rollouts[e], "effective": effective[e],
                 "rollouts_per_effective": rollouts[e] / effective[e] if effective[e] else None,
                 "partial": e == last}
                for e in sorted(rollouts)]


# --------------------------------------------------------------------- the API the driver uses


@dataclass
class Leased:
    rollout_id: str
    group_id: str
    prompt_id: str


@dataclass
class DeliveredGroup:
    group_id: str
    prompt_id: str
    rewards: list[float]


@dataclass
class DeliveredBatch:
    batch_id: str
    policy_version: int
    groups: list[DeliveredGroup]


class Api(Protocol):
    async def lease(self, max_rollouts: int) -> tuple[list[Leased], int]: ...
    async def report(self, results: list[dict]) -> list[tuple[str, str]]: ...
    async def next_batch(self) -> DeliveredBatch | None: ...
    async def ack(self, batch_id: str) -> None: ...
    async def publish(self, version: int) -> None: ...
    async def counters(self) -> dict[str, Any]: ...
    async def group_size(self, group_id: str) -> int: ...


class ServiceApi:
    """The real scheduler, through the async SDK (`sara_client.alocal`)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def lease(self, max_rollouts: int) -> tuple[list[Leased], int]:
        answer = await self.client.lease(WORKER, max_rollouts=max_rollouts, wait_s=0.0,
                                         backend="sim")
        return ([Leased(r.rollout_id, r.group_id, r.prompt_id) for r in answer.rollouts],
                answer.policy.version)

    async def report(self, results: list[dict]) -> list[tuple[str, str]]:
        answer = await self.client.report(WORKER, results)
        return [(d.group_id, d.decision) for d in answer.decisions]

    async def next_batch(self) -> DeliveredBatch | None:
        batch = await self.client.next_batch(wait_s=0.0)
        if batch is None:
            return None
        return DeliveredBatch(batch.batch_id, batch.policy_version, [
            DeliveredGroup(g.group_id, g.prompt_id, [r.reward for r in g.rollouts])
            for g in batch.groups])

    async def ack(self, batch_id: str) -> None:
        await self.client.ack(batch_id)

    async def publish(self, version: int) -> None:
        await self.client.publish_policy(version)

    async def group_size(self, group_id: str) -> int:
        return (await self.client.get_group(group_id)).k

    async def counters(self) -> dict[str, Any]:
        stats = await self.client.stats()
        out = stats.counters.model_dump()
        out["abandon_histogram"] = dict(stats.abandon_histogram)
        out["derived"] = stats.derived.model_dump()
        out["auto"] = stats.auto_thresholds
        return out


# ----------------------------------------------------------------------------- the driver


def _groups_of_k(rollouts: int, k: int) -> int | float:
    """A delivered group of `rollouts` as groups of k: a whole number for groups of k or 4k,
    a fraction for a variable size."""
    whole, rest = divmod(rollouts, k)
    return whole if rest == 0 else rollouts / k


async def drive(api: Api, method: Method, cfg: Config, pool: Pool, sim: SimBackend,
                progress: Callable[[int], None] | None = None) -> Tally:
    """Sync rounds of lease-all -> generate -> report-all, then the trainer, until
    `cfg.groups` effective groups have been delivered. See the module docstring."""
    tally = Tally(method.budget(cfg.k))   # a false abandon misses the rest of the budget
    drawn: dict[str, int] = {}                  # rollouts generated per prompt so far
    outcomes: dict[str, list[bool]] = {}        # per group, in the order reported
    group_gamma: dict[str, float] = {}
    group_minv: dict[str, int] = {}
    abandoned: set[str] = set()
    template = Rollout(rollout_id="x", group_id="x", prompt_id="x", prompt="x", task="sim",
                       sampling=SamplingParams(max_tokens=MAX_TOKENS))
    version, idle, consumed = 0, 0, 0
    while tally.effective < cfg.groups:
        leased: list[Leased] = []
        while True:
            got, version = await api.lease(MAX_ROLLOUTS_PER_LEASE)
            if not got:
                break
            leased += got
        tally.rounds += 1
        idle = 0 if leased else idle + 1
        if idle > 50:
            raise RuntimeError(f"{method.key}: 50 rounds without a rollout to generate")
        results = []
        tokens = 0
        new_groups: list[str] = []
        for r in leased:
            n = drawn.get(r.prompt_id, 0)
            drawn[r.prompt_id] = n + 1
            gamma = pool.gamma(r.prompt_id, version)
            o = sim.outcome(template.model_copy(update={
                "rollout_id": f"{r.prompt_id}#{n}", "meta": {"p_success": gamma}}))
            seen = outcomes.setdefault(r.group_id, [])
            seen.append(bool(o.success))
            if len(seen) == 1:
                new_groups.append(r.group_id)
            group_gamma[r.group_id] = gamma
            group_minv.setdefault(r.group_id, version)
            tokens += o.tokens
            results.append({"rollout_id": r.rollout_id, "reward": 1.0 if o.success else 0.0,
                            "completion": "", "completion_tokens": o.tokens,
                            "finish_reason": o.finish_reason, "policy_version": version})
        tally.rollouts += len(results)
        tally.tokens += tokens
        for i in range(0, len(results), MAX_RESULTS_PER_CALL):
            for gid, decision in await api.report(results[i:i + MAX_RESULTS_PER_CALL]):
                if decision != "abandon" or gid in abandoned:
                    continue
                abandoned.add(gid)
                seen = outcomes[gid]
                mixed = any(seen) and not all(seen)
                if mixed and method.policy != "pilot_commit":   # its band drops mixed pilots
                    tally.violations.append(f"group {gid} abandoned after a mixed prefix {seen}")
                budget = (await api.group_size(gid) if method.sizing != "fixed"
                          else method.budget(cfg.k))
                tally.abandons.append((tally.rounds, group_gamma[gid], len(seen),
                                       None if mixed else not seen[0], budget))
                tally.abandon_hist[len(seen)] = tally.abandon_hist.get(len(seen), 0) + 1
        counters = await api.counters()
        before, consumed = consumed, counters["groups_opened"] + counters["groups_skipped"]
        epoch = int((before + consumed) / 2) // len(pool.ids)
        for gid in new_groups:
            tally.groups[gid] = [epoch, 0, False, False]
        while True:
            batch = await api.next_batch()
            if batch is None:
                break
            effective = delivered = lag = 0
            for g in batch.groups:
                wins = sum(1 for x in g.rewards if x >= 0.5)
                mixed = 0 < wins < len(g.rewards)
                effective += mixed * _groups_of_k(len(g.rewards), cfg.k)
                delivered += len(g.rewards)
                lag += batch.policy_version - group_minv.get(g.group_id, batch.policy_version)
                wrong_size = (method.sizing == "fixed"
                              and len(g.rewards) != method.delivers(cfg.k))
                if method.policy != "uniform" and (not mixed or wrong_size):
                    tally.violations.append(
                        f"delivered group {g.group_id}: {len(g.rewards)} rollouts, {wins} wins")
                record = tally.groups.get(g.group_id)
                if record is not None:   # in groups of k, as the run's figure counts them
                    record[2] = mixed * _groups_of_k(len(g.rewards), cfg.k)
            tally.effective += effective
            tally.batches.append({
                "round": tally.rounds, "version": batch.policy_version, "effective": effective,
                "groups": len(batch.groups), "delivered_rollouts": delivered, "lag": lag,
                "cum_rollouts": tally.rollouts, "cum_tokens": tally.tokens})
            await api.ack(batch.batch_id)
            await api.publish(batch.policy_version + 1)
        if progress is not None:
            progress(tally.effective)
    for gid, record in tally.groups.items():
        record[1] = len(outcomes[gid])
        record[3] = gid in abandoned or record[1] >= method.budget(cfg.k)
    tally.counters = await api.counters()
    return tally


# ----------------------------------------------------------------------- the reference model


@dataclass
class _Group:
    gid: str
    pid: str
    thr_f: int
    thr_s: int
    pf: list[float]
    ps: list[float]
    issued: int = 0
    done: int = 0
    s: int = 0
    f: int = 0
    state: str = "open"
    p_eff: float = 0.0
    min_v: int | None = None
    results: list[float] = field(default_factory=list)
    audit: bool = False      # flagged at open: runs on to k where it would be abandoned
    audited: bool = False    # it reached that point


@dataclass(frozen=True)
class _Plan:
    thr_f: int
    thr_s: int
    issue: int
    pf: list[float]
    ps: list[float]

    @property
    def skip(self) -> bool:
        return self.thr_f == 0 and self.thr_s == 0


YIELD_UNIT = 10**9   # flow control's unit, lua/_prelude.lua's YIELD_UNIT


def _units(p: float) -> int:
    """A score in flow control's units, rounded as lua/_prelude.lua's yield_units rounds it."""
    return math.floor(p * YIELD_UNIT + 0.5)


class ModelService:
    """A pure-Python scheduler written from docs/architecture.md: the same API as `ServiceApi`,
    no Redis.

    It follows the design's rules for plans, issuing, decisions, posteriors, flow control,
    selection, batches and staleness, and the service's documented orderings (decided groups'
    rollouts go to the front of the queue, each lease opens at most `flow target` prompts, an
    epoch is a seeded shuffle of the sorted ids). DPS and MoPPS scores come from
    `sara_service.math.selection`, the pure predictor functions (their own unit tests check them);
    everything else, thresholds included, is computed here.
    """

    def __init__(self, method: Method, cfg: Config, pool: Pool, seed: int) -> None:
        self.m, self.cfg, self.pool = method, cfg, pool
        self.k = cfg.k
        self.seed = seed
        self.rng = random.Random(seed)
        self.pick_rng = random.Random(seed + 7919)      # stands in for Redis' HRANDFIELD
        self.target = cfg.prefetch_batches * cfg.batch_size
        self.version = 0
        self.decay, self.half_life = cfg.memory(method)
        # a, b, v, t (the pool's clock at the last update; None until the first, as in Lua)
        self.post: dict[str, list] = {pid: [1.0, 1.0, 0, None] for pid in pool.ids}
        self.obs: dict[str, list[tuple]] = {pid: [] for pid in pool.ids}
        self.queue: deque[str] = deque()
        self.epoch = 0
        self.pending: deque[tuple[str, int]] = deque()
        self.groups: dict[str, _Group] = {}
        self.open: dict[str, float] = {}                          # gid -> p_eff (flow control)
        self.ready: deque[str] = deque()
        self.c = {"groups_opened": 0, "groups_skipped": 0, "groups_abandoned": 0,
                  "groups_committed": 0, "rollouts_completed": 0, "groups_delivered": 0,
                  "groups_dropped_stale": 0, "groups_dropped_saturated": 0,
                  "groups_audited": 0, "audits_mixed": 0, "audits_pure": 0}
        self.visits: dict[str, int] = {}                          # groups opened per prompt
        self.last: dict[str, str] = {}                            # prompt -> its newest group
        self.round: tuple[int, list[str]] = (-1, [])              # dps/mopps: a ranked round
        self.prior_plan = self._plan(1.0, 1.0)
        self._n = 0

    # --- plans and posteriors

    def _plan(self, a: float, b: float) -> _Plan:
        k = self.k
        if self.m.policy == "sara":
            t_f, t_s = thresholds(k, a, b, self.m.tau)
        else:
            t_f = t_s = k + 1
        # The p_eff values only weigh open groups in flow control. The service's own tables are
        # used for them so that sums of equal terms round alike and the model opens a group
        # exactly when the service does; the thresholds, which decide, are this module's own.
        reference = plan_group(self.m.policy, k, a, b, self.m.tau)
        if (reference.after_failures, reference.after_successes) != (t_f, t_s):
            if not _tie(k, a, b, self.m.tau):
                raise AssertionError(f"thresholds differ from sara_service.math.allocation for "
                                     f"k={k} a={a} b={b}: {(t_f, t_s)} vs {reference}")
            # p_eff is exactly τ on a prefix and the service's rounding put it below τ: follow
            # the service (this model mirrors it), and count the disagreement
            t_f, t_s = reference.after_failures, reference.after_successes
            self.c["tie_plans"] = self.c.get("tie_plans", 0) + 1
        return _Plan(t_f, t_s, min(t_f, t_s, k), list(reference.p_eff_fail),
                     list(reference.p_eff_success))

    def _clock(self) -> float:
        """Epochs of the pool: prompts consumed (groups opened + skipped) per prompt."""
        return (self.c["groups_opened"] + self.c["groups_skipped"]) / len(self.pool.ids)

    def _weight_since(self, v: int, t: float | None, clock: float) -> float:
        """Evidence weight: λ per version times 0.5 per half-life of the pool's epochs, in the
        order the Lua script (and the scheduler) multiply them."""
        w = 1.0
        if self.version > v:
            w = self.decay ** (self.version - v)
        epochs = 0.0 if t is None else clock - t
        if math.isfinite(self.half_life) and epochs > 0:
            w = w * 0.5 ** (epochs / self.half_life)
        return w

    def _posterior_now(self, pid: str, clock: float) -> tuple[float, float]:
        a, b, v, t = self.post[pid]
        w = self._weight_since(v, t, clock)
        if w == 1.0:
            return a, b
        return 1.0 + w * (a - 1.0), 1.0 + w * (b - 1.0)

    def _learn(self, pid: str, success: bool, clock: float) -> None:
        a, b, v, t = self.post[pid]
        w = self._weight_since(v, t, clock)
        if w != 1.0:
            a, b = 1.0 + w * (a - 1.0), 1.0 + w * (b - 1.0)
        self.post[pid] = [a + success, b + (not success), max(v, self.version),
                          clock if t is None else max(t, clock)]

    def _mixed_chance(self, pid: str, failing: bool, rest: int) -> float:
        """q recorded for an abandoned group: P(the rest would not all have stayed pure) under
        the prompt's posterior, rounded to 1e-6 as the store rounds it."""
        a, b = self.post[pid][:2]
        stay = 1.0
        for j in range(rest):
            stay = stay * ((b if failing else a) + j) / (a + b + j)
        return math.floor((1.0 - stay) * 1e6 + 0.5) / 1e6

    def _weight(self, p_eff: float) -> float:
        """An open group's weight in flow control: uniform delivers every group it opens."""
        return 1.0 if self.m.policy == "uniform" else p_eff

    def _observe(self, pid: str, outcome: str, q: float | None = None) -> None:
        obs = self.obs[pid]
        obs.append((self.version, outcome) if q is None else (self.version, outcome, q))
        if len(obs) > 16:
            del obs[0]

    # --- selection and opening

    def _busy(self, pid: str) -> bool:
        """One group per prompt at a time: the prompt's newest group is open, committed or
        ready (delivered groups leave `groups`; abandoned and dropped ones are done)."""
        g = self.groups.get(self.last.get(pid, ""))
        return g is not None and g.state in ("open", "committed", "ready")

    def _pop_free(self, count: int, refill: bool, taken: list[str]) -> bool:
        """Pop prompts from the epoch queue into `taken` until it holds `count`, passing over
        busy ones (and ones already taken), at most count + 64 pops; with `refill` (the
        scheduler's draw), start the next epoch whenever the queue runs dry, as each of its
        epoch pops may. False when the queue ran short."""
        popped = 0
        while len(taken) < count and popped < count + BUSY_SPARE:
            if not self.queue:
                if not refill:
                    return False
                self.queue.extend(shuffled(sorted(self.pool.ids),
                                           self.seed * 1_000_003 + self.epoch))
                self.epoch += 1
            pid = self.queue.popleft()
            popped += 1
            if self._busy(pid):
                self.c["prompts_skipped_busy"] = self.c.get("prompts_skipped_busy", 0) + 1
            elif pid not in taken:
                taken.append(pid)
        return True

    def _pop_epoch(self, count: int) -> list[str]:
        """The scheduler's draw in epoch order (core/draws.py's free_from_epoch)."""
        got: list[str] = []
        self._pop_free(count, True, got)
        return got

    def _select(self, count: int, clock: float) -> list[str]:
        if self.m.selection == "epoch":
            return self._pop_epoch(count)
        # core/draws.py at SARA_SELECTION_RANK=version: one round a policy version, lambda x B
        # free candidates from the epoch and the best B kept; past it, the epoch in order
        if self.round[0] != self.version:
            self.round = (self.version, [])
            pool: list[str] = []
            self._pop_free(self.cfg.selection_lambda * self.cfg.batch_size, True, pool)
            if pool:
                if self.m.selection == "dps":
                    params = DpsParams(decay=self.cfg.dps_decay, prior=1.0)
                    scores = [dps_mixed_probability(
                        dps_observations(self.obs[p], self.m.dps_censored), self.version,
                        params) for p in pool]
                else:
                    scores = [mopps_score(*self._posterior_now(p, clock), self.rng, 0.5)
                              for p in pool]
                self.round[1].extend(top_by_score(pool, scores, self.cfg.batch_size, self.rng))
        out = self.round[1][:count]
        del self.round[1][:count]
        if len(out) < count:
            rest: list[str] = []
            self._pop_free(count - len(out), True, rest)
            out += [p for p in rest if p not in out]
        return out

    def _open(self, wanted: int) -> int:
        per_group = max(1, self.prior_plan.issue)
        count = min(self.target, math.ceil(wanted / per_group))
        clock = self._clock()  # read once, before this call's skips move it (as the service)
        if self._full():
            return 0   # flow control has no room: nothing is drawn (the lease script says so)
        if not self.m.exact:
            return self._open_chosen(self._planned(self._select(count, clock), clock))
        # one plan for every group: the lease script opens groups on the free prompts its queue
        # holds; only when the queue ran short (and flow control has room) does the scheduler
        # start the next epoch and open the rest, for what the lease still lacks
        got: list[str] = []
        full = self._pop_free(count, False, got)
        opened = self._open_chosen([(pid, self.prior_plan) for pid in got])
        rest = wanted - min(wanted, opened * per_group)
        if full or opened < len(got) or rest <= 0 or self._full():
            return opened
        more: list[str] = []
        self._pop_free(min(self.target, math.ceil(rest / per_group)), True, more)
        return opened + self._open_chosen([(pid, self.prior_plan) for pid in more])

    def _planned(self, pids: list[str], clock: float) -> list[tuple[str, _Plan]]:
        chosen = []
        for pid in pids:
            plan = self.prior_plan if self.m.prior == "uniform" else self._plan(
                *self._posterior_now(pid, clock))
            if plan.skip:
                self.c["groups_skipped"] += 1
            else:
                chosen.append((pid, plan))
        return chosen

    def _expected(self) -> int:
        """Flow control's measure as the Lua scripts keep it (lua/_prelude.lua): ready groups
        and open groups' scores in units of 1e-9 groups, each score rounded alone, so sums are
        exact in any order."""
        return len(self.ready) * YIELD_UNIT + sum(_units(score) for score in self.open.values())

    def _full(self) -> bool:
        return self._expected() >= self.target * YIELD_UNIT

    def _open_chosen(self, chosen: list[tuple[str, _Plan]]) -> int:
        """Open the chosen prompts in order while flow control allows; the rest go back (to the
        epoch queue's front, or first in the ranked round)."""
        expected = self._expected()
        opened = 0
        for pid, plan in chosen:
            if expected >= self.target * YIELD_UNIT:
                break
            self._n += 1
            visit = self.visits.get(pid, 0)
            self.visits[pid] = visit + 1
            g = _Group(f"g{self._n}", pid, plan.thr_f, plan.thr_s, plan.pf, plan.ps,
                       issued=plan.issue, p_eff=plan.pf[0],
                       audit=audit_draw(self.seed, pid, visit, self.cfg.audit_fraction))
            self.groups[g.gid] = g
            self.last[pid] = g.gid
            self.open[g.gid] = self._weight(g.p_eff)
            self.pending.extend((g.gid, slot) for slot in range(plan.issue))
            self.c["groups_opened"] += 1
            expected += _units(self._weight(g.p_eff))
            opened += 1
        unopened = [pid for pid, _ in chosen[opened:]]
        if self.m.selection == "epoch":
            self.queue.extendleft(reversed(unopened))
        else:
            self.round[1][:0] = unopened
        return opened

    # --- the API

    async def lease(self, max_rollouts: int) -> tuple[list[Leased], int]:
        out: list[Leased] = []

        def take(n: int) -> None:
            while self.pending and len(out) < n:
                gid, slot = self.pending.popleft()
                if self.groups[gid].state == "abandoned":
                    continue  # cancelled slot
                out.append(Leased(f"{gid}:{slot}", gid, self.groups[gid].pid))

        take(max_rollouts)
        if len(out) < max_rollouts and self._open(max_rollouts - len(out)):
            take(max_rollouts)
        return out, self.version

    def _issue(self, g: _Group, to: int) -> None:
        if to > g.issued:
            self.pending.extendleft((g.gid, s) for s in range(to - 1, g.issued - 1, -1))
            g.issued = to

    async def report(self, results: list[dict]) -> list[tuple[str, str]]:
        decided: dict[str, str] = {}
        clock = self._clock()
        for r in results:
            gid = r["rollout_id"].rpartition(":")[0]
            g = self.groups[gid]
            success = r["reward"] >= 0.5
            self._learn(g.pid, success, clock)
            if g.state == "abandoned":  # a late result: the posterior learns, nothing else
                decided[gid] = "abandon"
                continue
            self.c["rollouts_completed"] += 1
            g.results.append(r["reward"])
            g.min_v = r["policy_version"] if g.min_v is None else min(g.min_v, r["policy_version"])
            g.done += 1
            g.s += success
            g.f += not success
            decision = None
            if g.state == "open":
                decision = self._decide(g)
            # as the service answers: the verdict after the group's last result in this call
            decided[gid] = decision or ("abandon" if g.state == "abandoned" else "commit")
            self._maybe_complete(g)
        return list(decided.items())

    def _decide(self, g: _Group) -> str:
        if g.s and g.f:
            g.state, g.p_eff = "committed", 1.0
            self.open[g.gid] = 1.0
            self.c["groups_committed"] += 1
            self.c["audits_mixed"] += g.audited
            self._observe(g.pid, "M")
            self._issue(g, self.k)
            return "commit"
        failing = g.s == 0
        n, thr = (g.f, g.thr_f) if failing else (g.s, g.thr_s)
        table = g.pf if failing else g.ps
        p = table[min(n, thr, self.k)]
        if n >= thr and g.audit and not g.audited:
            g.audited = True
            self.c["groups_audited"] += 1
            self._issue(g, self.k)
        if n >= thr and not g.audited:
            g.state, g.p_eff = "abandoned", p
            self.open.pop(g.gid, None)
            self.c["groups_abandoned"] += 1
            self._observe(g.pid, "F" if failing else "S",
                          self._mixed_chance(g.pid, failing, self.k - n))
            return "abandon"
        g.p_eff = p
        self.open[g.gid] = self._weight(p)
        self._issue(g, min(thr, self.k))
        return "continue"

    def _maybe_complete(self, g: _Group) -> None:
        if g.state == "committed" and g.done >= self.k:
            g.state = "ready"
            self.open.pop(g.gid, None)
            self.ready.append(g.gid)
        elif g.state == "open" and g.done >= self.k:
            self._observe(g.pid, "F" if g.s == 0 else "S")
            self.open.pop(g.gid, None)
            if self.m.policy == "uniform":
                g.state = "ready"
                self.ready.append(g.gid)
            else:
                g.state = "dropped"
                self.c["groups_dropped_saturated"] += 1
            self.c["audits_pure"] += g.audited

    async def next_batch(self) -> DeliveredBatch | None:
        picked: list[str] = []
        while len(picked) < self.cfg.batch_size and self.ready:
            gid = self.ready.popleft()
            g = self.groups[gid]
            if g.min_v is not None and self.version - g.min_v > self.cfg.max_staleness:
                g.state = "dropped"
                self.c["groups_dropped_stale"] += 1
            else:
                picked.append(gid)
        if len(picked) < self.cfg.batch_size:
            self.ready.extendleft(reversed(picked))
            return None
        self.c["groups_delivered"] += len(picked)
        groups = [DeliveredGroup(gid, self.groups[gid].pid, self.groups[gid].results)
                  for gid in picked]
        for gid in picked:  # done with them: keep the model's memory flat
            del self.groups[gid]
        return DeliveredBatch(f"b{self.version}", self.version, groups)

    async def ack(self, batch_id: str) -> None:
        pass

    async def publish(self, version: int) -> None:
        assert version > self.version
        self.version = version

    async def counters(self) -> dict[str, Any]:
        return dict(self.c)


def audit_draw(seed: int, pid: str, visit: int, fraction: float) -> bool:
    """open_groups.lua's audit flag: the first 48 bits of sha1("seed:prompt:visit") below the
    fraction (written from the script's comment, so the model can make the same draws)."""
    if fraction <= 0:
        return False
    digest = hashlib.sha1(f"{seed}:{pid}:{visit}".encode()).hexdigest()
    return int(digest[:12], 16) / 2**48 < fraction


def _tie(k: int, a: float, b: float, tau: float) -> bool:
    """True when p_eff is exactly τ (to 1e-9) somewhere on a pure prefix."""
    return any(abs(p_eff_pure(a, b, k, n, side) - tau) < 1e-9
               for n in range(k + 1) for side in (True, False))


# ------------------------------------------------------------------------------- one job


@dataclass(frozen=True)
class Job:
    cfg: Config
    method: str
    engine: str        # "service" or "model"
    rep: int = 0

    @property
    def name(self) -> str:
        # rep 0 runs on the service run's seeds (the '=' check), reps 1.. are the independent
        # runs the expectation is the mean of
        suffix = ("" if self.engine == "service" else " model, service's seeds" if not self.rep
                  else f" model {self.rep}/{self.cfg.model_reps}")
        return f"{self.cfg.pool} k={self.cfg.k} {METHODS[self.method].label}{suffix}"


async def _run_service(job: Job, pool: Pool, sim: SimBackend,
                       progress: Callable[[int], None] | None) -> Tally:
    import sara_client

    method = METHODS[job.method]
    unstick = None
    try:
        with tempfile.TemporaryDirectory(prefix="sara-bench-") as tmp:
            async with sara_client.alocal(data_dir=tmp, **job.cfg.settings(method)) as client:
                for i in range(0, len(pool.prompts), 5000):
                    await client.add_prompts(pool.prompts[i:i + 5000])
                tally = await drive(ServiceApi(client), method, job.cfg, pool, sim, progress)
                unstick = asyncio.ensure_future(unstick_shutdown(tally.note_recancel))
        return tally
    finally:
        if unstick is not None:
            unstick.cancel()


def run_job(job: Job, queue: Any = None, index: int = 0) -> dict[str, Any]:
    """Run one job to completion; returns its summary. Progress goes to `queue` if given."""
    logging.getLogger("sara").setLevel(logging.ERROR)
    cfg = job.cfg
    pool = cfg.make_pool()
    seed = cfg.seed + 1000 * job.rep
    sim = SimBackend(seed=seed)
    last = [0.0]

    def progress(done: int) -> None:
        now = time.monotonic()
        if queue is not None and (now - last[0] > 0.2 or done >= cfg.groups):
            last[0] = now
            queue.put((index, min(done, cfg.groups)))

    started = time.perf_counter()
    method = METHODS[job.method]
    if job.engine == "service":
        tally = asyncio.run(_run_service(job, pool, sim, progress))
    else:
        model = ModelService(method, cfg, pool, seed)
        tally = asyncio.run(drive(model, method, cfg, pool, sim, progress))
    tally.seconds = time.perf_counter() - started
    if queue is not None:
        queue.put((index, cfg.groups))
    try:
        out = tally.summary()
    except NothingToMeasure as exc:
        raise NothingToMeasure(f"{job.method} ({job.engine}, {cfg.groups} groups): {exc}") from None
    out["shutdown_recancels"] = tally.shutdown_recancels
    out["counters"] = tally.counters
    return out


# --------------------------------------------------------------------------- expectations


def exact_expectation(cfg: Config, method: Method, versions: list[float] | None = None
                      ) -> dict[str, Any] | None:
    """Closed-form figures for a fixed-prior, epoch-selection method on cfg's pool; None for
    the others. For the drifting pool, averaged over the policy versions the run generated at."""
    if not method.exact:
        return None
    pool = cfg.make_pool()
    lengths = Lengths.of_sim(max_tokens=MAX_TOKENS)
    if pool.drifting:
        snapshots = [pool.gammas(v) for v in (versions or [0.0])]
    else:
        snapshots = [pool.gammas()]
    e = expectation(snapshots, cfg.k, method.policy, method.tau, lengths=lengths)
    return {"rollouts_per_effective": e.rollouts_per_effective,
            "useful_fraction": e.useful_fraction,
            "tokens_per_effective": e.tokens_per_effective,
            "false_abandon_rate": e.false_abandon_rate}


FIGURES = ("rollouts_per_effective", "useful_fraction", "tokens_per_effective",
           "false_abandon_rate", "rounds_per_batch")


def _mean(values: list[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def combine(cfg: Config, method_key: str, service: dict, models: list[dict]) -> dict[str, Any]:
    """One result row: measured, exact (where it exists), model, and the expectation to show.

    models[0] ran on the service run's seeds (the mirror); the model's expectation is the mean
    of the independent runs models[1:] (of the mirror alone when there are none)."""
    method = METHODS[method_key]
    # generation versions of the measured window (a batch's groups were generated `lag` earlier)
    versions = [v - service["lag"] for v in service["versions"]]
    exact = exact_expectation(cfg, method, versions)
    mirror, independent = (models[0], models[1:] or models[:1]) if models else (None, [])
    model: dict[str, Any] = {f: _mean([m[f] for m in independent]) for f in FIGURES}
    if independent:
        n_epochs = max(len(m["by_epoch"]) for m in independent)
        model["by_epoch"] = []
        for i in range(n_epochs):  # pooled over the runs: a ratio of sums
            eps = [m["by_epoch"][i] for m in independent if i < len(m["by_epoch"])]
            rollouts, effective = sum(e["rollouts"] for e in eps), sum(e["effective"] for e in eps)
            model["by_epoch"].append({"rollouts": rollouts, "effective": effective,
                                      "rollouts_per_effective": rollouts / effective
                                      if effective else None})
        model["runs"] = [{f: m[f] for f in FIGURES} for m in independent]
    if mirror is not None:
        model["mirror"] = {f: mirror[f] for f in FIGURES}
        model["same_as_service"] = all(mirror[f] == service[f] for f in
                                       ("rollouts", "effective", "rounds_per_batch", "batches"))
    expected = dict(model)
    source = "model"
    if exact is not None:
        expected.update(exact)
        source = "exact"
    return {"pool": cfg.pool, "k": cfg.k, "seed": cfg.seed, "method": method_key,
            "label": method.label,
            "tau": method.tau if method.abandons else None, "settings": cfg.settings(method),
            "measured": service, "exact": exact, "model": model, "expected": expected,
            "expected_source": source, "model_reps": len(independent)}


# --------------------------------------------------------------------------- orchestration


def _jobs(cfgs: list[Config], methods: list[str]) -> list[Job]:
    jobs = []
    for cfg in cfgs:
        for key in methods:
            jobs.append(Job(cfg, key, "service"))
            # rep 0 mirrors the service run's seeds; reps 1.. are independent (the expectation)
            if METHODS[key].modelled:
                jobs += [Job(cfg, key, "model", rep) for rep in range(cfg.model_reps + 1)]
    # longest first (service runs of the costliest methods), so the pool's tail is short
    cost = {"uniform": 37, "ds": 37, "sara-0.3": 31, "sara-0.45": 29, "sara-0.5": 28,
            "sara-history": 24, "dps": 20, "mopps": 24, "sara-dps": 20,
            "sara-history-v0.5": 28, "mopps-v0.5": 33, "sara-dps-hard": 20, "sara-auto": 28,
            "sara-auto-tokens": 28}
    return sorted(jobs, key=lambda j: -(cost.get(j.method, 30) * j.cfg.k * j.cfg.groups
                                        * (1 if j.engine == "service" else 0.1)))


def run_all(cfgs: list[Config], methods: list[str], jobs_n: int = 1,
            show_progress: bool = True) -> list[dict[str, Any]]:
    """Run every job (service + model reps) for every config; returns the result rows."""
    results = run_jobs(_jobs(cfgs, methods), jobs_n, show_progress)
    rows = []
    for cfg in cfgs:
        for key in methods:
            service = results[Job(cfg, key, "service")]
            models = [results[Job(cfg, key, "model", r)] for r in range(cfg.model_reps + 1)
                      if METHODS[key].modelled]
            rows.append(combine(cfg, key, service, models))
    return rows


def run_jobs(jobs: list[Job], jobs_n: int = 1, show_progress: bool = True) -> dict[Job, dict]:
    """Run jobs, `jobs_n` at a time (processes); returns each one's summary."""
    results: dict[Job, dict] = {}
    progress_ctx = _progress(jobs) if show_progress else contextlib.nullcontext(None)
    with progress_ctx as bars:
        if jobs_n <= 1:
            for i, job in enumerate(jobs):
                q = _InlineQueue(bars)
                results[job] = run_job(job, q, i)
        else:
            ctx = multiprocessing.get_context("spawn")
            with ctx.Manager() as manager:
                queue = manager.Queue()
                with ProcessPoolExecutor(jobs_n, mp_context=ctx) as ex:
                    futures = {ex.submit(run_job, job, queue, i): job for i, job in enumerate(jobs)}
                    pending = set(futures)
                    while pending:
                        while not queue.empty():
                            index, done = queue.get()
                            if bars is not None:
                                bars.update(index, done)
                        for f in [f for f in pending if f.done()]:
                            pending.discard(f)
                            results[futures[f]] = f.result()
                        time.sleep(0.1)
    return results


# ------------------------------------------------------------------- the τ grid for sara-auto


def grid_classes(k: int) -> list[tuple[tuple[int, int], list[float]]]:
    """The grid's τ values grouped by the thresholds they give every prompt (uniform prior,
    epoch selection: one plan per run). Equal thresholds make identical decisions on the same
    seeds, so one service run stands for its class. τ values that would skip every prompt
    (Settings refuses them) are left out."""
    classes: dict[tuple[int, int], list[float]] = {}
    for tau in GRID_TAUS:
        limits = thresholds(k, 1.0, 1.0, tau)
        if limits != (0, 0):
            classes.setdefault(limits, []).append(tau)
    return list(classes.items())


def nominal_versions(cfg: Config) -> list[float]:
    """The policy versions a run of cfg generates at, one per trainer batch, before it runs
    (for choosing the grid's region; the tables use the auto run's own versions)."""
    return [float(v) for v in range(max(1, cfg.groups // cfg.batch_size))]


def near_classes(cfgs: list[Config], margin: float
                 ) -> list[tuple[tuple[int, int], list[float]]]:
    """The classes of grid_classes whose closed-form rollouts per effective group, averaged
    over cfgs' pools (one per seed, same pool kind and k), is within `margin` (relative) of the
    best class's: the region around the optimum. The classes outside it cannot be the best
    fixed τ in expectation; they would only win a seed-mean by noise."""
    classes = grid_classes(cfgs[0].k)
    exact = [sum(exact_expectation(c, METHODS[f"sara-{taus[0]:g}"], nominal_versions(c))[
        "rollouts_per_effective"] for c in cfgs) / len(cfgs) for _, taus in classes]
    best = min(exact)
    return [cls for cls, e in zip(classes, exact) if e <= best * (1.0 + margin)]


def run_grid(cfgs: list[Config], jobs_n: int = 1, show_progress: bool = True,
             near: float | None = None) -> list[dict[str, Any]]:
    """One service run per distinct fixed-τ plan of the grid, per config (same seeds and
    --groups as the other methods, so the drifting pool drifts on the same schedule). With
    `near`, only the classes within that margin of the closed-form best (`near_classes`, the
    same classes for every seed of a pool and k)."""
    region: dict[tuple[str, int], list[tuple[tuple[int, int], list[float]]]] = {}
    for cfg in cfgs:
        if (cfg.pool, cfg.k) not in region:
            same = [c for c in cfgs if (c.pool, c.k) == (cfg.pool, cfg.k)]
            region[cfg.pool, cfg.k] = (near_classes(same, near) if near is not None
                                       else grid_classes(cfg.k))
    plan = [(cfg, limits, taus) for cfg in cfgs for limits, taus in region[cfg.pool, cfg.k]]
    jobs = [Job(cfg, f"sara-{taus[0]:g}", "service") for cfg, _, taus in plan]
    results = run_jobs(jobs, jobs_n, show_progress)
    return [{"pool": cfg.pool, "k": cfg.k, "seed": cfg.seed, "taus": taus,
             "thresholds": list(limits), "key": job.method,
             "measured": results[job]["rollouts_per_effective"]}
            for (cfg, limits, taus), job in zip(plan, jobs)]


# ----------------------------------------------------- several seeds: auto against the grid

# two-sided 95% quantiles of Student's t by degrees of freedom (larger: the normal's 1.96)
_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26,
        10: 2.23, 12: 2.18, 15: 2.13, 20: 2.09, 30: 2.04}


def t95(df: int) -> float:
    """The t quantile for df degrees of freedom (the next tabulated df below, conservative)."""
    if df < 1:
        return math.inf
    return _T95[max(d for d in _T95 if d <= df)] if df <= 30 else 1.96


def mean_se(values: list[float]) -> tuple[float, float | None]:
    """Mean and its standard error (sample s.d. / sqrt(n); None for one value)."""
    n = len(values)
    m = sum(values) / n
    if n < 2:
        return m, None
    var = sum((v - m) ** 2 for v in values) / (n - 1)
    return m, math.sqrt(var / n)


def verdict(gap: float, half: float | None, target: float) -> str:
    """The 2% target against a gap and its 95% half-width (None: one seed, no spread)."""
    if half is None:
        return "met (one seed: no spread)" if gap <= target else "missed (one seed: no spread)"
    if gap + half <= target:
        return "met"
    if gap <= target:
        return "met at the mean; the 95% interval reaches past the target"
    if gap - half <= target:
        return "missed at the mean, within noise"
    return "missed beyond noise"


def paired_gap(auto: dict[int, float], ref: dict[int, float], target: float
               ) -> dict[str, Any]:
    """auto / ref - 1 over the seeds both have, with the s.e. of the paired differences (the
    runs of one seed share its pool and outcome stream: common random numbers) over ref's
    mean, and the verdict against `target`."""
    seeds = sorted(set(auto) & set(ref))
    diffs = [auto[s] - ref[s] for s in seeds]
    base, _ = mean_se([ref[s] for s in seeds])
    d, d_se = mean_se(diffs)
    gap_se = None if d_se is None else d_se / base
    half = None if gap_se is None else t95(len(seeds) - 1) * gap_se
    return {"seeds": seeds, "gap": d / base, "gap_se": gap_se, "half95": half,
            "verdict": verdict(d / base, half, target)}


def compare_grid(auto: dict[int, float], fixed: dict[str, dict[int, float]],
                 exact: dict[str, dict[int, float]] | None = None, target: float = 0.02
                 ) -> dict[str, Any]:
    """Auto against the grid over seeds. auto: seed -> figure; fixed (exact): class name ->
    seed -> measured (closed-form) figure of that fixed τ on that seed's pool. The best fixed
    τ is the class with the lowest mean over the seeds (measured; separately in closed form);
    a class missing a seed is left out."""
    seeds = sorted(auto)
    out: dict[str, Any] = {"seeds": seeds, "auto": mean_se([auto[s] for s in seeds]),
                           "classes": {}}
    for name, by_seed in fixed.items():
        if all(s in by_seed for s in seeds):
            out["classes"][name] = {"measured": mean_se([by_seed[s] for s in seeds])}
            if exact and name in exact:
                out["classes"][name]["exact"] = mean_se([exact[name][s] for s in seeds])
    if not out["classes"]:
        raise ValueError("no grid class has every seed")
    best = min(out["classes"], key=lambda c: out["classes"][c]["measured"][0])
    out["best_measured"] = {"class": best, **paired_gap(auto, fixed[best], target)}
    if exact:
        with_exact = [c for c in out["classes"] if "exact" in out["classes"][c]]
        best_e = min(with_exact, key=lambda c: out["classes"][c]["exact"][0])
        out["best_exact"] = {"class": best_e, **paired_gap(auto, exact[best_e], target)}
    return out


def _taus(g: dict[str, Any]) -> str:
    taus = g["taus"]
    span = f"{taus[0]:g}" if len(taus) == 1 else f"{taus[0]:g}-{taus[-1]:g}"
    t_f, t_s = g["thresholds"]
    return f"τ {span} ({t_f}/{t_s})"


def _pm(m: float, se: float | None, fmt: str = ".2f") -> str:
    return f"{m:{fmt}}" + ("" if se is None else f"±{se:{fmt}}")


def _gap(c: dict[str, Any]) -> str:
    se = "" if c["gap_se"] is None else f"±{100 * c['gap_se']:.1f}"
    return f"{100 * c['gap']:+.1f}{se}%"


def grid_summary(rows: list[dict[str, Any]], grid: list[dict[str, Any]], cfgs: list[Config],
                 near: float | None = None, target: float = 0.02
                 ) -> tuple[list[dict[str, Any]], str]:
    """sara-auto against the grid of fixed τ per pool and k, over the seeds run: the summaries
    (`compare_grid` per pool and k, for the JSON) and the table. Each grid run's closed form is
    taken at the policy versions of the auto run of its seed."""
    seeds = sorted({c.seed for c in cfgs})
    region = ("τ = 0.05..0.95 step 0.05" if near is None else
              f"τ of 0.05..0.95 (step 0.05) whose thresholds' closed form, at the nominal "
              f"versions and averaged over the seeds' pools, is within {100 * near:g}% of the "
              f"best's (the region around the optimum; the rest of the grid was not run)")
    n = len(seeds)
    lines = [
        f"auto vs the best fixed τ over {n} seed{'s' * (n > 1)} ({', '.join(map(str, seeds))}; "
        f"a seed draws the pool and the outcome stream, shared by every run of that seed): "
        f"grid {region}; one service run per distinct threshold pair (τ values with the same "
        f"thresholds decide identically). mean±se over seeds; best = lowest seed-mean, measured "
        f"(biased low: the minimum of noisy means) and in closed form (exact, at the versions "
        f"of each seed's auto run: no such bias); gap = mean(auto) / mean(best) - 1 ± the s.e. "
        f"of the paired per-seed differences (negative: auto spends less). Target: gap <= "
        f"{100 * target:+g}%; verdicts use the 95% interval (t, {max(n - 1, 1)} df).",
        f"  {'pool':<9} {'k':>3} {'SARA auto':>12}  {'best fixed τ, measured':<31} "
        f"{'gap':>11}  {'best fixed τ, exact':<31} {'gap':>11}  verdict (vs exact; vs measured)"]
    summaries, details = [], []
    for pool, k in dict.fromkeys((c.pool, c.k) for c in cfgs):
        same = [c for c in cfgs if (c.pool, c.k) == (pool, k)]
        auto_rows = {r["seed"]: r for r in rows if r["pool"] == pool and r["k"] == k
                     and r["method"] == "sara-auto"}
        block = [g for g in grid if g["pool"] == pool and g["k"] == k]
        if not auto_rows or not block:
            continue
        auto = {s: r["measured"]["rollouts_per_effective"] for s, r in auto_rows.items()}
        fixed: dict[str, dict[int, float]] = {}
        exact: dict[str, dict[int, float]] = {}
        names: dict[str, dict[str, Any]] = {}
        for g in block:
            cfg = next(c for c in same if c.seed == g["seed"])
            auto_m = auto_rows[g["seed"]]["measured"]
            versions = [v - auto_m["lag"] for v in auto_m["versions"]]
            g["exact"] = exact_expectation(cfg, METHODS[g["key"]], versions)[
                "rollouts_per_effective"]
            fixed.setdefault(g["key"], {})[g["seed"]] = g["measured"]
            exact.setdefault(g["key"], {})[g["seed"]] = g["exact"]
            names[g["key"]] = g
        cmp = compare_grid(auto, fixed, exact, target)
        cmp.update(pool=pool, k=k, per_seed={"auto": auto, "fixed": fixed, "exact": exact},
                   class_taus={key: {"taus": g["taus"], "thresholds": g["thresholds"]}
                               for key, g in names.items()})
        summaries.append(cmp)
        bm, be = cmp["best_measured"], cmp["best_exact"]
        cm, ce = cmp["classes"][bm["class"]], cmp["classes"][be["class"]]
        lines.append(
            f"  {pool:<9} {k:>3} {_pm(*cmp['auto']):>12}  "
            f"{_pm(*cm['measured']) + ' ' + _taus(names[bm['class']]):<31} {_gap(bm):>11}  "
            f"{_pm(*ce['exact']) + ' ' + _taus(names[be['class']]):<31} {_gap(be):>11}  "
            f"{be['verdict']}; {bm['verdict']}")
        parts = []
        for key, c in sorted(cmp["classes"].items(), key=lambda kv: names[kv[0]]["taus"][0]):
            parts.append(f"{_taus(names[key])} {_pm(*c['measured'])} (exact {c['exact'][0]:.2f})")
        details.append(f"  {pool} k={k}, each fixed τ, measured mean±se (exact mean): "
                       + "; ".join(parts))
        ends = []
        for s in cmp["seeds"]:
            end = auto_rows[s]["measured"]["counters"].get("auto") or {}
            ends.append(f"seed {s} {auto[s]:.2f} (ρ {_num(end.get('rho'), '.1f')}, "
                        f"{end.get('abandon_after_failures', '-')}/"
                        f"{end.get('abandon_after_successes', '-')})")
        details.append(f"  {pool} k={k}, auto per seed (at the end: ρ, abandon after failures/"
                       f"successes): " + "; ".join(ends))
    return summaries, "\n".join(lines + details) + "\n"


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, or None (with a note) when it is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no chart",
              file=sys.stderr)
        return None
    return plt


def _finish(plt: Any, fig: Any, axes: Any, used: int, path: Path, top: float) -> None:
    """Blank the unused panels, put the first panel's legend on top, and save."""
    for ax in list(axes.flat)[used:]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, top))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def grid_chart(summaries: list[dict[str, Any]], path: Path) -> bool:
    """Per pool and k: each fixed τ's seed-mean ± s.e. (bars: measured; ticks: exact) and
    SARA auto's mean ± s.e. (band)."""
    plt = _pyplot()
    if plt is None:
        return False
    cols = 2 if len(summaries) > 1 else 1
    nrows = math.ceil(len(summaries) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(7.5 * cols, 4.0 * nrows), squeeze=False)
    for ax, cmp in zip(axes.flat, summaries):
        keys = sorted(cmp["classes"], key=lambda key: cmp["class_taus"][key]["taus"][0])
        x = range(len(keys))
        m = [cmp["classes"][key]["measured"][0] for key in keys]
        se = [cmp["classes"][key]["measured"][1] or 0.0 for key in keys]
        e = [cmp["classes"][key]["exact"][0] for key in keys]
        ax.bar(x, m, yerr=se, color="#4c72b0", width=0.6, capsize=3,
               label="fixed τ, measured (mean ± s.e.)")
        ax.scatter(x, e, marker="_", s=400, color="black", label="fixed τ, exact", zorder=3)
        a, a_se = cmp["auto"]
        ax.axhline(a, color="#c44e52", lw=1.5, label="SARA auto (mean ± s.e.)")
        if a_se:
            ax.axhspan(a - a_se, a + a_se, color="#c44e52", alpha=0.2)
        labels = []
        for key in keys:
            taus, (t_f, t_s) = cmp["class_taus"][key]["taus"], cmp["class_taus"][key]["thresholds"]
            span = f"{taus[0]:g}" if len(taus) == 1 else f"{taus[0]:g}-{taus[-1]:g}"
            labels.append(f"{span}\n{t_f}/{t_s}")
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=8)
        lo = min(m + e + [a]) * 0.97
        ax.set_ylim(lo, max(m + e + [a]) * 1.02)
        be = cmp["best_exact"]
        ax.set_title(f"{cmp['pool']} pool, k={cmp['k']}, {len(cmp['seeds'])} seeds: auto "
                     f"{100 * be['gap']:+.1f}% vs the exact best", fontsize=10)
        ax.set_xlabel("fixed τ (abandon after failures/successes)", fontsize=8)
        ax.set_ylabel("rollouts per effective group")
        ax.grid(axis="y", alpha=0.3)
    _finish(plt, fig, axes, len(summaries), path, 0.94)
    return True


class _InlineQueue:
    def __init__(self, bars: Any) -> None:
        self.bars = bars

    def put(self, item: tuple[int, int]) -> None:
        if self.bars is not None:
            self.bars.update(*item)


class _Bars:
    def __init__(self, progress: Any, tasks: list[Any]) -> None:
        self.progress, self.tasks = progress, tasks

    def update(self, index: int, done: int) -> None:
        self.progress.update(self.tasks[index], completed=done)


@contextlib.contextmanager
def _progress(jobs: list[Job]):
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)

    columns = (TextColumn("{task.description:<40}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, transient=False, refresh_per_second=4) as progress:
        tasks = [progress.add_task(job.name, total=job.cfg.groups) for job in jobs]
        yield _Bars(progress, tasks)


# --------------------------------------------------------------------------------- output


def _pct(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "   -  "
    return f"{100 * (a / b - 1):+5.1f}%"


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _block(rows: list[dict[str, Any]], cfg: Config) -> list[dict[str, Any]]:
    """cfg's rows (rows recorded before seeds were kept have none: seed 0)."""
    return [r for r in rows if r["pool"] == cfg.pool and r["k"] == cfg.k
            and r.get("seed", 0) == cfg.seed]


def format_table(rows: list[dict[str, Any]], cfgs: list[Config]) -> str:
    lines = []
    several = len({c.seed for c in cfgs}) > 1
    for cfg in cfgs:
        block = _block(rows, cfg)
        if not block:
            continue
        ds = next((r for r in block if r["method"] == "ds"), None)
        drift = (f", drift +{cfg.drift:g}/epoch of {cfg.versions_per_epoch:g} versions"
                 if cfg.pool == "drifting" else "")
        seed = f", seed {cfg.seed}" if several else ""
        lines.append(f"{cfg.pool} pool{drift}, k={cfg.k}{seed}: {cfg.prompts} prompts, "
                     f"{cfg.groups} effective groups per method, batch {cfg.batch_size}, "
                     f"prefetch {cfg.prefetch_batches}")
        runs = f"{cfg.model_reps} independent run{'s' if cfg.model_reps != 1 else ''}"
        lines.append(f"  meas = the service; exact = closed form over the pool; model = mean of "
                     f"{runs} of the reference scheduler; '=' = one more run of it, on the "
                     "service run's seeds, made exactly the same decisions; Δ and exp = against "
                     "exact where it exists, else the model (~)")
        head = (f"  {'method':<14} {'rollouts per effective group':^32}  {'vs DS':^15} "
                f"{'useful fraction':^15} {'tokens/eff.group':^17} {'false-abandon rate':^22} "
                f"{'rounds/batch':^13} {'stale':>5}")
        sub = (f"  {'':<14} {'meas':>7} {'exact':>7} {'model':>7} {'Δ':>7}   "
               f"{'meas':>7} {'exp':>7} "
               f"{'meas':>7} {'exp':>7} {'meas':>8} {'exp':>8} {'meas':>7} {'exp':>7} {'τ':>6} "
               f"{'meas':>6} {'model':>6} {'drops':>5}")
        lines += [head, sub, "  " + "-" * (len(sub) - 2)]
        for r in block:
            m, e, mo = r["measured"], r["expected"], r["model"]
            mark = "" if r["expected_source"] == "exact" else "~"
            same = "=" if mo.get("same_as_service") else " "
            ref_m = ds["measured"]["rollouts_per_effective"] if ds else None
            ref_e = ds["expected"]["rollouts_per_effective"] if ds else None
            exp_r = e.get("rollouts_per_effective")
            exact_r = (r["exact"] or {}).get("rollouts_per_effective")
            fa = m["false_abandon_rate"]
            exp_fa = mark + _num(e.get("false_abandon_rate"), ".4f")
            lines.append(
                f"  {r['label']:<14} {m['rollouts_per_effective']:7.2f} {_num(exact_r, '.2f'):>7} "
                f"{_num(mo.get('rollouts_per_effective'), '.2f'):>7}{same}"
                f"{_pct(m['rollouts_per_effective'], exp_r):>7}   "
                f"{_pct(m['rollouts_per_effective'], ref_m):>7} {_pct(exp_r, ref_e):>7} "
                f"{m['useful_fraction']:7.3f} {mark + _num(e.get('useful_fraction'), '.3f'):>7} "
                f"{m['tokens_per_effective']:8.0f} "
                f"{mark + _num(e.get('tokens_per_effective'), '.0f'):>8} "
                f"{_num(fa, '.4f'):>7} "
                f"{exp_fa if fa is not None else '-':>7} "
                f"{_tau(r['tau']):>6} "
                f"{m['rounds_per_batch']:6.2f} {_num(mo.get('rounds_per_batch'), '.2f'):>6} "
                f"{m['counters'].get('groups_dropped_stale', 0):>5}")
        hist = next((r for r in block if r["method"] == "sara-history"), None)
        if hist and ds:
            epochs = hist["measured"]["by_epoch"]
            model_epochs = hist["model"].get("by_epoch") or []
            ref = ds["measured"]["rollouts_per_effective"]
            parts = []
            for i, ep in enumerate(epochs):
                if ep["rollouts_per_effective"] is None or ep["effective"] < 2 * cfg.batch_size:
                    continue  # a sliver of an epoch at the end of the run says nothing
                model_ep = model_epochs[i] if i < len(model_epochs) else {}
                parts.append(f"e{ep['epoch']}{' (partial)' if ep['partial'] else ''} "
                             f"{ep['rollouts_per_effective']:.1f} "
                             f"({_pct(ep['rollouts_per_effective'], ref).strip()}; "
                             f"model {_num(model_ep.get('rollouts_per_effective'), '.1f')})")
            later = [ep for ep in epochs[1:] if ep["effective"]]
            if later:
                r_later = sum(ep["rollouts"] for ep in later) / sum(ep["effective"] for ep in later)
                parts.append(f"after epoch 1: {r_later:.1f} ({_pct(r_later, ref).strip()} vs DS)")
            lines.append("  SARA+history by epoch of the pool (rollouts/eff.group, vs DS): "
                         + "; ".join(parts))
        if ds:
            ceiling = cfg.k / ds["expected"]["rollouts_per_effective"] - 1
            lines.append(f"  ceiling for any method that fills groups to k (every group mixed, "
                         f"k = {cfg.k} rollouts per effective group): {100 * ceiling:+.1f}% vs DS")
        checks = []
        for r in block:
            m, c = r["measured"], r["measured"]["counters"]
            svc = c.get("derived", {}).get("rollouts_per_effective_group")
            issues = []
            if m["n_violations"]:
                issues.append(f"{m['n_violations']} violations: {m['violations'][:2]}")
            hist_svc = {str(a): b for a, b in (c.get("abandon_histogram") or {}).items()}
            if METHODS[r["method"]].abandons and hist_svc and hist_svc != {
                    str(a): b for a, b in _total_hist(m).items()}:
                issues.append(f"abandon histogram differs: service {hist_svc} vs worker "
                              f"{m['abandon_hist']}")
            if m.get("shutdown_recancels"):
                issues.append("the app's shutdown hung until its maintenance task was cancelled "
                              f"again ({m['shutdown_recancels']}x)")
            if c.get("results_late"):
                issues.append(f"{c['results_late']} late results (wasted rollouts)")
            d = c.get("derived", {})
            fa = ""
            if METHODS[r["method"]].abandons:
                estimate = _num(d.get("estimated_false_abandon_rate"), ".4f")
                bound = _num(d.get("expected_false_abandon_rate"), ".3f")
                audited = _num(d.get("false_abandon_rate"), ".3f")
                fa = (f"false abandons: audited {audited}, posterior model {estimate}, mean "
                      f"p_eff at abandonment {bound}; ")
            skipped = f"{c['groups_skipped']} prompts skipped; " if c.get("groups_skipped") else ""
            if METHODS[r["method"]].abandons and ds is not None:
                fa += (f"its DS estimate {_num(d.get('ds_rollouts_per_effective_group'), '.1f')} "
                       f"[95% {_num(d.get('ds_rollouts_per_effective_group_low'), '.1f')}, "
                       f"{_num(d.get('ds_rollouts_per_effective_group_high'), '.1f')}] "
                       f"(DS measured {ds['measured']['rollouts_per_effective']:.1f}); ")
            checks.append(f"    {r['label']:<14} service's own rollouts/eff.group "
                          f"{_num(svc, '.2f')} (whole run); {fa}{skipped}{m['seconds']:.0f}s; "
                          + ("; ".join(issues) if issues else "no anomalies"))
        lines.append("  checks:")
        lines += checks
        lines.append("")
    return "\n".join(lines)


def _tau(tau: float | str | None) -> str:
    if tau is None:
        return "-"
    return tau if isinstance(tau, str) else f"{tau:.2f}"


def _total_hist(measured: dict) -> dict[int, int]:
    return {int(a): b for a, b in measured["abandon_hist"].items()}


def chart(rows: list[dict[str, Any]], cfgs: list[Config], path: Path) -> bool:
    """Rollouts per effective group per method, measured bars with expected markers."""
    plt = _pyplot()
    if plt is None:
        return False
    cfgs = [c for c in cfgs if _block(rows, c)]
    cols = 2 if len(cfgs) > 1 else 1
    nrows = math.ceil(len(cfgs) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(7.5 * cols, 4.2 * nrows), squeeze=False)
    for ax, cfg in zip(axes.flat, cfgs):
        block = _block(rows, cfg)
        ds = next((r for r in block if r["method"] == "ds"), None)
        x = range(len(block))
        meas = [r["measured"]["rollouts_per_effective"] for r in block]
        exp = [r["expected"].get("rollouts_per_effective") for r in block]
        colors = ["#999999" if r["method"] in ("uniform", "ds") else
                  "#4c72b0" if r["method"].startswith("sara") else "#dd8452" for r in block]
        ax.bar(x, meas, color=colors, width=0.7, label="measured (service)")
        for i, (r, e) in enumerate(zip(block, exp)):
            if e is None:
                continue
            exact = r["expected_source"] == "exact"
            ax.plot([i - 0.35, i + 0.35], [e, e], color="black", lw=1.6,
                    ls="-" if exact else "--",
                    label=None if i else "expected: exact (solid) / model (dashed)")
            if ds:
                pct = 100 * (meas[i] / ds["measured"]["rollouts_per_effective"] - 1)
                ax.text(i, meas[i] + 0.5, f"{pct:+.0f}%", ha="center", va="bottom", fontsize=8)
        ax.axhline(cfg.k, color="#55a868", ls=":", lw=1.2,
                   label="k: every group mixed (the floor for fill-to-k methods)")
        ax.set_xticks(list(x))
        ax.set_xticklabels([r["label"] for r in block], rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("rollouts per effective group")
        ax.set_title(f"{cfg.pool} pool, k={cfg.k} (labels: vs DS)", fontsize=10)
        ax.set_ylim(0, max(meas + [e for e in exp if e]) * 1.15)
        ax.grid(axis="y", alpha=0.3)
    _finish(plt, fig, axes, len(cfgs), path, 0.95)
    return True


def _cpu_seconds() -> tuple[float, float]:
    """CPU seconds (user + system) of this process and of its finished children (redis)."""
    import resource

    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def header(cfgs: list[Config], methods: list[str], argv: list[str], seconds: float,
           jobs_n: int, code: str | None = None) -> str:
    cfg = cfgs[0]
    seeds = sorted({c.seed for c in cfgs})
    own, kids = _cpu_seconds()
    return "\n".join([
        "SARA allocation efficiency through the real scheduler (bench/allocation.py)",
        f"date:      {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC",
        f"code:      {code or git_state()}",
        f"command:   {shlex.join(['python', 'bench/allocation.py', *argv])}",
        f"machine:   {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; {jobs_n} runs at a time; {seconds:.0f}s in all, "
        f"CPU {own:.0f}s here + {kids:.0f}s in child processes (redis-server, worker "
        f"processes); load average at the end {os.getloadavg()[0]:.1f}",
        f"setup:     sara_client.alocal() (the FastAPI app + Lua on an embedded redis-server) "
        f"per run; sim outcomes (SimBackend.outcome, max_tokens {MAX_TOKENS}); one worker with "
        f"unlimited capacity in sync rounds; trainer acks every batch and publishes a version",
        f"settings:  batch_size {cfg.batch_size}, prefetch_batches {cfg.prefetch_batches}, "
        f"max_staleness {cfg.max_staleness}, posterior_decay {cfg.posterior_decay} per version "
        f"and posterior_half_life {cfg.posterior_half_life:g} epochs (history, MoPPS; the "
        f"'old' rows: 0.5 per version, no half-life, hard DPS labels), "
        f"dps_decay {cfg.dps_decay}, selection_lambda {cfg.selection_lambda}, "
        f"seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))}",
        f"methods:   {', '.join(methods)}",
        "",
    ])


# ------------------------------------------------------------------------------------ CLI


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pool", default="standard,drifting",
                   help="comma list of: " + ", ".join(POOLS))
    p.add_argument("--pool-file", default="", metavar="FILE.jsonl",
                   help="run on this pool instead of --pool: one POST /prompts item a line, "
                        "its success chance in meta.p_success (all its prompts, no drift)")
    p.add_argument("--k", default="8,16", help="comma list of group sizes")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                   help="comma list of: " + ", ".join(DEFAULT_METHODS)
                   + " (and sara-<τ> for any τ of the grid)")
    p.add_argument("--grid", action="store_true",
                   help="also run the grid of fixed τ (0.05..0.95) per pool and k, and print "
                        "sara-auto against the best of it (adds sara-auto to the methods)")
    p.add_argument("--groups", type=int, default=2048, help="effective groups per method")
    p.add_argument("--prompts", type=int, default=1024, help="pool size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", default=None,
                   help="comma list of seeds (overrides --seed): every method and the grid run "
                        "on each; with --grid the comparison is over seeds, paired by seed")
    p.add_argument("--grid-near", type=float, default=None, metavar="MARGIN",
                   help="with --grid, run only the fixed τ whose closed form is within MARGIN "
                        "(e.g. 0.05) of the closed-form best on the pool: the region around "
                        "the optimum")
    p.add_argument("--quick", action="store_true",
                   help="CI: standard pool, k=16, 256 groups, 256 prompts, 1 model rep")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--prefetch-batches", type=int, default=2)
    p.add_argument("--posterior-decay", type=float, default=1.0,
                   help="λ per policy version for SARA+history and MoPPS (service default 1)")
    p.add_argument("--posterior-half-life", type=float, default=DEFAULT_HALF_LIFE,
                   help="half-life in epochs of the pool for SARA+history and MoPPS (inf: "
                        f"never forget; service default {DEFAULT_HALF_LIFE:g})")
    p.add_argument("--dps-decay", type=float, default=0.5)
    p.add_argument("--audit", type=float, default=0.0,
                   help="SARA_AUDIT_FRACTION for every method (0: off, as the exact figures "
                        "assume; the service's default is 0.05)")
    p.add_argument("--drift", type=float, default=DEFAULT_DRIFT, help="γ gained per epoch")
    p.add_argument("--model-reps", type=int, default=3)
    p.add_argument("--jobs", type=int, default=1,
                   help="runs at a time (processes; on a busy 2-core box 2 was slower than 1)")
    p.add_argument("--out", default=None,
                   help="output prefix (default bench/results/allocation, or "
                        "allocation_quick with --quick)")
    p.add_argument("--no-write", action="store_true", help="print only")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        defaults = {a.dest: a.default for a in p._actions}
        for name, value in (("pool", "standard"), ("k", "16"), ("groups", 256),
                            ("prompts", 256), ("model_reps", 1)):
            if getattr(args, name) == defaults[name]:
                setattr(args, name, value)
    return args


def configs(args: argparse.Namespace) -> list[Config]:
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    pools, prompts = args.pool.split(","), args.prompts
    if args.pool_file:
        try:
            prompts = len(load_pool_file(args.pool_file))
        except (OSError, ValueError) as e:
            raise SystemExit(f"--pool-file: {e}") from None
        pools = [f"file:{Path(args.pool_file).stem}"]
    return [Config(pool=pool.strip(), pool_file=args.pool_file, k=int(k), groups=args.groups,
                   prompts=prompts,
                   seed=seed, batch_size=args.batch_size,
                   prefetch_batches=args.prefetch_batches,
                   posterior_decay=args.posterior_decay,
                   posterior_half_life=args.posterior_half_life, audit_fraction=args.audit,
                   dps_decay=args.dps_decay, drift=args.drift, model_reps=args.model_reps)
            for pool in pools for k in args.k.split(",") for seed in seeds]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",")]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown methods {unknown}; choose from {', '.join(METHODS)}")
    cfgs = configs(args)
    for cfg in cfgs:
        if cfg.pool not in POOLS and not cfg.pool_file:
            raise SystemExit(f"unknown pool {cfg.pool!r}; choose from {', '.join(POOLS)}")
    if args.grid and "sara-auto" not in methods:
        methods.append("sara-auto")
    # the code the runs use, read before they start: edits during a long run are not in it
    code = git_state()
    started = time.perf_counter()
    try:
        rows = run_all(cfgs, methods, args.jobs, show_progress=not args.no_progress)
    except NothingToMeasure as exc:
        raise SystemExit(f"bench/allocation.py: {exc}") from None
    grid = (run_grid(cfgs, args.jobs, not args.no_progress, args.grid_near)
            if args.grid else [])
    seconds = time.perf_counter() - started
    text = header(cfgs, methods, argv, seconds, args.jobs, code) + format_table(rows, cfgs)
    summaries: list[dict[str, Any]] = []
    if grid:
        summaries, table = grid_summary(rows, grid, cfgs, args.grid_near)
        text += "\n" + table
    print(text)
    if not args.no_write:
        prefix = Path(args.out) if args.out else RESULTS / (
            "allocation_quick" if args.quick else "allocation")
        prefix.parent.mkdir(parents=True, exist_ok=True)

        def path(ext: str) -> Path:  # not with_suffix: "allocation_decay_0.5" has a dot
            return prefix.parent / (prefix.name + ext)

        path(".txt").write_text(text + "\n")
        meta = {"command": shlex.join(["python", "bench/allocation.py", *argv]),
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                "code": code, "seconds": seconds,
                "configs": [asdict(c) for c in cfgs], "methods": methods}
        path(".json").write_text(json.dumps({"meta": meta, "results": rows, "grid": grid,
                                             "grid_summary": summaries},
                                            indent=1, default=float) + "\n")
        if len({c.seed for c in cfgs}) > 1 and summaries:
            grid_chart(summaries, path(".png"))    # one chart per seed would say little
        else:
            chart(rows, cfgs, path(".png"))
        print(f"wrote {prefix}.txt, .json, .png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
