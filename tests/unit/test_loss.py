"""The clipped policy-gradient loss against a naive per-token loop."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from sara_trainer.loss import aggregate, k3_kl, policy_loss

ATOL = 1e-6


def naive_loss(logp, old, adv, mask, ref=None, eps_low=0.2, eps_high=0.28, kl_coef=0.0):
    """Per-token Python loop: token-mean of the clipped PG term (+ kl_coef · token-mean k3)."""
    total, kl_total, n = 0.0, 0.0, 0
    rows, cols = logp.shape
    for b in range(rows):
        for t in range(cols):
            if mask[b][t] == 0:
                continue
            ratio = torch.exp(logp[b, t] - float(old[b][t]))
            clipped = min(max(ratio.item(), 1 - eps_low), 1 + eps_high)
            a = float(adv[b])
            unclipped_term = -a * ratio
            clipped_term = -a * clipped
            total = total + (unclipped_term if unclipped_term.item() >= clipped_term
                             else clipped_term * torch.ones(()))
            if ref is not None:
                d = float(ref[b][t]) - logp[b, t]
                kl_total = kl_total + torch.exp(d) - d - 1
            n += 1
    loss = total / n
    if ref is not None and kl_coef:
        loss = loss + kl_coef * kl_total / n
    return loss


def _case(rows, cols, seed, spread=0.5):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(rows, cols, generator=g) * 3).double()
    old = logp + torch.randn(rows, cols, generator=g, dtype=torch.float64) * spread
    ref = logp + torch.randn(rows, cols, generator=g, dtype=torch.float64) * spread
    adv = torch.randn(rows, generator=g, dtype=torch.float64)
    mask = (torch.rand(rows, cols, generator=g) > 0.3).double()
    mask[:, 0] = 1.0  # every row has a token
    return logp, old, ref, adv, mask


@pytest.mark.parametrize("rows,cols,seed", [(1, 1, 0), (3, 5, 1), (8, 16, 2), (16, 7, 3),
                                            (5, 12, 4)])
@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_matches_naive_loop_value_and_gradient(rows, cols, seed, kl_coef):
    logp0, old, ref, adv, mask = _case(rows, cols, seed)
    logp_a = logp0.clone().requires_grad_(True)
    logp_b = logp0.clone().requires_grad_(True)
    loss, metrics = policy_loss(logp_a, adv, mask, old, ref, clip_eps_low=0.2,
                                clip_eps_high=0.28, kl_coef=kl_coef)
    want = naive_loss(logp_b, old, adv, mask, ref, 0.2, 0.28, kl_coef)
    assert abs(loss.item() - want.item()) < ATOL
    loss.backward()
    want.backward()
    torch.testing.assert_close(logp_a.grad, logp_b.grad, atol=ATOL, rtol=0)
    # padding gets no gradient
    assert torch.all(logp_a.grad[mask == 0] == 0)
    assert metrics["tokens"] == float(mask.sum())


def test_gradient_flows_only_through_logp():
    logp0, old, ref, adv, mask = _case(4, 6, 7)
    logp = logp0.clone().requires_grad_(True)
    old, ref, adv = (x.clone().requires_grad_(True) for x in (old, ref, adv))
    loss, _ = policy_loss(logp, adv, mask, old, ref, kl_coef=0.5)
    loss.backward()
    assert logp.grad is not None and torch.any(logp.grad != 0)
    for x in (old, ref, adv):
        assert x.grad is None


def test_on_policy_ratio_is_one_and_gradient_is_minus_advantage():
    logp0, _, _, adv, mask = _case(4, 6, 8)
    logp = logp0.clone().requires_grad_(True)
    loss, metrics = policy_loss(logp, adv, mask)  # no old logprobs
    n = mask.sum()
    want = -(adv.unsqueeze(-1) * mask).sum() / n
    assert abs(loss.item() - float(want)) < 1e-12
    loss.backward()
    torch.testing.assert_close(logp.grad, -(adv.unsqueeze(-1) * mask) / n)
    assert metrics["clip_frac"] == 0.0
    assert metrics["ratio_mean"] == pytest.approx(1.0)


def test_clipping_engages_where_expected():
    eps_low, eps_high = 0.2, 0.28
    # columns: ratio 2 (above 1+eh), 1.1 (inside), 0.5 (below 1−el)
    old = torch.zeros(2, 3, dtype=torch.float64)
    logp = torch.log(torch.tensor([[2.0, 1.1, 0.5], [2.0, 1.1, 0.5]],
                                  dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    mask = torch.ones(2, 3, dtype=torch.float64)
    loss, metrics = policy_loss(logp, adv, mask, old, clip_eps_low=eps_low,
                                clip_eps_high=eps_high)
    loss.backward()
    grad = logp.grad
    # A > 0: clipped (no gradient) only where ratio > 1+eh; A < 0: only where ratio < 1−el
    assert grad[0, 0] == 0 and grad[0, 1] != 0 and grad[0, 2] != 0
    assert grad[1, 2] == 0 and grad[1, 0] != 0 and grad[1, 1] != 0
    assert metrics["clip_frac"] == pytest.approx(2 / 6)
    assert metrics["clip_frac_high"] == pytest.approx(1 / 6)
    assert metrics["clip_frac_low"] == pytest.approx(1 / 6)
    want = -(1 + eps_high) - 1.1 - 0.5 + 2.0 + 1.1 + (1 - eps_low)
    assert loss.item() == pytest.approx(want / 6)


def test_asymmetric_clip_higher():
    old = torch.zeros(1, 1, dtype=torch.float64)
    logp = torch.log(torch.tensor([[1.25]], dtype=torch.float64)).requires_grad_(True)
    adv = torch.ones(1, dtype=torch.float64)
    mask = torch.ones(1, 1)
    _, narrow = policy_loss(logp, adv, mask, old, clip_eps_low=0.2, clip_eps_high=0.2)
    _, wide = policy_loss(logp, adv, mask, old, clip_eps_low=0.2, clip_eps_high=0.28)
    assert narrow["clip_frac"] == 1.0 and wide["clip_frac"] == 0.0


def test_k3_is_nonnegative_and_zero_when_policies_match():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(64, 9, generator=g) * 5
    ref = -torch.rand(64, 9, generator=g) * 5
    assert torch.all(k3_kl(logp, ref) >= 0)
    assert torch.all(k3_kl(logp, logp) == 0)
    mask = torch.ones(64, 9)
    _, metrics = policy_loss(logp, torch.zeros(64), mask, ref_logp=logp.clone(), kl_coef=0.1)
    assert metrics["kl"] == 0.0
    _, metrics = policy_loss(logp, torch.zeros(64), mask, ref_logp=ref, kl_coef=0.1)
    assert metrics["kl"] > 0


def test_padding_may_hold_nan_or_inf():
    logp0, old, ref, adv, mask = _case(3, 5, 9)
    old = old.masked_fill(mask == 0, float("nan"))
    ref = ref.masked_fill(mask == 0, float("-inf"))
    logp = logp0.clone().requires_grad_(True)
    loss, metrics = policy_loss(logp, adv, mask, old, ref, kl_coef=0.1)
    loss.backward()
    assert math.isfinite(loss.item()) and torch.all(torch.isfinite(logp.grad))
    assert all(math.isfinite(v) for v in metrics.values())


def test_token_mean_weighs_every_token_equally_and_micro_batches_add_up():
    logp0, old, _, adv, mask = _case(8, 10, 10)
    full = logp0.clone().requires_grad_(True)
    loss, _ = policy_loss(full, adv, mask, old)
    loss.backward()
    n = float(mask.sum())
    parts = logp0.clone().requires_grad_(True)
    total = 0.0
    for rows in (slice(0, 3), slice(3, 8)):
        part, _ = policy_loss(parts[rows], adv[rows], mask[rows], old[rows], normalizer=n)
        part.backward()
        total += part.item()
    assert total == pytest.approx(loss.item(), abs=1e-12)
    torch.testing.assert_close(parts.grad, full.grad)


def test_other_aggregations():
    values = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert float(aggregate(values, mask, "token-mean")) == pytest.approx(2.0)
    assert float(aggregate(values, mask, "seq-mean-token-mean")) == pytest.approx((1.5 + 3) / 2)
    assert float(aggregate(values, mask, "seq-mean-token-sum-norm", max_tokens=4)) == \
        pytest.approx(6 / (2 * 4))
    with pytest.raises(ValueError):
        aggregate(values, mask, "sum")


def test_errors():
    logp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="mask shape"):
        policy_loss(logp, torch.zeros(2), torch.ones(2, 4))
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(logp, torch.zeros(2), torch.ones(2, 3), kl_coef=0.1)
