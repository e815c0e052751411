"""DPS and MoPPS predictors against hand-worked cases and a naive reference chain."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sara_service.math.selection import (
    DpsParams, differ_chance, dps_mixed_probability, dps_observations, mopps_levels_score,
    mopps_score, top_by_score,
)

outcomes = st.lists(st.tuples(st.integers(0, 30), st.sampled_from("FMS")), max_size=16)


def naive_dps(observations, version, decay, prior, cap=64):
    """The reference sampler's procedure written out for one prompt, step by step (a step per
    policy version), with explicit loops over the states. At a step with an observation (the last
    one recorded at that version), the transition counts decay toward the prior and gain one soft
    count over (from, to) in proportion to from-belief x to-belief x P(from -> to), the from-belief
    being the prompt's belief one step before (`before`); at a step without, they only decay and
    the belief moves on. The prediction for a step is the belief pushed through the counts as they
    stood after the step before. Walks stop `cap` steps after an observation, as the module's do."""
    counts = {(a, b): prior for a in "FMS" for b in "FMS"}
    seen = {}
    for v, o in sorted(observations, key=lambda o: o[0]):
        seen[v] = o

    def chance(i, j):
        return counts[(i, j)] / sum(counts[(i, x)] for x in "FMS")

    def pushed(belief):
        return {j: sum(belief[i] * chance(i, j) for i in "FMS") for j in "FMS"}

    def decayed():
        return {key: prior + decay * (c - prior) for key, c in counts.items()}

    before = {s: 1 / 3 for s in "FMS"}     # the belief one step before the current step
    prediction = pushed(before)             # the prediction for the current step
    if not seen:
        return prediction["M"]
    last = max(seen)
    since = 0                               # steps since the last observation
    for step in range(min(seen), max(version, last + 1)):
        if step in seen:
            after = {s: float(s == seen[step]) for s in "FMS"}
            joint = {(i, j): before[i] * after[j] * chance(i, j) for i in "FMS" for j in "FMS"}
            total = sum(joint.values())
            counts = {key: c + joint[key] / total for key, c in decayed().items()}
            before, since = after, 0
            prediction = pushed(before)
            continue
        since += 1
        if since > cap:
            continue                        # past the cap: the walk stands still
        before = prediction
        counts = decayed()
        prediction = pushed(before) if since < cap else before
    return prediction["M"]


def test_unseen_prompt_gets_the_prior_prediction():
    assert dps_mixed_probability([], 5) == pytest.approx(1 / 3)


def test_one_mixed_observation_predicts_as_the_reference_update_gives():
    # from the uniform starting belief, one soft count spread over (i, M) by 1/3 each: row M of
    # the counts becomes (1, 4/3, 1), and the next step's prediction is that row normalised
    assert dps_mixed_probability([(0, "M")], 1) == pytest.approx(0.4, abs=1e-15)


def test_one_observation_counts_a_version_the_last_recorded():
    assert dps_mixed_probability([(2, "M"), (3, "F"), (3, "M")], 5) == \
        dps_mixed_probability([(2, "M"), (3, "M")], 5)
    assert dps_mixed_probability([(3, "M"), (3, "F")], 5) == dps_mixed_probability([(3, "F")], 5)


def test_persistently_mixed_prompt_ranks_above_persistently_saturated():
    mixed = [(v, "M") for v in range(6)]
    failing = [(v, "F") for v in range(6)]
    assert dps_mixed_probability(mixed, 6) > 1 / 3 > dps_mixed_probability(failing, 6)


def test_a_long_unsampled_gap_forgets_toward_the_prior():
    mixed = [(v, "M") for v in range(6)]
    near, far = dps_mixed_probability(mixed, 6), dps_mixed_probability(mixed, 200)
    assert near > far and far == pytest.approx(1 / 3, abs=1e-6)


def test_slower_decay_learns_more_from_the_same_history():
    mixed = [(v, "M") for v in range(8)]
    assert (dps_mixed_probability(mixed, 8, DpsParams(decay=0.9))
            > dps_mixed_probability(mixed, 8, DpsParams(decay=0.5)))


@settings(max_examples=200, deadline=None)
@given(outcomes, st.integers(0, 40), st.floats(0.0, 1.0), st.floats(0.1, 5.0))
def test_dps_matches_the_naive_chain_and_is_a_probability(observations, later, decay, prior):
    version = max([v for v, _ in observations], default=0) + later
    got = dps_mixed_probability(observations, version, DpsParams(decay=decay, prior=prior))
    assert 0.0 <= got <= 1.0
    assert got == pytest.approx(naive_dps(observations, version, decay, prior), abs=1e-12)


def test_mopps_prefers_posteriors_near_the_target():
    rng = random.Random(0)
    near = [mopps_score(50, 50, rng) for _ in range(200)]
    far = [mopps_score(1, 60, rng) for _ in range(200)]
    assert sum(near) / 200 > sum(far) / 200
    assert all(s <= 0 for s in near + far)


def test_mopps_is_deterministic_under_a_seeded_rng():
    a = [mopps_score(2, 3, random.Random(7)) for _ in range(3)]
    b = [mopps_score(2, 3, random.Random(7)) for _ in range(3)]
    assert a == b


def test_top_by_score_keeps_the_best_and_breaks_ties_at_random():
    picked = top_by_score(["a", "b", "c", "d"], [0.1, 0.9, 0.5, 0.9], 2, random.Random(0))
    assert sorted(picked) == ["b", "d"]
    firsts = {top_by_score(["x", "y"], [1.0, 1.0], 1, random.Random(s))[0] for s in range(20)}
    assert firsts == {"x", "y"}


def test_a_historys_forward_walk_is_kept_across_versions():
    from sara_service.math import selection
    observations = [[3, "M"], [1, "F"], [3, "S"]]      # as Redis hands them back: lists, unsorted
    selection._forward.cache_clear()
    first = dps_mixed_probability(observations, 9)
    again = dps_mixed_probability([tuple(o) for o in observations], 9)
    assert first == again == pytest.approx(naive_dps(observations, 9, 0.5, 1.0), abs=1e-12)
    later = dps_mixed_probability(observations, 12)    # the next versions extend the same walk
    assert later == pytest.approx(naive_dps(observations, 12, 0.5, 1.0), abs=1e-12)
    info = selection._forward.cache_info()
    assert (info.misses, info.hits) == (1, 2)
    walk = selection._forward(((1, "F", 0.0), (3, "S", 0.0)), DpsParams())   # one a version
    assert len(walk.mixed) == 12 - 3                    # walked as far as asked, no further


@settings(max_examples=100, deadline=None)
@given(outcomes, st.lists(st.integers(0, 90), min_size=1, max_size=8))
def test_a_kept_walk_answers_every_version_as_a_fresh_one_would(observations, laters):
    """Versions asked in any order (earlier, later, past the walk's cap) get the naive chain's
    figure: the walk kept from one question is the one a fresh walk would take."""
    last = max([v for v, _ in observations], default=0)
    params = DpsParams(decay=0.7, prior=1.0)
    for later in laters:
        got = dps_mixed_probability(observations, last + later, params)
        assert got == pytest.approx(naive_dps(observations, last + later, 0.7, 1.0), abs=1e-12)


# ------------------------------------------------------------------ censored (abandoned) groups


def _after_failing_history(last):
    """A prompt mixed twice, then whatever `last` is, read one version later."""
    return dps_mixed_probability([(0, "M"), (1, "M"), last], 3)


def test_a_censored_observation_with_no_chance_of_mixed_is_the_hard_label():
    assert _after_failing_history((2, "F", 0.0)) == _after_failing_history((2, "F"))
    assert _after_failing_history((2, "S", 0.0)) == _after_failing_history((2, "S"))


@pytest.mark.parametrize("side", ["F", "S"])
def test_a_censored_observation_moves_the_prediction_less_than_a_hard_one(side):
    mixed = _after_failing_history((2, "M"))
    hard = _after_failing_history((2, side))
    soft = _after_failing_history((2, side, 0.4))
    assert hard < soft < mixed
    # and the more likely the abandoned group was mixed, the less it counts against the prompt
    assert soft < _after_failing_history((2, side, 0.8)) < mixed


def test_certainly_mixed_censored_observation_is_a_mixed_label():
    assert _after_failing_history((2, "F", 1.0)) == pytest.approx(_after_failing_history((2, "M")),
                                                                 abs=1e-15)


def test_store_entries_keep_or_drop_the_censoring():
    stored = [[0, "M"], [1, "F", 0.25]]
    assert dps_observations(stored) == [(0, "M"), (1, "F", 0.25)]
    assert dps_observations(stored, censored=False) == [(0, "M"), (1, "F")]


def test_an_unknown_outcome_class_is_refused():
    with pytest.raises(ValueError, match="outcome"):
        dps_mixed_probability([(0, "X")], 1)


@given(st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.integers(2, 64))
def test_with_two_levels_differing_ranks_as_the_distance_from_one_half(p, q, k):
    # the reward view's MoPPS score orders two-level prompts as MoPPS at target 0.5 does
    a, b = differ_chance([p, 1 - p], k), differ_chance([q, 1 - q], k)
    if abs(abs(p - 0.5) - abs(q - 0.5)) > 1e-9 and abs(a - b) > 1e-12:
        assert (a > b) == (abs(p - 0.5) < abs(q - 0.5))


def test_differ_chance_is_one_minus_the_all_one_level_chance():
    assert differ_chance([1.0, 0.0, 0.0], 8) == 0.0
    assert differ_chance([0.5, 0.5], 2) == pytest.approx(0.5)
    assert differ_chance([0.2, 0.3, 0.5], 3) == pytest.approx(1 - 0.008 - 0.027 - 0.125)


def test_mopps_under_levels_prefers_prompts_whose_levels_vary():
    rng = random.Random(3)
    vary = [mopps_levels_score([20, 20, 1], 8, rng) for _ in range(200)]
    same = [mopps_levels_score([1, 60, 1], 8, rng) for _ in range(200)]
    assert sum(vary) / 200 > 0.9 > 0.5 > sum(same) / 200
    assert [mopps_levels_score([2, 3], 8, random.Random(7)) for _ in range(3)] == \
        [mopps_levels_score([2, 3], 8, random.Random(7)) for _ in range(3)]
