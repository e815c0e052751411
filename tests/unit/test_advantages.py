"""Advantage estimators against naive per-rollout Python loops, on ragged groups."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sara_trainer.advantages import ESTIMATORS, compute_advantages, split_groups

EPS = 1e-6
ATOL = 1e-6


def _mean(xs):
    return sum(xs) / len(xs)


def _std(xs, unbiased=True):
    n = len(xs)
    dof = n - 1 if unbiased else n
    if dof <= 0:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / dof)


def naive(groups, estimator, eps=EPS, unbiased=True):
    out = []
    if estimator in ("reinforce_pp",):
        flat = [r for g in groups for r in g]
        m, s = _mean(flat), _std(flat, unbiased)
        return [0.0 if s == 0 else (r - m) / (s + eps) for r in flat]
    if estimator == "reinforce_pp_baseline":
        centred = [r - _mean(g) for g in groups for r in g]
        s = _std(centred, unbiased)
        return [0.0 if s == 0 else c / (s + eps) for c in centred]
    for g in groups:
        m, s = _mean(g), _std(g, unbiased)
        for i, r in enumerate(g):
            if estimator == "grpo":
                out.append(0.0 if s == 0 else (r - m) / (s + eps))
            elif estimator == "dr_grpo":
                out.append(r - m)
            elif estimator == "rloo":
                others = [x for j, x in enumerate(g) if j != i]
                out.append(r - _mean(others) if others else 0.0)
    return out


binary_groups = st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=2, max_size=16),
                         min_size=1, max_size=12)
real_groups = st.lists(st.lists(st.floats(-5, 5, allow_nan=False).map(lambda x: round(x, 3)),
                                min_size=2, max_size=16), min_size=1, max_size=12)


@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
@settings(max_examples=60, deadline=None)
@given(groups=st.one_of(binary_groups, real_groups), unbiased=st.booleans())
def test_matches_naive_loop(estimator, groups, unbiased):
    got = compute_advantages(groups, estimator, eps=EPS, unbiased=unbiased)
    want = naive(groups, estimator, unbiased=unbiased)
    assert got.shape == (sum(len(g) for g in groups),)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("shape", [[8], [8, 8, 8], [2, 16, 5, 3], [16] * 32, [3, 1, 4]])
@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
def test_fixed_shapes(shape, estimator):
    rng = np.random.default_rng(sum(shape))
    groups = [rng.integers(0, 2, size=n).astype(float).tolist() for n in shape]
    got = compute_advantages(groups, estimator)
    np.testing.assert_allclose(got, naive(groups, estimator), atol=ATOL, rtol=0)
    parts = split_groups(got, shape)
    assert [len(p) for p in parts] == shape


def test_grpo_known_values():
    # one success in four: mean 0.25, unbiased std 0.5
    got = compute_advantages([[1, 0, 0, 0]], "grpo", eps=0.0)
    np.testing.assert_allclose(got, [1.5, -0.5, -0.5, -0.5], atol=1e-12)
    np.testing.assert_allclose(compute_advantages([[1, 0, 0, 0]], "dr_grpo"),
                               [0.75, -0.25, -0.25, -0.25], atol=1e-12)
    np.testing.assert_allclose(compute_advantages([[1, 0, 0, 0]], "rloo"),
                               [1.0, -1 / 3, -1 / 3, -1 / 3], atol=1e-12)


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"])
def test_zero_variance_groups_give_zero_without_nan(estimator):
    groups = [[1.0] * 8, [0.0] * 8, [0.1] * 3, [0.7]]
    got = compute_advantages(groups, estimator)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, 0.0, atol=1e-9)


@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
def test_constant_batch_gives_zero_without_nan(estimator):
    got = compute_advantages([[1.0] * 4, [1.0] * 2, [1.0]], estimator)
    assert np.all(got == 0.0)


def test_reinforce_pp_normalises_over_the_batch_not_the_group():
    got = compute_advantages([[1.0] * 4, [0.0] * 4], "reinforce_pp", eps=0.0)
    std = np.std([1.0] * 4 + [0.0] * 4, ddof=1)
    np.testing.assert_allclose(got, np.repeat([0.5 / std, -0.5 / std], 4), atol=1e-12)
    assert abs(got.mean()) < 1e-12


def test_zero_variance_group_beside_a_mixed_one_grpo():
    got = compute_advantages([[1, 1, 1, 1], [0, 1, 0, 1]], "grpo")
    assert np.all(got[:4] == 0.0)
    assert np.all(np.isfinite(got)) and np.any(got[4:] != 0)


def test_rloo_equals_scaled_dr_grpo():
    groups = [[0, 1, 1, 0, 1], [1, 0, 0]]
    rloo = compute_advantages(groups, "rloo")
    dr = compute_advantages(groups, "dr_grpo")
    scale = np.repeat([5 / 4, 3 / 2], [5, 3])
    np.testing.assert_allclose(rloo, dr * scale, atol=1e-12)


def test_errors():
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        compute_advantages([[0, 1]], "ppo")
    with pytest.raises(ValueError, match="at least one"):
        compute_advantages([[0, 1], []], "grpo")
    with pytest.raises(ValueError, match="finite"):
        compute_advantages([[0, float("nan")]], "grpo")
    with pytest.raises(ValueError):
        split_groups(np.zeros(3), [2, 2])


def naive_drawn(groups, drawn, estimator, eps=EPS, unbiased=True):
    """GRPO / Dr. GRPO with each group's mean and std over its drawn rewards where given."""
    out = []
    for g, pool in zip(groups, drawn):
        pool = g if pool is None else pool
        m, s = _mean(pool), _std(pool, unbiased)
        for r in g:
            if estimator == "dr_grpo":
                out.append(r - m)
            else:
                out.append(0.0 if s == 0 else (r - m) / (s + eps))
    return out


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_baseline_over_the_drawn_rewards_matches_the_naive_loop(estimator, data):
    """Reinforce-Ada's "global statistics": a kept group's mean and std come from every reward
    its prompt drew; a group without drawn rewards keeps its own."""
    groups = data.draw(binary_groups)
    drawn = [data.draw(st.none() | st.lists(st.sampled_from([0.0, 1.0]), min_size=len(g),
                                            max_size=4 * len(g)).map(lambda extra, g=g: g + extra))
             for g in groups]
    for unbiased in (True, False):
        got = compute_advantages(groups, estimator, eps=EPS, unbiased=unbiased, drawn=drawn)
        want = naive_drawn(groups, drawn, estimator, unbiased=unbiased)
        assert np.allclose(got, want, atol=ATOL)


def test_the_drawn_baseline_moves_the_advantages_and_is_refused_where_undefined():
    kept, drawn = [[1.0, 1.0, 0.0, 0.0]], [[1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]
    own = compute_advantages(kept, "dr_grpo")
    pooled = compute_advantages(kept, "dr_grpo", drawn=drawn)
    assert list(own) == [0.5, 0.5, -0.5, -0.5]
    assert list(pooled) == [0.75, 0.75, -0.25, -0.25]   # the pool's mean is 0.25
    with pytest.raises(ValueError, match="only grpo, dr_grpo"):
        compute_advantages(kept, "rloo", drawn=drawn)
    with pytest.raises(ValueError, match="1 groups"):
        compute_advantages(kept, "grpo", drawn=drawn * 2)
