"""Per-rollout advantages from group rewards (numpy only; no torch needed).

Input: rewards as a list of groups, ``[[r_11, ..., r_1k1], [r_21, ...], ...]``; groups may differ
in size (``commit = partial`` delivers mixed prefixes). Output: one float64 array of advantages,
flat, in the same order as the rewards concatenated (``split_groups`` gives them back per group).

Estimators (``std`` is Bessel-corrected unless ``unbiased=False``; a group or batch of one has
std 0):

- ``grpo``: (r − group mean) / (group std + eps). A zero-variance group gives exactly 0.
- ``dr_grpo``: r − group mean (Dr. GRPO: no division by std).

For these two, ``drawn`` may give a group its baseline from more rewards than it delivers: every
reward its prompt drew, when the delivered rollouts are a subset (Reinforce-Ada's kept ones;
its paper's "global statistics": the mean and std over the whole pool of the prompt's
responses). A group with no drawn rewards (None) takes its own.
- ``rloo``: r_i − mean of the other rollouts of the group, = k/(k−1) (r_i − group mean);
  0 for a group of one.
- ``reinforce_pp``: Reinforce++: (r − batch mean) / (batch std + eps), over every rollout of the
  batch; groups play no part.
- ``reinforce_pp_baseline``: (r − group mean) / (batch std of those differences + eps)
  (OpenRLHF's Reinforce++-baseline).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

DEFAULT_EPS = 1e-6


def _flatten(rewards: Iterable[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    groups = [np.asarray(g, dtype=np.float64).reshape(-1) for g in rewards]
    if any(g.size == 0 for g in groups):
        raise ValueError("every group needs at least one reward")
    sizes = np.array([g.size for g in groups], dtype=np.int64)
    flat = np.concatenate(groups) if groups else np.zeros(0, dtype=np.float64)
    if not np.all(np.isfinite(flat)):
        raise ValueError("rewards must be finite")
    return flat, sizes


def _group_stats(flat: np.ndarray, sizes: np.ndarray, unbiased: bool
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Per-rollout group mean and group std (broadcast back to each rollout)."""
    index = np.repeat(np.arange(sizes.size), sizes)
    sums = np.bincount(index, weights=flat, minlength=sizes.size)
    means = sums / sizes
    centred = flat - means[index]
    sq = np.bincount(index, weights=centred * centred, minlength=sizes.size)
    dof = sizes - 1 if unbiased else sizes
    with np.errstate(divide="ignore", invalid="ignore"):
        var = np.where(dof > 0, sq / np.maximum(dof, 1), 0.0)
    return means[index], np.sqrt(var)[index]


def _batch_std(values: np.ndarray, unbiased: bool) -> float:
    n = values.size
    if n - (1 if unbiased else 0) <= 0:
        return 0.0
    return float(np.std(values, ddof=1 if unbiased else 0))


def split_groups(flat: np.ndarray, sizes: Sequence[int]) -> list[np.ndarray]:
    """Cut a flat per-rollout array back into groups of the given sizes."""
    sizes = list(sizes)
    if sum(sizes) != len(flat):
        raise ValueError("sizes do not add up to the array length")
    return np.split(np.asarray(flat), np.cumsum(sizes)[:-1]) if sizes else []


def _baseline_stats(rewards: Sequence[Sequence[float]], drawn: Sequence[Sequence[float] | None],
                    sizes: np.ndarray, unbiased: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per-rollout group mean and std, each group's over its drawn rewards where it has them."""
    pools = [r if d is None else d for r, d in zip(rewards, drawn)]
    flat, pool_sizes = _flatten(pools)
    mean, std = _group_stats(flat, pool_sizes, unbiased)
    firsts = np.concatenate([[0], np.cumsum(pool_sizes)[:-1]]).astype(np.int64)
    return np.repeat(mean[firsts], sizes), np.repeat(std[firsts], sizes)


def _stats(rewards: Sequence[Sequence[float]], drawn: Sequence[Sequence[float] | None] | None,
           unbiased: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flat rewards, per-rollout baseline mean, per-rollout std)."""
    flat, sizes = _flatten(rewards)
    if drawn is None:
        return (flat, *_group_stats(flat, sizes, unbiased))
    if len(drawn) != len(sizes):
        raise ValueError(f"drawn has {len(drawn)} entries for {len(sizes)} groups")
    return (flat, *_baseline_stats(rewards, drawn, sizes, unbiased))


def grpo(rewards: Iterable[Sequence[float]], eps: float = DEFAULT_EPS, unbiased: bool = True,
         drawn: Sequence[Sequence[float] | None] | None = None) -> np.ndarray:
    flat, mean, std = _stats(list(rewards), drawn, unbiased)
    centred = flat - mean
    # A zero-variance group has centred == 0 exactly only up to rounding; force it.
    centred = np.where(std > 0, centred, 0.0)
    return centred / (std + eps)


def dr_grpo(rewards: Iterable[Sequence[float]], eps: float = DEFAULT_EPS, unbiased: bool = True,
            drawn: Sequence[Sequence[float] | None] | None = None) -> np.ndarray:
    flat, mean, _ = _stats(list(rewards), drawn, unbiased)
    return flat - mean


def rloo(rewards: Iterable[Sequence[float]], eps: float = DEFAULT_EPS, unbiased: bool = True
         ) -> np.ndarray:
    flat, sizes = _flatten(rewards)
    index = np.repeat(np.arange(sizes.size), sizes)
    sums = np.bincount(index, weights=flat, minlength=sizes.size)[index]
    n = sizes[index].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        others = np.where(n > 1, (sums - flat) / np.maximum(n - 1, 1), flat)
    return flat - others


def reinforce_pp(rewards: Iterable[Sequence[float]], eps: float = DEFAULT_EPS,
                 unbiased: bool = True) -> np.ndarray:
    flat, _ = _flatten(rewards)
    if flat.size == 0:
        return flat
    centred = flat - flat.mean()
    std = _batch_std(flat, unbiased)
    if std == 0.0:
        return np.zeros_like(flat)
    return centred / (std + eps)


def reinforce_pp_baseline(rewards: Iterable[Sequence[float]], eps: float = DEFAULT_EPS,
                          unbiased: bool = True) -> np.ndarray:
    flat, sizes = _flatten(rewards)
    mean, _ = _group_stats(flat, sizes, unbiased)
    centred = flat - mean
    std = _batch_std(centred, unbiased)
    if std == 0.0:
        return np.zeros_like(flat)
    return centred / (std + eps)


ESTIMATORS: dict[str, Callable[..., np.ndarray]] = {
    "grpo": grpo, "dr_grpo": dr_grpo, "rloo": rloo, "reinforce_pp": reinforce_pp,
    "reinforce_pp_baseline": reinforce_pp_baseline,
}


# the estimators whose group baseline can come from the rewards a group drew (``drawn``)
DRAWN_BASELINE = ("grpo", "dr_grpo")


def compute_advantages(rewards: Iterable[Sequence[float]], estimator: str = "grpo",
                       eps: float = DEFAULT_EPS, unbiased: bool = True,
                       drawn: Sequence[Sequence[float] | None] | None = None) -> np.ndarray:
    """Flat per-rollout advantages (float64) for ragged groups of rewards, by estimator name;
    `drawn` (grpo, dr_grpo): per group, the rewards its baseline is taken over, or None."""
    try:
        fn = ESTIMATORS[estimator]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {estimator!r}; choose from "
                         f"{', '.join(ESTIMATORS)}") from None
    if drawn is None:
        return fn(rewards, eps=eps, unbiased=unbiased)
    if estimator not in DRAWN_BASELINE:
        raise ValueError(f"{estimator} takes no baseline over drawn rewards; only "
                         f"{', '.join(DRAWN_BASELINE)} do")
    return fn(rewards, eps=eps, unbiased=unbiased, drawn=drawn)
