"""Shared allocation cases: the Python reference's answers, for checking the Lua scripts.

    from tests.allocation_cases import CASES            # the default 300 (seed 0), built lazily
    from tests.allocation_cases import generate_cases   # generate_cases(seed=0, count=300)

(With tests/ itself on sys.path: ``from allocation_cases import ...``.)

Each case is a JSON-ready dict describing one group, fed its outcomes one at a time, in order:

    policy         "uniform" | "dynamic_sampling" | "sara"
    k              group size
    alpha0, beta0  the Beta prior the group was planned with
    tau_low        abandonment threshold
    commit_mode    always "complete": a committed group is filled to k
    skip           True when the plan issues nothing (both thresholds 0); then outcomes,
                   decisions and issued_after are all [] and final is "skipped"
    initial_issue  rollouts issued when the group opens (plan_group(...).initial_issue)
    after_failures, after_successes   the plan's thresholds (k + 1 = never)
    outcomes       rewards received, 1 = success, 0 = failure; the sequence stops at the first
                   "commit" or "abandon", or at k outcomes
    decisions      decisions[i] is the decision after outcomes[:i+1]: "commit" (first mixed
                   prefix), "abandon" (sara only: pure prefix with p_eff < tau_low) or
                   "continue"; uniform and dynamic_sampling never abandon
    issued_after   issued_after[i] is the total rollouts issued to the group after applying
                   outcomes[i]: issue_target(...) while open, k once committed, unchanged by an
                   abandon (its in-flight rollouts are cancelled, nothing new is issued)
    final          "committed", "abandoned", "skipped", or "saturated" (k pure outcomes, never
                   abandoned: uniform delivers it, dynamic_sampling and sara drop it)

To run a case against a store: open the group with the plan from
``plan_group(policy, k, alpha0, beta0, tau_low)``, check it issues ``initial_issue``, then apply the
outcomes one by one, checking each decision and the issued total after it.
"""

from __future__ import annotations

import random
from typing import Any

from sara_service.math.allocation import decide, issue_target, plan_group

# Hand-picked groups: (policy, k, alpha0, beta0, tau_low). Each is run with a few outcome sequences.
EDGE_PLANS: list[tuple[str, int, float, float, float]] = [
    ("sara", 8, 1.0, 1.0, 0.5),  # the paper's setting: thresholds 4 and 4
    ("sara", 8, 1.0, 1.0, 0.0),  # tau 0: never abandons, saturated groups run to k
    ("sara", 8, 1.0, 1.0, 1.0),  # tau 1: skipped before any rollout
    ("sara", 2, 1.0, 1.0, 0.5),  # smallest useful group
    ("sara", 2, 1.0, 1.0, 0.3),
    ("sara", 1, 1.0, 1.0, 0.0),  # a group of 1 can never be mixed
    ("sara", 8, 5.0, 0.5, 0.3),  # informed priors, asymmetric thresholds
    ("sara", 8, 0.5, 5.0, 0.3),
    ("sara", 16, 20.0, 1.0, 0.2),
    ("sara", 16, 1.0, 20.0, 0.2),
    ("sara", 4, 50.0, 0.05, 0.5),  # near-certain success: skipped at n = 0
    ("sara", 4, 0.05, 50.0, 0.5),  # near-certain failure: skipped at n = 0
    ("sara", 64, 0.1, 0.1, 0.3),  # U-shaped prior: most groups saturate
    ("sara", 1024, 1e6, 1e6, 0.5),  # large k and a sharp prior at gamma = 0.5
    ("uniform", 8, 1.0, 1.0, 0.5),
    ("uniform", 2, 1.0, 1.0, 0.5),
    ("dynamic_sampling", 8, 1.0, 1.0, 0.5),
    ("dynamic_sampling", 4, 50.0, 0.05, 0.5),  # baselines never skip
]

_SMALL_K = [2, 2, 3, 4, 4, 5, 6, 8, 8, 8, 12, 16, 16, 32, 64]


def run_case(
    policy: str, k: int, alpha0: float, beta0: float, tau_low: float, stream: list[int]
) -> dict[str, Any]:
    """Feed ``stream`` (k outcomes) to a new group until it commits, abandons or completes."""
    plan = plan_group(policy, k, alpha0, beta0, tau_low)
    case: dict[str, Any] = {
        "policy": policy, "k": k, "alpha0": alpha0, "beta0": beta0, "tau_low": tau_low,
        "commit_mode": "complete", "skip": plan.skip, "initial_issue": plan.initial_issue,
        "after_failures": plan.after_failures, "after_successes": plan.after_successes,
        "outcomes": [], "decisions": [], "issued_after": [],
        "final": "skipped" if plan.skip else "saturated",
    }
    if plan.skip:
        return case
    issued, successes = plan.initial_issue, 0
    for n, outcome in enumerate(stream[:k], start=1):
        successes += outcome
        if policy == "sara":
            decision = decide(n, successes, k, alpha0, beta0, tau_low)
        else:  # baselines: the first mixed prefix commits, nothing is ever abandoned
            decision = "commit" if 0 < successes < n else "continue"
        if decision == "commit":
            issued = k
        else:
            issued = max(issued, issue_target(plan, successes, n - successes))
        case["outcomes"].append(outcome)
        case["decisions"].append(decision)
        case["issued_after"].append(issued)
        if decision != "continue":
            case["final"] = {"commit": "committed", "abandon": "abandoned"}[decision]
            break
    return case


def _random_plan(rng: random.Random) -> tuple[str, int, float, float, float]:
    policy = rng.choices(["sara", "uniform", "dynamic_sampling"], weights=[6, 1, 1])[0]
    k = rng.choice(_SMALL_K) if rng.random() < 0.9 else rng.choice([128, 256, 1024])
    if rng.random() < 0.5:
        alpha0 = beta0 = 1.0  # prior = uniform, the common configuration
    else:  # prior = history: anything from vague to sharp
        alpha0, beta0 = 10 ** rng.uniform(-1.0, 3.0), 10 ** rng.uniform(-1.0, 3.0)
    tau_low = rng.choice([0.0, 0.1, 0.2, 0.3, 0.5, 0.5, 1.0, round(0.6 * rng.random(), 3)])
    return policy, k, alpha0, beta0, tau_low


def _stream(rng: random.Random, k: int, gamma: float) -> list[int]:
    return [1 if rng.random() < gamma else 0 for _ in range(k)]


def generate_cases(seed: int = 0, count: int = 300) -> list[dict[str, Any]]:
    """``count`` cases, deterministic in ``seed``: every edge plan with all-fail, all-success
    and random streams first, then random plans with streams drawn at a random success rate."""
    rng = random.Random(seed)
    cases: list[dict[str, Any]] = []
    for policy, k, alpha0, beta0, tau_low in EDGE_PLANS:
        for stream in ([0] * k, [1] * k, _stream(rng, k, rng.random())):
            cases.append(run_case(policy, k, alpha0, beta0, tau_low, stream))
    while len(cases) < count:
        policy, k, alpha0, beta0, tau_low = _random_plan(rng)
        # Extreme success rates often, so pure prefixes long enough to abandon are common.
        gamma = rng.choice([0.0, 1.0, 0.02, 0.98, rng.random()])
        cases.append(run_case(policy, k, alpha0, beta0, tau_low, _stream(rng, k, gamma)))
    return cases[:count]


_cache: dict[str, list[dict[str, Any]]] = {}


def __getattr__(name: str) -> Any:
    # CASES is built on first use, not at import, so importing this module costs nothing.
    if name == "CASES":
        if "CASES" not in _cache:
            _cache["CASES"] = generate_cases()
        return _cache["CASES"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
