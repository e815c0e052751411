"""Reinforce-Ada's allocation as a policy of the engine (pure: no I/O, no randomness).

Reinforce-Ada (Xiong et al., arXiv 2510.04996) samples a prompt in rounds: `round_size`
rollouts at a time, up to a budget of k (its reference settings: rounds of 8, at most 4, so
k = 32). After each complete round a prompt leaves once it has enough signal:

- "balanced": at least keep // 2 successes and keep - keep // 2 failures;
- "positive": at least one success.

A prompt that leaves, or reaches the budget, is down-sampled to `keep` rollouts (its reference
setting: 4): keep // 2 successes and the rest failures where it has them, the other kind
making up any shortfall, earliest first (`keep_slots`). Its paper computes the advantage
baseline from every rollout the prompt drew, not only those kept ("global statistics"); the
engine delivers the kept ones with every reward drawn (`drawn_rewards`), and the trainer's
GRPO baseline is taken over those (`TrainerConfig.drawn_baseline`).

Where this engine differs from the paper's code, and why:

- a group that ends with all its rewards equal (pure at the budget, or all successes when the
  "positive" rule is met) is not delivered: it carries no gradient, and the engine delivers
  only effective groups (the reference keeps it in the batch);
- a success is a reward >= SARA_SUCCESS_THRESHOLD, the engine's one definition (the paper's
  `positive_threshold` compares with > 0.7; for 0/1 rewards the two agree);
- rounds run per group as results arrive, not in lock-step over a batch of prompts: a group's
  next round is issued when its own round is complete.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from .allocation import GroupPlan, plan_group

RULES = ("balanced", "positive")


@dataclass(frozen=True)
class RoundRule:
    """How a group is sampled in rounds: `size` rollouts a round, and the successes and
    failures it needs before it stops."""

    size: int
    successes: int
    failures: int

    def stops(self, successes: int, failures: int) -> bool:
        """True once a group with these outcomes has the signal its rule asks for."""
        return successes >= self.successes and failures >= self.failures


def round_rule(round_size: int, keep: int, rule: str) -> RoundRule:
    """The stop rule of `rule` for groups kept at `keep` rollouts (see the module docstring)."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}; got {rule!r}")
    if round_size < 1 or keep < 2:
        raise ValueError(f"round_size must be >= 1 and keep >= 2; got {round_size}, {keep}")
    if rule == "positive":
        return RoundRule(round_size, 1, 0)
    return RoundRule(round_size, keep // 2, keep - keep // 2)


def plan_rounds(k: int, alpha0: float, beta0: float, rule: RoundRule) -> GroupPlan:
    """The plan of a Reinforce-Ada group: Dynamic Sampling's (never abandoned, its p_eff
    tables), issuing one round at first, with the round rule the scripts follow."""
    if k % rule.size:
        raise ValueError(f"the budget k={k} must be a whole number of rounds of {rule.size}")
    ds = plan_group("dynamic_sampling", k, alpha0, beta0, 0.0)
    return replace(ds, policy="reinforce_ada", initial_issue=rule.size,
                   rounds=(rule.size, rule.successes, rule.failures))


def decide_round(outcomes: Sequence[bool], issued: int, k: int, rule: RoundRule) -> str:
    """The decision after a result, with `outcomes` the group's results so far (True: a
    success) and `issued` rollouts out: "continue" while the round runs or a next one is
    issued, "commit" when the group stops mixed, "abandon" when it stops pure before its budget
    (the "positive" rule met by successes only); a group pure at its budget is "continue", then
    dropped as saturated, as under Dynamic Sampling."""
    done = len(outcomes)
    if done < issued:
        return "continue"
    wins = sum(1 for x in outcomes if x)
    losses = done - wins
    if not rule.stops(wins, losses) and issued < k:
        return "continue"
    if wins and losses:
        return "commit"
    return "continue" if issued >= k else "abandon"


def next_issue(done: int, issued: int, k: int, rule: RoundRule) -> int:
    """Rollouts a group that continues has issued after the decision: one more round once the
    current one is complete, up to the budget."""
    return min(issued + rule.size, k) if done >= issued else issued


def keep_slots(outcomes: Sequence[bool], keep: int) -> list[int]:
    """The positions (in slot order) of the rollouts a stopped group keeps: keep // 2 successes
    and keep - keep // 2 failures where there are that many, the other kind making up the
    rest, the earliest of each kind; every position when there are no more than `keep`."""
    if len(outcomes) <= keep:
        return list(range(len(outcomes)))
    wins = [i for i, x in enumerate(outcomes) if x]
    losses = [i for i, x in enumerate(outcomes) if not x]
    take_wins = min(keep // 2, len(wins))
    take_losses = min(keep - take_wins, len(losses))
    take_wins = min(len(wins), keep - take_losses)
    return sorted(wins[:take_wins] + losses[:take_losses])
