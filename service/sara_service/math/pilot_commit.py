"""Pilot-Commit's allocation as a policy of the engine (pure: no I/O, no randomness).

Pilot-Commit (arXiv 2605.26606; databricks/pilot-commit) samples a small pilot per prompt
first, then spends a large per-prompt budget only where the pilot says the prompt teaches
something. Its scripts: pilots of 32 (or 16) rollouts, 96 (or 48) more for a committed prompt,
so groups of 128 (or 64): the pilot is a quarter of the budget. A prompt is committed when its
pilot pass rate p lies in the band `lower <= p <= 1 - upper`, both ends inclusive (the scripts'
lower 0.125 and upper 0.25: p in [0.125, 0.75]); its pilot stays in the group, which is filled to
the budget, and nothing is down-sampled. A prompt whose every pilot rollout succeeded is excluded
for the rest of the run; one out of the band otherwise is dropped for now.

Here the band is given in pass rates (`band_low`, `band_high`: the scripts' 0.125 and 0.75)
and held in successes (`pilot_band`). A committed group is mixed whenever the band excludes 0
and the whole pilot, which `pilot_band` requires: the engine delivers effective groups only.

Where this engine differs from the paper's code, and why:

- a committed prompt is filled at once, under the policy version that runs when its pilot ends;
  the paper's code holds in-band prompts in a replay buffer and commits them in a later round
  (dropped once more than 4 steps old). Ours is never staler than the buffer allows, so the
  staleness cap holds trivially: the buffer exists there to batch generation in lock-step rounds,
  which this engine does not run;
- the paper's pilot always runs whole. Composed with SARA's stopping (`after_failures`, from
  SARA_PC_TAU_LOW), a pilot is issued only up to SARA's threshold on failures and abandoned
  when that prefix failed throughout: its chance of ending mixed, under the prior, has fallen
  below tau_low (SARA's plan for a group the pilot's size). One success issues the rest of the
  pilot. An all-success prefix is never stopped: that would lose the "solved" verdict;
- a success is a reward >= SARA_SUCCESS_THRESHOLD (the paper's accuracy is 0/1);
- its exclusion of solved prompts reads the prompt's outcome history (`excluded`), so it
  survives a restart; the paper's lives in the trainer's memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from .allocation import GroupPlan, plan_group


@dataclass(frozen=True)
class PilotBand:
    """A pilot of `pilot` rollouts, committed when its successes lie in [low, high]."""

    pilot: int
    low: int
    high: int

    def in_band(self, successes: int) -> bool:
        """True when a complete pilot with this many successes is committed."""
        return self.low <= successes <= self.high


def pilot_band(pilot: int, band_low: float, band_high: float) -> PilotBand:
    """The band of pass rates [band_low, band_high] on a pilot of `pilot`, in successes: the
    successes s with band_low <= s / pilot <= band_high. Refused unless every pilot in it is
    mixed (it excludes 0 and `pilot` successes) and it holds at least one count."""
    if pilot < 2:
        raise ValueError(f"a pilot needs at least 2 rollouts to be mixed; got {pilot}")
    if not 0.0 <= band_low <= band_high <= 1.0:
        raise ValueError(f"the band needs 0 <= low <= high <= 1; got [{band_low}, {band_high}]")
    # the tolerance keeps a rate that is exactly s / pilot on its edge inside the band
    low = max(0, math.ceil(band_low * pilot - 1e-9))
    high = min(pilot, math.floor(band_high * pilot + 1e-9))
    if low < 1 or high > pilot - 1 or low > high:
        raise ValueError(
            f"the band [{band_low:g}, {band_high:g}] on a pilot of {pilot} admits successes "
            f"{low}..{high}: it must hold a count between 1 and {pilot - 1}, so that every "
            "committed pilot is mixed (raise the low end above 0, the high end below 1, or "
            "widen the pilot)")
    return PilotBand(pilot, low, high)


def plan_pilot(k: int, alpha0: float, beta0: float, band: PilotBand,
               tau_low: float | None = None) -> GroupPlan:
    """The plan of a Pilot-Commit group of budget k: Dynamic Sampling's p_eff tables, issuing
    the pilot at first, with the band the scripts decide on. With `tau_low` (SARA's stopping
    composed), `after_failures` is SARA's threshold on failures for a group of the pilot's
    size, and only that many are issued at first; without it, the pilot runs whole (no
    threshold: after_failures is k + 1)."""
    if band.pilot >= k:
        raise ValueError(f"the pilot ({band.pilot}) must be smaller than the budget k={k}")
    ds = plan_group("dynamic_sampling", k, alpha0, beta0, 0.0)
    after_failures, first = ds.after_failures, band.pilot
    if tau_low is not None:
        after_failures = plan_group("sara", band.pilot, alpha0, beta0, tau_low).after_failures
        if after_failures < 1:
            raise ValueError(f"tau_low={tau_low:g} would stop every pilot before its first "
                             "rollout: lower it")
        first = min(after_failures, band.pilot)
    return replace(ds, policy="pilot_commit", initial_issue=first,
                   after_failures=after_failures, pilot=(band.pilot, band.low, band.high))


def decide_pilot(outcomes: Sequence[bool], band: PilotBand, after_failures: int | None = None
                 ) -> str:
    """The decision after a result of a group's pilot, with `outcomes` its results so far (True:
    a success): "continue" until the pilot is complete, then "commit" in band, else "abandon";
    with `after_failures` (SARA's stopping) also "abandon" once that many failed and none
    succeeded."""
    wins = sum(1 for x in outcomes if x)
    if len(outcomes) < band.pilot:
        stopped = after_failures is not None and wins == 0 and len(outcomes) >= after_failures
        return "abandon" if stopped else "continue"
    return "commit" if band.in_band(wins) else "abandon"


def pilot_issued(outcomes: Sequence[bool], band: PilotBand, first: int) -> int:
    """Rollouts of the pilot issued after these outcomes, `first` issued at the start: the whole
    pilot once one has succeeded (SARA's prefix is no longer pure failures)."""
    return band.pilot if any(outcomes) else first


def excluded(side: str, streak: int) -> bool:
    """True for a prompt to skip for the rest of the run: its last group ended all successes
    (`selection.greso_streak`'s trailing run). Under this policy a group ends all successes
    only as a solved pilot: a committed one is mixed."""
    return side == "S" and streak > 0
