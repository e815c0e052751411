"""The hf backend's sampling on hand-made logits: greedy rows, top-p truncation, the inverse-CDF
draw, and the raw (pre-temperature) logprob of the chosen token."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from sara_worker.backends.hf_sampling import sample  # noqa: E402

PROBS = [0.5, 0.3, 0.2]


def logits_of(*rows):
    return torch.tensor([[math.log(p) for p in row] for row in rows])


def fixed(*values):
    """uniforms() that answers `values` for the rows it is asked about, checking which."""
    def uniforms(rows):
        assert len(rows) == len(values)
        return torch.tensor(values)
    return uniforms


def test_a_greedy_row_takes_the_argmax_with_its_raw_logprob():
    (token, logprob), = sample(logits_of([0.2, 0.5, 0.3]), [0.0], [1.0], fixed())
    assert token == 1 and logprob == pytest.approx(math.log(0.5))


@pytest.mark.parametrize("u, token", [(0.1, 0), (0.49, 0), (0.51, 1), (0.79, 1), (0.81, 2)])
def test_a_sampled_row_inverts_the_cdf_at_its_uniform(u, token):
    (got, logprob), = sample(logits_of(PROBS), [1.0], [1.0], fixed(u))
    assert got == token and logprob == pytest.approx(math.log(PROBS[token]))


@pytest.mark.parametrize("u, token", [(0.1, 0), (0.7, 1), (0.999, 1)])
def test_top_p_cuts_the_tail_and_renormalises(u, token):
    # top_p 0.6 keeps tokens 0 (0.5) and 1 (0.3, reached before 0.6 is): 0.2 is never drawn
    (got, logprob), = sample(logits_of(PROBS), [1.0], [0.6], fixed(u))
    assert got == token and logprob == pytest.approx(math.log(PROBS[token]))


def test_temperature_reshapes_the_draw_not_the_reported_logprob():
    # at temperature 0.5 the probabilities go as p^2: 0.25 / 0.38, 0.09 / 0.38, 0.04 / 0.38
    (got, logprob), = sample(logits_of(PROBS), [0.5], [1.0], fixed(0.7))
    assert got == 1  # 0.7 > 0.658 (0.25 / 0.38), < 0.895
    assert logprob == pytest.approx(math.log(0.3))


def test_only_the_sampled_rows_ask_for_uniforms():
    out = sample(logits_of(PROBS, PROBS, PROBS), [0.0, 1.0, 0.0], [1.0, 1.0, 1.0], fixed(0.9))
    assert [t for t, _ in out] == [0, 2, 0]
